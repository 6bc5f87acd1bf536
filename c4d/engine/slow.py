"""Slow kinds, judged per check window (C4D_CONN_BW_CHECK_PERIOD) from complete collectives.

Each complete op (C, k) was reduced (reduce.reduce_comms) to: last arrival L (aligned),
margin = L - next-to-last arrival, the last arriver's compute gap before the op and the
others' median gap, transfer = median end - L, and busbw. Window w holds the ops whose L
falls in [w·P, (w+1)·P) (master clock); it is judged ``slow_grace_ms`` after it closed.

RankNonCommSlow (per comm, then merged per rank): each member's compute before op (C, k) is
its compute since its op (C, k - 1) (the sum of its gaps in between, any communicator); a
member whose median compute in the window exceeds the others' by
``max(slow_arrival_min_ms, slow_arrival_rel x theirs)``, consistently (``slow_last_frac`` of
the ops), makes them wait: it is slow. A victim of a cascade has a normal compute.

RankCommSlow (per comm): the median busbw of C's most frequent (op, bytes) in the window,
against its siblings, the other communicators with the same op, size, rank count and node
span in the same window (at least two), else against C's own baseline, the median of up
to ``slow_baseline_windows`` earlier windows that were not slow. Slow when below
``slow_bw_ratio`` of that reference. A slowdown every sibling shares is not a rank's.
Rank or link: hypotheses checked against every unit of the window (blame.py), narrowed by
PEER pace setters (peer.localize_slow); docs/engine.md has the rules.

A tick's judging comes in three parts, so that an engine sharded by communicator can take the
rows where the communicators are and judge them where the judge's state is
(docs/engine-shards.md): ``SlowJudge.plan`` (the windows that may be judged, the stalls),
``take_windows`` (each communicator's rows of those windows and the PEER rows of its collectives
taken: a ``Taken``), ``SlowJudge.judge_taken`` (the windows across communicators); ``judge`` is
the three in one engine.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from c4d.engine import blame
from c4d.engine.calibration import localize
from c4d.engine.comm import Comm
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.expected import link_class
from c4d.engine.own_pace import OwnPace
from c4d.engine.peer import link_wire, pace_setters
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.rows import COMPLETED, cat, row_nanmedian, take
from c4d.engine.types import DiagKind, How, Localization, Target
from c4d.engine.wait_view import join_peers
from c4d.record import schema
from c4d.record.schema import Op


@dataclass
class SlowFinding:
    kind: DiagKind
    comm: CommMeta  # the communicator reported against (one engine's: a Comm)
    op: int
    seq: int
    ranks: tuple[int, ...]
    loc: Localization
    detail: dict[str, Any] = field(default_factory=dict)


def _subset(rows: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``take(rows, mask)``, no copy when every row is kept (the common case: a window's rows of
    a large job are large, and each copy of them would be held to the window's end)."""
    return rows if mask.all() else take(rows, mask)


@dataclass(frozen=True)
class WindowPlan:
    """What taking a tick's closed-window rows needs of the judge (``SlowJudge.plan``): plain
    values, so the taking can run where the communicators are (docs/engine-shards.md)."""

    closed: int  # the last window that may be judged
    P: int  # the window's length (ns)
    stall_from: int | None  # first window of the stall in progress
    stalled: tuple[tuple[int, int], ...]  # windows [a, b] of ended stalls, not judged
    next_window: int | None  # the first window not judged yet (earlier ones' rows are late)


@dataclass
class Taken:
    """The rows ``take_windows`` took from some communicators at one tick, by comm index in the
    order taken: all the window judging reads of them (``SlowJudge.judge_taken``)."""

    coll: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)  # ops, gaps, win
    p2p: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # ops, win
    # PEER rows that finished a transfer of the collectives taken (pace_setters, link_wire)
    peers: dict[int, np.ndarray] = field(default_factory=dict)
    stalled_ops: int = 0  # rows dropped as a stall's
    late_ops: int = 0  # rows whose window was judged already


class CommMeta(Protocol):
    """What the window judging reads of a communicator (a ``Comm`` has it): its index, id, size
    and members' global ranks (-1: not known)."""

    idx: int
    id: int
    n: int
    grank: np.ndarray


def take_windows(plan: WindowPlan, comms: Mapping[int, Comm], pool: Pool | None = None) -> Taken:
    """The rows of windows ``plan`` lets be judged, taken from ``comms`` (the communicators kept
    where this runs: a shard's), with no judge's state: what ``SlowJudge.judge`` does where the
    communicators are. ``pool``: the one that holds ``comms`` (None: every one is looked at)."""
    closed, P = plan.closed, plan.P
    got = Taken()
    # only the communicators keeping rows of a window that may now be judged (the pool knows
    # every one's earliest), in index order
    if pool is None:
        due = list(comms.values())
    else:
        due = [comms[i] for i in pool.due((closed + 1) * P).tolist() if i in comms]
    if pool is not None and due:  # a window closed: the node summaries to their communicators
        pool.settle()
    for c in due:
        coll = _take_coll(c, plan, got)
        if coll is not None:
            got.coll[c.idx] = coll
            peers = _finished_peers(c, coll[0]["seq"])
            if peers is not None:
                got.peers[c.idx] = peers
        p2p = _take_p2p(c, plan, got)
        if p2p is not None:
            got.p2p[c.idx] = p2p
    return got


def _finished_peers(c: Comm, seqs: np.ndarray) -> np.ndarray | None:
    """``c``'s PEER rows that finished a transfer of an op in ``seqs``' range (a superset of what
    ``peer._finished`` keeps of any subset of ``seqs``, in the same order); None when it has
    none. Its parts joined into a copy, not in place (``wait_view.join_peers``): one pass over the
    joined rows, not one per part (dozens a window: five times slower)."""
    if not c.peer_rows or not len(seqs):
        return None
    s = seqs.astype(np.int64)
    lo, hi = int(s.min()), int(s.max())
    tab = cat(c.peer_rows) if len(c.peer_rows) > 1 else c.peer_rows[0]
    q = tab["seq"].astype(np.int64)
    return tab[(q >= lo) & (q <= hi) & (tab["done"] > 0)]


def _usable(ops: np.ndarray, win: np.ndarray, plan: WindowPlan, got: Taken) -> np.ndarray:
    """Which taken rows a window may judge: not reduced before the members' clocks were known,
    not of windows a stall covers, not late (their window was judged) (the stalled and late
    ones counted in ``got``)."""
    stalled = np.zeros(len(win), bool)
    if plan.stall_from is not None:
        stalled |= win >= plan.stall_from
    for a, b in plan.stalled:
        stalled |= (win >= a) & (win <= b)
    got.stalled_ops += int(stalled.sum())
    use = ops["aligned"] & ~stalled
    if plan.next_window is not None:
        late = use & (win < plan.next_window)
        got.late_ops += int(late.sum())
        use &= ~late
    return use


def _take_coll(c: Comm, plan: WindowPlan, got: Taken) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Take c's COMPLETED rows (their members' gaps, their windows) of windows that may now be judged."""
    rows = c.take_closed(plan.closed, plan.P)
    if rows is None:
        return None
    ops, gaps, win = rows
    use = _usable(ops, win, plan, got)
    if not use.any():
        return None
    if use.all():
        return ops, gaps, win
    return take(ops, use), gaps[use], win[use]


def _take_p2p(c: Comm, plan: WindowPlan, got: Taken) -> tuple[np.ndarray, np.ndarray] | None:
    """Take c's P2P_DONE rows (and their windows) of windows that may now be judged."""
    rows = c.take_closed_p2p(plan.closed, plan.P)
    if rows is None:
        return None
    ops, win = rows
    use = _usable(ops, win, plan, got)
    if not use.any():
        return None
    return (ops, win) if use.all() else (take(ops, use), win[use])


