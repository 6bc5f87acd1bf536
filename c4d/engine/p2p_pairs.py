"""Every communicator's p2p sends paired with their receives, once per chunk, and the
transfer times that are measurable handed to each communicator (``P2P_DONE`` rows, kept by
``Comm.keep_transfers`` for the slow judge).

Apart because it is the one part of the engine's memory that spans communicators and chunks
by link: the unpaired halves and the causality bounds per directed link live here, not in
any communicator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from c4d.engine.comm import Comm
from c4d.engine.ranks import RankTable
from c4d.engine.rows import OP_SPLIT, P2P_DONE, RECV, SEND, OpCols, lexsort, take
from c4d.record import schema
from c4d.util.sorted_lookup import find_sorted

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
        whether it shares its group's events (ingest_ops.shares_events)."""
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
            if not c.keep_transfers(rows, la):
                continue
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
        _, known = find_sorted(self.bkey, uk)
        new = ~known
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
        pos, hit = find_sorted(self.bkey, key)
        return np.where(hit, np.minimum(self.bcur[pos], self.bprev[pos]), big)
