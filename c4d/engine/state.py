"""The engine's memory: per-rank and per-communicator numpy arrays, filled batch by batch.

Nothing here keeps one Python object per record, and a chunk's rows of all communicators
are ingested together: the arrays a chunk's OP and HEARTBEAT rows update (membership,
heartbeat counters, ``op_done``, the ring's tags) live in one ``Pool`` for every
communicator, each ``Comm`` holding views of its ranges, so one fancy-indexed assignment
updates them all (c4d/engine/engine.py: ``_collectives``, ``_feed_heartbeats``).

* ``RankTable`` — per global rank: node, liveness (master clock), clean exit, clock offset.
* ``Comm`` — per communicator: the latest heartbeat of every member (how far it has
  issued / arrived / finished, its oldest pending op), the highest op finished per member
  from OP records, p2p completion counters, and an op ring ``(W slots x nranks)`` of arrival,
  end and compute-gap times in which a collective (C, k) becomes *complete* once every
  member's OP record is in (an op whose rows are all in one chunk skips the ring). Complete
  ops are reduced to one row each of ``COMPLETED``: last arrival, wait, transfer, busbw, who
  arrived last and by how much (``reduce_group``: all ops of all communicators of one size
  at once; ``reduce_comms`` orders the groups so the clock refinement gives what one
  communicator after the other gives). Those rows feed the slow windows.

Times: ``*_ns`` from records are the sending rank's clock; the engine converts with the
per-rank offset (rank clock minus master clock, c4d/engine/clock.py) wherever it compares
ranks or compares with the master's clock.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from c4d import schema
from c4d.engine.compute import compute_before
from c4d.engine.ranks import RankTable
from c4d.engine.rows import (
    COMPLETED,
    END_SYNC,
    NO_ROWS,
    OP_SPLIT,
    P2P,
    P2P_DONE,
    RECV,
    SEND,
    OpCols,
    cat,
    grow,
    lexsort,
    row_median,
    split_rows,
    take,
)
from c4d.opstats import busbw_factor, total_bytes
from c4d.ratelog import RateLimitedLog

log = logging.getLogger("c4d.engine")

# One side of a p2p transfer waiting for its counterpart (send k from src to dst pairs with
# recv k at dst from src).
P2P_HALF = np.dtype(
    [
        ("src", "<i4"),  # comm ranks
        ("dst", "<i4"),
        ("seq", "<i8"),
        ("recv", "?"),  # this side is the receiver
        ("grouped", "?"),  # shares its ncclGroup's events with other ops: times span the group
        ("bytes", "<i8"),
        ("arr", "<i8"),  # rank clock
        ("end", "<i8"),
        ("g", "<i8"),  # global rank of this side
        ("comm", "<i8"),  # communicator index
        ("sig", "<i8"),  # count << 8 | dtype: a send and its receive must agree (consistency.py)
    ]
)
P2P_BOUND_EPOCH_NS = 30_000_000_000
P2P_HALF_CAP = 65536  # unpaired sides kept (the oldest go first)


# what the live view reads of a communicator's latest completed collectives and transfers
RECENT = np.dtype(
    [("seq", "<i8"), ("last", "<i4"), ("wait_max", "<i8"), ("transfer", "<i8"), ("busbw", "<f8")]
)
RECENT_XFER = np.dtype([("transfer", "<i8"), ("bytes", "<i8")])
RATE_WINDOW_NS = 5_000_000_000  # the live view's ops/s is measured over this much master time
RECENT_OPS = 256  # completed ops kept per communicator: what the live view summarises
PENDING_PARTS = 16  # chunks' rows a communicator keeps as views for the slow judge (Comm._completed)
# chunks' node summaries the pool keeps before it hands them out joined (Pool.settle): every
# communicator's views keep a block alive until the judge took them all: without a bound a
# window's blocks hold its summaries twice at the judge's peak
MAX_BLOCKS = 32
RING_CELL_BYTES = 25  # an op ring's member rows per slot and member: has, arrival, end, compute gap
# communicators a job may ever admit (indices are never reused: ~60 bytes of index-wide arrays
# each): C4D_MAX_COMMS_EVER
MAX_COMMS_EVER = 1 << 22
# what a sender can make the engine hold beyond a communicator's tables (C4D_MAX_COMM_BYTES,
# charged at the edge), in bytes for the whole job (Pool.budget; docs/untrusted-input.md)
BUDGETS = {"ring": ("C4D_MAX_RING_BYTES", 512 << 20), "peer": ("C4D_MAX_PEER_BYTES", 256 << 20)}
P2P_BUDGET = ("C4D_MAX_P2P_BYTES", 128 << 20)  # p2p completion counters (P2PDone): 16 bytes a key
# completed ops' rows kept for the slow judge until their window closes (Comm.pending,
# p2p_pending, the pool's summaries): the job's rate times two windows, or a sender's
KEPT_BUDGET = ("C4D_MAX_KEPT_BYTES", 3 << 30)


def budget_from_env(var: str, default: int, env=None) -> int:
    """A byte budget from the environment (suffixes K, M, G); a malformed one logs a line and
    keeps the default."""
    raw = (os.environ if env is None else env).get(var, "").strip()
    if not raw:
        return default
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(raw[-1:].upper(), 1)
    try:
        v = int(float(raw[:-1] if mult > 1 else raw) * mult)
        if v <= 0:
            raise ValueError
    except ValueError:
        log.warning("c4d: %s=%r is not a positive number of bytes; using %d", var, raw, default)
        return default
    return v


class P2PDone:
    """Every communicator's p2p completion counters, (comm, comm rank, op, peer) -> highest seq
    finished + 1, as one sorted array of int64 keys (``key``): a chunk's p2p OP rows update
    them with one search (tens of thousands of keys a chunk in a large job: a dict update per
    key is a Python call each). The hang graph reads a communicator's as a dict
    (``Comm.p2p_done``), made when it asks."""

    def __init__(self, max_bytes: int = P2P_BUDGET[1]) -> None:
        self.keys = np.empty(0, np.int64)
        self.vals = np.empty(0, np.int64)
        self.gen = 0  # bumped by every update (Comm.p2p_done's cache)
        # keys are (comm, member, op, peer) a sender names: n^2 per communicator, 16 bytes each
        self.max_keys = max(1, max_bytes // 16)
        self.dropped = 0  # new keys that found no room (counted, not kept)
        self.ratelog: RateLimitedLog | None = None

    @staticmethod
    def key(comm: np.ndarray, cr: np.ndarray, op: np.ndarray, peer: np.ndarray) -> np.ndarray:
        """Ordered as (comm index, comm rank, op, peer): comm ranks and peers are below
        MAX_NRANKS = 2^17, ops below 16."""
        return (
            (comm.astype(np.int64) << 38) | (cr.astype(np.int64) << 21) | (op.astype(np.int64) << 17) | peer
        )

    def update(self, key: np.ndarray, seq: np.ndarray) -> None:
        """p2p ops finished: their keys and seqs."""
        if not len(key):
            return
        o = np.argsort(key, kind="stable")
        k = key[o]
        heads = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        uk, mx = k[heads], np.maximum.reduceat(seq[o].astype(np.int64) + 1, heads)
        pos = np.searchsorted(self.keys, uk)
        hit = pos < len(self.keys)
        hit[hit] = self.keys[pos[hit]] == uk[hit]
        if hit.any():
            ph = pos[hit]
            self.vals[ph] = np.maximum(self.vals[ph], mx[hit])
        if not hit.all():
            new = ~hit
            room = self.max_keys - len(self.keys)
            if int(new.sum()) > room:  # past the budget: the first keys (in key order) that fit
                over = np.flatnonzero(new)[max(room, 0) :]
                self.dropped += len(over)
                new[over] = False
                if self.ratelog is not None:
                    self.ratelog("p2p bytes", "c4d engine: dropped %d p2p completion counter(s): p2p bytes "
                                 "(C4D_MAX_P2P_BYTES)", len(over), n=len(over))  # fmt: skip
            keys = np.concatenate([self.keys, uk[new]])
            vals = np.concatenate([self.vals, mx[new]])
            order = np.argsort(keys, kind="stable")
            self.keys, self.vals = keys[order], vals[order]
        self.gen += 1

    def _range(self, idx: int) -> tuple[int, int]:
        lo, hi = np.searchsorted(self.keys, [idx << 38, (idx + 1) << 38]).tolist()
        return lo, hi

    def of(self, idx: int) -> dict[tuple[int, int, int], int]:
        """Communicator idx's counters: (comm rank, op, peer) -> seq + 1."""
        lo, hi = self._range(idx)
        return {
            ((k >> 21) & 0x1FFFF, (k >> 17) & 15, k & 0x1FFFF): v
            for k, v in zip(self.keys[lo:hi].tolist(), self.vals[lo:hi].tolist(), strict=True)
        }

    def forget(self, idx: int) -> None:
        lo, hi = self._range(idx)
        if hi > lo:
            self.keys = np.delete(self.keys, np.s_[lo:hi])
            self.vals = np.delete(self.vals, np.s_[lo:hi])
            self.gen += 1


