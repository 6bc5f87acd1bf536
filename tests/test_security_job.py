"""One master, one job: records of a second job pointed at the same master are refused and
counted, never mixed with the first (c4d/master/collector.py).

The job id is the shim's ``C4D_JOB_ID`` (else ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``): it is
sent as the ZeroMQ connection property ``X-C4D-Job`` on every message and in each REGISTER.
"""

from __future__ import annotations

import logging

import numpy as np
import zmq

from c4d.master.collector import Collector
from c4d.master.master import Master, MasterConfig
from c4d.record import schema, trace, wire
from tests import records as R
from tests.conftest import wait_for
from tests.masterproc import MasterProc
from tests.test_shim import base_env, run_job, train


def _pids_in(path) -> set[int]:
    reg = trace.read_raw(path).kinds[schema.Kind.REGISTER]
    return {int(p) for p in np.unique(reg["pid"])}


def test_a_second_job_at_the_same_master_is_refused_and_counted_not_mixed(tmp_path, simtrain, libc4d, jobs):
    """Job B's ranks 0..3 would otherwise pass for job A's ranks 0..3 (their heartbeats keep a dead
    rank of A alive, their ops land in A's ranks' history)."""
    m = MasterProc(tmp_path)
    args = train(40, 2, 1, "--compute-us", "20000")
    try:
        env = {"C4D_MASTER_ADDR": m.endpoint, "C4D_HEARTBEAT_MS": "100"}
        a = run_job(jobs, simtrain, 4, args, base_env(libc4d, C4D_JOB_ID="jobA", **env), tmp_path)
        wait_for(lambda: "serving job jobA" in m.stderr(), 60, "the master to serve job A")
        b = run_job(jobs, simtrain, 4, args, base_env(libc4d, C4D_JOB_ID="jobB", **env), tmp_path)
        for j in (a, b):
            assert j.wait(180) == [0] * 4, [j.stderr(r) for r in range(4)]
        counted = wait_for(lambda: m.counters("c4d_bad_messages_by_reason").get("other job"), 30, "B counted")
    finally:
        assert m.stop() == 0
    assert counted >= 4  # at least one message per rank of B (each sends its REGISTER first)
    pids = _pids_in(m.trace)
    assert pids == {p.pid for p in a.procs}
    assert m.diagnoses() == []
    said = [ln for ln in m.stderr().splitlines() if "refused records of job jobB" in ln]
    assert len(said) == 1 and "this master serves job jobA" in said[0]  # rate-limited: once a minute


def test_a_master_told_its_job_refuses_any_other_even_first(tmp_path, simtrain, libc4d, jobs):
    m = MasterProc(tmp_path, "--job", "train-42")
    args = ["--verify", "--job-dir", "{dir}"]
    try:
        env = lambda job: base_env(libc4d, C4D_MASTER_ADDR=m.endpoint, TORCHELASTIC_RUN_ID=job)  # noqa: E731
        other = run_job(jobs, simtrain, 2, args, env("train-41"), tmp_path)
        assert other.wait(120) == [0, 0]
        wait_for(lambda: m.counters("c4d_bad_messages_by_reason").get("other job"), 30, "train-41 counted")
        mine = run_job(jobs, simtrain, 2, args, env("train-42"), tmp_path)
        assert mine.wait(120) == [0, 0]
        assert mine.stdout(0) == other.stdout(0) == "verify ok\n"
        wait_for(lambda: {p.pid for p in mine.procs} <= _pids_in(m.trace), 30, "train-42's registrations")
    finally:
        m.stop()
    assert not _pids_in(m.trace) & {p.pid for p in other.procs}


def _push(endpoint: str, *batches: bytes, job: str | None = None) -> None:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PUSH)
    s.linger = 2000
    if job is not None:
        s.setsockopt(zmq.METADATA if hasattr(zmq, "METADATA") else 95, f"X-C4D-Job:{job}".encode())
    s.connect(endpoint)
    for b in batches:
        s.send(b)
    s.close()


def _register(rank: int, job: bytes) -> bytes:
    r = R.register(rank, "node-0")
    r["job"] = job
    return wire.encode(r.view(schema.HEADER), rank)


def _collect(c: Collector, n: int) -> list[np.ndarray]:
    got: list[np.ndarray] = []
    wait_for(lambda: got.extend(c.poll(0.05)) or c.messages >= n, 30, f"{n} messages")
    return got


