"""One communicator's state: the latest heartbeat of every member (how far it has issued /
arrived / finished, its oldest pending op), the highest op finished per member from OP
records, p2p completion counters, and an op ring ``(W slots x nranks)`` of arrival, end and
compute-gap times in which a collective (C, k) becomes *complete* once every member's OP
record is in (an op whose rows are all in one chunk skips the ring). Complete ops are
reduced (c4d/engine/reduce.py) to ``COMPLETED`` rows, which it keeps with the measured p2p
transfers (``P2P_DONE`` rows, c4d/engine/p2p_pairs.py) until the slow judge takes them.

Nothing here keeps one Python object per record. A ``Comm`` of the engine holds views of its
ranges of the ``Pool`` (c4d/engine/pool.py); one made without a pool (a node agent's) owns
its arrays. Apart from the pool because it is one communicator's view and bookkeeping: the
pool, the reduction, the p2p pairing and the node agent hand it rows or take them through its
methods, never its private fields.
"""

from __future__ import annotations

import numpy as np

from c4d.engine.compute import compute_before
from c4d.engine.pool import BUDGETS, RING_CELL_BYTES, P2PDone, Pool
from c4d.engine.ranks import RankTable
from c4d.engine.reduce import Complete, reduce_group
from c4d.engine.rows import COMPLETED, NO_ROWS, cat, copy_rows, split_rows, take
from c4d.record import schema

# what the live view reads of a communicator's latest completed collectives and transfers
RECENT = np.dtype(
    [("seq", "<i8"), ("last", "<i4"), ("wait_max", "<i8"), ("transfer", "<i8"), ("busbw", "<f8")]
)
RECENT_XFER = np.dtype([("transfer", "<i8"), ("bytes", "<i8")])
RECENT_OPS = 256  # completed ops kept per communicator: what the live view summarises
PENDING_PARTS = 16  # chunks' rows a communicator keeps as views for the slow judge (Comm.keep_completed)


