"""Receiving in a process of its own (c4d.master.receiver, ``c4d master --receiver-process``): the
master gets what a Collector in its own process gets, counted the same; a live sim job's hang is
named through it; a dead receiver is taken over; a killed master takes its receiver along.
Real processes, real libzmq sockets, no mocks."""

from __future__ import annotations

import logging
import signal
import threading
import time

import numpy as np
import pytest
import zmq

from c4d.master.collector import Collector
from c4d.master.master import Master, MasterConfig
from c4d.master.receiver import ReceiverProcess
from c4d.record import schema, wire
from c4d.run import proctree
from tests.conftest import free_port, wait_for
from tests.masterproc import MasterProc, descendants_named, hang_named_live


def _ops(n: int, seq0: int, rank: int = 0) -> np.ndarray:
    r = np.zeros(n, schema.OP)
    r["kind"], r["version"], r["rank"] = schema.Kind.OP, schema.SCHEMA_VERSION, rank
    r["seq"] = np.arange(seq0, seq0 + n)
    return r


def _send(endpoint: str, job: str, msgs: list[bytes]) -> threading.Thread:
    """``msgs`` pushed on a connection that names ``job``, from a thread (the master's queue per
    connection is a couple of messages: the sender waits for the receiver as a real one does)."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PUSH)
    if job:  # (none: a sender that names no job, taken by a master that was not told one)
        s.setsockopt(zmq.METADATA, f"X-C4D-Job:{job}".encode())
    s.connect(endpoint)

    def go() -> None:
        for m in msgs:
            s.send(m)
        s.close(linger=-1)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _take(col, records: int, bad: int) -> list[np.ndarray]:
    got: list[np.ndarray] = []

    def done() -> bool:
        got.extend(col.poll(0.05))
        return sum(map(len, got)) >= records and col.bad_messages >= bad

    wait_for(done, 60, "the records and the refusals")
    return got


def test_a_receiving_process_hands_over_what_a_collector_takes():
    """The same messages (batches of the job served, a garbage message, a batch of another job)
    to a Collector in this process and to a receiving process: the same rows in the same order,
    the same counts by reason, the same job pinned."""
    good = [wire.encode(_ops(25, 25 * i)) for i in range(400)]
    results = []
    for make in (Collector, ReceiverProcess):
        col = make(f"tcp://127.0.0.1:{free_port()}", job="j1")
        try:
            t1 = _send(col.endpoint, "j1", [*good[:200], b"garbage", *good[200:]])
            t2 = _send(col.endpoint, "other", [wire.encode(_ops(7, 0, rank=1))])
            got = _take(col, 25 * 400, 2)
            t1.join(30), t2.join(30)
            rows = np.concatenate([g.view(schema.OP) for g in got])
            results.append(
                (rows["seq"].tolist(), col.records, col.bad_messages, dict(col.bad_reasons), col.job)
            )
            assert col.messages >= 401  # (counted as they came, whoever holds the socket)
        finally:
            col.close()
    assert results[0] == results[1]
    assert results[0][0] == list(range(25 * 400))
    assert results[0][3] == {"short message": 1, "other job": 1}


def test_a_receiving_process_that_cannot_bind_says_so():
    """An endpoint already bound: the one-line error a Collector gives, and no process left over."""
    held = Collector(f"tcp://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(OSError, match="cannot bind the master to"):
            ReceiverProcess(held.endpoint)
    finally:
        held.close()


def test_a_dead_receiving_process_is_taken_over(caplog):
    """kill -9 of the receiving process: one ERROR line, the master binds the endpoint itself and
    what the sender sends after its reconnect arrives, counted after what the receiver counted."""
    rp = ReceiverProcess(f"tcp://127.0.0.1:{free_port()}", job="j1")
    try:
        t = _send(rp.endpoint, "j1", [wire.encode(_ops(10, 0))])
        _take(rp, 10, 0)
        t.join(30)
        rp._proc.kill()
        rp._proc.wait(10)
        with caplog.at_level(logging.ERROR, logger="c4d.master.receiver"):
            rp.poll(0.6)  # the death is found (a wait checks the process every 0.5 s)
            t = _send(rp.endpoint, "j1", [wire.encode(_ops(10, 10)) for _ in range(3)])
            got = _take(rp, 30, 0)
            t.join(30)
        assert rp.local is not None and rp.pid is None
        assert rp.records == 40 and sum(map(len, got)) == 30
        assert rp.job == "j1"
    finally:
        rp.close()
    assert len([r for r in caplog.records if "receiving process" in r.getMessage()]) == 1


def test_a_master_with_a_receiving_process_drains_what_it_holds(tmp_path):
    """Master.drain asks the receiver for what it received and waits for its mark: every record
    sent before the drain reaches the edge and the trace."""
    m = Master(MasterConfig(bind=f"tcp://127.0.0.1:{free_port()}", receiver_process=True,
                            trace=str(tmp_path / "t.c4d")))  # fmt: skip
    try:
        assert isinstance(m.collector, ReceiverProcess)
        t = _send(m.endpoint, "", [wire.encode(_ops(20, 20 * i)) for i in range(50)])
        t.join(30)
        wait_for(lambda: (m.drain(0.5), m.collector.records >= 1000)[1], 60, "the records to arrive")
        assert m.collector.records == 1000 and m.collector.synced
    finally:
        m.close()
    from c4d.record import trace

    assert (trace.read_raw(tmp_path / "t.c4d").raw["kind"] == schema.Kind.OP).sum() == 1000


def test_c4d_master_receiver_process_from_the_environment(monkeypatch):
    """C4D_MASTER_RECEIVER_PROCESS=1 turns it on; 0 or unset: off."""
    monkeypatch.setenv("C4D_MASTER_RECEIVER_PROCESS", "1")
    assert MasterConfig().receiver_process is True
    monkeypatch.setenv("C4D_MASTER_RECEIVER_PROCESS", "0")
    assert MasterConfig().receiver_process is False
    monkeypatch.delenv("C4D_MASTER_RECEIVER_PROCESS")
    assert MasterConfig().receiver_process is False


@pytest.mark.slow
def test_c4d_master_receiver_process_names_a_hang_live(tmp_path, libc4d, simtrain):
    """`c4d master --receiver-process --engine-process` with a sim job whose rank 3 stops
    computing: the JSON line names rank 3, and a replay of the master's trace says the same."""
    m = MasterProc(tmp_path, "--receiver-process", "--engine-process", metrics=False)
    assert descendants_named(m.proc.pid, "c4d.master.receiver")
    live, replayed = hang_named_live(m)
    assert live and all(d["ranks"] == [3] for d in live)
    assert [d["ranks"] for d in replayed][: len(live)] == [d["ranks"] for d in live]