class RateLog:
    """OP rows ingested per communicator, every communicator's at once: the live view's rate (a
    log entry per chunk, RATE_WINDOW_NS of them) and each one's total, not a deque entry per
    communicator per chunk (a Python call each, tens of thousands a second in a large job)."""

    def __init__(self) -> None:
        self.log: deque[tuple[int, np.ndarray, np.ndarray]] = deque()  # (master time, comm idx, rows)
        self.total = np.zeros(0, np.int64)  # by communicator index
        self.first = np.zeros(0, np.int64)  # by communicator index: master time of its first (-1 none)

    def note(self, t_ns: int, idx: np.ndarray, rows: np.ndarray) -> None:
        """``rows`` OP rows of each communicator ``idx`` (distinct) ingested at master time ``t_ns``."""
        if not len(idx):
            return
        top = int(idx.max()) + 1
        if top > len(self.total):
            size = max(64, 2 * len(self.total), top)
            self.total, self.first = grow(self.total, size, 0), grow(self.first, size, -1)
        self.total[idx] += rows
        f = self.first[idx]
        self.first[idx] = np.where(f < 0, t_ns, f)
        self.log.append((t_ns, idx, rows))
        while self.log[0][0] <= t_ns - RATE_WINDOW_NS:
            self.log.popleft()

    def since(self, t0: int, n: int) -> np.ndarray:
        """OP rows ingested after master time t0, by communicator index (n of them)."""
        parts = [(i, r) for t, i, r in self.log if t > t0]
        if not parts:
            return np.zeros(n, np.int64)
        i, r = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        return np.bincount(i, weights=r, minlength=n)[:n].astype(np.int64)

    def forget(self, i: int) -> None:
        if i < len(self.total):
            self.total[i], self.first[i] = 0, -1


