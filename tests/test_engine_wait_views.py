"""The wait-for graph and the mismatch record judge from snapshots (c4d/engine/wait_view.py,
emission.FoundMismatches), never from live communicators: what a sharded engine sends its join
(docs/engine-shards.md, "The design") must give the same findings after a pickle round trip,
and must not move when the engine is fed on."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil

import numpy as np
import pytest

from c4d.engine import Engine, hang
from c4d.engine.consistency import MAX_REPORTED, Consistency, Mismatch
from c4d.engine.emission import FoundMismatches
from c4d.engine.rows import P2P
from c4d.engine.wait_view import WaitView, busy_views
from tests import factories
from tests.golden import make_golden
from tests.test_engine_golden import GOLDEN, NAMES


def _proj(ev: hang.Evaluation) -> list:
    """Everything a finding says, its communicator by index and id (a view compares by identity)."""
    fs = [
        (f.key, f.kind, None if f.comm is None else (f.comm.idx, f.comm.id), f.op, f.seq, f.ranks,
         f.start_ns, f.loc, f.detail)
        for f in ev.findings
    ]  # fmt: skip
    return [fs, ev.oldest_wait, ev.peers_read]


def _fields(v: WaitView) -> dict:
    return {k: getattr(v, k) for k in WaitView.__slots__}


def _same(a: WaitView, b: WaitView) -> bool:
    fa, fb = _fields(a), _fields(b)
    for k, x in fa.items():
        y = fb[k]
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        elif x != y:
            return False
    return True


def _plain(v: WaitView) -> None:
    """Only ints, numpy arrays and one dict of int tuples to ints: nothing that reaches a Comm."""
    for k, x in _fields(v).items():
        if isinstance(x, dict):
            assert all(type(a) is tuple and all(type(i) is int for i in a) for a in x), k
            assert all(type(n) is int for n in x.values()), k
        else:
            assert type(x) is int or isinstance(x, np.ndarray), (k, type(x))


def test_golden_replays_judge_alike_from_pickled_views_and_views_stay_put(monkeypatch, tmp_path):
    real = hang.evaluate
    seen = {"ticks": 0, "views": 0, "findings": 0, "stuck": 0, "p2p": 0}
    kept: list[tuple[dict[int, WaitView], dict[int, WaitView]]] = []  # the latest ticks' and copies

    def still() -> None:
        for views, copy in kept:
            assert list(views) == list(copy)
            for i, v in views.items():
                assert _same(v, copy[i]), f"the view of communicator {i} changed after it was taken"

    def evaluate(ranks, views, th, now, lik=None):
        still()  # the engine was fed since the earlier ticks took theirs
        got = real(ranks, views, th, now, lik)
        sent = pickle.loads(pickle.dumps(views))
        assert _proj(real(ranks, sent, th, now, lik)) == _proj(got)
        for v in views.values():
            _plain(v)
            seen["p2p"] += bool(v.p2p_done)
        kept.append((views, pickle.loads(pickle.dumps(views))))
        del kept[:-4]
        seen["ticks"] += 1
        seen["views"] += len(views)
        seen["findings"] += len(got.findings)
        seen["stuck"] += len(got.peers_read)
        return got

    monkeypatch.setattr(hang, "evaluate", evaluate)
    for name in NAMES:
        expected = json.loads((GOLDEN / f"{name}.expected.json").read_text())
        path = tmp_path / f"{name}.c4d"
        with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
            shutil.copyfileobj(g, f)
        assert make_golden.diagnose(path) == expected["diagnoses"], name
        still()
        kept.clear()
    # every kind of input was there: views at most ticks, hangs found, a stuck collective's PEER
    # rows read, p2p counters copied
    assert seen["ticks"] > 100 and seen["views"] > seen["ticks"], seen
    assert seen["findings"] > 0 and seen["stuck"] > 0 and seen["p2p"] > 0, seen


def _waits(c) -> bool:
    """Someone waits in communicator ``c``: arrived at an op it has not finished, or in a p2p op
    that started (what hang.WaitGraph._collect makes graph nodes of)."""
    done = c.done_eff()
    live = c.hb_seen & ~c.gone & (c.grank >= 0)
    p2p = live & (c.pend_seq >= 0) & ((c.pend_flags & P2P) != 0) & (c.pend_start > 0)
    return bool((live & (np.maximum(c.n_arrived, done) > done)).any() or p2p.any())


@pytest.mark.parametrize("fault", ["noncomm-hang", "clean"])
def test_busy_views_are_the_communicators_someone_waits_in(fault):
    """At every tick of a tp2pp2dp4 job (a rank's compute stuck at step 10, or none), the views are
    those of the communicators a member waits in, in index order, whichever way they are found
    (the pool's busy list or every communicator), and copies of their state."""
    faults = [factories.Fault("noncomm-hang", rank=5, step=10)] if fault != "clean" else []
    job = factories.Job(
        tp=2, pp=2, dp=4, ranks_per_node=4, steps=20, hang_timeout_us=1_000_000, faults=faults
    )
    model, batches = factories.build_cached(job)
    eng = Engine()
    tick, t, bi, busy_ticks, idle_seen = job.tick_ms * factories.MS, 0, 0, 0, 0
    while t <= model.end_time:
        t += tick
        while bi < len(batches) and batches[bi][0] <= t:
            eng.feed(batches[bi][1], int(factories.T0 + t - tick))
            bi += 1
        eng.tick(int(factories.T0 + t))
        want = [i for i, c in eng.comms.items() if _waits(c)]
        views = busy_views(eng.comms, eng._pool)
        assert list(views) == want
        assert list(busy_views(eng.comms, None)) == want
        for i, v in views.items():
            c = eng.comms[i]
            assert v.idx == i and v.id == c.id and np.array_equal(v.done_eff(), c.done_eff())
            assert np.array_equal(v.pend_seq, c.pend_seq) and v.pend_seq is not c.pend_seq
            assert v.p2p_done == c.p2p_done and v.p2p_done is not c.p2p_done
        busy_ticks += bool(want)
        idle_seen += len(eng.comms) - len(want)
    assert idle_seen > 0 and busy_ticks > 0
    if fault != "clean":  # the hang: ranks wait, in collectives and p2p ops, behind rank 5 from then on
        assert busy_ticks > 10 and want and len(want) < len(eng.comms)


def _mm(rng: np.random.Generator, comm: int, now: int) -> Mismatch:
    """A verdict on ``comm``: a collective's members apart, or a send and its receive."""
    seq = int(rng.integers(0, 40))
    if rng.random() < 0.3:
        return Mismatch.pair(comm, seq, (0, 10), (1, 11), 8, 9, 4, 8, "records", now)
    sigs = [0, 0, int(rng.integers(0, 3))]
    return Mismatch.make(comm, seq, [0, 1, 2], [20, 21, 22], sigs, [4, 4, 4], "heartbeats", now)


def _explains(said: list[Mismatch], comm: int, seq: int | None, start: int, T: int) -> Mismatch | None:
    """The reference: of the verdicts said on ``comm`` (every one, in order; freed ones
    removed), the latest of its last MAX_REPORTED found at or before ``seq`` (any p2p one), at
    most T before ``start``."""
    mine = [mm for mm in said if mm.comm == comm][-MAX_REPORTED:]
    for mm in reversed(mine):
        if (seq is None or mm.p2p or mm.seq <= seq) and start <= mm.found_ns + T:
            return mm
    return None


def test_the_joins_record_of_mismatches_explains_a_stall_by_the_verdict_it_continues():
    """Verdicts handed over (pickled, as from a shard), more than MAX_REPORTED on some
    communicators, some forgotten between: every stall (communicator, seq or none, start) is
    explained by the verdict the reference names, or by none."""
    rng = np.random.default_rng(7)
    C, R, said = Consistency(), FoundMismatches(), []
    T = 1_000
    now = 0
    explained = 0
    for step in range(400):
        now += int(rng.integers(0, 300))
        comm = int(rng.integers(0, 4))
        C._add(_mm(rng, comm, now))
        for taken in C.take_new():
            said.append(taken)
            R.add(pickle.loads(pickle.dumps(taken)))
        if step % 97 == 96:
            gone = int(rng.integers(0, 4))
            said = [mm for mm in said if mm.comm != gone]
            R.forget([gone])
        for c in range(5):
            for seq in (None, 0, 10, 20, 39):
                for start in (now - 2 * T, now - T // 2, now, now + T // 2, now + 2 * T):
                    a, b = _explains(said, c, seq, start, T), R.explains(c, seq, start, T)
                    assert (a is None) == (b is None)
                    if a is not None:
                        assert (a.comm, a.seq, a.found_ns, a.p2p, a.culprits) == (
                            b.comm, b.seq, b.found_ns, b.p2p, b.culprits
                        )  # fmt: skip
                        explained += 1
    assert explained > 100
    assert max(len(v) for v in R.found.values()) == MAX_REPORTED


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("comm-hang")])
def test_a_stuck_collectives_peer_rows_read_from_its_view_are_joined_as_reading_the_comm_joined_them(
    name, monkeypatch, tmp_path
):
    """hang_links read ``Comm.peer_table``, which joins the communicator's PEER parts (and so
    decides what its cap lets go later); reading them from a view does not, so the engine joins
    them after the graph (wait_view.join_peers): at every tick that read them, one part."""
    from c4d.offline import analyze
    from c4d.record import trace

    real, read = hang.evaluate, []

    def evaluate(*a, **k):
        ev = real(*a, **k)
        read.append(ev.peers_read)
        return ev

    joined = []

    def on_tick(eng) -> None:
        for i in read[-1]:
            joined.append(len(eng.comms[i].peer_rows))

    monkeypatch.setattr(hang, "evaluate", evaluate)
    path = tmp_path / f"{name}.c4d"
    with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    analyze.replay(trace.read_raw(path), analyze.make_engine(), on_tick=on_tick)
    assert joined and set(joined) == {1}, joined