def _merge(into: dict[int, Any], part: dict[int, Any]) -> None:
    """One take's rows into a tick's: a communicator is one shard's, its rows in one take."""
    if not into.keys().isdisjoint(part):
        raise ValueError("a communicator's rows in two takes")
    into.update(part)


class _PeerRows:
    """A communicator's PEER rows as taken (``Taken.peers``), where ``peer.pace_setters`` and
    ``peer.link_wire`` read ``Comm.peer_table``."""

    __slots__ = ("rows",)

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def peer_table(self) -> np.ndarray:
        return self.rows


class _Peers:
    """The PEER rows of a tick's takes, per comm index; which ones the windows read
    (``wait_view.join_peers``)."""

    def __init__(self, rows: dict[int, np.ndarray]) -> None:
        self.rows = rows
        self.read: dict[int, None] = {}

    def of(self, i: int) -> _PeerRows:
        self.read[i] = None
        got = self.rows.get(i)
        return _PeerRows(got if got is not None else np.empty(0, schema.PEER))


class SlowJudge:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.next_window: int | None = None
        self.baseline: dict[tuple, deque[float]] = {}  # unit base key -> clean windows' bw
        self.slow_ranks: dict[int, int] = {}  # global rank -> last window it was reported slow in
        self.named_at: dict[blame.Hyp, int] = {}  # rank, link or node -> last window named RankCommSlow
        self.named_from: dict[blame.Hyp, set[tuple]] = {}  # ... -> the unit keys that named it
        self.evidence = blame.Evidence(cfg.model_memory)  # what earlier windows said, per slow unit
        self.slow_units: dict[tuple, int] = {}  # unit key -> last window it was slow in
        self.unit_shapes: dict[tuple, blame.UnitShape] = {}  # unit key -> its latest shape and state
        self.first_seen: dict[tuple, int] = {}  # unit key -> the first window it had enough ops in
        # the last two windows a unit was below the degraded line / a rank's compute stood out in
        self.low: dict[tuple, tuple[int, int]] = {}
        self.noncomm_low: dict[int, tuple[int, int]] = {}
        self.late_ops = 0  # ops that completed after their window was judged
        self.own = OwnPace(cfg)  # ranks no collective compares with others (own_pace.py)
        self.expected = cfg.expected_busbw
        # A window waits while a wait that began before it closed is still in progress (its
        # ops may yet turn out to be a stall's). A stall (a wait longer than min(T, period), a
        # hang in the making): the windows it covers are dropped, each as it closes while the
        # stall lasts and the rest up to the one it ends in when it ends. Their ops ran while
        # the rest of the job blocked, then caught up; their pace says nothing of a rank
        # (bystanders would be named RankCommSlow). Windows are let go as they close, not held
        # to the stall's end: a hang of one TP group while the rest of the job goes on would
        # keep every row of the job.
        self.stall_from: int | None = None  # first window of the stall in progress
        self.stalled: list[tuple[int, int]] = []  # windows [a, b] of ended stalls, not judged
        self.stalled_ops = 0
        self.peers_read: tuple[int, ...] = ()  # comm indices whose PEER rows the last judging read

    def forget(self, comm_idx: list[int]) -> None:
        """Drop the state of freed communicators (unit keys carry the comm index second)."""
        gone = set(comm_idx)
        dicts: tuple[dict, ...] = (self.baseline, self.slow_units,
                                   self.unit_shapes, self.first_seen,
                                   self.low)  # fmt: skip
        for d in dicts:
            for key in [k for k in d if len(k) > 1 and k[1] in gone]:
                del d[key]

    def plan(
        self, ranks: RankTable, th: ResolvedThresholds, now: int, oldest_wait: int | None = None
    ) -> WindowPlan:
        """The first half of ``judge``, before any communicator is looked at: the last window
        that may be judged and the stall bookkeeping, as what ``take_windows`` needs."""
        P = th.period_ns
        grace = int(self.cfg.slow_grace_ms * 1e6)
        # last window that may be judged: records of its last ops must be in, later by the
        # delivery lag when the master falls behind
        closed = (now - grace - ranks.delivery_lag_ns) // P - 1
        waited = now - oldest_wait if oldest_wait is not None else 0
        since = (oldest_wait or 0) // P  # the window the oldest wait began in
        stalling = waited > min(th.hang_timeout_ns, P)
        if waited > grace and not stalling:  # a wait since before a window closed: it may be a stall's
            closed = min(closed, since - 1)
        if stalling:
            self.stall_from = since if self.stall_from is None else min(self.stall_from, since)
        elif self.stall_from is not None:
            self.stalled.append((self.stall_from, now // P))
            self.stall_from = None
        if self.next_window is not None:
            self.stalled = [(a, b) for a, b in self.stalled if b >= self.next_window]
        return self._plan_at(int(closed), int(P))

    def _plan_at(self, closed: int, P: int) -> WindowPlan:
        """The judge's stall state as plain values, for a take up to window ``closed``."""
        return WindowPlan(
            closed, P, None if self.stall_from is None else int(self.stall_from),
            tuple((int(a), int(b)) for a, b in self.stalled),
            None if self.next_window is None else int(self.next_window),
        )  # fmt: skip

    def judge(
        self,
        ranks: RankTable,
        comms: dict[int, Comm],
        th: ResolvedThresholds,
        now: int,
        oldest_wait: int | None = None,
        pool: Pool | None = None,
    ) -> list[SlowFinding]:
        """The windows that closed by ``now``: ``plan``, ``take_windows`` of every communicator,
        ``judge_taken`` (one engine: the communicators are here)."""
        plan = self.plan(ranks, th, now, oldest_wait)
        out = self.judge_taken(ranks, comms, plan, [take_windows(plan, comms, pool)])
        join_peers(comms, self.peers_read)
        return out

    def judge_taken(
        self, ranks: RankTable, metas: Mapping[int, CommMeta], plan: WindowPlan, takes: list[Taken]
    ) -> list[SlowFinding]:
        """The second half of ``judge``: the windows of the rows ``takes`` hold (one per shard,
        each communicator in one), judged across communicators. ``metas``: each communicator's
        index, id, size and members (``CommMeta``; the findings carry them); nothing else of a
        communicator is read. ``peers_read`` says afterwards whose PEER rows were read."""
        closed, P = plan.closed, plan.P
        # per communicator its rows taken, (its members' compute,) each row's window, in index
        # order (one engine's: Pool.due's)
        per_comm: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        per_p2p: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        peer_rows: dict[int, np.ndarray] = {}
        for t in takes:
            _merge(per_comm, t.coll)
            _merge(per_p2p, t.p2p)
            _merge(peer_rows, t.peers)
            self.stalled_ops += t.stalled_ops
            self.late_ops += t.late_ops
        if len(takes) > 1:
            per_comm, per_p2p = dict(sorted(per_comm.items())), dict(sorted(per_p2p.items()))
        peers = _Peers(peer_rows)
        out: list[SlowFinding] = []
        # the windows the taken rows are of (each communicator's span a window or two: a
        # np.unique of every row, 2.5 M at 16,384 ranks, was most of the judge's own time; the
        # windows as taken: a read of a field of every kept row is a pass over all their bytes)
        wins = set(self.own.windows(closed))
        for win in [x[-1] for x in per_comm.values()] + [x[-1] for x in per_p2p.values()]:
            lo, hi = int(win.min()), int(win.max())
            wins.update((lo, hi) if hi - lo <= 1 else np.unique(win).tolist())
        if wins:
            for w in sorted(wins):
                if self._in_stall(w):
                    self.own.drop(int(w))  # its collectives and p2p rows were dropped too (_usable)
                sel, gaps = {}, {}
                for i, (o, g, win) in per_comm.items():
                    m = win == w
                    if m.any():  # one window closed is the common case: no copy (_subset)
                        sel[i], gaps[i] = _subset(o, m), (g if m.all() else g[m])
                sel_p2p = {}
                for i, (o, win) in per_p2p.items():
                    m = win == w
                    if m.any():
                        sel_p2p[i] = _subset(o, m)
                out += self._window(ranks, metas, sel, gaps, sel_p2p, int(w), P, peers)
        if closed >= (self.next_window if self.next_window is not None else closed):
            self.next_window = int(closed) + 1
        self.peers_read = tuple(peers.read)
        return out

    def _in_stall(self, w: int) -> bool:
        """Does a stall, ended or in progress, cover window ``w``?"""
        in_progress = self.stall_from is not None and w >= self.stall_from
        return in_progress or any(a <= w <= b for a, b in self.stalled)

    # -- one window --------------------------------------------------------------------
    def _window(
        self,
        ranks: RankTable,
        comms: Mapping[int, CommMeta],
        sel: dict[int, np.ndarray],
        gaps: dict[int, np.ndarray],
        sel_p2p: dict[int, np.ndarray],
        w: int,
        P: int,
        peers: _Peers,
    ) -> list[SlowFinding]:
        win = {"window_start_s": round(w * P / 1e9, 3), "window_s": round(P / 1e9, 3)}
        out = self._noncomm_slow(comms, sel, gaps, w, win)
        out += self._own_pace(comms, sel, sel_p2p, ranks, w, win)
        out += self._comm_slow(ranks, comms, sel, sel_p2p, w, win, peers)
        self.evidence.close_window()
        return out

    def _own_pace(self, comms, sel, sel_p2p, ranks: RankTable, w: int, win: dict) -> list[SlowFinding]:
        """RankNonCommSlow of ranks that no collective of the window compares with others: each
        against its own earlier windows (own_pace.py)."""
        covered: set[int] = set()
        for i, o in sel.items():
            c = comms[i]
            if c.n >= 2 and len(o) >= self.cfg.slow_min_ops:
                covered.update(int(g) for g in c.grank if g >= 0)
        out = []
        for f in self.own.judge(w, covered):
            where = self._busiest_comm(f.rank, comms, sel, sel_p2p, ranks)
            if where is None:
                continue
            c, op, seq = where
            self.slow_ranks[f.rank] = w
            d: dict[str, Any] = {
                "gap_ms": f.mean_ms, "own_baseline_ms": f.baseline_ms, "own_ratio": f.ratio,
                "shared_ratio": f.shared, "ops": f.ops, **win,
            }  # fmt: skip
            loc = localize(
                DiagKind.RankNonCommSlow, How.arrival, Target.rank, (f.rank,),
                f"rank {f.rank} computes {f.ratio}x as long per op as in its own earlier windows "
                f"({f.mean_ms} ms, was {f.baseline_ms} ms); no collective compares it with other ranks",
                refine="own-pace",
            )  # fmt: skip
            out.append(SlowFinding(DiagKind.RankNonCommSlow, c, op, seq, (f.rank,), loc, d))
        return out

    @staticmethod
    def _busiest_comm(g: int, comms, sel, sel_p2p, ranks: RankTable) -> tuple[CommMeta, int, int] | None:
        """The communicator, op and latest seq a rank's finding is reported against: the one
        where it had the most of the window's p2p transfers, else collectives."""
        best: tuple[int, CommMeta, int, int] | None = None
        for i, cr in ranks.comms_of[g] if g < len(ranks.comms_of) else ():
            c = comms.get(i)
            if c is None or c.n < 2:
                continue
            p = sel_p2p.get(i)
            if p is not None:
                mine = (p["src"] == cr) | (p["dst"] == cr)
                if mine.any() and (best is None or int(mine.sum()) > best[0]):
                    best = (int(mine.sum()), c, int(Op.Send), int(p["seq"][mine][-1]))
            o = sel.get(i)
            if o is not None and len(o) and (best is None or len(o) > best[0]):
                best = (len(o), c, int(np.bincount(o["op"]).argmax()), int(o["seq"][-1]))
        return None if best is None else best[1:]

    # -- RankNonCommSlow ---------------------------------------------------------------
    def _noncomm_slow(
        self,
        comms: Mapping[int, CommMeta],
        sel: dict[int, np.ndarray],
        gaps: dict[int, np.ndarray],
        w: int,
        win: dict,
    ) -> list[SlowFinding]:
        """A member whose own compute before C's ops (its compute gap: arrival minus the end of
        its previous synchronizing op) is longer than the other members' in most of the
        window's ops, by at least max(slow_arrival_min_ms, slow_arrival_rel x their gap): the
        others wait that long for it. Victims of a cascade arrive late with a normal gap."""
        cfg = self.cfg
        found: dict[int, list[tuple[CommMeta, float, dict[str, Any], np.ndarray]]] = {}
        # below, a member stands out in an op by half its need, need >= slow_arrival_min_ms
        calm_ns = cfg.slow_arrival_min_ms * 1e6 / 2
        calm_share = min(cfg.slow_stood_out_share, cfg.slow_last_frac)
        for i, o in sel.items():
            c = comms[i]
            if c.n < 2 or len(o) < cfg.slow_min_ops:
                continue
            if _calm(gaps[i], calm_ns, calm_share):
                continue
            # float32 as kept (medians sort them so and average in float64: the same values,
            # half the bytes to sort); differences with float64 medians are float64
            G = gaps[i]
            med = _col_nanmedian(G)  # per member, over the window's ops
            others = _others_median(med)
            need = np.maximum(cfg.slow_arrival_min_ms * 1e6, cfg.slow_arrival_rel * np.nan_to_num(others))
            fin = med[np.isfinite(med)]
            if len(fin) >= 4:
                # many members: one of them is high by chance; a slow rank stands out from the
                # members' own spread as well (4 robust standard deviations)
                spread = 1.4826 * float(_median(np.abs(fin - _median(fin))))
                need = np.maximum(need, 4 * spread)
            excess = med - others
            op_med = row_nanmedian(G)
            # Each member's share of ops in which it computes clearly longer than that op's
            # median. One window can make one of many members look slow by chance on a busy
            # host, so a finding needs the rank to have stood out in the window before too
            # (in a third of its ops at least: the window the fault began in counts), unless
            # it is strong now (nearly every op, twice the margin).
            valid = np.isfinite(G) & np.isfinite(op_med)[:, None]
            above = np.where(valid, G - op_med[:, None] >= need[None, :] / 2, False)
            nvalid = _col_count(valid)
            shares = np.where(nvalid > 0, _col_count(above) / np.maximum(nvalid, 1), 0.0)
            for r in np.flatnonzero(shares >= cfg.slow_stood_out_share).tolist():
                if c.grank[r] >= 0:
                    g = int(c.grank[r])
                    latest = self.noncomm_low.get(g, (-9, -9))[0]
                    if latest != w:
                        self.noncomm_low[g] = (w, latest)
            cand = np.flatnonzero((excess >= need) & np.isfinite(med) & np.isfinite(others))
            for r in cand.tolist():
                share = float(shares[r])
                if nvalid[r] < cfg.slow_min_ops or share < cfg.slow_last_frac or c.grank[r] < 0:
                    continue
                g = int(c.grank[r])
                before = self.noncomm_low.get(g, (-9, -9))[1]
                strong = share >= 0.9 and excess[r] >= 2 * need[r]
                if not strong and before != w - 1:
                    continue
                last = o["last"] == r
                d: dict[str, Any] = {
                    "gap_ms": round(float(med[r]) / 1e6, 3),
                    "others_gap_ms": round(float(others[r]) / 1e6, 3),
                    "excess_ms": round(float(excess[r]) / 1e6, 3),
                    "late_share": round(share, 3),
                    "last_share": round(float(last.mean()), 3),
                    "others_wait_ms": round(float(_median(o["wait_med"][last])) / 1e6, 3)
                    if last.any()
                    else None,
                }
                found.setdefault(int(c.grank[r]), []).append((c, share, d, o))
        out: list[SlowFinding] = []
        for g, items in sorted(found.items()):
            items.sort(key=lambda x: (-x[1], x[0].idx))
            c, share, d, o = items[0]
            d = {**d, "comms": [f"{x.id:016x}" for x, _, _, _ in items], **win}
            self.slow_ranks[g] = w
            loc = localize(
                DiagKind.RankNonCommSlow, How.arrival, Target.rank, (g,),
                f"rank {g} computes {d['excess_ms']} ms longer than the others before {share:.0%} of "
                "their collectives: they wait for it",
                prior=share, refine="" if len(items) > 1 or c.n > 2 else "two-rank",
            )  # fmt: skip
            op = int(np.bincount(o["op"]).argmax())
            out.append(SlowFinding(DiagKind.RankNonCommSlow, c, op, int(o["seq"][-1]), (g,), loc, d))
        return out

    # -- RankCommSlow ------------------------------------------------------------------
    def _units(self, ranks: RankTable, comms: Mapping[int, CommMeta], sel, sel_p2p) -> list[_Unit]:
        """What can be slow in a window: communicators and p2p links. A communicator gives one
        candidate per collective (op, size) it ran often enough, all with its unit key; the
        judge keeps one per communicator (``_main``) once their references are known."""
        cfg = self.cfg
        units: list[_Unit] = []
        for i, o in sorted(sel.items()):
            c = comms[i]
            if c.n < 2:
                continue
            o = _subset(o, np.isfinite(o["busbw"]))  # an end before the last arrival is timer noise
            if len(o) < cfg.slow_min_ops:
                continue
            keys = o["op"].astype(np.int64) * (1 << 48) + o["bytes"]
            uk, cnt = np.unique(keys, return_counts=True)
            members = tuple(sorted(int(g) for g in c.grank if g >= 0))
            span = len(set(ranks.node[c.grank[c.grank >= 0]].tolist()))
            links = blame.ring_links([int(g) for g in c.grank if g >= 0])
            for k in uk[cnt >= cfg.slow_min_ops].tolist():
                om = _subset(o, keys == k)
                op, nb = int(om["op"][0]), int(om["bytes"][0])
                units.append(
                    _Unit(("c", i), i, members, float(_median(om["busbw"])), ("c", op, nb, c.n, span),
                          ("c", i, op, nb), op, int(om["seq"][-1]), om, om["busbw"], links=links,
                          expected=self._expected_at(span, op, nb, c.n))
                )  # fmt: skip
        min_p2p = cfg.slow_p2p_min_ops_factor * cfg.slow_min_ops
        for i, a, b, nb, bw, seq, bws in p2p_links_many(sorted(sel_p2p.items()), min_p2p):
            c = comms[i]
            ga, gb = int(c.grank[a]), int(c.grank[b])
            if ga < 0 or gb < 0:
                continue
            span = 1 if ranks.node[ga] == ranks.node[gb] else 2
            units.append(
                _Unit(("p", i, min(a, b), max(a, b)), i, tuple(sorted((ga, gb))), bw,
                      ("p", c.n, a, b, nb, span), ("p", i, a, b, nb), int(Op.Send),
                      seq, None, bws, link=(ga, gb), links={blame.link_of(ga, gb)},
                      expected=self._expected_at(span, int(Op.Send), nb, 2))
            )  # fmt: skip
        return units

    def _links_ratio(
        self, comms: Mapping[int, CommMeta], u: _Unit, ranks: RankTable, peers: _Peers
    ) -> float | None:
        """A collective unit's network links against each other in this window: the median of
        the others' per-step wire times over the slowest one's (below 1: that link is slower);
        None without two network links measured in ``slow_min_ops`` ops each, or for a unit that
        has siblings (siblings that are no reference leave it to its own past, as before)."""
        if u.ops is None or u.link is not None or not u.alone:
            return None
        c = comms[u.comm]
        node = ranks.node
        net = []
        for (a, b), (t, n) in link_wire(peers.of(u.comm), u.ops["seq"]).items():
            ga, gb = int(c.grank[a]), int(c.grank[b])
            if n >= self.cfg.slow_min_ops and ga >= 0 and gb >= 0 and node[ga] != node[gb]:
                net.append(t)
        if len(net) < 2:  # each a median of positive wire times (link_wire)
            return None
        net.sort()
        return float(_median(net[:-1])) / net[-1]

    def _expected_at(self, span: int, op: int, nbytes: int, n: int) -> float | None:
        if self.expected is None:
            return None
        return self.expected.at(link_class(span), op, nbytes, n)

    def _comm_slow(self, ranks, comms, sel, sel_p2p, w: int, win: dict, peers: _Peers) -> list[SlowFinding]:
        cfg = self.cfg
        # A unit's first window is start-up (processes still launching, a partial window): it
        # is not judged, only remembered as a baseline (a single communicator has nothing else
        # to be compared with).
        units, starting = [], []
        for u in self._units(ranks, comms, sel, sel_p2p):
            if self.first_seen.setdefault(u.key, w) < w:
                units.append(u)
            else:
                starting.append(u)
                self.baseline.setdefault(u.base_key, deque(maxlen=cfg.slow_baseline_windows)).append(u.bw)
        for u in starting:  # known, not judged yet: a rank's verdict may wait for it (_localize)
            if u.key not in self.unit_shapes:
                nodes = {int(g): int(ranks.node[g]) for g in u.members}
                self.unit_shapes[u.key] = blame.shape(u.key, u.members, u.links, nodes)
        # Reference per unit: its siblings (same shape, same op and size, other ranks) in this
        # window, else its own earlier clean windows. A shift every sibling shares is the
        # network's or the host's, not a rank's; against own baselines the same guard is the
        # job-wide median ratio (a loaded host slows every communicator at once).
        sib: dict[tuple, list[_Unit]] = {}
        for u in units:
            sib.setdefault(u.sib_key, []).append(u)
        for group in sib.values():
            bw = np.array([x.bw for x in group], dtype=np.float64)
            if np.isfinite(bw).all():
                refs = _medians_of_others(bw).tolist()
            else:  # NaN in np.median propagates; _medians_of_others assumes finite values
                refs = [float(_median(np.delete(bw, j))) for j in range(len(bw))]
            for member, ref in zip(group, refs, strict=True):
                member.sib_ref = ref if len(group) > 1 else None
                member.alone = len(group) == 1
        for u in units:
            q = self.baseline.get(u.base_key)
            u.own_ref = float(_median(q)) if q else None
        units, also = _main(units)
        shared = _shared_slowdown(units, cfg.slow_degraded_ratio)
        for u in units:
            u.shared = shared
            # siblings slowed alike (every ring leaving one node's NIC) would hide each other:
            # a unit whose siblings fell below the degraded line of its own past is judged on that
            if u.sib_ref and u.own_ref and u.sib_ref < cfg.slow_degraded_ratio * u.own_ref * shared:
                u.sib_ref = None
        slow: dict[tuple, _Unit] = {}  # by unit key: a p2p link is slow when either direction is
        for u in units:
            if u.sib_ref:
                u.ratio, u.compared = u.bw / u.sib_ref, "siblings"
            elif u.expected and (not u.own_ref or u.own_ref < cfg.slow_degraded_ratio * u.expected):
                # no clean past of its own (slow from the first step, or too new): the busbw
                # healthy communicators of its link class reach at its size
                u.ratio, u.compared = u.bw / u.expected, "expected"
            elif (lk := self._links_ratio(comms, u, ranks, peers)) is not None and lk < cfg.slow_bw_ratio:
                # no siblings, no expected busbw: a ring one of whose network links moves its
                # steps far slower than its other network links goes at that link's pace (its
                # own past is no reference when the fault was there from its first step)
                u.ratio, u.compared, u.link_ref = lk, "network links", u.bw / lk
            elif u.own_ref:
                u.ratio, u.compared = u.bw / u.own_ref / max(shared, 1e-9), "own baseline"
            if u.ratio is not None and u.ratio < cfg.slow_degraded_ratio:
                self._low_now(u.key, w)
            if u.ratio is not None and u.ratio < cfg.slow_bw_ratio:
                # most of its ops are slow, not a median a few outliers pulled down (a busy host
                # stretches single transfers)
                most = u.slow_share(cfg.slow_bw_ratio) >= cfg.slow_ops_share
                if most and u.link is not None:
                    # a p2p link's few measured transfers are noisy on a busy host: it is slow
                    # when it was below the degraded line in the window before too, or when
                    # nearly all its transfers are well below the line now
                    most = self._strong(u) or self._low_before(u.key, w)
                if most and (u.key not in slow or u.ratio < (slow[u.key].ratio or 0)):
                    slow[u.key] = u
            else:  # its communicator's other collectives too: a clean window for every size
                for x in (u, *also.get(id(u), ())):
                    q = self.baseline.setdefault(x.base_key, deque(maxlen=cfg.slow_baseline_windows))
                    q.append(x.bw)
        now_units: dict[tuple, _Unit] = {}  # per key, the worse direction of a p2p link
        for u in units:
            x = now_units.get(u.key)
            if x is None or (u.ratio or 9.0) < (x.ratio or 9.0):
                now_units[u.key] = u
        # Each unit's state for blame (blame.py): slow, degraded, clear or unknown. A unit slow
        # in the previous window and not judged in this one (too few ops in a window cut by
        # the job's end) still counts as slow.
        node_of = {int(g): int(ranks.node[g]) for u in units for g in u.members}
        shapes: dict[tuple, blame.UnitShape] = {}
        for key, u in now_units.items():
            st = "unknown"
            if u.ratio is not None:
                if u.ratio < cfg.slow_degraded_ratio:
                    st = "degraded"
                elif u.ratio < cfg.slow_clear_ratio:
                    st = "dim"  # measured between the lines: weak evidence, not a unit to wait for
                elif u.clear(cfg.slow_bw_ratio, cfg.slow_clear_ops_share):
                    st = "clear"
            sh = blame.shape(key, u.members, u.links, node_of)
            sh.state = "slow" if key in slow else st
            sh.ratio = u.ratio if u.ratio is not None else 1.0
            shapes[key] = sh
        # a unit judged against its siblings cannot show a fault that slows them as much
        for group in sib.values():
            judged = [x for x in group if x.compared == "siblings" and x.key in shapes]
            if not judged:
                continue
            in_shapes = [o.key for o in group if o.key in shapes]
            pacing = tuple(shapes[k].pacing for k in in_shapes)
            own = Counter(in_shapes)
            for x in judged:
                shapes[x.key].sib_pacing, shapes[x.key].sib_self = pacing, own[x.key]
        for key, w0 in self.slow_units.items():
            if w0 == w - 1 and key not in shapes and key in self.unit_shapes:
                prev = self.unit_shapes[key]
                shapes[key] = blame.UnitShape(key, prev.members, prev.links, prev.pacing, "slow", prev.ratio)
        for key in slow:
            self.slow_units[key] = w
        self.unit_shapes.update(shapes)
        located: list[tuple[_Unit, dict[str, Any], Localization]] = []
        named = self._named(w)
        for key in sorted(slow):
            u = slow[key]
            d: dict[str, Any] = {
                "busbw_gbs": round(u.bw, 6),
                "baseline_gbs": None if u.own_ref is None else round(u.own_ref, 6),
                "siblings_gbs": None if u.sib_ref is None else round(u.sib_ref, 6),
                **({"expected_gbs": round(u.expected, 6)} if u.compared == "expected" and u.expected else {}),
                "ratio": round(u.ratio or 0.0, 3),
                "compared_with": u.compared,
            }
            loc = self._localize(ranks, comms, u, list(shapes.values()), d, w, peers, named)
            if loc is None:
                continue  # a weak verdict waits for a second window (see _localize)
            located.append((u, d, loc))
        out = []
        for items in _one_per_culprit(located):
            loc = items[0][2]  # the strongest verdict; the worst unit reports it
            u, d, _ = min(items, key=lambda x: (x[1]["ratio"], x[0].key))
            c = comms[u.comm]
            names: list[str] = []
            for x, _, _ in items:
                name = f"{comms[x.comm].id:016x}"
                if name not in names:
                    names.append(name)
            d = {**d, "comms": names, **win}
            if u.link is not None:
                d["p2p_link"] = list(u.link)
            for g in loc.ranks if loc.localized else ():
                self.slow_ranks[g] = w
            h = _hyp_of(loc, ranks)
            if h is not None:
                self.named_at[h] = w
                self.named_from.setdefault(h, set()).update(x.key for x, _, _ in items)
            out.append(SlowFinding(DiagKind.RankCommSlow, c, u.op, u.seq, loc.ranks, loc, d))
        return out

    def _named(self, w: int) -> tuple[blame.Hyp, ...]:
        """The ranks, links and nodes named RankCommSlow in the last ``slow_named_windows`` windows:
        part of every hypothesis (explaining away, blame.py)."""
        keep = {h: w0 for h, w0 in self.named_at.items() if w - w0 <= self.cfg.slow_named_windows}
        self.named_at = keep
        self.named_from = {h: k for h, k in self.named_from.items() if h in keep}
        return tuple(sorted(keep))

    def _strong(self, u: _Unit) -> bool:
        """Slow beyond what a busy host's stretched ops give: far below the line in nearly all
        its ops (a p2p link, or a collective only a weak verdict names, counts in its first
        window only so: _comm_slow, _sure)."""
        line = self.cfg.slow_bw_ratio
        cfg = self.cfg
        return (
            u.ratio is not None
            and u.ratio < cfg.slow_p2p_strong_ratio * line
            and u.slow_share(line) >= cfg.slow_strong_share
        )

    def _sure(self, u: _Unit, w: int) -> bool:
        """A collective named by a weak verdict (exclusion, suspects) as a p2p link is named at
        all (_comm_slow): nearly all its ops far below the line, or its communicator below the
        degraded line the window before too."""
        return u.link is not None or self._strong(u) or self._low_before(u.key, w)

    def _low_now(self, key: tuple, w: int) -> None:
        latest = self.low.get(key, (-9, -9))[0]
        if latest != w:  # (a p2p link's other direction may have been seen in this window already)
            self.low[key] = (w, latest)

    def _low_before(self, key: tuple, w: int) -> bool:
        """Was this unit below the degraded line in the window before ``w``?"""
        latest, before = self.low.get(key, (-9, -9))
        return (latest if latest != w else before) == w - 1

    def _localize(
        self,
        ranks: RankTable,
        comms: Mapping[int, CommMeta],
        u: _Unit,
        shapes: list[blame.UnitShape],
        d: dict[str, Any],
        w: int,
        peers: _Peers,
        named: tuple[blame.Hyp, ...] = (),
    ) -> Localization | None:
        """Rank, link or node behind a slow unit: the evidence model (blame.py) over every unit
        of the window, with PEER pace setters of a ring as units of their own. None: a weak
        verdict (suspects, or a link inside a collective named because every other candidate
        is ruled out) waits for a second window below the line (``_sure``)."""
        cfg = self.cfg
        kind = DiagKind.RankCommSlow
        c = comms[u.comm]
        node_of = {int(g): ranks.known_node(int(g)) for s in shapes for g in s.members}
        node_of.update({int(g): ranks.known_node(int(g)) for g in u.members})
        units = list(shapes)
        seen: set[tuple[int, int]] = set()
        if u.ops is not None and len(u.members) > 2:
            # the ops below the line: an onset window's earlier ops are set by whichever link
            # the jitter of the moment made slowest, not by the fault
            below = u.below(cfg.slow_bw_ratio)
            seqs = u.ops["seq"][below] if below.sum() >= 2 else u.ops["seq"]
            counts, n_ops, seen_cr = pace_setters(peers.of(u.comm), seqs)
            seen_g = {blame.link_of(int(c.grank[a]), int(c.grank[b])) for a, b in seen_cr}
            ring = blame.shape(u.key, u.members, u.links | seen_g, node_of)
            if n_ops >= 2:
                for a, b in sorted(seen_cr):
                    share = counts.get((a, b), 0) / n_ops
                    ga, gb = int(c.grank[a]), int(c.grank[b])
                    lk = blame.link_of(ga, gb)
                    seen.add(lk)
                    st = ("slow" if share >= cfg.peer_slow_share
                          else "clear" if share <= cfg.peer_clear_share else "degraded")  # fmt: skip
                    # a link of the other class than the ring's pace-setting one (a slowed NVLink
                    # beside network links) need not set the pace: it says nothing either way
                    paces = frozenset({lk}) if lk in ring.pacing else frozenset()
                    units.append(blame.UnitShape(("peer", u.comm, ga, gb), frozenset(lk), frozenset({lk}),
                                                 paces, st, 1.0 - share, "peer"))  # fmt: skip
                slow_links = [f"{int(c.grank[a])}->{int(c.grank[b])}" for a, b in sorted(seen_cr)
                              if counts.get((a, b), 0) / n_ops >= cfg.peer_slow_share]  # fmt: skip
                if slow_links:
                    d["slow_links"] = slow_links
                if counts:
                    d["pace_share"] = {
                        f"{int(c.grank[a])}->{int(c.grank[b])}": round(k / n_ops, 3)
                        for (a, b), k in sorted(counts.items(), key=lambda kv: -kv[1])[:8]
                    }
        nodes = sorted({node_of[g] for g in u.members if node_of[g] >= 0})
        cands = [blame.Hyp(rank=g) for g in u.members] + [blame.Hyp(link=lk) for lk in sorted(u.links | seen)]
        cands += [blame.Hyp(node=n, node_ranks=ranks.ranks_on(n), node_name=ranks.node_names[n])
                  for n in nodes]  # fmt: skip
        now = {s.key for s in units}
        later = tuple(x for key, x in self.unit_shapes.items() if key not in now)
        past = self.evidence.past(u.key)
        # a culprit named from this unit's own evidence is a candidate like the others, not part
        # of every hypothesis: a window that contradicts it (an onset window's noise named a
        # node, its next windows show one link) revises it
        again = tuple(h for h in named if u.key in self.named_from.get(h, ()))
        others = tuple(h for h in named if h not in again)
        v = blame.decide(cands, units, cfg.likelihoods(dim=True), others, later, past, again)
        self.evidence.add(u.key, v, past)
        if v.contradicted:
            d["ruled_out"] = [h.name() for h in v.contradicted][:16]
        runner = v.runner_up.name() if v.runner_up is not None else None
        alts = tuple(h.name() for h in v.alternatives)
        h = v.hyp
        if v.refine in ("undecided", "masked") and not self._low_before(u.key, w):
            return None  # the evidence may yet tell them apart: a second window first
        node = blame.on_one_node(v, node_of) if v.refine != "undecided" else None
        if node is not None and self._sure(u, w):
            nr = ranks.ranks_on(node)
            return localize(
                kind, How.exclusion, Target.node, nr,
                f"the slow unit's candidates all lie on node {ranks.node_name(nr[0])}; "
                "nothing visible tells its ranks and links apart",
                refine="equivalent", runner_up=runner,
                alternatives=((h.name(),) if h is not None else ()) + alts,
            )  # fmt: skip
        if h is None:
            if not self._sure(u, w):
                return None
            why = ("a unit judged later may tell them apart" if v.refine == "undecided"
                   else "the evidence explains them equally")  # fmt: skip
            return localize(
                kind, How.none, Target.suspects, v.suspects or u.members,
                f"suspects {', '.join(alts) or 'the slow unit'}: {why}",
                prior=1 / max(len(u.members), 1), refine=v.refine, runner_up=runner, alternatives=alts,
            )  # fmt: skip
        how = _how(h, v, u)
        if how in (How.exclusion, How.two_rank) and not self._sure(u, w):
            return None  # one slow unit and nothing else: a second window first
        target = Target.node if h.is_node else Target.link if h.is_link else Target.rank
        link = None
        if h.is_link:
            a, b = h.link
            if u.link is not None and set(u.link) == {a, b}:
                a, b = u.link  # a p2p link: its direction
            elif f"{b}->{a}" in d.get("slow_links", ()) and f"{a}->{b}" not in d.get("slow_links", ()):
                a, b = b, a  # the direction that set the ring's pace
            link = (a, b)
        why = {
            How.peer_progress: "sets the ring's pace (PEER)",
            How.cross_comm: f"explains {v.support} slow or degraded units",
            How.p2p_pair: "is the slow p2p link",
            How.two_rank: "is the slow two-rank communicator",
            How.exclusion: f"is left when {_telling(v)} units rule out the others",
        }[how]
        text = f"{h.name()} {why}" + (f"; nothing visible tells it from {', '.join(alts)}" if alts else "")
        refine = "equivalent" if v.refine == "masked" else v.refine
        return localize(
            kind, how, target, link if link is not None else h.ranks(), text,
            refine=refine, link=link, posterior=v.posterior, runner_up=runner, alternatives=alts,
        )  # fmt: skip


def p2p_links(p: np.ndarray, min_ops: int) -> list[tuple[int, int, int, float, int, np.ndarray]]:
    """Per directed link (src, dst comm ranks) of one communicator's P2P_DONE rows with at least
    ``min_ops`` transfers, and as many of its most frequent size (the smallest on a tie):
    (src, dst, that size, median bytes/transfer, the last one's seq, each one's bytes/transfer
    in arrival order), in (src, dst) order."""
    return [x[1:] for x in p2p_links_many([(0, p)], min_ops)]


def p2p_links_many(
    parts: list[tuple[int, np.ndarray]], min_ops: int
) -> list[tuple[int, int, int, int, float, int, np.ndarray]]:
    """``p2p_links`` of many communicators at once, each tuple led by the communicator's index
    (``parts``: (index, its P2P_DONE rows), in index order). One sort and one median pass for
    every link of the window, not a call per communicator (a 2,048-rank pipeline has a
    two-rank communicator per stage pair: two thousand calls a window took a tenth of the
    master's time)."""
    parts = [(i, q) for i, q in parts if len(q) >= min_ops]
    if not parts:
        return []
    p = cat([q for _, q in parts])
    ids = [i for i, _ in parts]
    cj = np.repeat(np.arange(len(parts), dtype=np.int64), [len(q) for _, q in parts])  # dense: no overflow
    src, dst, nbytes = p["src"].astype(np.int64), p["dst"].astype(np.int64), p["bytes"].astype(np.int64)
    m = int(max(src.max(), dst.max())) + 2
    key = (cj * m + src) * m + dst
    o = np.lexsort((nbytes, key))  # stable: arrival order inside each (link, size) run
    ks, bs = key[o], nbytes[o]
    head = np.r_[True, (ks[1:] != ks[:-1]) | (bs[1:] != bs[:-1])]
    starts = np.flatnonzero(head)
    lens = np.diff(np.r_[starts, len(o)])
    run_key = ks[starts]
    lead = np.r_[True, run_key[1:] != run_key[:-1]]  # first run (smallest size) of each link
    link_of_run = np.cumsum(lead) - 1
    link_total = np.bincount(link_of_run, weights=lens).astype(np.int64)
    # the most frequent size per link, the first (smallest) of equal counts, as np.unique + argmax
    order = np.lexsort((np.arange(len(lens)), -lens, link_of_run))
    best = order[np.r_[True, link_of_run[order][1:] != link_of_run[order][:-1]]]  # per link, in link order
    runs = best[link_total >= min_ops]
    runs = runs[lens[runs] >= min_ops]
    if not len(runs):
        return []
    n = lens[runs]
    first = np.r_[0, np.cumsum(n)[:-1]]  # each run's offset among the selected rows
    idx = o[np.repeat(starts[runs] - first, n) + np.arange(int(n.sum()))]  # rows of p, runs in order
    bws = nbytes[idx] / p["transfer"][idx]
    med = _run_medians(bws, first, n)
    nan = np.add.reduceat(np.isnan(bws), first) > 0
    med = np.where(nan, np.nan, med)
    last = idx[first + n - 1]
    r0 = idx[first]
    cols = (np.asarray(ids)[cj[r0]], src[r0], dst[r0], nbytes[r0], med, p["seq"][last].astype(np.int64))
    return [
        (i, a, b, nb, bw, sq, bws[f : f + c])
        for i, a, b, nb, bw, sq, f, c in zip(
            *(x.tolist() for x in cols), first.tolist(), n.tolist(), strict=True
        )
    ]


def _run_medians(v: np.ndarray, first: np.ndarray, n: np.ndarray) -> np.ndarray:
    """np.median of each run ``v[first[i] : first[i] + n[i]]`` (NaN runs are the caller's): the
    runs as rows of one matrix padded with +inf, each row sorted. A window's links are runs of
    ~a hundred to a few thousand transfers: one sort of every value by (run, value) costs
    several times the row sorts."""
    k, width = len(n), int(n.max())
    if k * width > 4 * len(v) + 4096:  # one long run among short ones: the padding would dwarf them
        sb = v[np.lexsort((v, np.repeat(np.arange(k), n)))]
        return (sb[first + (n - 1) // 2] + sb[first + n // 2]) / 2
    m = np.full((k, width), np.inf)
    m[np.repeat(np.arange(k), n), np.arange(len(v)) - np.repeat(first, n)] = v
    m.sort(axis=1)
    r = np.arange(k)
    return (m[r, (n - 1) // 2] + m[r, n // 2]) / 2


def _main(units: list[_Unit]) -> tuple[list[_Unit], dict[int, list[_Unit]]]:
    """One unit per communicator from its candidates (one per collective op and size): the
    most frequent of those with a reference (siblings or own baseline), else the most
    frequent; ties to the lower (op, size). The others come back keyed by the kept unit's id,
    so a clean window adds to every size's baseline. (The most frequent alone flipped between
    two sizes run equally often, and a size without a baseline then took a slowed window as
    its baseline: a factor-4 slowdown named a window late, and hidden whenever that size won.)"""
    by: dict[tuple, list[_Unit]] = {}
    for u in units:
        if u.key[0] == "c":
            by.setdefault(u.key, []).append(u)
    best = {
        k: max(c, key=lambda x: (bool(x.sib_ref or x.own_ref), len(x.bws), -x.op, -x.base_key[3]))
        for k, c in by.items()
    }
    out = [u for u in units if u.key[0] != "c" or u is best[u.key]]
    also = {id(b): [x for x in by[k] if x is not b] for k, b in best.items()}
    return out, also


def _shared_slowdown(units: list[_Unit], degraded: float) -> float:
    """The slowdown every unit shares (a loaded host slows every communicator at once): the
    median of the units' ratios to their own baselines, leaving out the units of the rank
    that most of the low ones share. Without that, a small job's units are mostly that
    rank's (a 4-stage pipeline has three links, two of them a slow middle stage's) and its
    own slowdown would pass for the host's. Needs three units when no rank stands out (as
    before: one or two say nothing about the host), one when one does. Units without a
    baseline are left out."""
    rated = [(u, u.bw / u.own_ref) for u in units if u.own_ref]
    count: dict[int, int] = {}
    for u, r in rated:
        if r < degraded:
            for g in u.members:
                count[g] = count.get(g, 0) + 1
    if count:
        top = max(count.values())
        cand = min(g for g, k in count.items() if k == top)
        rest = [r for u, r in rated if cand not in u.members]
        return min(1.0, float(_median(rest))) if rest else 1.0
    return min(1.0, float(_median([r for _, r in rated]))) if len(rated) >= 3 else 1.0


def _median(a: Any) -> float:
    """``np.median`` of a 1-D sequence, without its dispatch (called per unit and per
    communicator every window: thousands of times at 2,048 ranks). NaN when any value is."""
    v = np.asarray(a, dtype=np.float64)
    n = len(v)
    if not n or np.isnan(v).any():
        return float("nan")
    s = np.sort(v)
    return float((s[(n - 1) // 2] + s[n // 2]) / 2)


def _share(mask: np.ndarray) -> float:
    """``np.mean`` of a boolean array (NaN when empty)."""
    return np.count_nonzero(mask) / len(mask) if len(mask) else float("nan")


def _how(h: blame.Hyp, v: blame.Verdict, u: _Unit) -> How:
    """Which evidence told the named hypothesis from the others (``Localization.how``): PEER pace
    setters; two or more slow units of a rank or node; one link nothing tells from its ends
    (a p2p link, a two-rank communicator, or a ring link whose ends' other links are invisible);
    else clear (or dim) units that ruled the others out."""
    if any(x.source == "peer" for x in v.decisive) and v.refine not in ("equivalent", "masked"):
        return How.peer_progress
    if not h.is_link and v.support >= 2:
        return How.cross_comm
    if h.is_link and v.refine in ("equivalent", "masked"):
        if u.link is not None and set(u.link) == set(h.link):
            return How.p2p_pair
        return How.two_rank if len(u.members) == 2 else How.peer_progress
    return How.exclusion


def _telling(v: blame.Verdict) -> str:
    """The states of the units that told the named hypothesis from its runner-up: clear ones, or
    dim ones (a ring slowed a little through links that do not set its pace)."""
    states = [s for s in ("clear", "dim") if any(x.state == s for x in v.decisive)]
    return " and ".join(states) or "clear"


def _hyp_of(loc: Localization, ranks: RankTable) -> blame.Hyp | None:
    if loc.target is Target.rank and len(loc.ranks) == 1:
        return blame.Hyp(rank=loc.ranks[0])
    if loc.target is Target.link and loc.link is not None:
        return blame.Hyp(link=blame.link_of(*loc.link))
    if loc.target is Target.node and loc.ranks:
        n = int(ranks.node[loc.ranks[0]])
        return blame.Hyp(node=n, node_ranks=ranks.ranks_on(n), node_name=ranks.node_names[n])
    return None


_STRENGTH = {Target.node: 3, Target.rank: 3, Target.link: 2, Target.suspects: 1}


def _one_per_culprit(located: list[tuple[_Unit, dict[str, Any], Localization]]) -> list[list]:
    """The window's verdicts, one finding per culprit: a verdict whose ranks overlap a stronger
    one's (a rank or node over a link over suspects) is part of it (one fault, one incident)."""
    groups: list[tuple[Localization, list]] = []
    for item in sorted(located, key=lambda x: (-_STRENGTH[x[2].target], -x[2].confidence, x[0].key)):
        loc = item[2]
        for head, items in groups:
            same = head.target is loc.target and head.ranks == loc.ranks
            if same or (_STRENGTH[head.target] > _STRENGTH[loc.target] and set(head.ranks) & set(loc.ranks)):
                items.append(item)
                break
        else:
            groups.append((loc, [item]))
    return [items for _, items in groups]


def _calm(G: np.ndarray, t: float, share: float) -> bool:
    """Whether no member of a communicator can stand out in ``share`` of a window's ops (``G``:
    ops x members, compute before each op, no NaN): in fewer ops than that is the spread of
    the members' compute ``t`` or more, and a member stands out in an op only by ``t`` above
    the op's median (which is above the op's least). A healthy group is calm; its medians and
    sorts (most of the window-close tick at 16,384 ranks) are then not needed."""
    if not len(G) or not np.isfinite(G).all():
        return False
    hi, lo = G[:, 0].copy(), G[:, 0].copy()  # column by column: a reduction along short rows is much slower
    for j in range(1, G.shape[1]):
        np.maximum(hi, G[:, j], out=hi)
        np.minimum(lo, G[:, j], out=lo)
    wide = np.count_nonzero(hi.astype(np.float64) - lo >= t)
    return bool(wide < share * len(G))


def _col_count(mask: np.ndarray) -> np.ndarray:
    """``mask.sum(axis=0)`` of an ops x members bool matrix as a product with ones (exact: the
    counts are far below 2**53): a reduction along the long axis of short rows is several
    times slower, and a window runs it twice per communicator."""
    return (np.ones(mask.shape[0]) @ mask.view(np.uint8)).astype(np.int64)


def _col_nanmedian(a: np.ndarray) -> np.ndarray:
    return row_nanmedian(np.ascontiguousarray(a.T))


def _others_median(med: np.ndarray) -> np.ndarray:
    """For each entry, the median of the other entries (NaN ignored)."""
    n = len(med)
    ok = np.isfinite(med)
    if n > 64:  # removing one value of many barely moves the median
        return np.full(n, float(_median(med[ok])) if ok.any() else np.nan)
    out = np.full(n, np.nan)
    idx = np.flatnonzero(ok)
    if len(idx) >= 2:
        out[idx] = _medians_of_others(med[idx])
    if len(idx) >= 1:  # a NaN entry's others are every finite one
        out[~ok] = float(_median(med[idx]))
    return out


def _medians_of_others(v: np.ndarray) -> np.ndarray:
    """For each of the finite values ``v``, ``np.median`` of all the others (NaN where there are
    none), from one sort: removing the j-th smallest shifts the ranks above it down by one."""
    k = len(v)
    if k < 2:
        return np.full(k, np.nan)
    order = np.argsort(v, kind="stable")
    s = v[order]
    pos = np.empty(k, np.int64)
    pos[order] = np.arange(k)  # each value's rank in s
    lo, hi = (k - 2) // 2, (k - 1) // 2  # the middle ranks among the k - 1 others

    def at(i: int) -> np.ndarray:  # the others' i-th smallest, for every removed rank at once
        return np.where(pos > i, s[i], s[min(i + 1, k - 1)])

    return (at(lo) + at(hi)) / 2


@dataclass
class _Unit:
    """A communicator's main collective, or one directed p2p link, in one window."""

    key: tuple  # ("c", comm idx) or ("p", comm idx, comm rank a, comm rank b) with a < b
    comm: int
    members: tuple[int, ...]  # global ranks
    bw: float  # GB/s (bytes/ns): busbw for collectives, bytes / transfer for p2p
    sib_key: tuple
    base_key: tuple
    op: int
    seq: int
    ops: np.ndarray | None  # COMPLETED rows (collectives): PEER link rates
    bws: np.ndarray  # per op, same unit as bw
    link: tuple[int, int] | None = None  # (sender, receiver) global ranks of a p2p link
    links: set[tuple[int, int]] = field(default_factory=set)  # undirected links it uses (blame.py)
    sib_ref: float | None = None
    own_ref: float | None = None
    ratio: float | None = None
    compared: str = ""
    shared: float = 1.0
    expected: float | None = None  # busbw its link class reaches at its size (expected.py)
    link_ref: float | None = None  # busbw at its other network links' pace (SlowJudge._links_ratio)
    alone: bool = False  # no unit of its shape in the window (not: its siblings were no reference)

    def reference(self) -> float | None:
        if self.compared == "expected":
            return self.expected
        if self.compared == "network links":
            return self.link_ref
        return self.sib_ref or (self.own_ref * self.shared if self.own_ref else None)

    def below(self, bw_ratio: float) -> np.ndarray:
        """Which of its ops are below ``bw_ratio`` x its reference (none without one)."""
        ref = self.reference()
        return self.bws < bw_ratio * ref if ref else np.zeros(len(self.bws), bool)

    def slow_share(self, bw_ratio: float) -> float:
        """Share of its ops below ``bw_ratio`` x its reference."""
        return _share(self.below(bw_ratio)) if self.reference() else 0.0

    def clear(self, bw_ratio: float, max_slow_share: float) -> bool:
        """Not slow, and at most ``max_slow_share`` of its ops below ``bw_ratio`` x the reference."""
        if self.ratio is not None and self.ratio < bw_ratio:
            return False
        return self.slow_share(bw_ratio) <= max_slow_share  # 0 without a reference


__all__ = ["COMPLETED", "SlowFinding", "SlowJudge"]
