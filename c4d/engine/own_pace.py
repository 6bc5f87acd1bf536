"""RankNonCommSlow for ranks no collective compares with others: against their own pace.

The slow judge finds a slow-computing rank by comparing members of one collective: the one
whose compute before the op is longer makes the others wait (slow.py). A rank in no
collective of two or more ranks (every stage of a pipeline-only job: tp = dp = 1) has no one
to be compared with; its p2p transfers are timed from the later arrival, so a slow compute
does not slow them either. Such a rank is compared with itself: its mean compute per
synchronizing op (the running compute sum of compute.compute_gaps, so its gaps between p2p ops)
in a check window, against the median of its own earlier windows that were not slow.

A whole host that slows (CPU load) slows every rank's compute: with three ranks or more
judged in a window, a rank's ratio is divided by the job's median ratio when that is above 1.
A pipeline's other stages wait for the slow one inside their receives, not in their compute,
so their ratios stay near 1 and the median with them. Ranks are never compared with each
other: a pipeline's stages differ in compute by design (the first and last stages carry
the embedding and the loss).

A window is slow at a ratio of ``1 + slow_arrival_rel`` or more and, summed over its ops, at
least ``slow_min_ops x slow_arrival_min_ms`` more compute than the baseline's pace (a
pipeline's stages sync at every micro-batch: a mean per op can be well under a millisecond);
a finding needs two such windows running, or one whose last half (or more) is far beyond the
line in every quarter (``slow_pace_strong`` x ``slow_arrival_rel``; the collective rule's twice the
margin in nearly every op).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from c4d.engine.compute import compute_before
from c4d.engine.config import EngineConfig
from c4d.engine.ranks import RankTable
from c4d.engine.rows import OpCols
from c4d.record.schema import OpFlag

COMPUTE_GIVEN = int(OpFlag.COMPUTE_GIVEN)

MAX_SPAN = 16  # quarters one chunk's rows may span before they are counted one quarter at a time
PARTS = 4  # quarters of a window: a slowdown that holds, against one long pause


@dataclass(frozen=True)
class OwnPaceFinding:
    rank: int
    mean_ms: float  # its mean compute per synchronizing op in the window
    baseline_ms: float  # the median of its earlier windows'
    ratio: float  # mean / baseline, over the job's shared slowdown
    shared: float  # the job's median ratio in the window (1.0: too few ranks or none)
    ops: int


class OwnPace:
    """Each rank's compute per check window (fed at ingest), and the judgement of a window."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.level = np.full(0, -1, np.int64)  # per rank: its running compute sum at its latest op
        # quarter of a window (window x PARTS + i) -> (compute ns, ops) per rank
        self.bins: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.period = 0  # the window length the bins were cut with
        self.judged_to = -1  # windows up to this were judged: later rows for them are late
        self.late = 0
        self.baseline: dict[int, deque[float]] = {}  # rank -> means of its clean windows (ns)
        self.low: dict[int, int] = {}  # rank -> the last window it was above the line in

    def feed(self, cols: OpCols, gaps: np.ndarray, cum: np.ndarray, ranks: RankTable, period_ns: int) -> None:
        """Bin each synchronizing op's compute gap in the window of its aligned arrival. An
        agent's forwarded op carries its rank's running sum instead (``given``): its compute is
        the increase since the rank's previous forwarded op. Ranks whose clock is not aligned
        yet are left out (their windows would be off by their clock's offset). ``cols``: the
        chunk's OP rows' columns (rows.OpCols)."""
        sync = cols.nranks >= 2
        if not sync.any() or period_ns <= 0:
            return
        if period_ns != self.period:  # thresholds changed (a job registered): start again
            self.bins.clear()
            self.period = period_ns
        given = (cols.flags & COMPUTE_GIVEN) != 0
        inc = np.where(sync & ~given, gaps, -1).astype(np.int64)
        fwd = sync & given
        if fwd.any():  # (a field, not the structured rows: those copy field by field)
            inc[fwd] = self._increments(cols.rank[fwd], cum[fwd])
        rows = np.flatnonzero(inc >= 0)
        if not len(rows):
            return
        g = cols.rank[rows]
        ok = ranks.aligned(g)
        rows, g = rows[ok], g[ok]
        arr = cols.arr[rows]
        q = (arr - ranks.offsets(g)) // (period_ns // PARTS)  # the quarter of a window
        late = q // PARTS <= self.judged_to
        self.late += int(late.sum())
        g, q, v = g[~late], q[~late], inc[rows][~late].astype(np.float64)
        if not len(q):
            return
        # one count over every (quarter, rank) of the chunk: its quarters are a few adjacent
        # ones, unless a record's times are far off (then one count per quarter)
        spans = (
            [(int(x), q == x) for x in np.unique(q).tolist()]
            if np.ptp(q) >= MAX_SPAN
            else [(int(q.min()), None)]
        )
        for q0, sel in spans:
            gq, qq, vq = (g, q, v) if sel is None else (g[sel], q[sel], v[sel])
            nq = int(qq.max()) - q0 + 1
            size = max(
                [int(gq.max()) + 1] + [len(self.bins[x][0]) for x in range(q0, q0 + nq) if x in self.bins]
            )
            key = (qq - q0) * size + gq
            S = np.bincount(key, weights=vq, minlength=nq * size).reshape(nq, size)
            K = np.bincount(key, minlength=nq * size).reshape(nq, size)
            for i in np.flatnonzero(K.any(axis=1)).tolist():
                s, k = S[i], K[i]
                old = self.bins.get(q0 + i)
                if old:
                    s[: len(old[0])] += old[0]
                    k[: len(old[1])] += old[1]
                self.bins[q0 + i] = (s, k)

    def _increments(self, rank: np.ndarray, cum: np.ndarray) -> np.ndarray:
        """Each forwarded op's compute: its rank's running sum minus at its previous one
        (compute.compute_before, in the order of the sums), -1 at a rank's first or where the sum
        went back (a stream that switched sources)."""
        g = rank.astype(np.int64)
        c = cum.astype(np.int64)
        n = int(g.max()) + 1
        if n > len(self.level):
            self.level = np.r_[self.level, np.full(n - len(self.level), -1, np.int64)]
        inc = compute_before(self.level, g, c, c)
        return np.where(inc >= 0, inc, -1)

    def windows(self, closed: int) -> list[int]:
        """Windows with binned compute that may now be judged."""
        return sorted({q // PARTS for q in self.bins if q // PARTS <= closed})

    def drop(self, w: int) -> None:
        """A window that is not judged (a stall covered it)."""
        self._take(w)
        self.judged_to = max(self.judged_to, w)

    def _take(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Window w's quarters, removed from the bins: (compute ns, ops), PARTS x ranks."""
        got = [self.bins.pop(w * PARTS + i, None) for i in range(PARTS)]
        n = max((len(b[0]) for b in got if b is not None), default=0)
        S, K = np.zeros((PARTS, n)), np.zeros((PARTS, n), np.int64)
        for i, b in enumerate(got):
            if b is not None:
                S[i, : len(b[0])], K[i, : len(b[1])] = b
        return S, K

    def judge(self, w: int, covered: set[int]) -> list[OwnPaceFinding]:
        """Window ``w``'s slow ranks among those not in ``covered`` (ranks a collective of the
        window compared with others)."""
        cfg = self.cfg
        S, K = self._take(w)
        self.judged_to = max(self.judged_to, w)
        s, k = S.sum(axis=0), K.sum(axis=0)
        cand = [g for g in np.flatnonzero(k >= cfg.slow_min_ops).tolist() if g not in covered]
        ratios = {}
        for g in cand:
            b = self.baseline.get(g)
            ref = float(np.median(b)) if b else 0.0
            if ref > 0:
                ratios[g] = (s[g] / k[g] / ref, ref)
        shared = 1.0
        if len(ratios) >= self.cfg.slow_shared_min_ranks:
            shared = max(1.0, float(np.median([r for r, _ in ratios.values()])))
        line = 1 + cfg.slow_arrival_rel
        out = []
        for g in cand:
            m = float(s[g] / k[g])
            if g not in ratios:  # its first window: start-up, only a baseline
                self.baseline.setdefault(g, deque(maxlen=cfg.slow_baseline_windows)).append(m)
                continue
            r, ref = ratios[g]
            ratio = r / shared
            # the floor is on the window's excess (a pipeline's stages sync at every
            # micro-batch, so a mean per op can be well under a millisecond)
            excess = (m - ref * shared) * float(k[g])
            if ratio < line or excess < cfg.slow_min_ops * cfg.slow_arrival_min_ms * 1e6:
                self.baseline[g].append(m)
                continue
            before = self.low.get(g)
            self.low[g] = w
            if before == w - 1 or self._strong(S[:, g], K[:, g], ref * shared):
                out.append(OwnPaceFinding(g, round(m / 1e6, 3), round(ref / 1e6, 3), round(ratio, 2),
                                          round(shared, 2), int(k[g])))  # fmt: skip
        return out

    def _strong(self, s: np.ndarray, k: np.ndarray, ref: float) -> bool:
        """Slow in its first window: its last quarters are all above the line and together
        ``slow_pace_strong`` x slow_arrival_rel beyond it, at least half a window of them. One long
        pause (a descheduled process) lands in the one quarter of the op that ends it."""
        line = 1 + self.cfg.slow_arrival_rel
        q = np.where(k > 0, s / np.maximum(k, 1) / ref, 0.0)
        i = PARTS
        while i > 0 and q[i - 1] >= line:
            i -= 1
        if PARTS - i < PARTS // 2:
            return False
        strong = 1 + self.cfg.slow_pace_strong * self.cfg.slow_arrival_rel
        return float(s[i:].sum() / max(int(k[i:].sum()), 1) / ref) >= strong
