"""A bounded sample of each communicator's completed ops per slow window.

The slow judge reads a window's ops through medians and shares (bus bandwidth, the members'
compute), which several hundred ops estimate as well as all of them; a tensor-parallel
communicator of a large job completes 500 a second, 5,000 in a 10 s window, 2,048 of them
at 16,384 ranks: the rows it keeps until the window closes were most of the master's memory.

Past ``cap`` ops a window, a communicator keeps the ops whose seq hashes to a multiple of
2^k (the same ops whichever chunk brings them, and no period of the training loop lines up
with the hash). k starts each window from the pace of the window before, and rises within
the window whenever the kept rows pass the cap again (a communicator's first window); since
a multiple of 2^(k+1) is one of 2^k, the judge takes the window's rows through its final k
(``thin``), and the sample is the same all through the window.
"""

from __future__ import annotations

import numpy as np

from c4d.engine.rows import grow
from c4d.record import schema

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier
MAX_SHIFT = schema.OPSUM_MAX_SHIFT  # (node agents send theirs in OPSUM rows)
NONE = np.iinfo(np.int64).min


def sampled(seq: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
    """Which ops a sample of one in 2^shift keeps (``shift`` per op or one for all)."""
    mask = (np.uint64(1) << np.asarray(shift).astype(np.uint64)) - np.uint64(1)
    return (((seq.astype(np.uint64) * GOLDEN) >> np.uint64(40)) & mask) == 0


class WindowSampler:
    """Per communicator (by index): the window its sample is for, the ops it completed and kept
    in it, its shift (one op in 2^shift), and the window before's (its final shift)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap  # 0: keep every op
        self.period_ns = 0  # the slow window (set by the engine from the job's thresholds)
        self.win = np.full(0, NONE, np.int64)
        self.ops = np.zeros(0, np.int64)
        self.kept = np.zeros(0, np.int64)
        self.shift = np.zeros(0, np.int64)
        self.prev_win = np.full(0, NONE, np.int64)
        self.prev_shift = np.zeros(0, np.int64)
        self.lo = np.zeros(0, np.int64)  # the earliest and latest last arrival in its window
        self.hi = np.zeros(0, np.int64)

    def select(
        self, last_arrive: np.ndarray, seq: np.ndarray, idx: np.ndarray, head: np.ndarray, tail: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Which rows of the runs ``head[k]:tail[k]`` (communicator ``idx[k]``, distinct, each
        within one window or starting it) to keep: their positions and each run's count; None:
        keep them all (no run is sampled)."""
        P = self.period_ns
        if self.cap <= 0 or P <= 0 or not len(idx):
            return None
        self._grow(int(idx.max()) + 1)
        n = tail - head
        starts = np.r_[0, np.cumsum(n)[:-1]]
        rows = np.repeat(head - starts, n) + np.arange(int(n.sum()))
        la = last_arrive[rows]
        lo, hi = np.minimum.reduceat(la, starts), np.maximum.reduceat(la, starts)
        w = lo // P
        new = w > self.win[idx]
        if new.any():
            i, wi = idx[new], w[new]
            self.prev_win[i], self.prev_shift[i] = self.win[i], self.shift[i]
            # the window before's pace (over the part of it the communicator was there for, a
            # quarter at least: a job that started in it, not a burst of a few ops)
            span = np.maximum(self.hi[i] - self.lo[i], P // 4)
            before = np.where(self.win[i] == wi - 1, self.ops[i] * P // span, 0)
            self.shift[i] = _shift_for(before, self.cap)
            self.win[i], self.ops[i], self.kept[i], self.lo[i], self.hi[i] = wi, 0, 0, lo[new], hi[new]
        self.lo[idx] = np.minimum(self.lo[idx], lo)
        self.hi[idx] = np.maximum(self.hi[idx], hi)
        sh = self.shift[idx]
        self.ops[idx] += n
        if not sh.any() and not (self.kept[idx] + n > self.cap).any():
            self.kept[idx] += n
            return None
        keep = sampled(seq[rows], np.repeat(sh, n))
        counts = np.add.reduceat(keep.astype(np.int64), starts)
        k = self.kept[idx] + counts
        over = k > self.cap  # past the cap again: a sparser sample from here on
        if over.any():
            up = _shift_for(k[over], self.cap)
            self.shift[idx[over]] += up
            k[over] >>= up
        self.kept[idx] = k
        return rows[keep], counts

    def thin(self, i: int, seq: np.ndarray, win: np.ndarray) -> np.ndarray | None:
        """Which of communicator ``i``'s rows (their windows ``win``) its windows' final samples
        keep; None: all of them."""
        if i >= len(self.win):
            return None
        shift = np.where(
            win == self.win[i], self.shift[i], np.where(win == self.prev_win[i], self.prev_shift[i], 0)
        )
        return sampled(seq, shift) if shift.any() else None

    def forget(self, i: int) -> None:
        if i < len(self.win):
            self.win[i] = self.prev_win[i] = NONE
            self.ops[i] = self.kept[i] = self.shift[i] = self.prev_shift[i] = 0

    def _grow(self, top: int) -> None:
        if top <= len(self.win):
            return
        size = max(64, 2 * len(self.win), top)
        self.win, self.prev_win = grow(self.win, size, NONE), grow(self.prev_win, size, NONE)
        self.ops, self.kept = grow(self.ops, size, 0), grow(self.kept, size, 0)
        self.shift, self.prev_shift = grow(self.shift, size, 0), grow(self.prev_shift, size, 0)
        self.lo, self.hi = grow(self.lo, size, 0), grow(self.hi, size, 0)


def _shift_for(ops: np.ndarray, cap: int) -> np.ndarray:
    """The least k with ops / 2^k <= cap."""
    over = np.maximum(ops, 1) / cap
    return np.clip(np.ceil(np.log2(np.maximum(over, 1.0))), 0, MAX_SHIFT).astype(np.int64)
