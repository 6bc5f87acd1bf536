"""The node agent's flush period follows the job's size (c4d/agent/flush.py): real Agent, real
ZeroMQ sockets, the ranks' REGISTER records as the shim sends them."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from c4d.agent.agent import Agent, AgentConfig
from c4d.agent.flush import FLUSH_MIN_S, MASTER_MESSAGES_PER_S, flush_period_s
from c4d.record import schema, wire
from tests import flood
from tests.conftest import wait_for


@pytest.mark.parametrize(
    "world, local, hb_ms, want",
    [
        (64, 8, 1000, FLUSH_MIN_S),  # a small job: as fast as ever
        (8 * 1000, 8, 1000, FLUSH_MIN_S),  # 1,000 nodes: the budget exactly
        (16384, 8, 1000, 2048 / MASTER_MESSAGES_PER_S),  # 2,048 nodes: 205 ms
        (65536, 8, 1000, 8192 / MASTER_MESSAGES_PER_S),
        (16384, 8, 150, 0.15),  # within one heartbeat of the job
        (16384, 8, 20, FLUSH_MIN_S),  # a heartbeat below the least period: the least
        (1 << 30, 8, 5000, 1.0),  # never less than once a second
        (1 << 30, 8, 0, 1.0),  # no heartbeat known: the cap alone
        (16384, 0, 1000, 1.0),  # no rank on the node known: one node per rank, capped
    ],
)
def test_the_period_keeps_the_masters_messages_bounded(world, local, hb_ms, want):
    assert flush_period_s(world, local, hb_ms) == pytest.approx(want)


def _register(rank: int, world: int, local_rank: int, hb_ms: int, t: int) -> bytes:
    r = flood.register(rank, world, t, job=b"big", pid=100 + rank)
    r["local_rank"], r["heartbeat_ms"] = local_rank, hb_ms
    return wire.encode(r.view(schema.HEADER), rank)


@pytest.fixture
def agent_and_ranks(tmp_path):
    """An Agent in this process (its period its own), forwarding to a PULL socket the test
    reads; a PUSH socket standing in for the node's ranks."""
    made = []

    def make(**cfg):
        ctx = zmq.Context.instance()
        up = ctx.socket(zmq.PULL)
        port = up.bind_to_random_port("tcp://127.0.0.1")
        a = Agent(AgentConfig(master=f"tcp://127.0.0.1:{port}", bind=f"ipc://{tmp_path}/agent.sock",
                              master_status=None, job="big", **cfg))  # fmt: skip
        ranks = ctx.socket(zmq.PUSH)
        ranks.setsockopt(zmq.LINGER, 0)
        ranks.setsockopt(zmq.METADATA, b"X-C4D-Job:big")
        ranks.connect(a.endpoint)
        made.append((a, up, ranks))
        return a, up, ranks

    yield make
    for a, up, ranks in made:
        ranks.close()
        a.close()
        up.close(linger=0)


def _step_until(a: Agent, cond, what: str, timeout_s: float = 30):
    return wait_for(lambda: (a.step(0.02), cond())[1], timeout_s, what)


def test_an_agent_of_a_large_job_forwards_less_often(agent_and_ranks):
    """Its first rank's REGISTER says local rank 7 of 16,384: eight ranks a node at least,
    2,048 nodes, so 205 ms; its flushes from then on are that far apart."""
    a, up, ranks = agent_and_ranks()
    assert a.flush_s == FLUSH_MIN_S  # nothing registered yet
    t = time.time_ns()
    ranks.send(_register(7, 16384, 7, 1000, t))
    _step_until(a, lambda: a.flush_s != FLUSH_MIN_S, "the agent to size its flush")
    assert a.flush_s == pytest.approx(0.2048)
    # the node's ranks go on registering (the shim repeats REGISTER): the agent forwards what
    # arrived since its last flush at each flush, in as many messages as that takes
    flushes: list[float] = []
    deadline = time.monotonic() + 30
    while len(flushes) < 5 and time.monotonic() < deadline:
        ranks.send(_register(7, 16384, 7, 1000, time.time_ns()))
        if a.step():  # (until the next flush, or sooner when a message comes: then none)
            flushes.append(time.monotonic())
        while up.poll(0):
            up.recv()
    assert len(flushes) >= 5, "the agent forwarded less than five times in 30 s"
    gaps = np.diff(flushes)
    assert (gaps >= 0.2048 * 0.9).all(), gaps


def test_the_nodes_ranks_registered_count_when_no_local_rank_says_more(agent_and_ranks):
    a, _, ranks = agent_and_ranks()
    t = time.time_ns()
    for g in range(4):  # four ranks of a 20,000-rank job, each saying local rank 0: 5,000 nodes
        ranks.send(_register(g, 20000, 0, 2000, t))
    _step_until(a, lambda: a.stats["forwarded"] >= 4, "the agent to take four registrations")
    assert a.flush_s == pytest.approx(0.5)


def test_a_period_given_stays(agent_and_ranks):
    a, _, ranks = agent_and_ranks(flush_s=0.05)
    ranks.send(_register(7, 16384, 7, 1000, time.time_ns()))
    _step_until(a, lambda: a.stats["forwarded"] >= 1, "the agent to forward the registration")
    assert a.flush_s == 0.05


def test_what_waits_for_a_flush_is_bounded_in_bytes(agent_and_ranks):
    """A flood does not wait for the period (a forged REGISTER can lengthen it to its cap):
    past FLUSH_BYTES the agent summarises and forwards at once. Here the period is 30 s and
    the node's ranks send 5 MiB: forwarded well before it."""
    from c4d.agent.agent import MAX_BATCH
    from c4d.agent.flush import FLUSH_BYTES

    a, _, ranks = agent_and_ranks(flush_s=60.0)
    t = time.time_ns()
    one = np.frombuffer(wire.decode(_register(3, 64, 3, 1000, t)).tobytes(), schema.HEADER)
    batch = wire.encode(np.repeat(one, MAX_BATCH), 3)  # the shim's REGISTER repeats, a batch's worth
    n = -(-(FLUSH_BYTES + (1 << 20)) // (MAX_BATCH * schema.RECORD_SIZE))
    for _ in range(n):
        ranks.send(batch)
    _step_until(a, lambda: a.stats["forwarded"] >= 1, "the agent to forward before its period", 30)
    assert a.flush_s == 60.0
