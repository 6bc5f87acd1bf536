"""The master's byte budgets grow with the job its ranks registered (each rank counted once),
never with what a record claims: the edge's communicator members and tables
(C4D_MAX_COMM_MEMBERS, C4D_MAX_COMM_BYTES: Limits.comm_members, comm_bytes) and the engine's
op rings and rows kept for the slow judge (C4D_MAX_RING_BYTES, C4D_MAX_KEPT_BYTES: Pool.fit).
A value set in the environment stays as set. At 65,536 ranks the fixed defaults refused half a
TP 8 x PP 4 job's communicators and let its data-parallel groups' rings go; the grown ones
hold them all. Through the edge's and the engine's real paths (Edge.admit, Ingest)."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from c4d.engine import Engine, EngineConfig
from c4d.engine.comm import Comm
from c4d.engine.pool import BUDGETS, KEPT_BUDGET, PER_RANK, RING_CELL_BYTES, Pool
from c4d.engine.shards import ShardedEngine
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.record import schema
from c4d.record.schema import Kind
from tests import flood
from tests import hostile as H

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
BIG = 65536  # ranks of the large job
RING_FLOOR, KEPT_FLOOR = BUDGETS["ring"][1], KEPT_BUDGET[1]
OLD = Limits(max_comm_bytes=512 * MIB, max_comm_members=1 << 18)  # the fixed defaults before


def _master(limits: Limits | None = None, engine=None) -> tuple[Engine, Ingest]:
    eng = engine if engine is not None else Engine(EngineConfig())
    return eng, Ingest(eng, Edge(limits or Limits()))


def _registered(ing: Ingest, world: int, t: int) -> None:
    """Every rank of a ``world``-rank job registers (in batches as large as the edge likes)."""
    reg = H.registers(world, t)
    for i in range(0, world, 16384):
        assert ing.feed(H.as_header(reg[i : i + 16384]), t)
    ing.tick(t)


def _layout(tp: int, pp: int, world: int) -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    """Megatron's groups (analysis/master_load.py): per group kind, each rank's communicator id
    and comm rank, and the group's size."""
    g = np.arange(world)
    t, p, d = g % tp, (g // tp) % pp, g // (tp * pp)
    dp = world // (tp * pp)
    return [
        ("tp", (1 << 40) | (g // tp), t, tp),
        ("dp", (2 << 40) | (p * tp + t), d, dp),
        ("pp", (3 << 40) | (d * tp + t), p, pp),
    ]


def _comm_init(ranks: np.ndarray, cid: np.ndarray, cr: np.ndarray, n: int, t: int) -> np.ndarray:
    a = np.zeros(len(ranks), schema.COMM)
    a["kind"], a["version"], a["rank"], a["time_ns"] = Kind.COMM, schema.SCHEMA_VERSION, ranks, t
    a["comm_id"], a["comm_rank"], a["comm_nranks"] = cid, cr, n
    a["color"] = a["key"] = -1
    a["event"] = schema.CommEvent.INIT_RANK
    return a.view(schema.HEADER)


def _allreduce(ranks: np.ndarray, cid: np.ndarray, cr: np.ndarray, n: int, t: int) -> np.ndarray:
    """Seq 0 of an all-reduce of each member ``ranks`` (tests/hostile.py's allreduces)."""
    a = np.zeros(len(ranks), schema.OP)
    a["kind"], a["version"], a["rank"], a["time_ns"] = Kind.OP, schema.SCHEMA_VERSION, ranks, t
    a["comm_id"], a["comm_rank"], a["comm_nranks"], a["seq"] = cid, cr, n, 0
    a["issue_ns"] = t - 10_000_000
    a["start_ns"] = a["issue_ns"] + 1000 + cr * 100
    a["end_ns"] = a["issue_ns"] + 500_000
    a["return_ns"] = a["issue_ns"] + 2000
    a["count"], a["bytes"], a["dtype"], a["peer"] = 1024, 4096, 7, -1
    a["flags"] = schema.OpFlag.DEVICE_TIMING
    return a.view(schema.HEADER)


def _ring_bytes(n: int) -> int:
    return Comm.slots(n) * n * RING_CELL_BYTES


# -- the budgets grow with the ranks registered ------------------------------------------
def test_budgets_grow_with_the_distinct_ranks_registered():
    t = H.now_ns()
    eng, ing = _master()
    lim, pool = ing.edge.limits, eng._pool
    _registered(ing, 8192, t)  # (a world of 8,192 claimed, then of 65,536: a new job)
    assert ing.edge.registered == eng.ranks.registered == 8192
    # the floors still: 64 KiB x 8,192 is the ring floor, 32 KiB x 8,192 half the tables'
    assert pool.budget["ring"] == RING_FLOOR and pool.kept_budget == KEPT_FLOOR
    assert lim.comm_bytes(ing.edge.registered) == 512 * MIB
    assert lim.comm_members(ing.edge.registered) == 1 << 18

    eng, ing = _master()
    lim, pool = ing.edge.limits, eng._pool
    _registered(ing, BIG, t)
    assert ing.edge.registered == eng.ranks.registered == BIG
    assert pool.budget["ring"] == PER_RANK["ring"] * BIG == 4 * GIB
    assert pool.kept_budget == PER_RANK["kept"] * BIG == 4 * GIB
    assert pool.budget["peer"] == BUDGETS["peer"][1]  # (not one that grows)
    assert lim.comm_bytes(ing.edge.registered) == 2 * GIB
    assert lim.comm_members(ing.edge.registered) == 16 * BIG


def test_a_re_register_or_a_claimed_world_size_grows_nothing():
    """Rank 0 claims a world of C4D_MAX_RANKS (the first REGISTER: taken), ranks register again
    and again (a shim repeats it every 10 heartbeats), a new incarnation of a rank registers, a
    forged REGISTER of a registered rank is refused: 4 ranks registered, the budgets their floors."""
    t = H.now_ns()
    eng, ing = _master()
    world = 1 << 17
    assert ing.feed(flood.register(0, world, t).view(schema.HEADER), t)
    ing.tick(t)
    assert ing.edge.world == world and ing.edge.registered == eng.ranks.registered == 1
    regs = np.concatenate([flood.register(r, world, t, pid=4242 + r) for r in range(4)])
    for _ in range(3):
        assert ing.feed(regs.view(schema.HEADER), t) == 4
        ing.tick(t)
    later = t + 4_000_000_000  # three heartbeat periods silent: a new pid on its node is a new incarnation
    assert ing.feed(flood.register(1, world, later, pid=7777).view(schema.HEADER), later) == 1
    forged = flood.register(2, world, later, node=b"victim-node", pid=2)
    assert ing.feed(forged.view(schema.HEADER), later) == 0
    ing.tick(later)
    assert ing.edge.rejected == {"rank identity changed": 1}
    assert int(eng.ranks.pid[1]) == 7777
    assert ing.edge.registered == eng.ranks.registered == 4
    pool, lim = eng._pool, ing.edge.limits
    assert pool.budget["ring"] == RING_FLOOR and pool.kept_budget == KEPT_FLOOR
    assert lim.comm_bytes(4) == 512 * MIB and lim.comm_members(4) == 1 << 18


def test_the_ranks_registered_count_from_their_row_whatever_the_batches():
    """The edge's decisions do not depend on how rows are cut into batches: a communicator
    counts the ranks registered by its row, not by its batch's end. Rank 0 claims 131,072
    ranks; 6 communicators of 65,536 members (4 fit 2^18 members), then 65,535 more ranks
    register (the budget is 16 x 65,536 = 16 such communicators), then 14 more communicators."""
    t = H.now_ns()
    world, n = 1 << 17, BIG
    first = flood.register(0, world, t, pid=1000).view(schema.HEADER)
    reg = H.registers(BIG, t)
    reg["world_size"], reg["heartbeat_ms"] = world, 1000  # (flood.register's settings)
    cid = np.arange(20, dtype=np.uint64) + 0x7000
    comms = _comm_init(np.zeros(20, np.int64), cid, np.zeros(20, np.int64), n, t)
    rows = np.concatenate([first, comms[:6], H.as_header(reg[1:]), comms[6:]])

    whole = Edge()
    kept_whole = whole.admit(rows, t)
    assert whole.registered == BIG
    assert sorted(whole.comms) == cid[:4].tolist() + cid[6:18].tolist()
    assert whole.rejected == {"communicator budget": 2 + 2}

    cut = Edge()
    edges = [0, 1, 3, 7, 8, 1000, 40000, len(rows) - 5, len(rows) - 1, len(rows)]
    kept_cut = np.concatenate([cut.admit(rows[a:b], t) for a, b in itertools.pairwise(edges)])
    assert sorted(cut.comms) == sorted(whole.comms) and cut.rejected == whole.rejected
    assert (kept_cut.view(np.uint8) == kept_whole.view(np.uint8)).all()


# -- set in the environment: the operator's word -------------------------------------------
def test_budgets_set_in_the_environment_stay_as_set(monkeypatch, caplog):
    for var, v in (("C4D_MAX_RING_BYTES", "256M"), ("C4D_MAX_KEPT_BYTES", "1G"),
                   ("C4D_MAX_COMM_BYTES", str(128 * MIB)), ("C4D_MAX_COMM_MEMBERS", "100000")):  # fmt: skip
        monkeypatch.setenv(var, v)
    t = H.now_ns()
    eng, ing = _master(Limits.from_env())
    _registered(ing, BIG, t)
    assert eng.ranks.registered == BIG
    assert eng._pool.budget["ring"] == 256 * MIB and eng._pool.kept_budget == GIB
    lim = ing.edge.limits
    assert lim.comm_bytes(BIG) == 128 * MIB and lim.comm_members(BIG) == 100000
    # and refused where they say: a communicator past 100,000 members' worth
    big = _comm_init(np.arange(2), np.array([0x9000, 0x9001], np.uint64), np.zeros(2, np.int64), BIG, t)
    with caplog.at_level(logging.WARNING, logger="c4d"):
        ing.feed(big, t)
    assert ing.edge.rejected == {"communicator budget": 1}
    # the line says which setting an operator whose own job it is would raise
    assert any("communicator budget" in r.getMessage() and "C4D_MAX_COMM_MEMBERS" in r.getMessage()
               for r in caplog.records)  # fmt: skip


@pytest.mark.parametrize("var", ["C4D_MAX_RING_BYTES", "C4D_MAX_KEPT_BYTES", "C4D_MAX_COMM_BYTES",
                                 "C4D_MAX_COMM_MEMBERS"])  # fmt: skip
def test_a_malformed_budget_is_one_line_and_grows_as_the_default(monkeypatch, caplog, var):
    monkeypatch.setenv(var, "lots")
    pool, lim = Pool(), Limits.from_env()
    assert sum(var in r.getMessage() for r in caplog.records) == 1
    pool.fit(BIG)
    assert pool.budget["ring"] == pool.kept_budget == 4 * GIB
    assert lim.comm_bytes(BIG) == 2 * GIB and lim.comm_members(BIG) == 16 * BIG


# -- a 65,536-rank job -------------------------------------------------------------------
@pytest.mark.parametrize("pp", [4, 8])
def test_a_65536_rank_jobs_communicators_are_all_admitted(pp):
    """TP 8, PP 4 or 8, DP groups of 2,048 or 1,024 members: every rank's REGISTER, then every
    member's COMM init, through the edge. The fixed defaults (512 MiB of tables) refused most
    of the pipeline groups (what the master then dropped summaries of); now all are admitted."""
    t = H.now_ns()
    rows = [H.as_header(H.registers(BIG, t))]
    offered = 0
    for _kind, cid, cr, n in _layout(8, pp, BIG):
        rows.append(_comm_init(np.arange(BIG), cid, cr, n, t))
        offered += BIG // n
    raw = np.concatenate(rows)
    got = {}
    for name, lim in (("old", OLD), ("grown", Limits())):
        edge = Edge(lim)
        for i in range(0, len(raw), BIG):
            edge.admit(raw[i : i + BIG], t)
        assert edge.registered == BIG
        got[name] = (len(edge.comms), dict(edge.rejected), edge.comm_bytes)
    old, grown = got["old"], got["grown"]
    assert old[0] < offered and old[1].get("communicator bytes", 0) > 0  # the test can fail
    assert grown[0] == offered and grown[1] == {}
    assert 512 * MIB < grown[2] <= Limits().comm_bytes(BIG)  # (pp 4: 1,015 MiB; pp 8: 728 MiB)


def _rings(layout, kinds: tuple[str, ...], eng: Engine, ing: Ingest, t: int) -> tuple[int, int]:
    """Each group of ``kinds`` initialised, then seq 0 of an all-reduce of each in two halves
    around a tick: the op spans two chunks, so each group's ring is made. Returns the groups
    and their rings' bytes."""
    g = np.arange(BIG)
    groups = [x for x in layout if x[0] in kinds]
    for _kind, cid, cr, n in groups:
        ing.feed(_comm_init(g, cid, cr, n, t), t)
    ing.tick(t)
    for half in (0, 1):
        for _kind, cid, cr, n in groups:
            m = (cr < n // 2) if half == 0 else (cr >= n // 2)
            assert ing.feed(_allreduce(g[m], cid[m], cr[m], n, t), t) == int(m.sum())
        ing.tick(t)
    return sum(BIG // n for *_, n in groups), sum(BIG // n * _ring_bytes(n) for *_, n in groups)


def _every_ring_held(eng: Engine, ing: Ingest, groups: int) -> None:
    pool = eng._pool
    rings = [c for c in eng.comms.values() if c._ring is not None]
    assert len(rings) == groups, (len(rings), groups)
    assert pool.evicted["ring"] == 0 and pool.dropped["ring bytes"] == 0
    assert sum(c.incomplete for c in eng.comms.values()) == 0
    assert sum(len(p) for c in rings for p in c.kept()) == groups  # every op completed
    assert ing.edge.rejected == {} and not ing.failures


def test_the_ring_budget_at_65536_ranks_holds_every_data_parallel_ring():
    """TP 8 x PP 4: the 32 DP groups of 2,048 members make rings of 25 MiB (800 MiB: past the
    512 MiB that let the least recently used go at 32,768 ranks); 4 GiB now holds them."""
    t = H.now_ns()
    eng, ing = _master()
    _registered(ing, BIG, t)
    groups, need = _rings(_layout(8, 4, BIG), ("dp",), eng, ing, t)
    assert need > RING_FLOOR  # the old default would have let rings go: the test can fail
    assert eng._pool.held["ring"] == need <= eng._pool.budget["ring"]
    _every_ring_held(eng, ing, groups)


@pytest.mark.slow
def test_the_ring_budget_at_65536_ranks_holds_every_ring_of_ranks_sending_directly():
    """TP 8 x PP 8, every TP and DP group's ring made (ranks that send their TP ops themselves):
    8,192 rings of 200 KiB and 64 of 25 MiB, 3.2 GiB of the 4 GiB."""
    t = H.now_ns()
    eng, ing = _master()
    _registered(ing, BIG, t)
    groups, need = _rings(_layout(8, 8, BIG), ("tp", "dp"), eng, ing, t)
    assert need > RING_FLOOR
    assert eng._pool.held["ring"] == need <= eng._pool.budget["ring"]
    _every_ring_held(eng, ing, groups)


def test_each_engine_shard_holds_its_share_of_the_grown_budgets(monkeypatch):
    """The join tells each shard the ranks registered with each chunk: two shards hold half of
    the grown totals each; one set in the environment is split as before."""
    t = H.now_ns()
    eng = ShardedEngine(EngineConfig(), shards=2)
    _, ing = _master(engine=eng)
    _registered(ing, BIG, t)
    for s in eng._shards:
        assert s.pool.budget["ring"] == s.pool.kept_budget == 2 * GIB
    monkeypatch.setenv("C4D_MAX_RING_BYTES", "256M")
    eng = ShardedEngine(EngineConfig(), shards=2)
    _, ing = _master(engine=eng)
    _registered(ing, BIG, t)
    for s in eng._shards:
        assert s.pool.budget["ring"] == 128 * MIB and s.pool.kept_budget == 2 * GIB