class Comm:
    """One communicator's arrays. ``n`` members, op ring of ``W`` sequence slots."""

    # per member (Pool.MEMBER gives each its initial value): the latest heartbeat's view
    # (hb_time on the rank's clock), its oldest pending op (pend_count, pend_dtype and
    # pend_redop: what members must agree on, consistency.py), from OP records the highest
    # collective seq finished + 1 (op_done) and the running compute sum at its latest op here
    # (last_cum); per op ring slot (Pool.SLOT): tag, opk, processed
    grank: np.ndarray
    gone: np.ndarray
    hb_seen: np.ndarray
    hb_time: np.ndarray
    n_issued: np.ndarray
    n_arrived: np.ndarray
    n_done: np.ndarray
    last_arrive: np.ndarray
    pend_seq: np.ndarray
    pend_op: np.ndarray
    pend_peer: np.ndarray
    pend_flags: np.ndarray
    pend_issue: np.ndarray
    pend_start: np.ndarray
    p2p_in_flight: np.ndarray
    pend_count: np.ndarray
    pend_dtype: np.ndarray
    pend_redop: np.ndarray
    op_done: np.ndarray
    last_cum: np.ndarray
    owner: np.ndarray
    tag: np.ndarray
    opk: np.ndarray
    processed: np.ndarray

    @staticmethod
    def slots(n: int) -> int:
        """W, the op ring's sequence slots for ``n`` members."""
        return int(min(1024, max(64, (1 << 20) // max(n, 1))))

    @staticmethod
    def table_bytes(n: int) -> int:
        """What the master holds for a communicator of ``n`` members before its op ring's member
        rows are made: this object, its share of the Pool, the edge's and the bookkeeping's entries
        (C4D_MAX_COMM_BYTES charges it: c4d/intake/validate.py; tests/test_edge_ingest.py measures it)."""
        return 12288 + 24 * Comm.slots(n) + 800 * n

    def __init__(self, idx: int, cid: int, n: int, pool: Pool | None = None) -> None:
        self.idx, self.id, self.n = idx, cid, n
        self.mbase = self.sbase = -1  # where its arrays lie in the engine's Pool (-1: its own)
        self.W = Comm.slots(n)
        self.parent = 0
        # bumped by every change to what the hang graph reads (hang.WaitGraph skips a
        # communicator nobody waited in at the version it last saw)
        self.version = 0
        self.idle_version = -1
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
        # the members' rows of ops not complete within one chunk (scatter): made on first use; a
        # communicator whose ops always come complete, or only as node agents' summaries or
        # p2p, never needs them (W x n each: 1.2 GiB for the 49k members of 16,384 ranks)
        self._ring: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.nbytes = np.zeros(W, np.int64)
        self.incomplete = 0  # ops evicted before every member reported
        # derived
        self.pending: list[np.ndarray] = []  # COMPLETED rows not yet judged by a slow window
        self.pending_min_la = NO_ROWS  # their earliest last_arrive (Pool.pmin too: the judge's)
        self.pending_gaps: list[np.ndarray] = []  # their members' compute before each op (ops x n, ns)
        self.pending_views = 0  # parts appended since the last join (keep_completed)
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
            pool.attach(self)  # its per-member and per-slot arrays: views of the pool's
        else:
            Pool.fresh(self)

    # -- the op ring's member rows ----------------------------------------------------------
    def ring_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """(has, arrival, end, compute gap), each W x n; None when the job's ring budget has no
        room for them (Pool.room)."""
        if self._ring is None:
            W, n = self.W, self.n
            if self._pool is not None and not self._pool.room(self, "ring", W * n * RING_CELL_BYTES):
                return None
            # has, arrival, end, the member's compute before the op (-1 unknown; add_collectives).
            # All zeros: a slot is read only once claimed by an op (scatter resets has and gap
            # then), and zeros are pages the kernel gives when first touched: a 512-member ring
            # is 12.5 MiB, and a -1 fill touched its gap's 4 MiB as it was made
            has, arr, end, gap = (np.zeros((W, n), dt) for dt in (bool, np.int64, np.int64, np.int64))
            self._ring = (has, arr, end, gap)
        return self._ring

    def drop_ring(self) -> int:
        """Its ring's member rows freed: the ops not complete in it are counted incomplete and
        marked processed, so their late rows are ignored (never reduced from half a ring).
        Returns the bytes they held (Pool.let_go uncharges them; 0: it had none)."""
        if self._ring is None:
            return 0
        freed = self._ring[0].size * RING_CELL_BYTES
        open_ = (self.tag >= 0) & ~self.processed
        self.incomplete += int((open_ & self._ring[0].any(axis=1)).sum())
        self.processed[open_] = True
        self._ring = None
        return freed

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
        keep = self._pool.sampler.thin(self.idx, ops["seq"], win) if self._pool is not None else None
        if keep is not None:  # each window through its final sample (sampling.py)
            ops, gaps, win = take(ops, keep), gaps[keep], win[keep]
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

    # -- what its pool hands it or takes back ---------------------------------------------
    def add_summaries(self, rows: list[np.ndarray], gaps: list[np.ndarray], la_min: int,
                      join: bool = False) -> None:  # fmt: skip
        """Runs of its node summaries (views of the pool's blocks: Pool.settle) appended to what
        it keeps: its members' compute columns only; ``la_min``: their earliest last arrival
        (the pool's); ``join``: the parts just appended joined into one (those joined before
        stay)."""
        self.pending.extend(rows)
        self.pending_gaps.extend(g[:, : self.n] for g in gaps)
        self.pending_min_la = min(self.pending_min_la, la_min)
        if join:
            _join_latest(self.pending, len(rows), cat)
            _join_latest(self.pending_gaps, len(gaps), np.concatenate)

    def kept_bytes(self) -> int:
        """What it keeps for the slow judge now, in bytes (a view counts its own: Pool.recount)."""
        n = sum(p.nbytes for p in self.pending) + sum(g.nbytes for g in self.pending_gaps)
        return n + sum(p.nbytes for p in self.p2p_pending)

    def leave_pool(self) -> None:
        """Its OP row count, first chunk's time and p2p counters kept as its own as it leaves
        its pool (Pool.detach, which has copied its arrays out of the pool's ranges)."""
        pool = self._pool
        assert pool is not None
        rate = pool.rate
        self._seen_own = int(rate.total[self.idx]) if self.idx < len(rate.total) else 0
        self._first_own = self.first_done_ns
        self._p2p_own, self._pool = pool.p2p.of(self.idx), None

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
        part = copy_rows(rows)
        pool = self._pool
        if pool is not None:
            while not pool.room(self, "peer", part.nbytes) and self.peer_rows:
                self.pop_peers()
            if self.idx not in pool.holders["peer"]:  # no room even alone: refused
                pool.refuse("peer bytes", BUDGETS["peer"][0], len(part))
                return
        self.peer_rows.append(part)
        self.peer_n += len(part)
        cap = max(4096, 64 * self.n)
        while self.peer_n > cap and len(self.peer_rows) > 1:
            self.pop_peers()

    def pop_peers(self) -> int:
        """Its oldest part of PEER rows let go (uncharged from its pool's budget); their rows."""
        old = self.peer_rows.pop(0)
        self.peer_n -= len(old)
        if self._pool is not None:
            self._pool.held["peer"] -= old.nbytes
            if not self.peer_rows:
                self._pool.holders["peer"].pop(self.idx, None)
        return len(old)

    def drop_peers(self) -> int:
        """Every PEER row it keeps let go (Pool.let_go); their bytes, which the pool uncharges."""
        freed = sum(p.nbytes for p in self.peer_rows)
        self.peer_rows, self.peer_n = [], 0
        return freed

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
        (The engine does this for all communicators of a chunk at once: ingest_ops.OpIngest._collectives.)"""
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

    def complete_ops(self, slots: np.ndarray) -> Complete:
        """Its complete ops at these slots of its ring (``scatter``'s), as the reduction takes them."""
        assert self._ring is not None  # (slots come from its ring)
        _has, arr, end, gap = self._ring
        return Complete(
            arr[slots], end[slots], gap[slots], self.opk[slots], self.nbytes[slots], self.tag[slots]
        )

    def keep_transfers(self, rows: np.ndarray, la_min: int) -> bool:
        """Keep measured p2p transfers (P2P_DONE rows, a view of a chunk's: P2PPairs.feed) for
        the slow windows and the live view, within its pool's budget; ``la_min``: their
        earliest last arrival. False: refused for want of room (counted by the pool)."""
        if self._pool is not None and not self._pool.keep(rows.nbytes, len(rows)):
            return False
        self.p2p_pending.append(rows)
        self.p2p_views += 1
        if self.p2p_views > PENDING_PARTS:
            _join_latest(self.p2p_pending, self.p2p_views, cat)
            self.p2p_views = 0
        if la_min < self.p2p_pending_min_la:
            self.p2p_pending_min_la = la_min
            if self._pool is not None:
                self._pool.p2pmin[self.idx] = la_min
        return True

    def take_all(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Every COMPLETED row it keeps and their members' compute (ops x n), in the order they
        came, taken: a node agent sends what its communicators completed at once
        (c4d/agent/summary.py) and judges nothing itself."""
        out = self.pending, self.pending_gaps
        self.pending, self.pending_gaps = [], []
        return out

    def _reduce(self, slots: np.ndarray, ranks: RankTable, gain: float) -> np.ndarray:
        """One COMPLETED row per complete op (``reduce_group`` of this communicator alone), kept;
        then the clock refinement from their end times."""
        red = reduce_group([self], [self.complete_ops(slots)], ranks, gain)
        red.sample(self._pool.sampler if self._pool is not None else None)
        red.keep(0)
        if red.writer[0]:
            ranks.add_residuals(self.grank, red.res[0])
        return red.out

    def keep_completed(self, out: np.ndarray, gaps: np.ndarray, la_min: int | None = None) -> None:
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
    return cat(got[::-1], dt)[-RECENT_OPS:] if got else np.empty(0, dt)
