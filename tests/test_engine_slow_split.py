"""The slow judge in halves, as an engine sharded by communicator runs it
(docs/engine-shards.md; c4d/engine/slow.py, c4d/engine/shards.py): the join plans a tick's windows
(``SlowJudge.plan``), each shard takes its own communicators' rows (``take_windows``), the join
judges the takes together (``SlowJudge.judge_taken``). Split so, with the plan and the takes
sent through pickle and the judge shown the communicators only as frozen snapshots (no PEER
table, no live arrays), an engine must give the plain engine's diagnoses, tick by tick."""

from __future__ import annotations

import copy
import gzip
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from factories import Fault, Job, build_cached, replay

from c4d.engine import DiagKind, Engine, EngineConfig
from c4d.engine.shards import owner
from c4d.engine.slow import Taken, WindowPlan, take_windows
from c4d.engine.wait_view import join_peers
from c4d.offline import analyze
from c4d.record import trace
from tests.golden import make_golden

GOLDEN = Path(make_golden.__file__).resolve().parent


class _Meta:
    """A communicator as the join knows it: index, id, size, members (a copy, taken at the
    tick). Anything else the window judging read of a communicator would fail here."""

    __slots__ = ("grank", "id", "idx", "n")

    def __init__(self, c) -> None:
        self.idx, self.id, self.n, self.grank = c.idx, c.id, c.n, c.grank.copy()


