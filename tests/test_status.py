"""The master's status endpoint (c4d/master/status.py) over real ZeroMQ sockets, and how an incident ends
when its job stops sending (c4d/engine/incidents.py: *stopped with the job*, not *resolved*)."""

from __future__ import annotations

import json

import numpy as np
import zmq

from c4d.engine.incidents import End, Incidents, heard_stamps
from c4d.master.status import MAX_PER_REPLY, StatusFollower, StatusServer, status_endpoint
from c4d.record.schema import HEADER, Kind
from tests.conftest import wait_for
from tests.test_incidents import S, hang


def test_the_status_endpoint_is_next_to_the_record_endpoint():
    assert status_endpoint("tcp://127.0.0.1:5599") == "tcp://127.0.0.1:5598"
    assert status_endpoint("tcp://0.0.0.0:5555") == "tcp://0.0.0.0:5554"
    assert status_endpoint("ipc:///tmp/m.sock") == "ipc:///tmp/m.sock.status"
    assert status_endpoint("tcp://127.0.0.1:*") is None  # not bound yet: nothing to derive
    assert status_endpoint("inproc://x") is None
    assert status_endpoint("not an endpoint") is None


def _serve_until(server, diags, job, cond, what):
    def step():
        server.serve(diags, job)
        return cond()

    wait_for(step, 10, what)


def test_a_follower_gets_every_diagnosis_once_and_only_its_jobs(tmp_path):
    server = StatusServer(f"ipc://{tmp_path}/s.status")
    diags = [hang(1.0 + i, 1 + i) for i in range(MAX_PER_REPLY + 3)]  # more than one reply holds
    mine = StatusFollower(server.endpoint, job="simA")
    other = StatusFollower(server.endpoint, job="simB")
    try:
        got: list[dict] = []
        _serve_until(server, diags, "simA", lambda: got.extend(mine.poll(0.02)) or len(got) >= len(diags),
                     "every diagnosis")  # fmt: skip
        assert [d["hang_times"] for d in got] == [d.hang_times for d in diags]
        assert got[0] == json.loads(json.dumps(diags[0].to_json()))  # the --json object, as is
        diags.append(hang(900.0, 3))
        more: list[dict] = []
        _serve_until(server, diags, "simA", lambda: more.extend(mine.poll(0.02)) or more, "the new one")
        assert [d["hang_times"] for d in more] == [3]
        # a master serving another job: nothing is taken from it, and the follower says whose it is
        _serve_until(server, diags, "simA", lambda: other.poll(0.02) == [] and other.other_job, "an answer")
        assert other.other_job == "simA" and other.answered
    finally:
        mine.close()
        other.close()
        server.close()


def test_garbage_requests_get_an_error_and_the_server_goes_on(tmp_path):
    server = StatusServer(f"ipc://{tmp_path}/s.status")
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.RCVTIMEO, 5000)
    req.connect(server.endpoint)
    raw = ctx.socket(zmq.DEALER)  # frames without the REQ delimiter: nothing to answer to
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.endpoint)
    diags = [hang(1.0, 1)]
    try:
        raw.send_multipart([b"no", b"delimiter"])
        for bad in (b"\xff\xfe", b"[1, 2]", b'{"since": -1}', b'{"since": true}', b'{"since": "0"}', b"{}"):
            req.send(bad)
            _serve_until(server, diags, "j", lambda: req.poll(0, zmq.POLLIN), f"an answer to {bad!r}")
            assert "error" in json.loads(req.recv()), bad
        req.send(b'{"since": 0}')
        _serve_until(server, diags, "j", lambda: req.poll(0, zmq.POLLIN), "an answer")
        ok = json.loads(req.recv())
        assert ok["count"] == 1 and ok["job"] == "j" and len(ok["diagnoses"]) == 1
    finally:
        req.close()
        raw.close()
        server.close()


def _hang_then(after_s: float | None):
    """A hang reported at n = 1..3 (T = 1 s, from t = 10 s); the job heard every 0.2 s until
    ``after_s`` seconds past the last report (None: never stops)."""
    diags = [hang(10.0 + i, 1 + i) for i in range(3)]
    end = 12.0 + (after_s if after_s is not None else 20.0)
    heard = np.arange(int(5 * S), int(end * S), int(0.2 * S), dtype=np.int64)
    return diags, heard


def test_a_hang_whose_job_stopped_ends_stopped_with_the_job_not_resolved():
    diags, heard = _hang_then(0.5)  # killed half a T after the last report: no next report could come
    [inc] = Incidents.fold(diags, int(40 * S), heard)
    assert inc.end is End.stopped and "stopped with the job" in inc.line()
    # live: the same verdict from the latest stamp the master fed
    live = Incidents()
    for d in diags:
        live.observe(d)
    for t in heard:
        live.heard(int(t))
    [ev] = live.expire(int(20 * S))
    assert ev.incident.end is End.stopped


def test_a_hang_that_cleared_while_the_job_ran_on_is_resolved():
    diags, heard = _hang_then(None)
    [inc] = Incidents.fold(diags, int(40 * S), heard)
    assert inc.end is End.resolved
    [inc] = Incidents.fold(diags, int(40 * S))  # nothing says when the job was heard: as before
    assert inc.end is End.resolved


def test_heard_stamps_are_the_tick_each_record_was_fed_at():
    raw = np.zeros(7, HEADER)
    raw["kind"] = [Kind.HEARTBEAT, Kind.TICK, Kind.HEARTBEAT, Kind.OP, Kind.TICK, Kind.TICK, Kind.HEARTBEAT]
    raw["time_ns"] = [0, 100, 0, 0, 200, 300, 0]
    stamps, last = heard_stamps(raw, 50)
    assert stamps.tolist() == [50, 100, 300] and last == 300
    stamps, last = heard_stamps(raw[:1], 300)  # a piece without a TICK: the previous piece's
    assert stamps.tolist() == [300] and last == 300
