"""What every communicator's arrays share: the ``Pool`` and its byte budgets.

The arrays a chunk's OP and HEARTBEAT rows update (membership, heartbeat counters,
``op_done``, the ring's tags) live in one ``Pool`` for every communicator, each ``Comm``
holding views of its ranges, so one fancy-indexed assignment updates them all
(``ingest_ops.OpIngest._collectives``, ``ingest.Ingest._heartbeats``). Beside them, every
communicator's p2p completion counters (``P2PDone``), OP rows ingested (``RateLog``) and node
agents' summaries not handed out yet (``SummaryBlock``), and the byte budgets of what a sender
can make the engine hold (``budget_from_env``, ``Pool.room``, ``Pool.keep``).

Apart from c4d/engine/comm.py because it holds every communicator at once: it points a
communicator's arrays at its ranges (by the names in ``Pool.MEMBER`` and ``Pool.SLOT``) and
otherwise reaches it only through what ``Pooled`` names. A ``Comm`` made without a pool (a
node agent's) never touches it.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, OrderedDict, deque
from typing import Protocol

import numpy as np

from c4d.engine.rows import NO_ROWS, P2P, grow, take
from c4d.engine.sampling import WindowSampler
from c4d.util.ratelog import RateLimitedLog

log = logging.getLogger("c4d.engine")

RATE_WINDOW_NS = 5_000_000_000  # the live view's ops/s is measured over this much master time
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
# Budgets whose default is a floor that grows with the ranks registered (Pool.fit), in bytes a
# rank: what a real job needs grows with it, and what a sender can make it reach is bounded by
# the ranks it can register (C4D_MAX_RANKS at the edge). One set in the environment stays as set.
# ring: a communicator's ring is RING_CELL_BYTES x 1,024 slots a member up to 1,024 members (25
# MiB past them, Comm.slots): 25 KiB a rank for each communicator of it whose ops span chunks;
# a job's data-parallel group's (through node agents, the TP summaries and PP p2p make none) and
# tensor-parallel group's (ranks sending directly): 50 KiB. 32,768 ranks' 32 DP groups of 1,024
# members need 800 MiB: the 512 MiB floor (64 KiB a rank at 8,192) let them go (performance.md).
# kept: a job's rate times about two windows; at 10 s windows a TP 8 x PP 4 job held at most
# 30 KiB a rank, through node agents (8,192 ranks) or from its ranks (2,048), at the first
# window's close (analysis/bench_budgets.py --kept-seconds 21): 64 KiB is twice that (3 GiB, the
# floor, is 64 KiB a rank at 49,152). A longer window's first (not sampled yet) holds more.
PER_RANK = {"ring": 64 << 10, "kept": 64 << 10}
SIZED = {**BUDGETS, "kept": KEPT_BUDGET}  # every byte budget Pool._size sizes


def env_budget(var: str, default: int, env=None, grows: bool = False) -> int | None:
    """A byte budget set in the environment (suffixes K, M, G); None when it is not, or is
    malformed (a line logged: the default is kept; ``grows``: a default that grows with the job)."""
    raw = (os.environ if env is None else env).get(var, "").strip()
    if not raw:
        return None
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(raw[-1:].upper(), 1)
    try:
        v = int(float(raw[:-1] if mult > 1 else raw) * mult)
        if v <= 0:
            raise ValueError
    except ValueError:
        more = ", more as ranks register" if grows else ""
        log.warning("c4d: %s=%r is not a positive number of bytes; using %d%s", var, raw, default, more)
        return None
    return v


def budget_from_env(var: str, default: int, env=None) -> int:
    """A byte budget from the environment (suffixes K, M, G); a malformed one logs a line and
    keeps the default."""
    v = env_budget(var, default, env)
    return default if v is None else v


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


class Pooled(Protocol):
    """What the pool asks of a communicator whose arrays it holds (c4d/engine/comm.py, Comm):
    its size and ranges, and the methods that hand it rows or let its parts go."""

    idx: int
    n: int  # members
    W: int  # op ring slots
    mbase: int  # its first member's index in the pool's member arrays (-1: its own)
    sbase: int  # its first slot's index in the pool's slot arrays
    pending_min_la: int
    p2p_pending_min_la: int
    peer_rows: list[np.ndarray]

    def add_summaries(
        self, rows: list[np.ndarray], gaps: list[np.ndarray], la_min: int, join: bool = False
    ) -> None: ...

    def leave_pool(self) -> None: ...

    def kept_bytes(self) -> int: ...

    def pop_peers(self) -> int: ...

    def drop_peers(self) -> int: ...

    def drop_ring(self) -> int: ...


class Pool:
    """The per-member and per-slot arrays that a chunk's collective rows update (membership,
    ``op_done``, ``last_cum``; the ring's ``tag``, ``opk``, ``processed``) of every
    communicator, in one flat array each, so the engine updates all communicators' with one
    numpy call (ingest_ops.OpIngest.feed). Each Comm's arrays are views of its ranges (``mbase``,
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

    def __init__(self, window_ops: int = 0) -> None:
        """``window_ops``: the most completed ops of a communicator kept per slow window
        (sampling.py; 0: all)."""
        self.member: dict[str, np.ndarray] = {k: np.full(0, f, dt) for k, dt, f in self.MEMBER}
        self.slot = {k: np.full(0, f, dt) for k, dt, f in self.SLOT}
        self.m_used = self.s_used = 0
        self.comms: dict[int, Pooled] = {}  # by index
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
        # made 26 MiB), PEER rows (a communicator keeps max(4096, 64 n)) and the rows kept for
        # the slow judge (below); those of PER_RANK grow with the ranks registered (fit) unless
        # set in the environment (``_fixed``); an engine shard's are its ``part`` (share)
        self._fixed = {k: env_budget(var, d, grows=k in PER_RANK) for k, (var, d) in SIZED.items()}
        self.part = 1.0
        self.ranks = 0  # registered ranks the budgets are sized for
        self.budget: dict[str, int] = {}
        self.kept_budget = 0
        self._size()
        self.held = dict.fromkeys(BUDGETS, 0)
        # communicator indices holding each, least recently used first (evicted first)
        self.holders: dict[str, OrderedDict[int, None]] = {k: OrderedDict() for k in BUDGETS}
        self.dropped: Counter[str] = Counter()  # rows refused for want of room, by reason
        self.evicted: Counter[str] = Counter()  # rings and PEER tables let go to make room
        self.ratelog = RateLimitedLog(log)
        self.p2p.ratelog = self.ratelog
        # rows kept for the slow judge: counted as they come (an upper bound: the judge takes
        # them elsewhere), counted exactly (recount) when that passes the budget (kept_budget)
        self.sampler = WindowSampler(window_ops)
        self.kept = 0
        self._refused = 0  # bytes refused since the last recount
        self._over = False  # the last recount found no room

    def share(self, part: float) -> None:
        """Hold ``part`` of each byte budget: an engine shard's pool (c4d/engine/shards.py), so
        the shards together hold what one engine's would (grown too: ``fit``)."""
        if part < 1:
            self.part = part
            self._size()
            self.p2p.max_keys = max(1, int(self.p2p.max_keys * part))

    def fit(self, ranks: int) -> None:
        """The budgets of PER_RANK not set in the environment sized for ``ranks`` registered
        ranks (RankTable.registered; an engine shard is told the join's): they only grow."""
        if ranks > self.ranks:
            self.ranks = ranks
            self._size()

    def _size(self) -> None:
        sized = {}
        for k, (_var, floor) in SIZED.items():
            fixed = self._fixed[k]
            total = fixed if fixed is not None else max(floor, PER_RANK.get(k, 0) * self.ranks)
            sized[k] = max(1, int(total * self.part)) if self.part < 1 else total
        self.kept_budget = sized.pop("kept")
        self.budget = sized

    def keep_summaries(self, out: np.ndarray, gaps: np.ndarray, idx: np.ndarray, head: np.ndarray,
                       tail: np.ndarray, la_min: np.ndarray) -> None:  # fmt: skip
        """A chunk's summaries (COMPLETED rows and their members' compute, ``idx[k]``'s rows
        ``head[k]:tail[k]``, earliest last arrival ``la_min[k]``; distinct communicators), or
        their sample (sampling.py)."""
        got = self.sampler.select(out["last_arrive"], out["seq"], idx, head, tail)
        if got is not None:
            rows, counts = got
            out, gaps = take(out, rows), gaps[rows]  # (whole rows: field by field was 3% of the engine)
            some = counts > 0
            idx, la_min, counts = idx[some], la_min[some], counts[some]
            tail = np.cumsum(counts)
            head = tail - counts
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
            c.add_summaries(rows, gaps, int(self.pmin[i]), join)

    def settle_one(self, c: Pooled) -> None:
        """Communicator ``c``'s summaries not handed out yet, handed to it (before rows of its
        own come after them: Comm.keep_completed)."""
        got = [x for x in (b.drop(c.idx) for b in self.blocks) if x is not None]
        c.add_summaries([r for r, _ in got], [g for _, g in got], int(self.pmin[c.idx]))
        self.blocked[c.idx] = False

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

    def attach(self, c: Pooled) -> None:
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
        grown = self._room(c.n, c.W)
        c.mbase, c.sbase = self.m_used, self.s_used
        self.m_used += c.n
        self.s_used += c.W
        self.comms[c.idx] = c
        for d in self.comms.values() if grown else (c,):
            self._point(d)
        self.member["owner"][c.mbase : c.mbase + c.n] = c.idx
        self._base(c)

    def reserve(self, sizes: list[tuple[int, int]]) -> None:
        """Room for communicators of these (members, op ring slots), about to be made together
        (CommIndex.make): the pool grows once for those no freed range of their size takes, not
        at each doubling on the way (each growth re-points the views of every communicator made
        so far)."""
        members = slots = 0
        for (n, w), k in Counter(sizes).items():
            k -= len(self.free.get(n, ()))
            if k > 0:
                members, slots = members + k * n, slots + k * w
        if (members or slots) and self._room(members, slots):
            for d in self.comms.values():
                self._point(d)

    def _room(self, members: int, slots: int) -> bool:
        """Grown (or compacted) so that ``members`` and ``slots`` more fit at the end; whether
        the arrays moved (the communicators' views must be re-pointed)."""
        grown = False
        if self.m_used + members > len(self.member["grank"]) or self.s_used + slots > len(self.slot["tag"]):
            live = self.comms.values()
            m_live, s_live = sum(d.n for d in live) + members, sum(d.W for d in live) + slots
            if 2 * m_live <= self.m_used or 2 * s_live <= self.s_used:
                self._compact()  # freed ranges of other sizes: reused, not added to
                grown = True
        for arrs, spec, used, need in (
            (self.member, self.MEMBER, self.m_used, members),
            (self.slot, self.SLOT, self.s_used, slots),
        ):
            cap = len(next(iter(arrs.values())))
            if used + need > cap:
                size = max(1024, 2 * cap)
                while size < used + need:  # doubled as often as one at a time would have
                    size *= 2
                for k, _dt, f in spec:
                    arrs[k] = grow(arrs[k], size, f)
                grown = True
        return grown

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

    def _base(self, c: Pooled) -> None:
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

    def _point(self, c: Pooled) -> None:
        for k, _dt, _f in self.MEMBER:
            setattr(c, k, self.member[k][c.mbase : c.mbase + c.n])
        for k, _dt, _f in self.SLOT:
            setattr(c, k, self.slot[k][c.sbase : c.sbase + c.W])

    def detach(self, c: Pooled) -> None:
        """A freed communicator's ranges go to the next one of its size (its Comm keeps copies)."""
        if self.comms.pop(c.idx, None) is not None:
            self.member["owner"][c.mbase : c.mbase + c.n] = -1
            self._own(c)
            c.leave_pool()
            self.p2p.forget(c.idx)
            self.rate.forget(c.idx)
            self.sampler.forget(c.idx)
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
            n += c.kept_bytes()
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

    def room(self, c: Pooled, what: str, nbytes: int) -> bool:
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
                self.dropped["peer bytes"] += v.pop_peers()
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

    def let_go(self, c: Pooled, what: str) -> None:
        """``c``'s op ring or PEER rows freed and uncharged (a ring's ops not complete are
        counted incomplete and their late rows ignored: Comm.scatter)."""
        order = self.holders[what]
        if c.idx not in order:
            return
        del order[c.idx]
        if what == "ring":
            self.held[what] -= c.drop_ring()
        elif what == "peer":
            self.held[what] -= c.drop_peers()

    @classmethod
    def fresh(cls, c: Pooled) -> None:
        """A communicator outside any pool (a node agent's) given arrays of its own, each at its
        initial value."""
        for specs, size in ((cls.MEMBER, c.n), (cls.SLOT, c.W)):
            for k, dt, f in specs:
                setattr(c, k, np.full(size, f, dt))

    @classmethod
    def _own(cls, c: Pooled) -> None:
        for k, _dt, _f in (*cls.MEMBER, *cls.SLOT):
            setattr(c, k, getattr(c, k).copy())