@pytest.mark.slow
def test_the_receiving_process_ends_with_a_killed_master(tmp_path):
    """kill -9 of `c4d master --receiver-process`: its receiving process does not outlive it."""
    m = MasterProc(tmp_path, "--receiver-process", metrics=False)
    kids = proctree.children_map().get(m.proc.pid, [])
    assert kids, "the master has a receiving process"
    m.stop(signal.SIGKILL)
    wait_for(lambda: not any(proctree.alive(k) for k in kids), 30, "the receiving process to exit")


def test_a_receiving_process_held_back_by_the_master_stops_when_asked():
    """Senders flood while the master reads nothing: the receiver waits on its queue to the
    master, and a close still ends it at once (STOP is read while it waits), not after a kill."""
    rp = ReceiverProcess(f"tcp://127.0.0.1:{free_port()}", job="j1")
    proc = rp._proc
    sent, done = [0], threading.Event()
    msg = wire.encode(_ops(500, 0))

    def flood() -> None:  # 190 MB: more than the receiver's queue to the master holds
        s = zmq.Context.instance().socket(zmq.PUSH)
        s.setsockopt(zmq.METADATA, b"X-C4D-Job:j1")
        s.setsockopt(zmq.SNDTIMEO, 100)
        s.connect(rp.endpoint)
        while sent[0] < 3000 and not done.is_set():
            try:
                s.send(msg)
                sent[0] += 1
            except zmq.Again:  # held back: until the test is over
                continue
        s.close(linger=0)

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    seen = [-1]

    def stuck() -> bool:  # the sender stopped moving: the receiver waits on the master
        was, seen[0] = seen[0], sent[0]
        return was == sent[0]

    try:
        wait_for(stuck, 60, "the flood to back up", interval=0.3)
        assert sent[0] < 3000
    finally:
        start = time.monotonic()
        rp.close()
    assert proc.returncode == 0 and time.monotonic() - start < 4.5  # (a kill comes after 5 s)
    done.set()
    t.join(10)
