"""Issue 14 at the ingest path (c4d/intake/validate.py + c4d/intake/ingest.py + the real engine, as the master
and `c4d analyze` drive them): each hostile input is dropped and counted by reason, memory
grows by less than a stated bound (tracemalloc: Python objects and numpy buffers), and the
good records around it all reach the engine."""

from __future__ import annotations

import logging
import subprocess
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.engine import Engine, EngineConfig
from c4d.intake import validate
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.record import schema, trace
from c4d.record.schema import Kind
from tests import hostile as H
from tests.conftest import c4d_cmd

WORLD = 8


def _job(t: int, limits: Limits | None = None) -> tuple[Engine, Ingest]:
    """An 8-rank job that registered and initialised its world communicator at master time t."""
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge(limits or Limits()))
    assert ing.feed(H.as_header(H.registers(WORLD, t), H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)), t)
    ing.tick(t)
    return eng, ing


def _world(eng: Engine):
    return eng.comms[eng._comm_index[H.WORLD_COMM]]


def test_an_op_200_record_is_dropped_and_the_batches_around_it_are_kept():
    t = H.now_ns()
    eng, ing = _job(t)
    ing.feed(H.as_header(H.allreduces(WORLD, range(0, 10), t)), t)
    bad = H.allreduces(WORLD, range(10, 20), t)
    bad["op"][37] = 200  # the record that used to end in IndexError in Engine._gaps
    ing.feed(H.as_header(bad), t)
    ing.feed(H.as_header(H.allreduces(WORLD, range(20, 30), t)), t)
    ing.tick(t + 100_000_000)
    assert ing.edge.rejected == {"bad op": 1} and not ing.failures
    op_done = _world(eng).op_done
    assert op_done.tolist() == [30] * WORLD  # every good record of all three batches arrived
    assert eng.stats["invalid"] == 0  # the engine never saw the bad one