def test_without_the_connection_property_a_register_names_the_job(tmp_path, caplog):
    """A sender whose libzmq can't set ZMQ_METADATA is judged by the job in its REGISTER. A
    batch with neither is not the job a master was told to serve (--job); one serving the
    first job it heard can't tell it apart and takes it (docs/reliability.md says so)."""
    caplog.set_level(logging.INFO, logger="c4d.master.collector")
    ops = wire.encode(R.ops(3, rank=1).view(schema.HEADER), 1)
    for named, taken in ((True, [1]), (False, [1, 3])):
        c = Collector(f"ipc://{tmp_path}/m{int(named)}.sock", job="A" if named else None)
        try:
            _push(c.endpoint, _register(1, b"A"), _register(0, b"B"), ops)
            got = _collect(c, 3)
        finally:
            c.close()
        assert [len(g) for g in got] == taken, named
        assert got[0]["rank"][0] == 1
        assert c.bad_reasons["other job"] == 1 + named
        assert c.other_job_records == 1 + 3 * named


def test_under_a_named_job_an_empty_job_field_is_not_that_job(tmp_path):
    """A key holder's REGISTER with an empty job field on a connection naming the job, or on
    one naming none, is refused under --job J (it was taken as J)."""
    c = Collector(f"ipc://{tmp_path}/m.sock", job="J")
    try:
        _push(c.endpoint, _register(0, b""), job="J")
        _push(c.endpoint, _register(1, b""))
        _push(c.endpoint, _register(2, b"J"), job="J")
        got = _collect(c, 3)
    finally:
        c.close()
    assert [int(g["rank"][0]) for g in got] == [2]
    assert c.bad_reasons["other job"] == 2


def test_the_connection_property_outranks_the_records(tmp_path):
    c = Collector(f"ipc://{tmp_path}/m.sock")
    try:
        _push(c.endpoint, _register(0, b"A"), job="A")  # pins A
        _push(c.endpoint, _register(1, b"A"), wire.encode(R.ops(2, rank=1).view(schema.HEADER), 1), job="B")
        got = _collect(c, 3)
    finally:
        c.close()
    assert c.job == "A" and [len(g) for g in got] == [1]
    assert c.bad_reasons["other job"] == 2 and c.other_job_records == 3


def test_each_attempt_on_a_kept_endpoint_serves_its_own_job(tmp_path):
    """``c4d run`` keeps one collector across restarts; each attempt's Master serves anew."""
    c = Collector(f"ipc://{tmp_path}/m.sock")
    try:
        first = Master(MasterConfig(), collector=c)
        _push(c.endpoint, _register(0, b"attempt-1"), job="attempt-1")
        _collect(c, 1)
        assert c.job == "attempt-1"
        first.close()
        second = Master(MasterConfig(), collector=c)
        assert c.job is None
        _push(c.endpoint, _register(0, b"attempt-2"), job="attempt-2")
        got = _collect(c, 2)
        second.close()
    finally:
        c.close()
    assert c.job == "attempt-2" and len(got) == 1 and not c.bad_reasons


def test_messages_joined_in_one_poll_keep_their_order_and_a_forged_register_is_refused_alone(tmp_path):
    """A poll joins consecutive messages of the job served into one batch (Collector.poll); under
    a job named, a message on the job's own connection whose REGISTER names another job is still
    refused on its own, and the rest, malformed messages and all, keep their order."""
    n = 60
    msgs = [wire.encode(R.ops(5, rank=1, start_seq=5 * k).view(schema.HEADER), 1) for k in range(n)]
    msgs[20] = b"not a batch"
    msgs[40] = _register(2, b"B")  # the job's connection, another job's registration
    for named in (True, False):
        c = Collector(f"ipc://{tmp_path}/m{int(named)}.sock", job="A" if named else None)
        try:
            _push(c.endpoint, _register(1, b"A"), job="A")  # the connection found to serve A
            got = _collect(c, 1)
            s = zmq.Context.instance().socket(zmq.PUSH)  # open until read: a connection's queue
            s.setsockopt(zmq.METADATA, b"X-C4D-Job:A")  # at the master holds 8 messages
            s.connect(c.endpoint)
            for m in msgs:
                s.send(m)
            got += _collect(c, 1 + n)
            s.close(linger=0)
        finally:
            c.close()
        rows = schema.join_records(got, schema.HEADER)
        ops = rows[rows["kind"] == schema.Kind.OP].view(schema.OP)
        want = [s for k in range(n) if k not in (20, 40) for s in range(5 * k, 5 * k + 5)]
        assert ops["seq"].tolist() == want  # every op, in the order sent
        assert c.bad_reasons["bad magic"] + c.bad_reasons["short message"] == 1
        assert c.bad_reasons["other job"] == (1 if named else 0)
        reg = rows[rows["kind"] == schema.Kind.REGISTER]
        assert reg["rank"].tolist() == ([1] if named else [1, 2])
        assert c.records == len(rows)