class SummaryBlock:
    """One chunk's node summaries as the engine kept them (Pool.keep_summaries)."""

    __slots__ = ("_at", "gaps", "head", "idx", "out", "tail")

    def __init__(self, out: np.ndarray, gaps: np.ndarray, idx: np.ndarray, head: np.ndarray,
                 tail: np.ndarray) -> None:  # fmt: skip
        self.out = out  # COMPLETED rows, each communicator's a run
        self.gaps = gaps  # float32 (rows, OPSUM_MAX_MEMBERS): the members' compute
        self.idx = idx  # per run: its communicator's index (-1: handed out already)
        self.head = head  # per run: its first row
        self.tail = tail  # per run: past its last row
        self._at: dict[int, int] | None = None  # communicator index -> its run (made when asked)

    def run_of(self, i: int) -> int:
        """The run of communicator ``i`` here; -1 when it has none."""
        if self._at is None:
            self._at = dict(zip(self.idx.tolist(), range(len(self.idx)), strict=True))
        return self._at.get(i, -1)

    def drop(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Communicator ``i``'s rows and compute here (views), taken out of the block."""
        k = self.run_of(i)
        if k < 0:
            return None
        assert self._at is not None
        del self._at[i]
        self.idx[k] = -1
        h, t = int(self.head[k]), int(self.tail[k])
        return self.out[h:t], self.gaps[h:t]


class Pool:
    """The per-member and per-slot arrays that a chunk's collective rows update (membership,
    ``op_done``, ``last_cum``; the ring's ``tag``, ``opk``, ``processed``) of every
    communicator, in one flat array each, so the engine updates all communicators' with one
    numpy call (Engine._feed_ops). Each Comm's arrays are views of its ranges (``mbase``,
    ``sbase``), re-pointed when the pool grows; a freed communicator's ranges go to the next
    communicator of its size, so the pool holds at most as many as were alive at once."""

    MEMBER = (
        ("grank", np.int64, -1), ("op_done", np.int64, 0), ("last_cum", np.int64, -1),
        ("hb_seen", np.bool_, False), ("hb_time", np.int64, 0), ("n_issued", np.int64, 0),
        ("n_arrived", np.int64, 0), ("n_done", np.int64, 0), ("last_arrive", np.int64, 0),
        ("pend_seq", np.int64, -1), ("pend_op", np.int16, 255), ("pend_peer", np.int32, -1),
        ("pend_flags", np.int16, 0), ("pend_issue", np.int64, 0), ("pend_start", np.int64, 0),
        ("p2p_in_flight", np.int64, 0), ("gone", np.bool_, False), ("owner", np.int64, -1),
        ("pend_count", np.uint64, 0), ("pend_dtype", np.int16, 255), ("pend_redop", np.int16, 255),
    )  # fmt: skip
    SLOT = (("tag", np.int64, -1), ("opk", np.uint8, 0), ("processed", np.bool_, False))

    def __init__(self) -> None:
        self.member: dict[str, np.ndarray] = {k: np.full(0, f, dt) for k, dt, f in self.MEMBER}
        self.slot = {k: np.full(0, f, dt) for k, dt, f in self.SLOT}
        self.m_used = self.s_used = 0
        self.comms: dict[int, Comm] = {}  # by index
        self.free: dict[int, list[tuple[int, int]]] = {}  # by size: ranges of freed communicators
        self.p2p = P2PDone(budget_from_env(*P2P_BUDGET))  # every communicator's p2p completion counters
        self.rate = RateLog()  # every communicator's OP rows ingested
        self.cbase = np.full(0, -1, np.int64)  # by communicator index: its mbase (-1 not here)
        # by communicator index: the earliest last arrival of the rows it keeps for the slow
        # judge (Comm.pending_min_la, p2p_pending_min_la), so a tick visits only the
        # communicators whose window closed (6,176 at 16,384 ranks, five ticks a second)
        self.pmin = np.full(0, NO_ROWS, np.int64)
        self.p2pmin = np.full(0, NO_ROWS, np.int64)
        # node agents' summaries of each chunk, kept for the slow judge as the chunk's rows
        # (Summaries: every communicator's run of rows, in seq order) until a window closes
        # (settle), not handed to each communicator as they come (a Python call per
        # communicator per chunk: thousands a chunk in a large job)
        self.blocks: list[SummaryBlock] = []
        self.blocked = np.zeros(0, bool)  # by communicator index: it has rows in the blocks
        # byte budgets of what senders make it hold beyond the tables the edge charges: op rings'
        # member rows (made when an op spans chunks; one row of a communicator of 1,024 members
        # made 26 MiB) and PEER rows (a communicator keeps max(4096, 64 n))
        self.budget = {k: budget_from_env(var, d) for k, (var, d) in BUDGETS.items()}
        self.held = dict.fromkeys(BUDGETS, 0)
        # communicator indices holding each, least recently used first (evicted first)
        self.holders: dict[str, OrderedDict[int, None]] = {k: OrderedDict() for k in BUDGETS}
        self.dropped: Counter[str] = Counter()  # rows refused for want of room, by reason
        self.evicted: Counter[str] = Counter()  # rings and PEER tables let go to make room
        self.ratelog = RateLimitedLog(log)
        self.p2p.ratelog = self.ratelog
        # rows kept for the slow judge: counted as they come (an upper bound: the judge takes
        # them elsewhere), counted exactly (recount) when that passes the budget
        self.kept_budget = budget_from_env(*KEPT_BUDGET)
        self.kept = 0
        self._refused = 0  # bytes refused since the last recount
        self._over = False  # the last recount found no room

    def keep_summaries(self, out: np.ndarray, gaps: np.ndarray, idx: np.ndarray, head: np.ndarray,
                       tail: np.ndarray, la_min: np.ndarray) -> None:  # fmt: skip
        """A chunk's summaries (COMPLETED rows and their members' compute, ``idx[k]``'s rows
        ``head[k]:tail[k]``, earliest last arrival ``la_min[k]``; distinct communicators)."""
        if not self.keep(out.nbytes + gaps.nbytes, len(out)):
            return
        self.blocks.append(SummaryBlock(out, gaps, idx.copy(), head, tail))
        self.pmin[idx] = np.minimum(self.pmin[idx], la_min)
        self.blocked[idx] = True
        if len(self.blocks) >= MAX_BLOCKS:  # handed out joined: the blocks freed
            self.settle(join=True)

    def settle(self, join: bool = False) -> None:
        """Every chunk's summaries kept so far handed to their communicators (``Comm.pending``,
        as views; ``join``: each one's new parts joined into one), in the order they came."""
        blocks, self.blocks = self.blocks, []
        if not blocks:
            return
        self.blocked[:] = False
        idx = np.concatenate([b.idx for b in blocks])
        which = np.repeat(np.arange(len(blocks)), [len(b.idx) for b in blocks])
        head = np.concatenate([b.head for b in blocks])
        tail = np.concatenate([b.tail for b in blocks])
        o = np.argsort(idx, kind="stable")  # each communicator's runs in the order they came
        idx, which, head, tail = idx[o], which[o], head[o], tail[o]
        starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
        ends = np.r_[starts[1:], len(idx)].tolist()
        which_l, head_l, tail_l = which.tolist(), head.tolist(), tail.tolist()
        for i, a, z in zip(idx[starts].tolist(), starts.tolist(), ends, strict=True):
            c = self.comms.get(i)
            if c is None:  # freed since
                continue
            rows = [blocks[which_l[k]].out[head_l[k] : tail_l[k]] for k in range(a, z)]
            gaps = [blocks[which_l[k]].gaps[head_l[k] : tail_l[k]] for k in range(a, z)]
            self._hand(c, rows, gaps)
            if join:  # the parts just handed out joined into one (those joined before stay)
                _join_latest(c.pending, len(rows), cat)
                _join_latest(c.pending_gaps, len(gaps), np.concatenate)

    def settle_one(self, c: Comm) -> None:
        """Communicator ``c``'s summaries not handed out yet, handed to it (before rows of its
        own come after them: Comm._completed)."""
        got = [x for x in (b.drop(c.idx) for b in self.blocks) if x is not None]
        self._hand(c, [r for r, _ in got], [g for _, g in got])
        self.blocked[c.idx] = False

    def _hand(self, c: Comm, rows: list[np.ndarray], gaps: list[np.ndarray]) -> None:
        """Runs of ``c``'s summaries (views of blocks) appended to what it keeps: its members'
        compute columns only, its earliest last arrival the pool's."""
        c.pending.extend(rows)
        c.pending_gaps.extend(g[:, : c.n] for g in gaps)
        c.pending_min_la = min(c.pending_min_la, int(self.pmin[c.idx]))

    def kept_of(self, i: int, rows: int | None = None) -> list[np.ndarray]:
        """Communicator ``i``'s summaries not handed out yet (views, in the order they came):
        the latest, at least ``rows`` of them where there are; all without ``rows``."""
        out: list[np.ndarray] = []
        if i >= len(self.blocked) or not self.blocked[i]:
            return out
        got = 0
        for b in reversed(self.blocks):
            k = b.run_of(i)
            if k >= 0:
                out.append(b.out[int(b.head[k]) : int(b.tail[k])])
                got += len(out[-1])
                if rows is not None and got >= rows:
                    break
        return out[::-1]

    def attach(self, c: Comm) -> None:
        free = self.free.get(c.n)
        if free:  # a freed communicator's ranges of the same size, back to their initial values
            c.mbase, c.sbase = free.pop()
            for k, _dt, f in self.MEMBER:
                self.member[k][c.mbase : c.mbase + c.n] = f
            for k, _dt, f in self.SLOT:
                self.slot[k][c.sbase : c.sbase + c.W] = f
            self.comms[c.idx] = c
            self._point(c)
            self.member["owner"][c.mbase : c.mbase + c.n] = c.idx
            self._base(c)
            return
        grown = False
        if self.m_used + c.n > len(self.member["grank"]) or self.s_used + c.W > len(self.slot["tag"]):
            live = self.comms.values()
            m_live, s_live = sum(d.n for d in live) + c.n, sum(d.W for d in live) + c.W
            if 2 * m_live <= self.m_used or 2 * s_live <= self.s_used:
                self._compact()  # freed ranges of other sizes: reused, not added to
                grown = True
        for arrs, spec, used, need in (
            (self.member, self.MEMBER, self.m_used, c.n),
            (self.slot, self.SLOT, self.s_used, c.W),
        ):
            cap = len(next(iter(arrs.values())))
            if used + need > cap:
                size = max(1024, 2 * cap, used + need)
                for k, _dt, f in spec:
                    arrs[k] = grow(arrs[k], size, f)
                grown = True
        c.mbase, c.sbase = self.m_used, self.s_used
        self.m_used += c.n
        self.s_used += c.W
        self.comms[c.idx] = c
        for d in self.comms.values() if grown else (c,):
            self._point(d)
        self.member["owner"][c.mbase : c.mbase + c.n] = c.idx
        self._base(c)

    def _compact(self) -> None:
        """The attached communicators' ranges moved to the front, in order, the freed ones
        dropped: a freed range is reused by a communicator of its size only, so communicators of
        ever new sizes made and freed (a sender's) would grow the pool without bound."""
        live = list(self.comms.values())
        self.free = {}
        for arrs, spec, base, size, attr in (
            (self.member, self.MEMBER, "mbase", "n", "m_used"),
            (self.slot, self.SLOT, "sbase", "W", "s_used"),
        ):
            start = np.array([getattr(d, base) for d in live], np.int64)
            lens = np.array([getattr(d, size) for d in live], np.int64)
            new = np.r_[0, np.cumsum(lens)[:-1]] if len(lens) else lens
            src = np.repeat(start - new, lens) + np.arange(int(lens.sum()))
            for k, dt, f in spec:
                a = np.full(max(1024, 2 * len(src)), f, dt)
                a[: len(src)] = arrs[k][src]
                arrs[k] = a
            for d, b in zip(live, new.tolist(), strict=True):
                setattr(d, base, b)
            setattr(self, attr, len(src))
        for d in live:
            self.cbase[d.idx] = d.mbase

    def _base(self, c: Comm) -> None:
        if c.idx >= len(self.cbase):
            size = max(64, 2 * len(self.cbase), c.idx + 1)
            self.cbase = grow(self.cbase, size, -1)
            self.pmin = grow(self.pmin, size, NO_ROWS)
            self.p2pmin = grow(self.p2pmin, size, NO_ROWS)
            self.blocked = grow(self.blocked, size, False)
        self.cbase[c.idx] = c.mbase
        self.pmin[c.idx] = c.pending_min_la
        self.p2pmin[c.idx] = c.p2p_pending_min_la

    def due(self, before: int) -> np.ndarray:
        """Indices of the attached communicators keeping rows whose last arrival is before ``before``."""
        return np.flatnonzero(np.minimum(self.pmin, self.p2pmin) < before)

    def busy(self) -> tuple[np.ndarray, np.ndarray]:
        """Indices (ascending) of the communicators where a member has arrived at an op it has
        not finished, and of those where one has a p2p op pending by its heartbeat: all that
        the hang graph and the live view look at, found for every communicator at once (a
        loop over 4,096 ranks' 1,568 communicators per tick was most of the hang graph)."""
        m, M = self.m_used, self.member
        own = M["owner"][:m]
        done = np.maximum(M["n_done"][:m], M["op_done"][:m])
        live = M["hb_seen"][:m] & ~M["gone"][:m] & (M["grank"][:m] >= 0) & (own >= 0)
        wait = live & (M["n_arrived"][:m] > done)
        pb = live & (M["pend_seq"][:m] >= 0) & ((M["pend_flags"][:m] & P2P) != 0) & (M["pend_start"][:m] > 0)
        return np.unique(own[wait]), np.unique(own[pb])

    def _point(self, c: Comm) -> None:
        for k, _dt, _f in self.MEMBER:
            setattr(c, k, self.member[k][c.mbase : c.mbase + c.n])
        for k, _dt, _f in self.SLOT:
            setattr(c, k, self.slot[k][c.sbase : c.sbase + c.W])

    def detach(self, c: Comm) -> None:
        """A freed communicator's ranges go to the next one of its size (its Comm keeps copies)."""
        if self.comms.pop(c.idx, None) is not None:
            self.member["owner"][c.mbase : c.mbase + c.n] = -1
            self._own(c)
            rate = self.rate
            c._seen_own = int(rate.total[c.idx]) if c.idx < len(rate.total) else 0
            c._first_own = c.first_done_ns
            c._p2p_own, c._pool = self.p2p.of(c.idx), None
            self.p2p.forget(c.idx)
            rate.forget(c.idx)
            self.free.setdefault(c.n, []).append((c.mbase, c.sbase))
            self.let_go(c, "ring")
            self.let_go(c, "peer")
            self.cbase[c.idx] = -1
            self.pmin[c.idx] = self.p2pmin[c.idx] = NO_ROWS
            c.mbase = c.sbase = -1

    def keep(self, nbytes: int, rows: int) -> bool:
        """Whether ``rows`` completed ops (``nbytes``) may be kept for the slow judge within the
        budget; counted under "kept bytes" if not."""
        most = self.kept_budget
        if self.kept + nbytes > most:
            if not self._over or self._refused >= most // 64:  # (a recount visits every communicator)
                self.recount()
                self._over = self.kept + nbytes > most
            if self.kept + nbytes > most:
                self._refused += nbytes
                self.refuse("kept bytes", KEPT_BUDGET[0], rows, "completed op(s)")
                return False
        self.kept += nbytes
        return True

    def recount(self) -> None:
        """What every communicator keeps for the slow judge now, in bytes (a view counts its own)."""
        n = sum(b.out.nbytes + b.gaps.nbytes for b in self.blocks)
        for c in self.comms.values():
            n += sum(p.nbytes for p in c.pending) + sum(g.nbytes for g in c.pending_gaps)
            n += sum(p.nbytes for p in c.p2p_pending)
        self.kept, self._refused, self._over = n, 0, False

    def refuse(self, reason: str, var: str, rows: int, what: str = "record(s)") -> None:
        """``rows`` refused for want of room in the budget ``var``: counted under ``reason``
        (c4d_records_rejected) and logged at most once a minute per reason."""
        self.dropped[reason] += rows
        self.ratelog(reason, f"c4d engine: dropped %d {what}: {reason} ({var})", rows, n=rows)

    def drops(self) -> dict[str, int]:
        """What the byte budgets refused or let go, by reason (rows; p2p: counters)."""
        out = dict(self.dropped)
        out.update({f"{k} evicted": v for k, v in self.evicted.items()})
        if self.p2p.dropped:
            out["p2p bytes"] = self.p2p.dropped
        return out

    def room(self, c: Comm, what: str, nbytes: int) -> bool:
        """Whether ``c`` may hold ``nbytes`` more of ``what`` ("ring", "peer") within the job's
        budget, the least recently used other holders let go to make room; charged if so."""
        held, most, order = self.held, self.budget[what], self.holders[what]
        while held[what] + nbytes > most and order:
            victim = next(iter(order))
            if victim == c.idx:
                if len(order) == 1:
                    break
                order.move_to_end(victim)
                continue
            v = self.comms[victim]
            if what == "peer":  # its oldest part: a communicator keeps its latest rows longest
                self.dropped["peer bytes"] += len(v.peer_rows[0])
                v._pop_peers()
            else:
                self.let_go(v, what)
            self.evicted[what] += 1
            self.ratelog(f"{what} evicted", "c4d engine: the job's %s budget (%s, %d bytes) is full: "
                         "the least recently used let go", what, BUDGETS[what][0], most)  # fmt: skip
        if held[what] + nbytes > most:
            return False
        held[what] += nbytes
        order[c.idx] = None
        order.move_to_end(c.idx)
        return True

    def let_go(self, c: Comm, what: str) -> None:
        """``c``'s op ring or PEER rows freed and uncharged (a ring's ops not complete are
        counted incomplete and their late rows ignored: Comm.scatter)."""
        order = self.holders[what]
        if c.idx not in order:
            return
        del order[c.idx]
        if what == "ring" and c._ring is not None:
            self.held[what] -= c._ring[0].size * RING_CELL_BYTES
            c._drop_ring()
        elif what == "peer":
            self.held[what] -= sum(p.nbytes for p in c.peer_rows)
            c.peer_rows, c.peer_n = [], 0

    @classmethod
    def _own(cls, c: Comm) -> None:
        for k, _dt, _f in (*cls.MEMBER, *cls.SLOT):
            setattr(c, k, getattr(c, k).copy())


class Comm:
    """One communicator's arrays. ``n`` members, op ring of ``W`` sequence slots."""

    @staticmethod
    def slots(n: int) -> int:
        """W, the op ring's sequence slots for ``n`` members."""
        return int(min(1024, max(64, (1 << 20) // max(n, 1))))

    @staticmethod
    def table_bytes(n: int) -> int:
        """What the master holds for a communicator of ``n`` members before its op ring's member
        rows are made: this object, its share of the Pool, the edge's and the bookkeeping's entries
        (C4D_MAX_COMM_BYTES charges it: c4d/validate.py; tests/test_edge_ingest.py measures it)."""
        return 12288 + 24 * Comm.slots(n) + 800 * n

    def __init__(self, idx: int, cid: int, n: int, pool: Pool | None = None) -> None:
        self.idx, self.id, self.n = idx, cid, n
        self.mbase = self.sbase = -1  # where its arrays lie in the engine's Pool (-1: its own)
        self.W = Comm.slots(n)
        self.grank = np.full(n, -1, np.int64)
        self.gone = np.zeros(n, bool)
        self.parent = 0
        # bumped by every change to what the hang graph reads (hang.WaitGraph skips a
        # communicator nobody waited in at the version it last saw)
        self.version = 0
        self.idle_version = -1
        # latest heartbeat per member
        self.hb_seen = np.zeros(n, bool)
        self.hb_time = np.zeros(n, np.int64)  # rank clock
        self.n_issued = np.zeros(n, np.int64)
        self.n_arrived = np.zeros(n, np.int64)
        self.n_done = np.zeros(n, np.int64)
        self.last_arrive = np.zeros(n, np.int64)
        self.pend_seq = np.full(n, -1, np.int64)
        self.pend_op = np.full(n, 255, np.int16)
        self.pend_peer = np.full(n, -1, np.int32)
        self.pend_flags = np.zeros(n, np.int16)
        self.pend_issue = np.zeros(n, np.int64)
        self.pend_start = np.zeros(n, np.int64)
        self.p2p_in_flight = np.zeros(n, np.int64)
        self.pend_count = np.zeros(n, np.uint64)  # what members must agree on (consistency.py)
        self.pend_dtype = np.full(n, 255, np.int16)
        self.pend_redop = np.full(n, 255, np.int16)
        # from OP records
        self.op_done = np.zeros(n, np.int64)  # highest collective seq finished + 1
        # p2p completion counters, (comm rank, op, peer) -> seq + 1 (p2p_done): the engine's
        # Pool keeps every communicator's (P2PDone); one of its own keeps them here
        self._pool = pool
        self._p2p_own: dict[tuple[int, int, int], int] = {}
        self._p2p_cache: tuple[int, dict[tuple[int, int, int], int]] = (-1, {})
        self.p2p_pending: list[np.ndarray] = []  # P2P_DONE rows not yet judged by a slow window
        self.p2p_pending_min_la = NO_ROWS  # their earliest last arrival (Pool.p2pmin too)
        self.has_coll = False
        self.has_p2p = False
        self._seen_own = 0  # ops_seen, first_done_ns of one not in a Pool (RateLog)
        self._first_own: int | None = None
        # op ring
        W = self.W
        self.tag = np.full(W, -1, np.int64)
        # the members' rows of ops not complete within one chunk (scatter): made on first use; a
        # communicator whose ops always come complete, or only as node agents' summaries or
        # p2p, never needs them (W x n each: 1.2 GiB for the 49k members of 16,384 ranks)
        self._ring: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.last_cum = np.full(n, -1, np.int64)  # each member's running compute sum at its latest op here
        self.opk = np.zeros(W, np.uint8)
        self.nbytes = np.zeros(W, np.int64)
        self.processed = np.zeros(W, bool)
        self.incomplete = 0  # ops evicted before every member reported
        # derived
        self.pending: list[np.ndarray] = []  # COMPLETED rows not yet judged by a slow window
        self.pending_min_la = NO_ROWS  # their earliest last_arrive (Pool.pmin too: the judge's)
        self.pending_gaps: list[np.ndarray] = []  # their members' compute before each op (ops x n, ns)
        self.pending_views = 0  # parts appended since the last join (_completed)
        self.p2p_views = 0  # the same for p2p_pending (P2PPairs.feed)
        # the live view's latest ops (recent_ops): the tail of those pending, after the last
        # RECENT_OPS the slow judge took (kept: a copy per communicator per chunk was what the
        # live view cost every ingest)
        self.recent_taken = np.empty(0, RECENT)
        self.peer_rows: list[np.ndarray] = []
        self.peer_n = 0
        self.split: list[np.ndarray] | None = None  # OP_SPLIT rows, when the engine hands them out
        # live view: p2p transfers done and the latest measured ones (its rate: Pool.rate)
        self.p2p_rows = 0
        self.p2p_taken = np.empty(0, RECENT_XFER)  # the last measured transfers the judge took
        if pool is not None:
            pool.attach(self)

    # -- the op ring's member rows ----------------------------------------------------------
    def ring_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """(has, arrival, end, compute gap), each W x n; None when the job's ring budget has no
        room for them (Pool.room)."""
        if self._ring is None:
            W, n = self.W, self.n
            if self._pool is not None and not self._pool.room(self, "ring", W * n * RING_CELL_BYTES):
                return None
            # has, arrival, end, the member's compute before the op (-1 unknown; add_collectives)
            self._ring = (np.zeros((W, n), bool), np.zeros((W, n), np.int64), np.zeros((W, n), np.int64),
                          np.full((W, n), -1, np.int64))  # fmt: skip
        return self._ring

    def _drop_ring(self) -> None:
        """Its ring's member rows freed: the ops not complete in it are counted incomplete and
        marked processed, so their late rows are ignored (never reduced from half a ring)."""
        if self._ring is None:
            return
        open_ = (self.tag >= 0) & ~self.processed
        self.incomplete += int((open_ & self._ring[0].any(axis=1)).sum())
        self.processed[open_] = True
        self._ring = None

    # -- derived views -----------------------------------------------------------------
    @property
    def p2p_done(self) -> dict[tuple[int, int, int], int]:
        """(comm rank, op, peer) -> highest seq finished + 1, from p2p OP records."""
        if self._pool is None:
            return self._p2p_own
        st = self._pool.p2p
        if self._p2p_cache[0] != st.gen:
            self._p2p_cache = (st.gen, st.of(self.idx))
        return self._p2p_cache[1]

    def done_eff(self) -> np.ndarray:
        return np.maximum(self.n_done, self.op_done)

    def arrived_eff(self) -> np.ndarray:
        return np.maximum(self.n_arrived, self.done_eff())

    def members(self) -> np.ndarray:
        return np.flatnonzero(~self.gone)

    def recent_ops(self) -> np.ndarray:
        """Its latest RECENT_OPS completed collectives (RECENT rows), oldest first."""
        return _tail(self.kept(RECENT_OPS), self.recent_taken, RECENT)

    def kept(self, rows: int | None = None) -> list[np.ndarray]:
        """Its COMPLETED rows not judged yet, in the order they came: ``pending``, then node
        summaries the pool has not handed out yet (Pool.settle; ``rows``: the latest, at least
        that many where there are)."""
        if self._pool is None or not self._pool.blocks:
            return self.pending
        return self.pending + self._pool.kept_of(self.idx, rows)

    def recent_transfers(self) -> np.ndarray:
        """Its latest RECENT_OPS measured p2p transfers (RECENT_XFER rows), oldest first."""
        return _tail(self.p2p_pending, self.p2p_taken, RECENT_XFER)

    def took(self, ops: np.ndarray, p2p: bool) -> None:
        """The slow judge took these rows (the latest it took): the live view's, once no more
        recent ones are pending."""
        if p2p:
            self.p2p_taken = _tail([ops], self.p2p_taken, RECENT_XFER)
        else:
            self.recent_taken = _tail([ops], self.recent_taken, RECENT)

    def take_closed(self, closed: int, P: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The slow judge takes its COMPLETED rows of windows up to ``closed`` (a row's window:
        ``last_arrive // P``), with their members' compute gaps and windows; None while none
        is closed (most ticks, for every communicator: no copy)."""
        if not self.pending or self.pending_min_la // P > closed:
            return None
        ops = cat(self.pending)
        gaps = np.concatenate(self.pending_gaps) if len(self.pending_gaps) > 1 else self.pending_gaps[0]
        win = ops["last_arrive"] // P
        (ops, gaps, win), rest = split_rows(win > closed, ops, gaps, win)
        self.took(ops[-RECENT_OPS:], p2p=False)
        self.pending, self.pending_gaps = ([rest[0]], [rest[1]]) if rest is not None else ([], [])
        self.pending_min_la = int(rest[0]["last_arrive"].min()) if rest is not None else NO_ROWS
        if self._pool is not None:
            self._pool.pmin[self.idx] = self.pending_min_la
        return ops, gaps, win

    def take_closed_p2p(self, closed: int, P: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``take_closed`` of its P2P_DONE rows (and their windows)."""
        if not self.p2p_pending or self.p2p_pending_min_la // P > closed:
            return None
        ops = cat(self.p2p_pending)
        win = ops["last_arrive"] // P
        (ops, win), rest = split_rows(win > closed, ops, win)
        self.took(ops[-RECENT_OPS:], p2p=True)
        self.p2p_pending = [rest[0]] if rest is not None else []
        self.p2p_pending_min_la = int(rest[0]["last_arrive"].min()) if rest is not None else NO_ROWS
        if self._pool is not None:
            self._pool.p2pmin[self.idx] = self.p2p_pending_min_la
        return ops, win

    def peer_table(self) -> np.ndarray:
        if len(self.peer_rows) > 1:
            self.peer_rows = [cat(self.peer_rows)]
        return self.peer_rows[0] if self.peer_rows else np.empty(0, schema.PEER)

    @property
    def ops_seen(self) -> int:
        """OP rows ingested (a node agent's summary counts one per member)."""
        if self._pool is None:
            return self._seen_own
        t = self._pool.rate.total
        return int(t[self.idx]) if self.idx < len(t) else 0

    @property
    def first_done_ns(self) -> int | None:
        """Master time of the first chunk with its OP rows (the live view's rate)."""
        if self._pool is None:
            return self._first_own
        f = self._pool.rate.first
        t = int(f[self.idx]) if self.idx < len(f) else -1
        return t if t >= 0 else None

    # -- ingestion ---------------------------------------------------------------------
    def add_heartbeats(self, hb: np.ndarray) -> None:
        self.version += 1
        cr = hb["comm_rank"].astype(np.int64)
        # latest row per member (rows are in arrival order; a rank's stream is FIFO)
        _, first_rev = np.unique(cr[::-1], return_index=True)
        idx = len(cr) - 1 - first_rev
        hb, cr = take(hb, idx), cr[idx]  # whole records (a structured copy goes field by field)
        t = hb["time_ns"].astype(np.int64)
        newer = t >= self.hb_time[cr]
        if not newer.all():
            hb, cr, t = take(hb, newer), cr[newer], t[newer]
        self.hb_seen[cr] = True
        self.hb_time[cr] = t
        self.grank[cr] = hb["rank"]
        self.n_issued[cr] = hb["n_issued"].astype(np.int64)
        self.n_arrived[cr] = hb["n_arrived"].astype(np.int64)
        self.n_done[cr] = hb["n_done"].astype(np.int64)
        self.last_arrive[cr] = hb["last_arrive_ns"].astype(np.int64)
        ps = hb["pend_seq"]
        self.pend_seq[cr] = np.where(ps == schema.UINT64_MAX, -1, ps.astype(np.int64))
        self.pend_op[cr] = hb["pend_op"]
        self.pend_peer[cr] = hb["pend_peer"]
        self.pend_flags[cr] = hb["pend_flags"]
        self.pend_issue[cr] = hb["pend_issue_ns"].astype(np.int64)
        self.pend_start[cr] = hb["pend_start_ns"].astype(np.int64)
        self.p2p_in_flight[cr] = hb["p2p_in_flight"].astype(np.int64)
        self.pend_count[cr] = hb["pend_count"]
        self.pend_dtype[cr] = hb["pend_dtype"]
        self.pend_redop[cr] = hb["pend_redop"]

    def add_peers(self, rows: np.ndarray) -> None:
        """Keep PEER rows: its latest ``max(4096, 64 n)``, within the job's budget (Pool.room: the
        communicators that added none for longest let theirs go first, then its own oldest)."""
        part = rows.copy()
        pool = self._pool
        if pool is not None:
            while not pool.room(self, "peer", part.nbytes) and self.peer_rows:
                self._pop_peers()
            if self.idx not in pool.holders["peer"]:  # no room even alone: refused
                pool.refuse("peer bytes", BUDGETS["peer"][0], len(part))
                return
        self.peer_rows.append(part)
        self.peer_n += len(part)
        cap = max(4096, 64 * self.n)
        while self.peer_n > cap and len(self.peer_rows) > 1:
            self._pop_peers()

    def _pop_peers(self) -> None:
        """Its oldest part of PEER rows let go."""
        old = self.peer_rows.pop(0)
        self.peer_n -= len(old)
        if self._pool is not None:
            self._pool.held["peer"] -= old.nbytes
            if not self.peer_rows:
                self._pool.holders["peer"].pop(self.idx, None)

    def add_p2p(self, ops: np.ndarray) -> None:
        """p2p OP rows: completion counters per (member, op, peer) for the hang graph."""
        self.version += 1
        self.has_p2p = True
        if self._pool is not None:
            cr, op, peer = ops["comm_rank"], ops["op"], ops["peer"]
            self._pool.p2p.update(P2PDone.key(np.full(len(ops), self.idx), cr, op, peer), ops["seq"])
            return
        # one int64 per (comm rank, op, peer), ordered as the tuples are: comm ranks and peers
        # are below MAX_NRANKS = 2^17, ops below 16
        key = (ops["comm_rank"].astype(np.int64) << 21) | (ops["op"].astype(np.int64) << 17) | ops["peer"]
        uk, inv = np.unique(key, return_inverse=True)
        mx = np.zeros(len(uk), np.int64)
        np.maximum.at(mx, inv.ravel(), ops["seq"].astype(np.int64) + 1)
        done = self._p2p_own
        for k0, m in zip(uk.tolist(), mx.tolist(), strict=True):
            k = (k0 >> 21, (k0 >> 17) & 15, k0 & 0x1FFFF)
            if m > done.get(k, 0):
                done[k] = m

    def add_collectives(self, ops: np.ndarray, cum: np.ndarray, ranks: RankTable, gain: float) -> np.ndarray:
        """Scatter collective OP rows into the ring; return COMPLETED rows of the ops now complete.
        (The engine does this for all communicators of a chunk at once: Engine._collectives.)"""
        self.version += 1
        self.has_coll = True
        seq = ops["seq"].astype(np.int64)
        cr = ops["comm_rank"].astype(np.int64)
        self.grank[cr] = ops["rank"]
        np.maximum.at(self.op_done, cr, seq + 1)
        comp = compute_before(self.last_cum, cr, seq, cum)
        slots = self.scatter(ops, seq, cr, comp)
        if not len(slots):
            return np.empty(0, COMPLETED)
        return self._reduce(slots, ranks, gain)

    def scatter(self, ops: np.ndarray, seq: np.ndarray, cr: np.ndarray, comp: np.ndarray) -> np.ndarray:
        """Put collective OP rows (and each member's compute before the op) into the ring; return
        the slots of the ops now complete, in seq order, marked processed."""
        W = self.W
        ring = self.ring_rows()
        if ring is None:  # no room in the job's ring budget: these rows are not kept
            assert self._pool is not None
            self._pool.refuse("ring bytes", BUDGETS["ring"][0], len(seq))
            return np.empty(0, np.int64)
        if self._pool is not None:
            self._pool.holders["ring"].move_to_end(self.idx)
        has, arr, end, gap = ring
        slot = seq % W
        tag = self.tag[slot]
        newer = seq > tag
        if newer.any():
            # A newer seq claims the slot: drop what an older, never-completed op left there.
            s_new, s_seq = slot[newer], seq[newer]
            order = np.lexsort((s_seq, s_new))
            s_new, s_seq = s_new[order], s_seq[order]
            last = np.r_[s_new[1:] != s_new[:-1], True]
            s_new, s_seq = s_new[last], s_seq[last]
            had = self.tag[s_new] >= 0
            self.incomplete += int((had & ~self.processed[s_new]).sum())
            self.tag[s_new] = s_seq
            has[s_new] = False
            gap[s_new] = -1
            self.processed[s_new] = False
        ok = seq == self.tag[slot]
        if not ok.all():
            ops, seq, cr, slot, comp = ops[ok], seq[ok], cr[ok], slot[ok], comp[ok]
        start = ops["start_ns"].astype(np.int64)
        issue = ops["issue_ns"].astype(np.int64)
        arr[slot, cr] = np.where(start > 0, start, issue)  # arrival: device start, else host issue
        end[slot, cr] = ops["end_ns"].astype(np.int64)
        gap[slot, cr] = comp
        has[slot, cr] = True
        self.opk[slot] = ops["op"]
        self.nbytes[slot] = ops["bytes"].astype(np.int64)
        touched = np.unique(slot)
        done = touched[has[touched].all(axis=1) & ~self.processed[touched]]
        if len(done):
            done = done[np.argsort(self.tag[done], kind="stable")]
            self.processed[done] = True
        return done

    def _reduce(self, slots: np.ndarray, ranks: RankTable, gain: float) -> np.ndarray:
        """One COMPLETED row per complete op (``reduce_group`` of this communicator alone), kept;
        then the clock refinement from their end times."""
        red = reduce_group([self], [Complete.of(self, slots)], ranks, gain)
        red.keep(0)
        if red.writer[0]:
            ranks.add_residuals(self.grank, red.res[0])
        return red.out

    def _completed(self, out: np.ndarray, gaps: np.ndarray, la_min: int | None = None) -> None:
        """Keep COMPLETED rows (and their members' compute, ops x n) for the slow windows and the
        live view. ``la_min``: their earliest last arrival, when the caller has it."""
        if self._pool is not None and self.idx < len(self._pool.blocked) and self._pool.blocked[self.idx]:
            self._pool.settle_one(self)  # node summaries of it came before these rows
        if self._pool is not None and not self._pool.keep(out.nbytes + gaps.nbytes, len(out)):
            return
        self.pending.append(out)
        if len(out):
            la = int(out["last_arrive"].min()) if la_min is None else la_min
            if la < self.pending_min_la:
                self.pending_min_la = la
                if self._pool is not None:
                    self._pool.pmin[self.idx] = la
        self.pending_gaps.append(gaps)
        self.pending_views += 1
        if self.pending_views > PENDING_PARTS:
            _join_latest(self.pending, self.pending_views, cat)
            _join_latest(self.pending_gaps, self.pending_views, np.concatenate)
            self.pending_views = 0


def _join_latest(parts: list[np.ndarray], views: int, join) -> None:
    """The latest ``views`` parts (those appended since the last join) joined into one, in
    place. A part is a view of a whole chunk's rows, which stay alive until every communicator
    judged them (twice the window's rows at the judge's peak), and the tick a window closes
    on would join one part per chunk; the parts joined before are not copied again."""
    k = min(views, len(parts))
    parts[-k:] = [join(parts[-k:])]


def _fields(rows: np.ndarray, dt: np.dtype) -> np.ndarray:
    out = np.empty(len(rows), dt)
    for k in dt.names or ():
        out[k] = rows[k]
    return out


def _tail(parts: list[np.ndarray], before: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The last RECENT_OPS rows (``dt``'s fields) of ``before`` then ``parts``."""
    got, k = [], 0
    for p in reversed(parts):
        got.append(_fields(p[-RECENT_OPS:], dt))
        k += len(got[-1])
        if k >= RECENT_OPS:
            break
    if k < RECENT_OPS:
        got.append(before)
    return np.concatenate(got[::-1])[-RECENT_OPS:] if got else np.empty(0, dt)


class Complete(NamedTuple):
    """One communicator's complete ops as its ring holds them (rank clocks), in seq order."""

    arr: np.ndarray  # ops x n: arrival (device start, else host issue)
    end: np.ndarray  # ops x n
    gap: np.ndarray  # ops x n: the member's compute before the op, -1 unknown
    op: np.ndarray
    nbytes: np.ndarray
    seq: np.ndarray

    @classmethod
    def of(cls, c: Comm, slots: np.ndarray) -> Complete:
        assert c._ring is not None  # (slots come from its ring)
        _has, arr, end, gap = c._ring
        return cls(arr[slots], end[slots], gap[slots], c.opk[slots], c.nbytes[slots], c.tag[slots])

    @classmethod
    def join(cls, parts: list[Complete]) -> Complete:
        """One communicator's ops from several sources (straight from a chunk's rows, from the
        ring), in seq order."""
        if len(parts) == 1:
            return parts[0]
        cat = [np.concatenate([p[k] for p in parts]) for k in range(6)]
        o = np.argsort(cat[5], kind="stable")
        return cls(*(x[o] for x in cat))


@dataclass
class Reduced:
    """``reduce_group``'s result for communicators of one size: their COMPLETED rows one after
    the other (communicator i's are ``out[bounds[i]:bounds[i + 1]]``), the members' compute
    (ops x n, NaN unknown), OP_SPLIT rows (ops x n) when some communicator keeps them, and
    the clock refinement each would apply (``writer``: it has one; ``res``: ranks x n, ns)."""

    comms: list[Comm]
    out: np.ndarray
    gaps: np.ndarray
    split: np.ndarray | None
    bounds: list[int]
    writer: np.ndarray
    res: np.ndarray

    def keep(self, i: int) -> None:
        """Communicator i keeps its rows (Comm._completed, and its OP_SPLIT rows)."""
        c, a, b = self.comms[i], self.bounds[i], self.bounds[i + 1]
        if c.split is not None and self.split is not None:
            c.split.append(self.split[a:b].ravel())
        c._completed(self.out[a:b], self.gaps[a:b])


def reduce_group(comms: list[Comm], parts: list[Complete], ranks: RankTable, gain: float) -> Reduced:
    """One COMPLETED row per complete op of communicators of one size n, all at once (each row
    depends only on its op and its communicator's members), with the offsets as they are now.
    Applies nothing to ``ranks``: the caller applies ``res`` where ``writer``, in communicator
    order (``Comm._reduce`` one at a time, ``reduce_comms`` in waves)."""
    n = comms[0].n
    C = len(comms)
    cnt = [len(p.seq) for p in parts]
    bounds = np.r_[0, np.cumsum(cnt)].tolist()
    seg = np.repeat(np.arange(C), cnt)
    cat = (lambda k: parts[0][k]) if C == 1 else (lambda k: np.concatenate([p[k] for p in parts]))
    arr, end, G = cat(0), cat(1), cat(2)
    op, nbytes, seq = cat(3), cat(4), cat(5)
    grank = np.stack([c.grank for c in comms]) if C > 1 else comms[0].grank[None, :]
    off = ranks.offsets(grank.ravel()).reshape(C, n)[seg]
    A = arr - off  # aligned arrivals (master clock)
    E = end - off
    m = len(seq)
    rows = np.arange(m)
    out = np.zeros(m, COMPLETED)
    out["seq"] = seq
    out["op"] = op
    out["bytes"] = nbytes
    endmed = row_median(E)
    # Who arrived last, by how much, and the transfer (last arrival -> done). Within one
    # host clock, aligned times are exact. Across hosts they carry the offset estimate's
    # error (ms early on, as large as the transfer itself), so ops that end together on
    # every member use each rank's own duration d = end - arrival instead, which needs no
    # clock: the last arriver has the smallest d, transfer = min d, wait_i = d_i - min d.
    K = A.astype(np.float64)  # "lateness": larger = arrived later
    own = np.zeros(m, bool)
    gr_ok = (grank >= 0).all(axis=1)
    nd = ranks.node[np.maximum(grank, 0)]
    one_clock = gr_ok & (nd >= 0).all(axis=1) & (nd == nd[:, :1]).all(axis=1)
    if n >= 2 and not one_clock.all():
        own = ~one_clock[seg] & END_SYNC[op] & (end > 0).all(axis=1) & (arr > 0).all(axis=1)
        if own.any():
            K[own] = -(end[own] - arr[own]).astype(np.float64)
    last = K.argmax(axis=1)
    Klast = K[rows, last]
    L = A[rows, last]
    out["last_arrive"] = L
    out["first_arrive"] = A.min(axis=1)
    out["last"] = last
    second = np.partition(K, n - 2, axis=1)[:, n - 2] if n >= 2 else Klast
    out["margin"] = (Klast - second).astype(np.int64)
    transfer = np.where(own, -Klast, endmed - L)
    out["transfer"] = transfer.astype(np.int64)
    size = total_bytes(op, nbytes, np.full(m, n))
    with np.errstate(divide="ignore", invalid="ignore"):  # ends before the last arrival: timer noise
        out["busbw"] = np.where(transfer > 0, size / transfer * busbw_factor(op, np.full(m, n)), np.nan)
    wait = (Klast[:, None] - K).astype(np.int64)
    out["wait_med"] = row_median(wait).astype(np.int64)
    out["wait_max"] = wait.max(axis=1)
    sp = None
    if any(c.split is not None for c in comms):
        sp = np.zeros((m, n), OP_SPLIT)
        sp["comm_id"] = np.array([c.id for c in comms], np.uint64)[seg, None]
        sp["seq"] = seq[:, None]
        sp["rank"] = grank[seg]
        sp["comm_rank"] = np.arange(n)[None, :]
        sp["peer"] = -1
        sp["op"] = op[:, None]
        sp["bytes"] = nbytes[:, None]
        sp["arrive_ns"] = A
        sp["last_arrive_ns"] = L[:, None]
        sp["wait_ns"] = wait
        sp["transfer_ns"] = transfer[:, None]
        sp["lateness_ns"] = K - np.median(K, axis=1)[:, None]
        sp["compute_ns"] = np.where(G >= 0, G, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            alg = np.where(transfer > 0, size / transfer, np.nan)
        sp["algbw_gbs"] = alg[:, None]
        sp["busbw_gbs"] = out["busbw"][:, None]
    # Ops reduced before every member's clock offset was known are not compared across
    # ranks (the slow windows skip them).
    known = np.asarray(gr_ok & ranks.aligned(np.maximum(grank, 0).ravel()).reshape(C, n).all(axis=1))
    out["aligned"] = known[seg]
    # Clock refinement: these ops end (nearly) together on every rank, so each rank's
    # median residual against the op's median end is its remaining offset error.
    out["ends_known"] = (end > 0).all(axis=1)
    sync = END_SYNC[op] & out["ends_known"]
    writer = np.zeros(C, bool)
    res = np.zeros((C, n))
    if gain > 0 and n >= 2:
        writer = known & (np.bincount(seg[sync], minlength=C) > 0)
        if writer.any():
            w = writer[seg] & sync
            med = _seg_col_median(E[w] - endmed[w, None], seg[w], C)[writer]
            res[writer] = gain * np.clip(med - med.mean(axis=1, keepdims=True), -1e9, 1e9)
            # members that share one host clock: the zero-mean step moves nothing (add_residuals
            # averages per node), so it is exactly zero and the op only marks the node refined;
            # reduce_comms relies on it (such a communicator orders against no other)
            res[one_clock] = 0.0
    # each member's compute before the op (see add_collectives): what a slow rank's peers
    # wait for
    gaps = np.where(G >= 0, G, np.nan).astype(np.float32)
    return Reduced(comms, out, gaps, sp, bounds, writer, res)


def reduce_comms(done: list[tuple[Comm, Complete]], ranks: RankTable, gain: float) -> None:
    """Reduce the complete ops of many communicators (``(comm, its ops)`` in the order the
    per-communicator path, ``Comm._reduce`` one after the other, would take them) with exactly
    its results, in a few ``reduce_group`` calls instead of one per communicator.

    What orders them is the clock refinement: communicator i's residuals move the offsets
    that a later communicator j reads when it shares a clock domain (a node, or a rank whose
    node is unknown) with i. So they run in waves: all communicators of a wave read the
    offsets as they are at its start, then its refinements are applied in communicator
    order. A communicator goes to the first wave after every earlier one that refines a
    domain of it, and one that refines goes no earlier than any earlier one that reads its
    domains; a refinement that would join clock islands (``RankTable._merge``, which moves
    whole islands) ends its wave and starts the next. Communicators on disjoint domains (all
    tensor-parallel groups of a job) share a wave; the data-parallel groups through one node
    take one wave each."""
    if not done:
        return
    comms = [c for c, _ in done]
    parts = [p for _, p in done]
    n_of = np.array([c.n for c in comms])
    cnt = np.array([len(p.seq) for p in parts])
    gr = np.concatenate([c.grank for c in comms])
    heads = np.r_[0, np.cumsum(n_of)[:-1]]
    nd = ranks.node[np.maximum(gr, 0)]
    dom = np.where(nd >= 0, nd, -1 - gr)
    dom = np.where(gr >= 0, dom, np.iinfo(np.int64).min)  # an unknown member reads no offset
    lab = np.where(nd >= 0, ranks.isl_node[np.maximum(nd, 0)], ranks.isl_rank[np.maximum(gr, 0)])
    # may refine: every member known and aligned, some op an end-synchronized one (reduce_group
    # decides, with the ends known too; this only has to be true wherever it will)
    sync_ops = END_SYNC[np.concatenate([p.op for p in parts])]
    syn = np.bincount(np.repeat(np.arange(len(comms)), cnt), weights=sync_ops, minlength=len(comms)) > 0
    known = np.minimum.reduceat((gr >= 0) & ranks.aligned(np.maximum(gr, 0)), heads)
    # one host clock for every member: its step is zero (reduce_group), so it writes no offset
    # and needs no order against the others (all ranks of an import whose hosts are unknown)
    one_clock = (np.minimum.reduceat(dom, heads) == np.maximum.reduceat(dom, heads)) & (
        np.minimum.reduceat(nd, heads) >= 0
    )
    may = (gain > 0) & (n_of >= 2) & known & syn & (cnt > 0) & ~one_clock
    lab_lo, lab_hi = np.minimum.reduceat(lab, heads), np.maximum.reduceat(lab, heads)
    merges = may & (lab_lo != lab_hi)
    # each domain as a dense index (the unknown member's none): its latest refining wave (-1:
    # none) and the latest wave that read it, in arrays (a large job's data-parallel group
    # spans hundreds of nodes: no loop over their sets)
    uniq, dense = np.unique(dom, return_inverse=True)
    dense = np.where(dom != np.iinfo(np.int64).min, dense.ravel(), -1)
    last_w = np.full(len(uniq), -1, np.int64)  # domain -> wave of its latest refinement
    last_r = np.zeros(len(uniq), np.int64)  # domain -> latest wave that read it
    bounds = np.r_[heads, len(gr)].tolist()
    may_l, merges_l, dl = may.tolist(), merges.tolist(), dense.tolist()
    wave_of: list[int] = []
    floor = 0
    for i in range(len(comms)):
        a, b = bounds[i], bounds[i + 1]
        if b - a > 16:  # many domains: numpy over them
            ds = dense[a:b]
            ds = ds[ds >= 0]
            w = max(floor, int(last_w[ds].max()) + 1) if len(ds) else floor
            if may_l[i] and len(ds):
                w = max(w, int(last_r[ds].max()))
            last_r[ds] = np.maximum(last_r[ds], w)
            if may_l[i]:
                last_w[ds] = w
        else:  # a few (a node's tensor-parallel group: one): one by one
            dset = set(dl[a:b])
            dset.discard(-1)
            w = max([floor] + [int(last_w[d]) + 1 for d in dset])
            if may_l[i]:
                w = max([w] + [int(last_r[d]) for d in dset])
            for d in dset:
                last_r[d] = max(int(last_r[d]), w)
                if may_l[i]:
                    last_w[d] = w
        if merges_l[i]:
            floor = w + 1
        wave_of.append(w)
    for w in range(max(wave_of) + 1):
        members = [i for i in range(len(comms)) if wave_of[i] == w]
        by_n: dict[int, list[int]] = {}
        for i in members:
            by_n.setdefault(comms[i].n, []).append(i)
        results: dict[int, tuple[Reduced, int]] = {}
        for _n, idx in sorted(by_n.items()):
            red = reduce_group([comms[i] for i in idx], [parts[i] for i in idx], ranks, gain)
            for j, i in enumerate(idx):
                results[i] = (red, j)
        # refinements in communicator order: those that join no islands touch disjoint
        # domains, so one update does them all; one that joins islands comes last in its wave
        plain_g: list[np.ndarray] = []
        plain_r: list[np.ndarray] = []
        for i in members:
            red, j = results[i]
            red.keep(j)
            if not red.writer[j]:
                continue
            if one_clock[i]:  # a zero step (add_residuals would average it into the node's)
                ranks.mark_refined(int(ranks.node[comms[i].grank[0]]))
                continue
            if merges[i]:
                if plain_g:
                    ranks.add_residuals(np.concatenate(plain_g), np.concatenate(plain_r), join=False)
                    plain_g, plain_r = [], []
                ranks.add_residuals(comms[i].grank, red.res[j])
            else:
                plain_g.append(comms[i].grank)
                plain_r.append(red.res[j])
        if plain_g:
            ranks.add_residuals(np.concatenate(plain_g), np.concatenate(plain_r), join=False)


def _seg_col_median(R: np.ndarray, seg: np.ndarray, C: int) -> np.ndarray:
    """Per segment (rows sorted by ``seg`` in [0, C)), the median of each column: np.median(R of
    the segment, axis=0) for all segments at once (C x columns; NaN where a segment has no row)."""
    k = np.bincount(seg, minlength=C)
    heads = np.r_[0, np.cumsum(k)[:-1]]
    pad = np.full((C, max(int(k.max()), 1) if len(k) else 1, R.shape[1]), np.nan)
    pad[seg, np.arange(len(seg)) - heads[seg]] = R
    srt = np.sort(pad, axis=1)  # NaN sort last
    c = np.arange(C)
    lo = srt[c, np.maximum((k - 1) // 2, 0)]
    hi = srt[c, np.maximum(k // 2, 0)]
    return (lo + hi) / 2


def _p2p_split(c: Comm, done: np.ndarray, gs: np.ndarray, gr: np.ndarray) -> np.ndarray:
    """OP_SPLIT rows of measured p2p transfers: one for the sender's op, one for the receiver's."""
    m = len(done)
    sp = np.zeros(2 * m, OP_SPLIT)
    sp["comm_id"] = c.id
    sp["seq"] = np.tile(done["seq"], 2)
    sp["rank"] = np.r_[gs, gr]
    sp["comm_rank"] = np.r_[done["src"], done["dst"]]
    sp["peer"] = np.r_[done["dst"], done["src"]]
    sp["op"] = np.r_[np.full(m, SEND), np.full(m, RECV)]
    sp["bytes"] = np.tile(done["bytes"], 2)
    for k in ("arrive_ns", "wait_ns", "lateness_ns", "compute_ns"):
        sp[k] = np.nan
    sp["last_arrive_ns"] = np.tile(done["last_arrive"], 2)
    sp["transfer_ns"] = np.tile(done["transfer"], 2)
    bw = done["bytes"] / done["transfer"]
    sp["algbw_gbs"] = np.tile(bw, 2)
    sp["busbw_gbs"] = np.tile(bw, 2)
    return sp


class P2PPairs:
    """Pairs every send with its receive (all communicators at once, once per chunk) and
    hands each communicator the transfers whose time is measurable (``Comm.p2p_pending``).

    Each side's own duration d = end - arrival needs no clock, and both sides end when the
    bytes have moved, so the side that arrived last has d = transfer. Ops in an ncclGroup
    with other ops share the group's events (d spans the whole group), so a pair is kept
    when both sides are alone (transfer = min d), or when the side that is alone provably
    arrived last; the others measure waiting, not the link.

    "Provably" without trusting clock estimates (pipeline stages on other nodes often share
    no collective, so nothing aligns their clocks to better than a few ms): causality bounds
    the two ranks' clock difference. Data cannot arrive before it was sent, so for every
    transfer s -> r, off_r - off_s <= end_r - arrival_s (raw times); the smallest such
    value over recent transfers on that link is within about one transfer time of the
    truth. Side u arrived after side v for sure when arrival_u - arrival_v >= that bound
    for the link v -> u.
    """

    def __init__(self, on_disagree: Callable[[np.ndarray, np.ndarray], None] | None = None) -> None:
        """``on_disagree(S, R)``: the pairs whose send (S) and receive (R) differ in count or dtype."""
        self.on_disagree = on_disagree
        self.half = np.empty(0, P2P_HALF)
        # causality bounds per directed link, sorted by key (comm << 42 | src << 21 | dst):
        # the minimum of the current and the previous epoch
        self.bkey = np.empty(0, np.int64)
        self.bcur = np.empty(0, np.int64)
        self.bprev = np.empty(0, np.int64)
        self.bep = np.empty(0, np.int64)

    def forget(self, comm_idx: list[int]) -> None:
        """Drop the unpaired halves and link bounds of freed communicators."""
        idx = np.asarray(comm_idx, np.int64)
        self.half = self.half[~np.isin(self.half["comm"], idx)]
        keep = ~np.isin(self.bkey >> 42, idx)
        self.bkey, self.bcur, self.bprev, self.bep = (
            a[keep] for a in (self.bkey, self.bcur, self.bprev, self.bep)
        )

    @staticmethod
    def _key(comm: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        return (comm.astype(np.int64) << 42) | (src.astype(np.int64) << 21) | dst.astype(np.int64)

    def feed(
        self, ops: OpCols, comm: np.ndarray, shared: np.ndarray, comms: dict[int, Comm], ranks: RankTable
    ) -> None:
        """p2p OP rows of one chunk (their columns), with each row's communicator index and
        whether it shares its group's events (Engine._shares_events)."""
        done = ops.end > 0
        if not done.any():
            return
        if not done.all():
            ops, comm, shared = ops.take(done), comm[done], shared[done]
        h = np.zeros(len(ops.end), P2P_HALF)
        is_recv = ops.op == RECV
        h["src"] = np.where(is_recv, ops.peer, ops.comm_rank)
        h["dst"] = np.where(is_recv, ops.comm_rank, ops.peer)
        h["seq"] = ops.seq
        h["recv"] = is_recv
        h["grouped"] = shared
        h["bytes"] = ops.nbytes
        h["arr"] = ops.arr
        h["end"] = ops.end
        h["g"] = ops.rank
        h["comm"] = comm
        dtype = ((ops.kinds >> np.uint64(8)) & np.uint64(0xFF)).view(np.int64)
        h["sig"] = (ops.elems.view(np.int64) << 8) | dtype
        # whole-record copies (take): numpy copies a structured array's rows field by field
        allh = schema.join_records([self.half, h]) if len(self.half) else h
        # by link (comm, src, dst), seq, send before receive: each field packed by its own range
        order = lexsort((allh["recv"], allh["seq"], allh["dst"], allh["src"], allh["comm"]))
        allh = take(allh, order)
        k = self._key(allh["comm"], allh["src"], allh["dst"])
        seq = allh["seq"]
        same = (k[1:] == k[:-1]) & (seq[1:] == seq[:-1]) & ~allh["recv"][:-1] & allh["recv"][1:]
        i = np.flatnonzero(same)
        paired = np.zeros(len(allh), bool)
        paired[i] = paired[i + 1] = True
        rest = take(allh, ~paired)
        if len(rest) > P2P_HALF_CAP:
            rest = take(rest, np.argsort(rest["arr"], kind="stable")[-P2P_HALF_CAP:])
        self.half = rest
        if not len(i):
            return
        S, R = take(allh, i), take(allh, i + 1)
        if self.on_disagree is not None:
            bad = S["sig"] != R["sig"]
            if bad.any():
                self.on_disagree(take(S, bad), take(R, bad))
        ksr = k[i]
        krs = self._key(S["comm"], S["dst"], S["src"])
        self._note(ksr, R["end"] - S["arr"], int(S["arr"].max()) // P2P_BOUND_EPOCH_NS)
        hi_sr, hi_rs = self._bound(ksr), self._bound(krs)  # bounds on off_r - off_s, off_s - off_r
        dS, dR = S["end"] - S["arr"], R["end"] - R["arr"]
        both = ~S["grouped"] & ~R["grouped"]
        s_last = ~S["grouped"] & R["grouped"] & (S["arr"] - R["arr"] >= hi_rs)
        r_last = S["grouped"] & ~R["grouped"] & (R["arr"] - S["arr"] >= hi_sr)
        transfer = np.where(both, np.minimum(dS, dR), np.where(s_last, dS, dR))
        keep = (both | s_last | r_last) & (transfer > 0)
        if not keep.any():
            return
        S, R, transfer = take(S, keep), take(R, keep), transfer[keep]
        gs, gr = S["g"], R["g"]
        out = np.zeros(len(S), P2P_DONE)
        out["src"], out["dst"], out["seq"] = S["src"], S["dst"], S["seq"]
        out["bytes"] = np.maximum(S["bytes"], R["bytes"])
        out["last_arrive"] = np.maximum(S["arr"] - ranks.offsets(gs), R["arr"] - ranks.offsets(gr))
        out["transfer"] = transfer
        out["aligned"] = ranks.aligned(gs) & ranks.aligned(gr)
        cidx = S["comm"]
        heads = np.flatnonzero(np.r_[True, cidx[1:] != cidx[:-1]])  # sorted by comm already
        tails = np.r_[heads[1:], len(S)]
        la_min = np.minimum.reduceat(out["last_arrive"], heads).tolist()
        for a, b, la, ci in zip(heads.tolist(), tails.tolist(), la_min, cidx[heads].tolist(), strict=True):
            c = comms[ci]
            rows = out[a:b]  # a view: the slow judge takes pending rows within a window or two
            if c._pool is not None and not c._pool.keep(rows.nbytes, len(rows)):
                continue
            c.p2p_pending.append(rows)
            c.p2p_views += 1
            if c.p2p_views > PENDING_PARTS:
                _join_latest(c.p2p_pending, c.p2p_views, cat)
                c.p2p_views = 0
            if la < c.p2p_pending_min_la:
                c.p2p_pending_min_la = la
                if c._pool is not None:
                    c._pool.p2pmin[ci] = la
            if c.split is not None:
                c.split.append(_p2p_split(c, rows, gs[a:b], gr[a:b]))

    def _note(self, key: np.ndarray, val: np.ndarray, epoch: int) -> None:
        """Fold this chunk's end_r - arrival_s into the per-link minima. ``key`` comes sorted
        (feed pairs the halves in link order): each link's minimum is one of its run's, and the
        links already known are found by a search of the sorted keys (cheaper than np.unique,
        np.minimum.at and np.isin on every chunk)."""
        val = val.astype(np.int64)
        if len(key) > 1 and (key[1:] >= key[:-1]).all():
            heads = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
            uk, mn = key[heads], np.minimum.reduceat(val, heads)
        else:
            uk, inv = np.unique(key, return_inverse=True)
            mn = np.full(len(uk), np.iinfo(np.int64).max, np.int64)
            np.minimum.at(mn, inv.ravel(), val)
        at = np.minimum(np.searchsorted(self.bkey, uk), max(len(self.bkey) - 1, 0))
        new = self.bkey[at] != uk if len(self.bkey) else np.ones(len(uk), bool)
        if new.any():
            big = np.iinfo(np.int64).max
            allk = np.concatenate([self.bkey, uk[new]])
            o = np.argsort(allk, kind="stable")
            self.bkey = allk[o]
            self.bcur = np.concatenate([self.bcur, np.full(int(new.sum()), big, np.int64)])[o]
            self.bprev = np.concatenate([self.bprev, np.full(int(new.sum()), big, np.int64)])[o]
            self.bep = np.concatenate([self.bep, np.full(int(new.sum()), epoch, np.int64)])[o]
        pos = np.searchsorted(self.bkey, uk)
        rolled = self.bep[pos] != epoch
        self.bprev[pos] = np.where(rolled, self.bcur[pos], self.bprev[pos])
        self.bcur[pos] = np.where(rolled, mn, np.minimum(self.bcur[pos], mn))
        self.bep[pos] = epoch

    def _bound(self, key: np.ndarray) -> np.ndarray:
        big = np.iinfo(np.int64).max
        if not len(self.bkey):
            return np.full(len(key), big, np.int64)
        pos = np.minimum(np.searchsorted(self.bkey, key), len(self.bkey) - 1)
        hit = self.bkey[pos] == key
        return np.where(hit, np.minimum(self.bcur[pos], self.bprev[pos]), big)
