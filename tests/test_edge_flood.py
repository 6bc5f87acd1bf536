"""Issue 41: the master and the agent stay within their byte budgets whatever a sender floods them
with. Real `c4d master` / `c4d agent` processes on loopback, a real flooding process
(tests/flood.py); memory is the process's peak resident set (VmHWM in /proc), sampled until
the flood ends.

Measured figures are in docs/untrusted-input.md; the bounds asserted here leave room for a
loaded machine (the 8-connection flood peaked at 369 MiB, where it reached 3.7 GiB in 4 s; 64
connections reached 1,042 MiB with a 4 MiB message limit, 262 MiB now).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from c4d.record import schema, wire
from tests import flood
from tests.conftest import c4d_cmd, free_port, metrics_text, wait_for

ROOT = Path(__file__).resolve().parents[1]


class Proc:
    """A c4d command as a process of its own, its stderr in a file."""

    def __init__(self, tmp: Path, name: str, *args: object, env: dict[str, str] | None = None):
        self.err_path = tmp / f"{name}.err"
        self._err = open(self.err_path, "w")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            c4d_cmd(*args), stdout=subprocess.DEVNULL, stderr=self._err, env=env or dict(os.environ)
        )
        wait_for(
            lambda: "listening on" in self.stderr() or self.proc.poll() is not None, 120, f"{name} to listen"
        )
        assert self.proc.poll() is None, self.stderr()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def rss(self) -> tuple[float, float]:
        return flood.rss_of(self.proc.pid)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._err.close()


def _flood(
    kind: str, endpoint: str, seconds: float, *args: object, watch: list[Proc]
) -> tuple[dict, list[float]]:
    """Run a flood; the peak RSS (MiB) of each watched process while it lasts and just after."""
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.flood", kind, endpoint, str(seconds), *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    peak = [0.0] * len(watch)

    def done() -> bool:
        for i, w in enumerate(watch):
            assert w.proc.poll() is None, w.stderr()[-2000:]
            peak[i] = max(peak[i], w.rss()[1])
        return p.poll() is not None

    wait_for(done, seconds + 60, f"the {kind} flood to end", interval=0.2)
    out, _ = p.communicate()
    return json.loads(out.strip().splitlines()[-1]), peak


def _counter(port: int, name: str, reason: str) -> float:
    text = metrics_text(port, name) or ""
    for line in text.splitlines():
        if line.startswith(f'{name}_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.slow
def test_a_flood_of_large_batches_from_an_unregistered_rank_stays_within_the_masters_budget(tmp_path):
    """8 connections sending the largest batches the master takes, of well-formed OP records of a
    rank that never registered: the master read them at its own pace, refused them all, and its memory stayed
    bounded (it was 47 MB -> 6.6 GB in 20 s)."""
    port, metrics = free_port(), free_port()
    ep = f"tcp://127.0.0.1:{port}"
    m = Proc(tmp_path, "master", "master", "--bind", ep, "--metrics-port", metrics)
    try:
        sent, (peak,) = _flood("ops", ep, 10, 8, watch=[m])
        refused = wait_for(
            lambda: _counter(metrics, "c4d_records_rejected", "no registration yet"), 30, "counted"
        )
    finally:
        assert m.stop() == 0
    assert sent["bytes"] > 256 << 20, sent  # far more than the budget was offered
    assert refused >= flood.BIG
    assert peak < 512, peak  # MiB: budget 64 MiB a poll + 8 x 3 x 128 KiB queued + the engine's own
    assert m.stderr().count("no registration yet") <= 2  # one line a minute


def test_many_connections_flooding_stay_within_the_masters_queue_budget(tmp_path):
    """96 connections sending the largest batches the master takes: libzmq holds a queue and the
    message being read per connection, so the master's memory grew with the connections (12 MiB
    each: 1,042 MiB at 64); now a connection holds 3 x 128 KiB at most."""
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    m = Proc(tmp_path, "master", "master", "--bind", ep)
    try:
        sent, (peak,) = _flood("ops", ep, 8, 96, watch=[m])
    finally:
        assert m.stop() == 0
    assert sent["bytes"] > 128 << 20, sent
    assert peak < 512, peak  # MiB: 96 x 3 x 128 KiB queued + a 64 MiB poll + the master's own


def test_connections_over_the_budget_are_shut_and_come_back_when_there_is_room(tmp_path):
    """With room for 4 connections (C4D_RECV_QUEUED_BYTES over what one may hold), 12 senders: the
    collector shuts the newest beyond 4 as they come (counted), each sender's ZeroMQ reconnects,
    and once the first 4 have gone the others get in and are heard. A message a sender wrote
    before its connection was shut is lost with it, so each sender repeats its REGISTER until
    heard, as the shim does (every 10th heartbeat)."""
    import zmq

    from c4d.master.collector import Collector, Intake

    c = Collector(f"ipc://{tmp_path}/m.sock", intake=Intake(queued_bytes=4 * Intake().held_per_sender()))
    assert c.intake.connections == 4
    ctx = zmq.Context()
    socks = []
    try:
        for rank in range(12):
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RECONNECT_IVL, 50)
            s.connect(c.endpoint)
            s.send(wire.encode(flood.register(rank, 16, time.time_ns()).view(schema.HEADER), rank))
            socks.append(s)
        got: set[int] = set()
        left: set[int] = set()
        again = time.monotonic() + 0.5

        def heard(n: int) -> bool:
            nonlocal again
            for raw in c.poll(0.05):
                got.update(raw["rank"].tolist())
            assert c.connections <= 4
            if time.monotonic() >= again:  # the shim's REGISTER repeats
                again = time.monotonic() + 0.5
                for rank in set(range(12)) - got - left:
                    reg = flood.register(rank, 16, time.time_ns()).view(schema.HEADER)
                    with contextlib.suppress(zmq.Again):
                        socks[rank].send(wire.encode(reg, rank), zmq.NOBLOCK)
            return len(got) >= n

        wait_for(lambda: heard(4) and c.refused_connections >= 8, 30, "the newest shut, the first heard")
        for r in sorted(got):  # those heard leave: room for the others
            socks[r].close(linger=0)
            left.add(r)
        wait_for(lambda: heard(12), 60, "every sender to get in and deliver")
    finally:
        for s in socks:
            s.close(linger=0)
        ctx.term()
        c.close()
    assert c.bad_reasons["too many connections"] == c.refused_connections >= 8


@pytest.mark.slow
def test_a_sender_without_the_curve_key_costs_the_master_nothing(tmp_path):
    from c4d.master import curve

    if not curve.available():
        pytest.skip("this libzmq has no CURVE")
    keys = tmp_path / "keys"
    curve.generate(keys)
    ep = f"tcp://127.0.0.1:{free_port()}"
    m = Proc(tmp_path, "master", "master", "--bind", ep, "--curve", keys)
    try:
        base = m.rss()[0]
        _sent, (peak,) = _flood("ops", ep, 5, 8, watch=[m])
    finally:
        assert m.stop() == 0
    assert peak < base + 64, (base, peak)
    assert "refused a connection" in m.stderr()


@pytest.mark.slow
def test_a_forged_world_and_new_communicators_stay_within_the_agents_budget(tmp_path):
    """One REGISTER claiming a world of 131,072 ranks, then 4,000 new communicators a message,
    at a node agent: the agent's tables stay within C4D_AGENT_COMM_BYTES and the edge's
    budget, and the master behind it is untouched (the agent was 46 MB -> 3.95 GB in 36 s)."""
    mep, aep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    m = Proc(tmp_path, "master", "master", "--bind", mep)
    a = Proc(tmp_path, "agent", "agent", "--master", mep, "--bind", aep, "--log-level", "debug")
    try:
        sent, (peak_a, peak_m) = _flood("comms", aep, 15, watch=[a, m])
    finally:
        assert a.stop() == 0
        assert m.stop() == 0
    assert sent["communicators"] >= 20_000, sent
    assert peak_a < 512, peak_a
    assert peak_m < 512, peak_m


@pytest.mark.slow
def test_a_flood_of_new_communicators_stays_within_the_masters_byte_budget(tmp_path):
    """A REGISTER claiming a world of 131,072 ranks (the job's first), then 4,000 new communicators
    a message, straight at the master: its communicator tables stop at C4D_MAX_COMM_BYTES (here
    64 MiB), the rest refused and counted (the member cap alone let 124,000 take 810 MiB)."""
    port, metrics = free_port(), free_port()
    ep = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "C4D_MAX_COMM_BYTES": str(64 << 20)}
    m = Proc(tmp_path, "master", "master", "--bind", ep, "--metrics-port", metrics, env=env)
    try:
        base = m.rss()[0]
        sent, (peak,) = _flood("comms", ep, 10, watch=[m])
        refused = wait_for(
            lambda: _counter(metrics, "c4d_records_rejected", "communicator bytes"), 30, "counted"
        )
    finally:
        assert m.stop() == 0
    assert sent["communicators"] >= 8_000, sent  # offered: far more than the budget's ~1,800
    assert refused >= 2 * flood.BIG, (refused, sent)  # (what arrived: the master reads at its pace)
    assert peak < base + 64 + 160, (base, peak)  # MiB: the budget + one message's passage


@pytest.mark.slow
def test_op_rings_a_sender_forces_stay_within_the_masters_ring_budget(tmp_path):
    """A REGISTER claiming a world of 131,072 ranks (the job's first), then communicators of 1,024
    members with ops two members report, spread over each op ring: every ring was made and
    written (26 MiB each, 6.5 GiB for the 256 the edge admits: 2.5 GiB in 9.5 s, still rising);
    now the rings stop at C4D_MAX_RING_BYTES (512 MiB by default) and the master under 1 GiB."""
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    m = Proc(tmp_path, "master", "master", "--bind", ep)
    try:
        sent, (peak,) = _flood("rings", ep, 20, watch=[m])
        wait_for(lambda: "ring budget" in m.stderr(), 60, "the ring budget to fill")
        peak = max(peak, m.rss()[1])
    finally:
        assert m.stop() == 0
    assert sent["communicators"] >= 40, sent  # offered: more rings than the budget holds (20)
    assert peak < 1024, peak  # MiB: 512 of rings + the tables of 256 communicators + the master
    assert m.stderr().count("ring budget") <= 2  # one line a minute


def test_the_agent_forgets_communicators_its_ranks_stopped_using(tmp_path, monkeypatch):
    """Not only on destroy: communicators no record named for C4D_AGENT_COMM_IDLE_S are freed
    from the edge and the summariser alike (a live one is named by every heartbeat)."""
    from c4d.agent.agent import Agent, AgentConfig

    monkeypatch.setenv("C4D_AGENT_COMM_IDLE_S", "1")
    pull = zmq.Context.instance().socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    a = Agent(
        AgentConfig(
            master=f"tcp://127.0.0.1:{port}",
            bind=f"ipc://{tmp_path}/a.sock",
            job="J",
            flush_s=0.05,
            master_status=None,
        )
    )
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.METADATA, b"X-C4D-Job:J")
    push.connect(a.endpoint)
    try:
        t = time.time_ns()
        push.send(wire.encode(flood.register(0, 8, t, job=b"J").view(schema.HEADER), 0))
        ops = flood.new_comm_ops(0, 0x7000_0000, 500, t).view(schema.HEADER)
        for part in np.array_split(ops, 2):  # in messages a shim sends (at most 255 records)
            push.send(wire.encode(part, 0))
        s = a.summary
        wait_for(lambda: (a.step(0.05), len(s.size) == 500)[1], 30, "the 500 communicators to be summarised")
        assert len(s.comms) == 500 and s.comm_bytes > 0 and len(a.edge.comms) == 500
        wait_for(lambda: (a.step(0.05), not s.size)[1], 30, "the idle communicators to be forgotten")
        assert not s.comms and not s.members and s.comm_bytes == 0 and not a.edge.comms
        assert not s.heartbeats.slot
    finally:
        push.close(linger=0)
        a.close()
        pull.close(linger=0)


def test_an_agent_with_a_full_summariser_forwards_the_rest_as_it_came():
    """Past C4D_AGENT_COMM_BYTES a new node-local communicator is not summarised: its ops go to
    the master as they came (the master reduces them), so nothing is lost to the budget."""
    from c4d.agent.summary import Summariser
    from c4d.intake.validate import Edge

    t = time.time_ns()
    s = Summariser(max_comm_bytes=1 << 20)
    e = Edge()
    raw = np.concatenate([flood.register(0, 8, t).view(schema.HEADER),
                          flood.new_comm_ops(0, 0x7000_0000, 200, t).view(schema.HEADER)])  # fmt: skip
    out = s.feed(e.admit(raw, t))
    summarised = int((out["kind"] == schema.Kind.OPSUM).sum())
    raw_ops = int((out["kind"] == schema.Kind.OP).sum())
    assert 0 < summarised < 200 and summarised + raw_ops == 200
    assert s.comm_bytes <= (1 << 20) + max(s._cost.values())


def test_a_connection_whose_end_the_monitor_never_reported_does_not_hold_a_place(tmp_path):
    """The socket monitor's queue is bounded: a busy master can lose a DISCONNECTED event. The
    connection's descriptor stays in the count, its number soon another file's (here: four open
    files' descriptors put there by hand, the one stand-in, for events libzmq dropped), and with
    room for 4 every new sender would be shut for good. Over the budget, the collector forgets
    descriptors that are no longer its connections first."""
    import zmq

    from c4d.master.collector import Collector, Intake

    c = Collector(f"ipc://{tmp_path}/m.sock", intake=Intake(queued_bytes=4 * Intake().held_per_sender()))
    ghosts = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_RDWR) for i in range(4)]
    c._live.update(dict.fromkeys(ghosts))
    ctx = zmq.Context()
    try:
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(c.endpoint)
        s.send(wire.encode(flood.register(7, 16, time.time_ns()).view(schema.HEADER), 7))
        got: set[int] = set()

        def heard() -> bool:
            for raw in c.poll(0.05):
                got.update(raw["rank"].tolist())
            return 7 in got

        wait_for(heard, 30, "the new sender heard")
        assert c.refused_connections == 0 and c.connections == 1
    finally:
        ctx.destroy(linger=0)
        c.close()
        for fd in ghosts:
            os.close(fd)