def _ship(x):
    return pickle.loads(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


class _Ticks(Engine):
    """An engine that keeps each tick's diagnoses apart (``per_tick``)."""

    def __init__(self, cfg: EngineConfig | None = None) -> None:
        super().__init__(cfg)
        self.per_tick: list[list[dict]] = []

    def tick(self, now_ns: int):
        out = super().tick(now_ns)
        self.per_tick.append([d.to_json() for d in out])
        return out


class _Split(_Ticks):
    """``Engine`` whose slow judge takes each tick's windows in ``shards`` parts, the
    communicators split by ``shards.owner`` of their ids, all from the engine's one pool (a
    shard's pool would hold only its own; ``take_windows`` skips the indices ``pool.due``
    names that are not among the communicators given, and ``pool.settle`` is once for all)."""

    def __init__(self, cfg: EngineConfig | None = None, shards: int = 2) -> None:
        super().__init__(cfg)
        self.shards = shards
        self.took = [0] * shards  # ticks at which each shard took rows
        self.stalled_ops = 0  # rows the takes dropped as a stall's
        self.peers_shipped = 0  # communicators whose PEER rows a take carried
        self.peers_read = 0  # ... and whose the judge read
        judge = self._slow

        def split(ranks, comms, th, now, oldest_wait=None, pool=None):
            plan = judge.plan(ranks, th, now, oldest_wait)
            sent = _ship(plan)
            assert sent == plan
            ids = np.array([c.id for c in comms.values()], np.uint64)
            where = owner(ids, self.shards).tolist()
            takes = []
            for s in range(self.shards):
                part = {i: c for (i, c), o in zip(comms.items(), where, strict=True) if o == s}
                t = take_windows(sent, part, pool)
                assert list(t.coll) == sorted(t.coll) and list(t.p2p) == sorted(t.p2p)  # index order
                self.took[s] += bool(t.coll or t.p2p)
                self.stalled_ops += t.stalled_ops
                self.peers_shipped += len(t.peers)
                takes.append(_ship(t))
            metas = {i: _Meta(c) for i, c in comms.items()}
            out = judge.judge_taken(ranks, metas, sent, takes)
            self.peers_read += len(judge.peers_read)
            join_peers(comms, judge.peers_read)  # where the communicators are
            return out

        judge.judge = split


def _same_ticks(plain: _Ticks, split: _Split) -> None:
    """The same diagnoses at every tick, and the judges and communicators left alike: the rows
    counted and kept, and each PEER table in the same parts (``join_peers``: they set what a
    full table lets go)."""
    assert len(plain.per_tick) == len(split.per_tick)
    for k, (a, b) in enumerate(zip(plain.per_tick, split.per_tick, strict=True)):
        assert a == b, f"tick {k}"
    p, s = plain._slow, split._slow
    judged = ("next_window", "stall_from", "stalled", "stalled_ops", "late_ops", "slow_ranks", "first_seen")
    assert [getattr(p, k) for k in judged] == [getattr(s, k) for k in judged]
    assert plain.comms.keys() == split.comms.keys()
    for i, c in plain.comms.items():
        d = split.comms[i]
        assert [len(x) for x in c.peer_rows] == [len(x) for x in d.peer_rows], i
        assert sum(map(len, c.pending)) == sum(map(len, d.pending)), i
        assert sum(map(len, c.p2p_pending)) == sum(map(len, d.p2p_pending)), i


PP = dict(tp=2, pp=2, dp=4, ranks_per_node=4, skew_ms=50.0, period_s=1)
PIPE = dict(tp=1, pp=4, dp=1, ranks_per_node=1, skew_ms=50.0, period_s=1)
LOCATE = dict(tp=1, pp=1, dp=8, ranks_per_node=4, skew_ms=20.0, period_s=1, peer_intra=False)
JOBS = {
    # a rank's ring links set its DP ring's pace (PEER: pace_setters)
    "comm-slow-rank": Job(**PP, steps=120, faults=[Fault("comm-slow", rank=5, step=40, factor=3.0)]),
    # one ring, slow from its first step: against its other network links (PEER: link_wire)
    "comm-slow-alone": Job(**LOCATE, steps=160, faults=[Fault("comm-slow", rank=4, step=0, factor=3.0)]),
    "noncomm-slow": Job(**PP, steps=120, faults=[Fault("noncomm-slow", rank=9, step=40, factor=3.0)]),
    # p2p rows only: the stages against their own pace
    "own-pace": Job(**PIPE, steps=160, faults=[Fault("noncomm-slow", rank=1, step=60, factor=3.0)]),
    # a hang: its windows dropped as a stall's while the rest of the job runs on
    "noncomm-hang": Job(**PP, steps=120, faults=[Fault("noncomm-hang", rank=6, step=40)]),
}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_job_judged_from_two_shards_takes_gives_the_plain_engines_diagnoses(name):
    job = JOBS[name]
    model, batches = build_cached(job)
    plain = replay(job, _Ticks, batches, model).engine
    split = replay(job, _Split, batches, model).engine
    _same_ticks(plain, split)
    said = {d["kind"] for t in plain.per_tick for d in t}
    if name == "noncomm-hang":
        assert DiagKind.RankNonCommHang.value in said and split.stalled_ops > 0
    else:
        assert said & {DiagKind.RankCommSlow.value, DiagKind.RankNonCommSlow.value}, said
    if name.startswith("comm-slow"):  # the PEER evidence came from the takes
        assert split.peers_shipped and split.peers_read
    if len(split.comms) > 1:
        assert all(split.took), split.took  # both shards had rows to give


SLOW_GOLDEN = [n for n in sorted(make_golden.CASES) if "slow" in n or n == "noncomm-hang-busy-host"]


@pytest.mark.parametrize("name", SLOW_GOLDEN)
def test_a_golden_trace_judged_from_two_shards_takes_gives_the_plain_engines_diagnoses(name, tmp_path):
    path = tmp_path / f"{name}.c4d"
    with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    rt = trace.read_raw(path)
    plain, split = _Ticks(EngineConfig.from_env()), _Split(EngineConfig.from_env())  # as make_engine
    for eng in (plain, split):
        analyze.replay(rt, eng)
    assert any(plain.per_tick)
    _same_ticks(plain, split)
    assert all(split.took), split.took


def test_a_plan_and_a_take_sent_through_pickle_give_the_same_findings():
    """At each window close of a slow job, the take judged as it was and as it arrives from
    another process (copied arrays, the same dtypes and bytes): the same findings, and the two
    judges left in the same state."""
    job = JOBS["comm-slow-rank"]
    model, batches = build_cached(job)
    eng = Engine()
    judge = eng._slow
    closes = found = 0

    def both(ranks, comms, th, now, oldest_wait=None, pool=None):
        nonlocal closes, found
        plan = judge.plan(ranks, th, now, oldest_wait)
        t = take_windows(plan, comms, pool)
        plan2, t2 = _ship(plan), _ship(t)
        assert isinstance(plan2, WindowPlan) and isinstance(t2, Taken) and plan2 == plan
        assert (t2.stalled_ops, t2.late_ops) == (t.stalled_ops, t.late_ops)
        for a, b in ((t.coll, t2.coll), (t.p2p, t2.p2p), (t.peers, t2.peers)):
            assert list(a) == list(b)
            for i in a:
                xs, ys = (a[i], b[i]) if isinstance(a[i], tuple) else ((a[i],), (b[i],))
                for x, y in zip(xs, ys, strict=True):
                    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
                    assert not np.shares_memory(x, y)
        twin = copy.deepcopy(judge)
        out = judge.judge_taken(ranks, comms, plan, [t])
        out2 = twin.judge_taken(ranks, comms, plan2, [t2])
        key = [(f.kind, f.comm.idx, f.op, f.seq, f.ranks, f.loc, f.detail) for f in out]
        assert key == [(f.kind, f.comm.idx, f.op, f.seq, f.ranks, f.loc, f.detail) for f in out2]
        assert judge.peers_read == twin.peers_read and judge.slow_ranks == twin.slow_ranks
        assert judge.next_window == twin.next_window and judge.late_ops == twin.late_ops
        join_peers(comms, judge.peers_read)
        closes += bool(t.coll)
        found += len(out)
        return out

    judge.judge = both
    replay(job, lambda: eng, batches, model)
    assert closes >= 3 and found, (closes, found)


def test_one_communicators_rows_in_two_takes_is_refused():
    plan = WindowPlan(closed=3, P=10**9, stall_from=None, stalled=(), next_window=None)
    rows = np.zeros(0, np.int64)
    a, b = Taken(p2p={7: (rows, rows)}), Taken(p2p={7: (rows, rows)})
    eng = Engine()
    with pytest.raises(ValueError, match="two takes"):
        eng._slow.judge_taken(eng.ranks, {}, plan, [a, b])
