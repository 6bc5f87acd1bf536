"""Complete collectives reduced to one ``COMPLETED`` row each: last arrival, wait, transfer,
busbw, who arrived last and by how much; each member's compute before the op; on request,
per-rank ``OP_SPLIT`` rows; and the clock refinement their end times give.

``reduce_group`` reduces all complete ops of all communicators of one size at once;
``reduce_comms`` orders the groups so the clock refinement gives what one communicator after
the other gives (``Comm._reduce``, c4d/engine/comm.py). Apart because it is the arithmetic
of the reduction only: it reads a communicator's members and hands it rows through what
``Reducible`` names, and keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from c4d.engine.ranks import RankTable
from c4d.engine.rows import COMPLETED, END_SYNC, OP_SPLIT, row_median
from c4d.record.opstats import busbw_factor, total_bytes


class Reducible(Protocol):
    """What the reduction reads of a communicator (c4d/engine/comm.py, Comm), and where it
    hands the rows it made."""

    @property
    def id(self) -> int: ...

    @property
    def n(self) -> int: ...  # members

    @property
    def grank(self) -> np.ndarray: ...  # each member's global rank (-1 unknown)

    @property
    def split(self) -> list[np.ndarray] | None: ...  # its OP_SPLIT rows, when it keeps them

    def keep_completed(self, out: np.ndarray, gaps: np.ndarray, la_min: int | None = None) -> None: ...


class Complete(NamedTuple):
    """One communicator's complete ops as its ring holds them (rank clocks), in seq order."""

    arr: np.ndarray  # ops x n: arrival (device start, else host issue)
    end: np.ndarray  # ops x n
    gap: np.ndarray  # ops x n: the member's compute before the op, -1 unknown
    op: np.ndarray
    nbytes: np.ndarray
    seq: np.ndarray

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

    comms: Sequence[Reducible]
    out: np.ndarray
    gaps: np.ndarray
    split: np.ndarray | None
    bounds: list[int]
    writer: np.ndarray
    res: np.ndarray

    def keep(self, i: int) -> None:
        """Communicator i keeps its rows (Comm.keep_completed, and its OP_SPLIT rows)."""
        c, a, b = self.comms[i], self.bounds[i], self.bounds[i + 1]
        if c.split is not None and self.split is not None:
            c.split.append(self.split[a:b].ravel())
        c.keep_completed(self.out[a:b], self.gaps[a:b])


def reduce_group(
    comms: Sequence[Reducible], parts: Sequence[Complete], ranks: RankTable, gain: float
) -> Reduced:
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


def reduce_comms(done: Sequence[tuple[Reducible, Complete]], ranks: RankTable, gain: float) -> None:
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
