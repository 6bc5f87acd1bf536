"""Issue 41: what a sender makes the engine hold beyond a communicator's tables is bounded in
bytes for the whole job: op rings (C4D_MAX_RING_BYTES) and PEER rows (C4D_MAX_PEER_BYTES).
Through the ingest path the master drives (Edge + Ingest + the real engine); memory is what
tracemalloc sees (Python objects and numpy buffers, resident or not)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from c4d.engine import Engine, EngineConfig
from c4d.engine.comm import Comm
from c4d.engine.pool import RING_CELL_BYTES
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge
from c4d.record import schema
from c4d.record.schema import Kind
from tests import flood
from tests import hostile as H

MIB = 1 << 20


def _forged_world(t: int) -> tuple[Engine, Ingest]:
    """A master whose first REGISTER claimed a world of 131,072 ranks (a forged one)."""
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge())
    assert ing.feed(flood.register(0, 1 << 17, t).view(schema.HEADER), t)
    return eng, ing


def _ring_flood(ing: Ingest, t: int, comms: int, members: int = 1024) -> int:
    """Ops only two members of each communicator report, spread over its ring (tests/flood.py);
    the rows fed."""
    w = Comm.slots(members)
    per = max(1, 2 * w // flood.BIG)
    for k in range(comms * per):
        ing.feed(flood.ring_ops(0x5000_0000, members, t, k).view(schema.HEADER), t)
    ing.tick(t)
    return comms * per * flood.BIG


def test_op_rings_a_sender_forces_stay_within_the_ring_budget(monkeypatch):
    """24 communicators of 1,024 members whose ops never complete: 24 rings of 25 MiB (600 MiB,
    and 6.5 GiB for the 256 the edge admits) before; now at most the budget, the rows past it
    counted, the least recently used rings let go first."""
    monkeypatch.setenv("C4D_MAX_RING_BYTES", "64M")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    with H.traced_growth() as grew:
        _ring_flood(ing, t, 24)
    pool = eng._pool
    ring = Comm.slots(1024) * 1024 * RING_CELL_BYTES
    assert pool.budget["ring"] == 64 * MIB
    assert pool.held["ring"] <= 64 * MIB
    assert pool.held["ring"] == ring * sum(c._ring is not None for c in eng.comms.values())
    assert pool.evicted["ring"] >= 24 - 64 * MIB // ring
    assert sum(c.incomplete for c in eng.comms.values()) > 0  # the let-go rings' open ops counted
    assert grew["mib"] < 64 + 64, grew  # the budget + the 24 communicators' tables (~21 MiB)


def test_the_jobs_own_ring_is_made_after_a_flood_filled_the_budget(monkeypatch):
    """The forged rings are the least recently used once the flood stops: the job's communicator
    gets its ring, and its op, reported in two pieces, completes."""
    monkeypatch.setenv("C4D_MAX_RING_BYTES", "64M")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    _ring_flood(ing, t, 8)
    assert eng._pool.held["ring"] > 64 * MIB - Comm.slots(1024) * 1024 * RING_CELL_BYTES
    cid, n = 0xC0FFEE, 8
    ing.feed(H.as_header(H.comm_init(range(n), cid, n, t)), t)
    ops = H.allreduces(n, [0], t, cid=cid)
    ing.feed(H.as_header(ops[:3]), t)
    ing.tick(t)  # the op spans two chunks: its rows go through the ring
    ing.feed(H.as_header(ops[3:]), t)
    ing.tick(t)
    c = eng.comms[eng._comm_index[cid]]
    assert c._ring is not None
    assert sum(len(p) for p in c.kept()) == 1  # the op completed
    assert eng._pool.dropped["ring bytes"] == 0


def test_rows_past_a_full_ring_budget_are_dropped_and_counted(monkeypatch):
    """A budget smaller than one ring: nothing is made, the rows are counted, nothing raises."""
    monkeypatch.setenv("C4D_MAX_RING_BYTES", "1M")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    fed = _ring_flood(ing, t, 2)
    assert eng._pool.held["ring"] == 0
    assert all(c._ring is None for c in eng.comms.values())
    assert eng._pool.dropped["ring bytes"] == fed
    assert ing.failures == {}


def _peers(rank: int, cid: int, n: int, t: int) -> np.ndarray:
    p = np.zeros(n, schema.PEER)
    p["kind"], p["version"], p["rank"], p["time_ns"] = Kind.PEER, schema.SCHEMA_VERSION, rank, t
    p["comm_id"], p["comm_rank"], p["peer"] = cid, 0, 0
    p["first_ns"], p["last_ns"] = t - 1000, t
    return p


@pytest.mark.slow
def test_peer_rows_of_many_communicators_stay_within_the_peer_budget(monkeypatch):
    """200 one-member communicators, each sent the 4,096 PEER rows a communicator keeps: 100 MiB
    before (14,000 such communicators fit the table budget: 7 GiB); now the budget, the
    communicators that sent none for longest let theirs go first."""
    monkeypatch.setenv("C4D_MAX_PEER_BYTES", "8M")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    with H.traced_growth() as grew:
        for k in range(200):
            ing.feed(flood.new_comm_ops(0, 0x100 + k, 1, t).view(schema.HEADER), t)
            rows = _peers(0, 0x100 + k, 4096, t)
            for i in range(0, 4096, 1023):
                ing.feed(rows[i : i + 1023].view(schema.HEADER), t)
        ing.tick(t)
    pool = eng._pool
    held = sum(sum(p.nbytes for p in c.peer_rows) for c in eng.comms.values())
    assert pool.held["peer"] == held <= 8 * MIB
    assert pool.evicted["peer"] > 0 and pool.dropped["peer bytes"] > 0
    last = eng.comms[eng._comm_index[0x100 + 199]]
    assert last.peer_n == 4096  # the latest sender's rows are all kept
    assert grew["mib"] < 8 + 48, grew


@pytest.mark.parametrize("value", ["lots", "-5", "0"])
def test_a_malformed_budget_is_one_line_and_the_default(monkeypatch, caplog, value):
    monkeypatch.setenv("C4D_MAX_RING_BYTES", value)
    eng = Engine(EngineConfig())
    assert eng._pool.budget["ring"] == 512 * MIB
    assert sum("C4D_MAX_RING_BYTES" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.slow
def test_communicators_of_ever_new_sizes_made_and_freed_do_not_grow_the_pool():
    """A freed communicator's ranges of the pool go to the next one of its size only: 200
    communicators of each new size, made and freed, grew the pool by 200 rings' tags each
    (without bound); now the pool is compacted, and the job's own communicator, alive throughout,
    keeps its state and completes its ops."""
    t = H.now_ns()
    eng, ing = _forged_world(t)
    cid, n = 0xC0FFEE, 8
    ing.feed(H.as_header(H.comm_init(range(n), cid, n, t), H.allreduces(n, [0], t, cid=cid)), t)
    ing.tick(t)
    job = eng.comms[eng._comm_index[cid]]
    for size in range(2, 42):
        ids = 0x9000_0000 + size * 1000 + np.arange(200)
        a = flood.big_ops(0, t, 200)
        a["comm_id"], a["comm_rank"], a["comm_nranks"], a["seq"] = ids, 0, size, 0
        ing.feed(a.view(schema.HEADER), t)
        ing.tick(t)
        assert eng.free_comms(ids.tolist()) == 200
    pool = eng._pool
    slots = 201 * Comm.slots(2)
    assert len(pool.slot["tag"]) <= 4 * slots, len(pool.slot["tag"])  # was 40 x 200 rings' tags
    assert pool.s_used <= 2 * slots
    assert list(job.grank) == list(range(n)) and int(job.op_done.min()) == 1
    ing.feed(H.as_header(H.allreduces(n, [1], t, cid=cid)), t)
    ing.tick(t)
    assert sum(len(p) for p in job.kept()) == 2 and int(job.op_done.min()) == 2


def test_p2p_completion_counters_a_sender_names_stay_within_their_budget(monkeypatch):
    """A communicator of 65,536 members and sends between new pairs of them: 16 bytes kept for
    each pair named, without bound; now at most C4D_MAX_P2P_BYTES, the rest counted."""
    monkeypatch.setenv("C4D_MAX_P2P_BYTES", "1M")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    n = 1 << 16
    sent = 0
    for k in range(0, 200_000, flood.BIG):
        a = flood.big_ops(0, t, flood.BIG)
        i = np.arange(k, k + flood.BIG)
        a["op"], a["flags"], a["comm_nranks"] = int(schema.Op.Send), int(schema.OpFlag.P2P), n
        a["comm_rank"] = a["rank"] = i % n
        a["peer"], a["seq"] = (i // n + 1 + i % n) % n, 0
        ing.feed(a.view(schema.HEADER), t)
        sent += len(a)
    ing.tick(t)
    p2p = eng._pool.p2p
    assert len(p2p.keys) == (1 << 20) // 16
    assert p2p.dropped == sent - len(p2p.keys)  # every pair distinct
    assert eng._pool.drops()["p2p bytes"] == p2p.dropped


@pytest.mark.slow
def test_completed_ops_kept_for_a_window_of_a_day_stay_within_the_kept_budget(monkeypatch):
    """The job's first REGISTER may set a slow-detection window of a day: every op completed
    was kept for the slow judge until it closed (108 bytes an op, without bound); now at most
    C4D_MAX_KEPT_BYTES, the rest counted, and what the judge frees makes room again. The
    per-window sample off (C4D_SLOW_WINDOW_OPS=0): the budget is what holds then."""
    monkeypatch.setenv("C4D_MAX_KEPT_BYTES", "4M")
    t = H.now_ns()
    eng = Engine(EngineConfig(slow_window_ops=0))
    ing = Ingest(eng, Edge())
    r = flood.register(0, 8, t)
    r["bw_check_period_s"] = 86400
    assert ing.feed(r.view(schema.HEADER), t)
    ops = 200 * flood.BIG
    with H.traced_growth() as grew:
        for k in range(0, ops, flood.BIG):
            a = flood.big_ops(0, t)
            a["comm_rank"], a["comm_nranks"], a["seq"] = 0, 1, k + np.arange(flood.BIG)
            ing.feed(a.view(schema.HEADER), t)
            ing.tick(t)  # a chunk each (within one, the op ring's 1,024 slots keep the latest)
    pool = eng._pool
    pool.recount()
    assert pool.kept <= 4 * MIB
    assert 0 < pool.dropped["kept bytes"] < ops
    assert grew["mib"] < 4 + 24, grew
    c = eng.comms[eng._comm_index[0xBAD]]
    c.pending, c.pending_gaps = [], []  # as the judge takes them when their window closes
    before = pool.dropped["kept bytes"]
    a = flood.big_ops(0, t)
    a["comm_rank"], a["comm_nranks"], a["seq"] = 0, 1, ops + np.arange(flood.BIG)
    ing.feed(a.view(schema.HEADER), t)
    ing.tick(t)
    assert pool.dropped["kept bytes"] < before + flood.BIG * 64 and sum(len(p) for p in c.pending) > 0


@pytest.mark.slow
def test_completed_ops_of_a_window_of_a_day_are_a_bounded_sample_with_the_default_cap():
    """The same flood with the per-window sample on (the default): a communicator's first
    window keeps the cap and about half of it per doubling of its sample (c4d/engine/sampling.py),
    and past the cap at most one chunk's sample before each doubling (BIG, BIG / 2, ...: 2 BIG in
    all): a few times the cap for sixty times as many ops, and the budget refuses none."""
    t = H.now_ns()
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge())
    r = flood.register(0, 8, t)
    r["bw_check_period_s"] = 86400
    assert ing.feed(r.view(schema.HEADER), t)
    cap = EngineConfig().slow_window_ops
    ops = -(-60 * cap // flood.BIG) * flood.BIG  # sixty times the cap, in the largest messages
    for k in range(0, ops, flood.BIG):
        a = flood.big_ops(0, t)
        a["comm_rank"], a["comm_nranks"], a["seq"] = 0, 1, k + np.arange(flood.BIG)
        ing.feed(a.view(schema.HEADER), t)
        ing.tick(t)
    c = eng.comms[eng._comm_index[0xBAD]]
    kept = sum(len(p) for p in c.kept())
    doublings = math.ceil(math.log2(ops / cap))
    assert ops > 50 * cap and 0 < kept <= cap * (1 + doublings / 2) + 2 * flood.BIG, (ops, kept)
    assert eng._pool.dropped["kept bytes"] == 0


def test_what_the_engine_budgets_refuse_is_counted_with_the_edges_refusals(monkeypatch):
    """c4d_records_rejected{reason} reads the edge's counts: the engine's refusals join them."""
    monkeypatch.setenv("C4D_MAX_RING_BYTES", "1M")
    t = H.now_ns()
    _eng, ing = _forged_world(t)
    fed = _ring_flood(ing, t, 1)
    assert ing.edge.rejected["ring bytes"] == fed


def test_communicators_ever_admitted_stop_at_their_budget(monkeypatch):
    """Indices are never reused, so each communicator ever admitted keeps ~60 bytes of
    index-wide arrays: past C4D_MAX_COMMS_EVER new ones are refused (counted), known ones go on."""
    monkeypatch.setenv("C4D_MAX_COMMS_EVER", "40")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    ing.feed(flood.new_comm_ops(0, 0x7000_0000, 100, t).view(schema.HEADER), t)
    ing.tick(t)
    assert len(eng.comms) == 40
    assert eng._pool.dropped["communicator indices"] >= 60
    first = eng.comms[0]
    seen = first.ops_seen
    ing.feed(flood.new_comm_ops(0, 0x7000_0000, 1, t + 1).view(schema.HEADER), t + 1)
    ing.tick(t + 1)
    assert eng.comms[0].ops_seen > seen  # a communicator admitted before the budget still heard


def test_open_ops_of_the_consistency_check_stop_at_their_budget(monkeypatch):
    """Ops one member of two reports stay open (their signatures wait for the other member's):
    past C4D_MAX_OPEN_OPS the oldest are forgotten, counted."""
    monkeypatch.setenv("C4D_MAX_OPEN_OPS", "1000")
    t = H.now_ns()
    eng, ing = _forged_world(t)
    for k in range(4):
        a = flood.big_ops(0, t, 2000)
        a["comm_id"] = 0x6000_0000 + np.arange(2000) + 2000 * k
        a["comm_rank"], a["comm_nranks"], a["seq"] = 0, 2, 0
        ing.feed(a.view(schema.HEADER), t)
        ing.tick(t)
    con = eng.consistency
    assert len(con.key) <= 1000
    assert con.stats["open ops forgotten"] >= 8000 - 1000 - 2000  # (the edge may refuse a few)