def test_an_op_200_record_in_a_trace_does_not_stop_analyze(tmp_path):
    t = H.now_ns()
    w = trace.TraceWriter(tmp_path / "t.c4d", {"created_ns": t})
    w.tick(t)
    w.write(H.as_header(H.registers(WORLD, t), H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)))
    bad = H.allreduces(WORLD, range(0, 4), t)
    bad["op"][:] = 200
    w.write(H.as_header(bad))
    w.write(H.as_header(H.allreduces(WORLD, range(4, 8), t)))
    w.tick(t + 200_000_000)
    w.close()
    r = subprocess.run(c4d_cmd("analyze", tmp_path / "t.c4d"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "dropped 32 records (bad op: 32)" in r.stderr


def test_a_heartbeat_of_rank_2_20_minus_1_costs_no_memory():
    t = H.now_ns()
    eng, ing = _job(t)
    with H.traced_growth() as g:
        hb = H.heartbeats(1, t)
        hb["rank"] = (1 << 20) - 1
        for _ in range(100):
            ing.feed(H.as_header(hb), t)
        ing.tick(t + 100_000_000)
    assert ing.edge.rejected == {"bad rank": 100}
    assert g["mib"] < 1.0, g  # was +162 MiB of RSS (issue 14)
    assert eng.ranks.n <= 16


@pytest.mark.slow
def test_twenty_thousand_new_communicators_stay_within_the_budget():
    t = H.now_ns()
    eng, ing = _job(t)
    with H.traced_growth() as g:
        for m in range(40):  # 40 messages of 500 one-rank communicators each (issue 14's probe)
            cids = 0x5000_0000 + m * 500 + np.arange(500)
            recs = H.comm_init(np.zeros(500, int), 0, 1, t)
            recs["comm_id"], recs["comm_rank"] = cids, 0
            ing.feed(H.as_header(recs), t)
        ing.tick(t + 100_000_000)
    budget = WORLD * Limits().comms_per_rank  # members of live communicators, summed
    assert len(eng.comms) == 1 + budget - WORLD  # the world communicator (8 members) + 504 one-rank ones
    assert ing.edge.rejected == {"communicator budget": 20_000 - (budget - WORLD)}
    assert g["mib"] < 48.0, g  # 512 communicators' rings (~26 KiB a member); was +627 MiB
    # and the job's own communicator still works
    ing.feed(H.as_header(H.allreduces(WORLD, range(0, 3), t)), t)
    ing.tick(t + 200_000_000)
    assert _world(eng).op_done.tolist() == [3] * WORLD


def test_a_communicator_larger_than_the_world_is_refused():
    t = H.now_ns()
    eng, ing = _job(t)
    with H.traced_growth() as g:
        for k in range(20):
            recs = H.comm_init([0], 0x7000 + k, 131_072, t)
            ing.feed(H.as_header(recs), t)
        ing.tick(t + 100_000_000)
    assert ing.edge.rejected == {"bad comm size": 20} and len(eng.comms) == 1
    assert g["mib"] < 1.0, g  # was +68 MiB per record


def test_two_hundred_thousand_random_ranks_cost_nothing():
    t = H.now_ns()
    _eng, ing = _job(t)
    rng = np.random.default_rng(0)
    with H.traced_growth() as g:
        for _ in range(400):
            hb = H.heartbeats(500, t, cid=0)
            hb["rank"] = rng.integers(WORLD, 1 << 31, 500)
            ing.feed(H.as_header(hb), t)
        ing.tick(t + 100_000_000)
    assert ing.edge.rejected == {"bad rank": 200_000}
    assert g["mib"] < 1.0, g  # was +280 MiB


def test_nothing_but_registration_before_the_job_registered():
    t = H.now_ns()
    ing = Ingest(Engine(EngineConfig()), Edge())
    ing.feed(H.as_header(H.allreduces(WORLD, range(3), t)), t)
    assert ing.edge.rejected == {"no registration yet": 3 * WORLD}
    # one rank's REGISTER sets the world; the others' records are taken from then on, in order
    ing.feed(H.as_header(H.registers(WORLD, t)[:1], H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)), t)
    assert ing.edge.accepted == 1 + WORLD


def test_times_and_fields_out_of_their_domains_are_each_counted():
    t = H.now_ns()
    _eng, ing = _job(t)
    cases = {
        "bad time": lambda a: a["end_ns"].__setitem__(0, np.uint64(1 << 63)),  # negative as int64
        "bad dtype": lambda a: a["dtype"].__setitem__(0, 99),
        # every bit of flags has a meaning now (0x80: an agent's COMPUTE_GIVEN): p2p on a collective
        "bad flags": lambda a: a["flags"].__setitem__(0, a["flags"][0] | 0x04),
        "bad compute": lambda a: a["compute_ns"].__setitem__(0, 5),  # a shim's are 0
        "bad comm rank": lambda a: a["comm_rank"].__setitem__(0, WORLD),
        "bad seq": lambda a: a["seq"].__setitem__(0, np.uint64(1 << 60)),
        "bad count": lambda a: a["bytes"].__setitem__(0, np.uint64(1 << 62)),
        "bad peer": lambda a: a["peer"].__setitem__(0, 1000),
        "communicator size changed": lambda a: a["comm_nranks"].__setitem__(0, 4),
    }
    for i, (reason, spoil) in enumerate(cases.items()):
        a = H.allreduces(WORLD, [i], t)
        spoil(a)
        ing.feed(H.as_header(a), t)
        assert ing.edge.rejected[reason] == 1, reason
    far = H.heartbeats(WORLD, t + 10 * 3600 * 10**9)  # ten hours ahead of the master's clock
    ing.feed(H.as_header(far), t)
    assert ing.edge.rejected["bad time"] == 1 + WORLD
    assert sum(ing.edge.rejected.values()) == len(cases) + WORLD


def test_destroyed_and_silent_communicators_are_freed():
    t = H.now_ns()
    lim = Limits(comm_idle_s=60, destroyed_grace_s=5)
    eng, ing = _job(t, lim)
    half = [0, 1, 2, 3]
    ing.feed(H.as_header(H.comm_init(half, 0xAA, 4, t), H.comm_init(half[::-1], 0xBB, 4, t)), t)
    ing.feed(H.as_header(H.allreduces(4, range(5), t, cid=0xAA), H.allreduces(4, range(5), t, cid=0xBB)), t)
    ing.tick(t)
    assert len(eng.comms) == 3
    s = 10**9
    gone = H.comm_init(half, 0xAA, 4, t + s, event=schema.CommEvent.DESTROY)
    ing.feed(H.as_header(gone, H.heartbeats(WORLD, t + s)), t + s)
    ing.tick(t + 2 * s)  # within the grace: the last slow window of 0xAA is still judged
    assert 0xAA in eng._comm_index
    ing.feed(H.as_header(H.heartbeats(WORLD, t + 7 * s)), t + 7 * s)
    ing.tick(t + 7 * s)
    assert 0xAA not in eng._comm_index and 0xBB in eng._comm_index
    late = H.allreduces(4, [5], t + 8 * s, cid=0xAA)
    ing.feed(H.as_header(late), t + 8 * s)
    assert ing.edge.rejected == {"destroyed communicator": 4}
    ing.feed(H.as_header(H.heartbeats(WORLD, t + 70 * s)), t + 70 * s)  # 0xBB silent for 70 s
    ing.tick(t + 70 * s)
    assert list(eng._comm_index) == [H.WORLD_COMM]
    assert ing.edge.slots == WORLD


def _memory_per_rank_kib(world: int, span: bool) -> float:
    """A TP=8 x DP=world/8 job, every rank in 3 communicators, 20 all-reduces on the world one;
    ``span``: each op's rows cut by a tick (half the members before it), so that its ring is made."""
    t = H.now_ns()
    with H.traced_growth() as g:
        eng = Engine(EngineConfig())
        ing = Ingest(eng, Edge())
        parts = [H.registers(world, t), H.comm_init(range(world), H.WORLD_COMM, world, t)]
        for d in range(world // 8):
            parts.append(H.comm_init(range(d * 8, d * 8 + 8), 0x100 + d, 8, t))
        for k in range(8):
            parts.append(H.comm_init(range(k, world, 8), 0x200 + k, world // 8, t))
        ing.feed(H.as_header(*parts), t)
        for step in range(20):
            ops = H.allreduces(world, [step], t)
            if span:
                ing.feed(H.as_header(ops[: world // 2]), t)
                ing.tick(t)
                ops = ops[world // 2 :]
            ing.feed(H.as_header(ops, H.heartbeats(world, t, done=step + 1)), t)
        ing.tick(t + 100_000_000)
    assert not ing.edge.rejected and len(eng.comms) == 1 + 32 + 8
    return g["mib"] * 1024 / world


@pytest.mark.slow
def test_memory_per_rank_is_what_the_docs_say():
    """docs/untrusted-input.md: ~1 KiB per rank plus, per communicator a rank is in, ~26 KiB
    once its op ring is made (an op that spans ingest chunks: a sender can force it), and
    little before (ops complete within a chunk are reduced from the rows)."""
    plain = _memory_per_rank_kib(256, span=False)
    spanned = _memory_per_rank_kib(256, span=True)
    assert plain < 3 * 8, plain  # no ring: member arrays and bookkeeping only
    assert 15 < spanned - plain < 32, (plain, spanned)  # the world communicator's ring (25.6 KiB a rank)
    assert spanned < 3 * 32 + 4, spanned  # the bound with every ring made: 3 x (26 KiB + slack)


def test_an_exception_in_one_batch_drops_that_batch_only(caplog):
    t = H.now_ns()
    eng, ing = _job(t)
    real_feed = eng.feed
    calls = {"n": 0}

    def flaky(raw, recv_ns, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise IndexError("index 0 is out of bounds")
        real_feed(raw, recv_ns, **kw)

    eng.feed = flaky  # the real engine, with one ingest failing the way issue 14's did
    with caplog.at_level(logging.WARNING, logger="c4d.intake.ingest"):
        for k in range(3):
            ing.feed(H.as_header(H.allreduces(WORLD, range(10 * k, 10 * k + 10), t)), t)
    ing.tick(t + 100_000_000)
    assert ing.failures == {"ingest: IndexError": 1} and ing.failed_records == 10 * WORLD
    assert sorted(set(_world(eng).op_done.tolist())) == [30]  # batches 1 and 3 are in
    assert sum("ingest failed" in r.getMessage() for r in caplog.records) == 1


def test_the_edge_kinds_match_the_schema():
    assert {int(k) for k in Kind} - {int(k) for k in schema.DTYPES} == {int(Kind.TICK)}


def test_a_one_shot_flood_gives_way_to_the_jobs_own_communicators():
    """The budget is full of forged communicators; once they have been silent for
    evict_silent_s, a communicator the job really uses (named by its heartbeats) gets in."""
    t = H.now_ns()
    eng, ing = _job(t, Limits(evict_silent_s=5))
    for m in range(40):
        recs = H.comm_init(np.zeros(500, int), 0, 1, t)
        recs["comm_id"], recs["comm_rank"] = 0x5000_0000 + m * 500 + np.arange(500), 0
        ing.feed(H.as_header(recs), t)
    ing.tick(t)
    s = 10**9
    tp = [4, 5]  # a new TP communicator, created after the flood
    for k in range(1, 9):  # its heartbeats every second; the world's too
        now = t + k * s
        hb = H.heartbeats(2, now, cid=0x7777)
        hb["rank"] = tp
        ing.feed(H.as_header(H.heartbeats(WORLD, now), hb), now)
        ing.tick(now)
        assert (0x7777 in eng._comm_index) == (k >= 5), k  # refused while the flood is fresh
    assert H.WORLD_COMM in eng._comm_index and not ing.failures  # named every second: never evicted
    assert ing.edge.slots <= WORLD * Limits().comms_per_rank
    assert len(eng.comms) <= 1 + WORLD * Limits().comms_per_rank


def test_a_poll_whose_validation_raises_loses_only_the_batch_that_raises():
    """Ingest.feed_many (what the master does with one poll): validation raising for the poll
    falls back to batch by batch, so only the batch that raises is lost."""
    t = H.now_ns()
    eng, ing = _job(t)
    real = ing.edge.admit

    def admit(raw, t_ns):
        if (raw["time_ns"] == 12345).any():
            raise ValueError("boom")
        return real(raw, t_ns)

    ing.edge.admit = admit
    batches = [H.allreduces(WORLD, range(10 * k, 10 * k + 10), t) for k in range(3)]
    batches[1]["time_ns"][0] = 12345
    got = ing.feed_many([H.as_header(b) for b in batches], t)
    ing.tick(t + 100_000_000)
    assert got == 2 * 10 * WORLD
    assert ing.failures == {"ingest: ValueError": 1} and ing.failed_records == 10 * WORLD
    assert _world(eng).ops_seen == 2 * 10 * WORLD


def test_a_forged_world_size_still_meets_the_absolute_member_cap():
    """A sender whose REGISTER is the first the master hears claims the largest world: the
    communicators it can make still meet the absolute cap."""
    t = H.now_ns()
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge(Limits(max_comm_members=100)))
    forged = H.registers(1, t)
    forged["world_size"] = Limits().max_ranks  # one REGISTER claiming the largest world accepted
    recs = H.comm_init(np.zeros(5000, int), 0, 1, t)
    recs["comm_id"], recs["comm_rank"] = 0x9000_0000 + np.arange(5000), 0
    ing.feed(H.as_header(forged, recs), t)
    ing.tick(t)
    assert ing.edge.world == Limits().max_ranks
    assert ing.edge.slots <= 100 and len(eng.comms) <= 100
    assert ing.edge.rejected == {"communicator budget": 5000 - 100}


def test_a_world_size_claimed_after_the_jobs_is_refused():
    """The job's first REGISTER fixes its world size: a later one claiming the largest world
    (which would raise the communicator budget to the absolute cap) is refused, and so is a
    REGISTER of a rank beyond the job's world."""
    t = H.now_ns()
    _eng, ing = _job(t)
    forged = H.registers(1, t)
    forged["world_size"] = Limits().max_ranks
    beyond = H.registers(1, t)
    beyond["rank"], beyond["world_size"] = 1000, -1  # no world claimed: would count as rank + 1
    assert ing.feed(H.as_header(forged, beyond), t) == 0
    assert ing.edge.world == WORLD
    assert ing.edge.rejected == {"job settings changed": 1, "bad rank": 1}


def test_communicators_named_across_batches_keep_the_order_and_times_of_one_move_each():
    """The edge moves the communicators a batch names to the end of its least-recently-named
    order when the order is read (Edge.comms), not at every batch: the order and the times are
    those of moving each one at every batch, by its first appearance in it; eviction (which
    reads them) takes the least recently named."""
    rng = np.random.default_rng(7)
    t = H.now_ns()
    edge = Edge()
    K = 12
    cids = [0x5000 + k for k in range(K)]
    edge.admit(H.as_header(H.registers(WORLD, t), *(H.comm_init(range(WORLD), c, WORLD, t) for c in cids)), t)
    want: dict[int, int] = {c: t for c in cids}  # insertion order = the order a move per batch gives
    for b in range(40):
        now = t + (b + 1) * 1_000_000
        named = [cids[k] for k in rng.permutation(K)[: int(rng.integers(1, K))]]
        ops = [H.allreduces(WORLD, [b], t, cid=c) for c in named]
        assert len(edge.admit(H.as_header(*ops), now)) == WORLD * len(named)
        for c in named:
            want.pop(c)
            want[c] = now
        if b % 7 == 3:  # the order read now and then, and at the end
            assert [(k, c.last_ns) for k, c in edge.comms.items()] == list(want.items()), b
    assert [(k, c.last_ns) for k, c in edge.comms.items()] == list(want.items())


def test_the_edge_hands_on_the_columns_of_a_batch_it_admitted_whole():
    """Edge.columns_of: the columns admit read, for the batch it returned as it came (the
    master's live-view counts read them); none for a batch it copied (a row dropped) or another."""
    t = H.now_ns()
    edge = Edge()
    edge.admit(H.as_header(H.registers(WORLD, t), H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)), t)
    good = H.as_header(H.allreduces(WORLD, range(3), t))
    ok = edge.admit(good, t)
    cols = edge.columns_of(ok)
    assert ok is good and cols is not None
    assert cols.as_kind(schema.OP)["seq"].tolist() == good.view(schema.OP)["seq"].tolist()
    assert edge.columns_of(good.copy()) is None
    bad = H.allreduces(WORLD, range(3, 6), t)
    bad["op"][0] = 200
    ok = edge.admit(H.as_header(bad), t)
    assert len(ok) == len(bad) - 1 and edge.columns_of(ok) is None


def test_a_batch_with_the_jobs_registrations_again_is_admitted_without_a_copy():
    """A rank registers again (the shim does, for a master that restarted): its clean names need
    no rewriting, so the batch goes on as it came, its columns with it; a name to clean still
    gets the batch copied and the name cleaned, the rows sent left as they were."""
    t = H.now_ns()
    edge = Edge()
    edge.admit(H.as_header(H.registers(WORLD, t), H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)), t)
    again = H.as_header(H.allreduces(WORLD, range(2), t), H.registers(WORLD, t))
    ok = edge.admit(again, t)
    assert ok is again and edge.columns_of(ok) is not None
    dirty = H.registers(WORLD, t, node_of=lambda r: f"node-{r // 4}".encode())
    dirty["job"] = b"job\x011"
    batch = H.as_header(H.allreduces(WORLD, range(2, 4), t), dirty)
    before = batch.copy()
    ok = edge.admit(batch, t)
    assert ok is not batch and edge.columns_of(ok) is None
    assert set(ok.view(schema.REGISTER)["job"][ok["kind"] == Kind.REGISTER].tolist()) == {b"job_1"}
    assert batch.tobytes() == before.tobytes()


# -- issue 41: the communicator tables bounded in bytes ----------------------------------------
def _flood_comms(ing: Ingest, t: int, n: int, first: int = 0x5000_0000, members: int = 1) -> None:
    """``n`` new communicators of ``members`` ranks each (a COMM init per member), 4,000 rows a batch."""
    per = max(1, 4000 // members)
    for c0 in range(0, n, per):
        k = min(per, n - c0)
        recs = H.comm_init(np.tile(np.arange(members), k), 0, members, t)
        recs["comm_id"] = first + c0 + np.repeat(np.arange(k), members)
        recs["comm_rank"] = np.tile(np.arange(members), k)
        ing.feed(H.as_header(recs), t)


@pytest.mark.slow
def test_the_table_bytes_charged_cover_what_the_master_holds():
    """Comm.table_bytes (what C4D_MAX_COMM_BYTES charges) is at least what the edge, the engine and
    the master's bookkeeping hold for a new communicator, and not far above it."""
    from c4d.engine.comm import Comm
    from c4d.intake.received import Received

    for members, n in ((1, 4000), (8, 1000), (64, 200)):
        t = H.now_ns()
        eng, rec = Engine(EngineConfig()), Received()
        lim = Limits(max_comm_members=1 << 30, comms_per_rank=1 << 20, max_comm_bytes=1 << 40)
        ing = Ingest(eng, Edge(lim), sinks=[lambda ok, rec=rec, t=t: rec.add(ok, t)], on_free=[rec.forget])
        ing.feed(H.as_header(H.registers(64, t)), t)
        _flood_comms(ing, t, 200, first=0x4000_0000, members=members)  # the pools' first growth
        ing.tick(t)
        with H.traced_growth() as g:
            _flood_comms(ing, t, n, members=members)
            ing.tick(t + 1)
        held = g["mib"] * 2**20 / n
        assert not ing.edge.rejected and len(eng.comms) == 200 + n
        assert 0.4 * Comm.table_bytes(members) < held <= Comm.table_bytes(members), (members, held)


def test_new_communicators_past_the_byte_budget_are_refused_and_counted():
    """A sender whose REGISTER claims the largest world may make communicators until their tables
    reach C4D_MAX_COMM_BYTES (the member cap alone let 124,000 of them take 810 MiB); beyond it
    they are refused as `communicator bytes`, and once the flood is silent the job's own get in."""
    from c4d.engine.comm import Comm

    t = H.now_ns()
    budget = 200 * Comm.table_bytes(1)
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge(Limits(max_comm_bytes=budget, evict_silent_s=5)))
    forged = H.registers(1, t)
    forged["world_size"] = Limits().max_ranks
    ing.feed(H.as_header(forged), t)
    with H.traced_growth() as g:
        _flood_comms(ing, t, 5000)
        ing.tick(t)
    assert len(eng.comms) == 200 and ing.edge.comm_bytes <= budget
    assert ing.edge.rejected == {"communicator bytes": 5000 - 200}
    assert g["mib"] * 2**20 < 1.5 * budget, g
    later = t + 6 * 10**9  # the forged ones silent past evict_silent_s: a new one takes their room
    ing.feed(H.as_header(H.comm_init([0], 0x7777, 1, later)), later)
    ing.tick(later)
    assert (
        len(eng.comms) == 200
        and 0x7777 in eng._comm_index
        and ing.edge.rejected["communicator bytes"] == 5000 - 200
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["name", "destroy", "expire"]), st.integers(0, 3),
                          st.integers(0, 4)), max_size=40), st.sampled_from([1, 2, 3, 64]))  # fmt: skip
def test_expire_frees_what_it_would_with_every_naming_applied_first(steps, fold):
    """Edge.expire reads the communicators' order only when one may be due (the namings not
    applied yet only make times later, and are folded into one, each communicator's latest,
    every ``fold`` batches): the same communicators freed, at the same ticks, and the same
    order at the end, as an edge whose order is brought up to date before every expire."""
    with mock.patch.object(validate, "_TOUCHED_BATCHES", fold):
        _expire_as_applied(steps)


def _expire_as_applied(steps) -> None:
    s = 10**9
    t0 = H.now_ns()
    lim = Limits(comm_idle_s=5, destroyed_grace_s=2)
    edges = [Edge(lim), Edge(lim)]
    cids = [0xA0 + k for k in range(4)]
    for e in edges:
        e.admit(H.as_header(H.registers(4, t0), *(H.comm_init(range(4), c, 4, t0) for c in cids)), t0)
    t, seq = t0, {c: 0 for c in cids}
    for what, k, dt in steps:
        t += dt * s
        c = cids[k]
        for e in edges:
            if what == "name":
                e.admit(H.as_header(H.allreduces(4, [seq[c]], t, cid=c)), t)
            elif what == "destroy":
                e.admit(H.as_header(H.comm_init(range(4), c, 4, t, event=schema.CommEvent.DESTROY)), t)
        _ = edges[0].comms  # the reference: each batch's namings applied as it comes
        seq[c] += what == "name"
        if what == "expire":
            assert edges[0].expire(t) == edges[1].expire(t)
    want = [(cid, c.last_ns) for cid, c in edges[0].comms.items()]
    assert [(cid, c.last_ns) for cid, c in edges[1].comms.items()] == want
