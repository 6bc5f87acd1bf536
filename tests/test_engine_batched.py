"""The batched collective path (reduce.reduce_comms: every communicator's complete ops of a chunk
in a few vectorized passes, the clock refinement in Jacobi order) gives exactly what reducing
one communicator at a time gives with every clock step deferred to the chunk's end
(Comm.add_collectives, Comm.add_heartbeats: tests/one_comm_at_a_time.py, the reference this
compares with): the same COMPLETED rows, OP_SPLIT rows, clock offsets, communicator state and
diagnoses, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import one_comm_at_a_time
import pytest
import records
from factories import Fault, Job, build_cached, replay

from c4d.engine import Engine, EngineConfig, ingest_ops
from c4d.engine.comm import Comm
from c4d.engine.pool import Pool
from c4d.record import schema

# tp groups on one node, dp groups across nodes (one node in several of them: their steps'
# scaled mean moves it), pipeline stages on other nodes, ±50 ms node clocks, faults that the
# diagnoses must name
SLOW = Job(
    tp=2, pp=2, dp=4, ranks_per_node=4, steps=60, skew_ms=50.0,
    faults=[Fault("noncomm-slow", rank=3, step=20, factor=3), Fault("comm-slow", rank=6, step=20, factor=3)],
)  # fmt: skip
# ticks every 20 ms: the chunks cut many ops, which complete from the ring (Comm.scatter)
CUT = Job(
    tp=2, pp=2, dp=4, ranks_per_node=4, steps=40, skew_ms=50.0, tick_ms=20.0,
    faults=[Fault("comm-slow", rank=5, step=15, factor=3)],
)  # fmt: skip
# data-parallel groups of 18 members on 18 nodes, two through each node (reduce.apply_steps moves
# each node by the scaled mean of both groups' steps)
WIDE = Job(
    tp=2, pp=1, dp=18, ranks_per_node=2, steps=30, skew_ms=50.0,
    faults=[Fault("comm-slow", rank=5, step=10, factor=3)],
)  # fmt: skip
HANG = Job(
    tp=2, pp=2, dp=4, ranks_per_node=2, steps=30, skew_ms=50.0, faults=[Fault("comm-hang", rank=5, step=10)]
)


def _run(job: Job, batched: bool, monkeypatch, drop_register: tuple[int, ...] = ()):
    """Replay the job; return its diagnoses (JSON), each communicator's COMPLETED rows in the
    order made, the OP_SPLIT rows and the final clock state."""
    made: dict[int, list[np.ndarray]] = {}
    orig = Comm.keep_completed

    def record(self, out, gaps):
        made.setdefault(self.id, []).append(out.copy())
        orig(self, out, gaps)

    model, batches = build_cached(job)
    if drop_register:  # those ranks' node stays unknown: each is its own clock domain
        keep = lambda b: b[~((b["kind"] == schema.Kind.REGISTER) & np.isin(b["rank"], drop_register))]  # noqa: E731
        batches = [(t, keep(b)) for t, b in batches]
    with monkeypatch.context() as mp:
        if not batched:
            one_comm_at_a_time.use(mp)
        mp.setattr(Comm, "keep_completed", record)
        run = replay(job, lambda: Engine(EngineConfig(), split=True), batches, model)
    R = run.engine.ranks
    state = {
        k: getattr(R, k).copy()
        for k in ("rel_node", "rel_rank", "anc_node", "anc_rank", "isl_node", "isl_rank")
    }
    for c in run.engine.comms.values():  # what the hang graph and the live view read
        for k, _dt, _f in (*Pool.MEMBER, *Pool.SLOT):
            state[f"{c.id:x}.{k}"] = getattr(c, k).copy()
        state[f"{c.id:x}.counts"] = np.array(
            [c.version, c.incomplete, c.ops_seen, c.p2p_rows, len(c.p2p_done)]
        )
        rate = run.engine._pool.rate  # what the live view's rate reads: OP rows by master time
        log = [(t, int(r[i == c.idx].sum())) for t, i, r in rate.log if (i == c.idx).any()]
        state[f"{c.id:x}.rate"] = np.array([*log, (c.first_done_ns or 0, 0)])
    diags = [json.dumps(d.to_json(), sort_keys=True) for d in run.diagnoses]
    return diags, made, run.engine.take_split(), state


@pytest.mark.parametrize(
    ("job", "drop"),
    [(SLOW, ()), (CUT, ()), (HANG, ()), (SLOW, (1, 6)), (WIDE, ())],
    ids=["slow", "chunks-cut-ops", "hang", "slow-unregistered", "wide-data-parallel"],
)
@pytest.mark.slow
def test_batched_reduction_equals_one_communicator_at_a_time(job, drop, monkeypatch):
    d1, made1, sp1, clk1 = _run(job, False, monkeypatch, drop)
    d2, made2, sp2, clk2 = _run(job, True, monkeypatch, drop)
    assert len(made1) >= 8 and sum(len(o) for v in made1.values() for o in v) > 300  # many ops reduced
    assert sorted(made1) == sorted(made2)
    for c in made1:  # per communicator, in order, bit for bit (NaN included)
        assert [o.tobytes() for o in made1[c]] == [o.tobytes() for o in made2[c]]
    assert len(sp1) > 1000 and sp1.tobytes() == sp2.tobytes()
    assert sorted(clk1) == sorted(clk2)
    for k in clk1:  # clock offsets, every communicator's members, ring tags and counters
        assert clk1[k].tobytes() == clk2[k].tobytes(), k
    assert d1 and d1 == d2


def test_the_load_exercises_clock_refinement_across_nodes(monkeypatch):
    """Guard for the test above: the refinement (the steps deferred to a chunk's end) really
    moves offsets."""
    _, made, _, clk = _run(SLOW, True, monkeypatch)
    assert any(o["aligned"].any() for v in made.values() for o in v)
    rel = clk["rel_node"]
    assert np.ptp(rel) > 10e6  # ±50 ms node clocks, refined (not just the receipt bounds)


def _two_ranks(comm_id: int, steps: int, start_seq: int = 0) -> np.ndarray:
    """OP rows of a 2-rank communicator (comm ranks 0, 1 = global ranks 0, 1), seq by seq."""
    a, b = records.ops(steps, 0, comm_id, start_seq), records.ops(steps, 1, comm_id, start_seq)
    b["comm_rank"] = 1
    return np.concatenate([a, b]).view(schema.HEADER)


def test_a_freed_communicators_pool_ranges_go_fresh_to_the_next_of_its_size():
    eng = Engine(EngineConfig())
    eng.feed(np.concatenate([records.register(0, "n0"), records.register(1, "n0")]).view(schema.HEADER), 0)
    eng.feed(_two_ranks(0xA, 5), 0)
    eng.tick(1_000_000_000)
    old = next(c for c in eng.comms.values() if c.id == 0xA)
    assert old.op_done.tolist() == [5, 5] and (old.tag[:5] == np.arange(5)).all()
    assert eng.free_comms([0xA]) == 1
    assert old.op_done.tolist() == [5, 5]  # the freed Comm keeps its own copies
    eng.feed(_two_ranks(0xB, 2, start_seq=0), 1_000_000_000)
    eng.tick(2_000_000_000)
    new = next(c for c in eng.comms.values() if c.id == 0xB)
    assert (new.mbase, new.sbase) == (0, 0)  # the freed ranges, not new ones
    assert new.op_done.tolist() == [2, 2] and new.tag[:3].tolist() == [0, 1, -1]
    assert not new.processed[2:].any() and old.tag[:5].tolist() == [0, 1, 2, 3, 4]
    assert len(new.recent_ops()) == 2


def test_a_chunk_with_more_ops_than_ring_slots_matches_one_at_a_time(monkeypatch):
    """A chunk holding more of a communicator's ops than its ring has slots (W = 1,024 for two
    ranks: ops 1,024 apart share one, two of them incomplete) takes the counted path of
    ingest_ops._rows_per_slot and completes exactly what Comm.add_collectives completes (the ring
    keeps the newest op of a slot); a chunk within the ring takes the shortcut."""
    took: list[bool] = []
    orig = ingest_ops._rows_per_slot

    def spy(ci_o, seq_o, gslot, o, heads, size, W):
        out = orig(ci_o, seq_o, gslot, o, heads, size, W)
        took.append(out is not size)
        return out

    made: list[bytes] = []
    orig_completed = Comm.keep_completed

    def record(self, out, gaps):
        made.append(out.tobytes())
        orig_completed(self, out, gaps)

    monkeypatch.setattr(ingest_ops, "_rows_per_slot", spy)
    monkeypatch.setattr(Comm, "keep_completed", record)
    got = {}
    for batched in (True, False):
        made.clear()
        if not batched:  # (after the batched run)
            one_comm_at_a_time.use(monkeypatch)
        eng = Engine(EngineConfig())
        hello = np.concatenate([records.register(0, "n0"), records.register(1, "n0")])
        eng.feed(hello.view(schema.HEADER), 0)
        rows = _two_ranks(0xA, 2_500)  # one chunk: 2,500 ops, two of them missing rank 1
        rows = rows[~((rows["rank"] == 1) & np.isin(rows.view(schema.OP)["seq"], [5, 1_500]))]
        eng.feed(rows, 0)
        eng.tick(1_000_000_000)
        eng.feed(_two_ranks(0xA, 100, start_seq=2_500), 1_000_000_000)  # within the ring
        eng.tick(2_000_000_000)
        c = next(iter(eng.comms.values()))
        got[batched] = (c.op_done.tolist(), c.incomplete, c.ops_seen, c.tag.tobytes(),
                        c.processed.tobytes(), c.recent_ops().tobytes(), b"".join(made))  # fmt: skip
    assert took == [True, False]
    assert got[True] == got[False]
    assert got[True][0] == [2_600, 2_600]


def test_communicators_on_one_host_clock_share_a_reduce_group(monkeypatch):
    """A job on one node (or an import whose hosts are unknown: every rank on "?") has nothing
    to refine: each communicator's step is zero. A chunk takes one reduce_group per
    communicator size."""
    from c4d.engine import reduce as reduce_mod

    calls: list[int] = []
    orig = reduce_mod.reduce_group

    def counted(comms, parts, ranks, gain):
        calls.append(len(comms))
        return orig(comms, parts, ranks, gain)

    one_node = Job(tp=2, pp=1, dp=8, ranks_per_node=16, steps=30, skew_ms=0.0)
    monkeypatch.setattr(reduce_mod, "reduce_group", counted)
    d1, made1, sp1, clk1 = _run(one_node, True, monkeypatch)
    # per chunk: the 8 tp pairs in one call, the 2 dp groups of 8 in another; never one alone
    assert calls and set(calls) == {8, 2}, calls
    monkeypatch.setattr(reduce_mod, "reduce_group", orig)
    d2, made2, sp2, clk2 = _run(one_node, False, monkeypatch)
    assert d1 == d2 and sorted(made1) == sorted(made2)
    assert sp1.tobytes() == sp2.tobytes() and all(clk1[k].tobytes() == clk2[k].tobytes() for k in clk1)


def test_packed_lexsort_orders_as_numpy_lexsort():
    """rows.lexsort packs integer keys into one int64 for a stable argsort: the same order as
    np.lexsort for any dtype and range, np.lexsort itself where the ranges do not fit."""
    from c4d.engine.rows import lexsort

    rng = np.random.default_rng(11)
    packed = 0
    for _ in range(300):
        m = int(rng.integers(1, 400))
        keys = []
        for _k in range(int(rng.integers(1, 4))):
            dt = [np.int64, np.int32, np.uint64, np.uint32, np.int16, np.uint8][int(rng.integers(6))]
            info = np.iinfo(dt)
            span = min(10 ** int(rng.integers(1, 19)), int(info.max) - int(info.min))
            lo = int(rng.integers(0, 2**62)) % (int(info.max) - int(info.min) - span + 1) + int(info.min)
            keys.append(np.array([lo + int(x) % (span + 1) for x in rng.integers(0, 2**62, m)], dtype=dt))
        want = np.lexsort(tuple(keys))
        assert (lexsort(tuple(keys)) == want).all()
        packed += sum((int(k.max()) - int(k.min())).bit_length() for k in keys) <= 62
    assert 50 < packed < 300  # both paths taken


def test_register_repeats_skipped_at_once_as_one_by_one():
    """RankTable.register skips a batch's REGISTER rows that say what it knows in one pass: the
    same node names and indices, pids, restarts and job settings as taking every row one by one
    (new pids, new and renamed nodes, ranks twice in a batch, undecodable and empty names)."""
    from c4d.engine.ranks import RankTable

    rng = np.random.default_rng(3)
    # b"p" * 37 + b"\xffxy" reads as a name whose UTF-8 is 42 bytes; cut to the field's 40, those
    # are the bytes of the last name, which reads as another
    names = [b"node-a", b"node-b", b"n\xffc", b"", b"p" * 37 + b"\xffxy", b"p" * 37 + "\ufffd".encode()]
    for trial in range(60):
        batched, single = RankTable(), RankTable()
        for t in (batched, single):
            t.ensure(63)
            t.final[:] = True  # (a restart clears it)
        for _ in range(8):
            rows = np.zeros(int(rng.integers(1, 40)), schema.REGISTER)
            rows["rank"] = rng.integers(0 if trial % 2 else 1, 16, len(rows))
            rows["pid"] = 100 + rng.integers(0, 2 if trial % 3 else 4, len(rows))
            rows["node"] = [names[int(i)] for i in rng.integers(0, len(names) if trial % 4 else 2, len(rows))]
            rows["hang_timeout_us"] = rng.integers(1, 1000, len(rows))
            batched.register(rows)
            for r in rows:
                single.register(r[None])
            assert batched.node_names == single.node_names
            assert (batched.node == single.node).all() and (batched.pid == single.pid).all()
            assert (batched.final == single.final).all() and batched.job == single.job
