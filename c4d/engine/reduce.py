"""Complete collectives reduced to one ``COMPLETED`` row each: last arrival, wait, transfer,
busbw, who arrived last and by how much; each member's compute before the op; on request,
per-rank ``OP_SPLIT`` rows; and the clock refinement their end times give.

``reduce_group`` reduces all complete ops of all communicators of one size at once;
``reduce_comms`` reduces a chunk's communicators with the offsets as the chunk found them
(``reduce_each``) and applies their clock refinement steps together at its end, each clock
domain moved by the mean of the steps that refine it, scaled to the contraction applying them
one after the other would give (``apply_steps``: Jacobi order). Apart
because it is the arithmetic of the reduction only: it reads a communicator's members and
hands it rows through what ``Reducible`` names, and keeps no state of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from c4d.engine.ranks import RankTable
from c4d.engine.rows import COMPLETED, END_SYNC, OP_SPLIT, row_median, take
from c4d.engine.sampling import WindowSampler
from c4d.record.opstats import busbw_factor, total_bytes


class Reducible(Protocol):
    """What the reduction reads of a communicator (c4d/engine/comm.py, Comm), and where it
    hands the rows it made."""

    @property
    def id(self) -> int: ...

    @property
    def idx(self) -> int: ...  # its index (the sampler's key)

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

    kept: tuple[np.ndarray, np.ndarray, list[int]] | None = None
    """The rows and compute the slow window's sample keeps, and their bounds (``sample``)."""

    def sample(self, sampler: WindowSampler | None) -> None:
        """Keep for the slow judge only the rows each communicator's window sample keeps
        (c4d/engine/sampling.py), every communicator at once; OP_SPLIT rows stay whole."""
        if sampler is None or not len(self.out):
            return
        b = np.asarray(self.bounds)
        some = b[1:] > b[:-1]
        idx = np.array([c.idx for c in self.comms], np.int64)[some]
        got = sampler.select(self.out["last_arrive"], self.out["seq"], idx, b[:-1][some], b[1:][some])
        if got is None:
            return
        rows, counts = got
        per = np.zeros(len(self.comms), np.int64)
        per[some] = counts
        self.kept = take(self.out, rows), self.gaps[rows], np.r_[0, np.cumsum(per)].tolist()

    def keep(self, i: int) -> None:
        """Communicator i keeps its rows (Comm.keep_completed: the sample's, after ``sample``)
        and its OP_SPLIT rows."""
        c, a, b = self.comms[i], self.bounds[i], self.bounds[i + 1]
        if c.split is not None and self.split is not None:
            c.split.append(self.split[a:b].ravel())
        out, gaps, bounds = self.kept if self.kept is not None else (self.out, self.gaps, self.bounds)
        c.keep_completed(out[bounds[i] : bounds[i + 1]], gaps[bounds[i] : bounds[i + 1]])


def reduce_group(
    comms: Sequence[Reducible], parts: Sequence[Complete], ranks: RankTable, gain: float
) -> Reduced:
    """One COMPLETED row per complete op of communicators of one size n, all at once (each row
    depends only on its op and its communicator's members), with the offsets as they are now.
    Applies nothing to ``ranks``: the caller applies ``res`` where ``writer``, in communicator
    order (``Comm._reduce`` at once, ``reduce_comms`` at the chunk's end)."""
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
            # averages per node), so it is exactly zero and the op only marks the node refined
            # (apply_steps relies on it)
            res[one_clock] = 0.0
    # each member's compute before the op (see add_collectives): what a slow rank's peers
    # wait for
    gaps = np.where(G >= 0, G, np.nan).astype(np.float32)
    return Reduced(comms, out, gaps, sp, bounds, writer, res)


class Step(NamedTuple):
    """One communicator's clock refinement step (``reduce_group``'s ``res`` where ``writer``):
    its members' global ranks and each one's residual (ns), as ``RankTable.add_residuals``
    takes them; ``comm``: its communicator's id (a chunk's steps are applied in id order, as
    ``reduce_each`` gives them: shards' steps are put in that order by the join)."""

    grank: np.ndarray
    res: np.ndarray
    comm: int = 0


def reduce_comms(
    done: Sequence[tuple[Reducible, Complete]],
    ranks: RankTable,
    gain: float,
    sampler: WindowSampler | None = None,
) -> None:
    """Reduce the complete ops of a chunk's communicators (``(comm, its ops)``, in
    communicator order) and apply the clock refinement their end times give, in Jacobi
    order: every communicator reads the offsets as the chunk found them (``reduce_each``),
    then their steps are applied together, a domain moved by their scaled mean (``apply_steps``).
    What ``Comm._reduce`` gives one communicator at a time with every step deferred to the
    chunk's end (tests/one_comm_at_a_time.py), in one ``reduce_group`` call per communicator
    size.

    The two halves are apart for an engine sharded by communicator (docs/engine-shards.md):
    a shard reduces its communicators with the offsets the join published for the chunk, the
    join applies every shard's steps, in communicator order. ``sampler``: the slow windows'
    sample of the rows kept (``Reduced.sample``)."""
    apply_steps(reduce_each(done, ranks, gain, sampler), ranks, gain)


def reduce_each(
    done: Sequence[tuple[Reducible, Complete]],
    ranks: RankTable,
    gain: float,
    sampler: WindowSampler | None = None,
) -> list[Step]:
    """Every communicator's complete ops (``(comm, its ops)``, in communicator order) reduced
    with the offsets ``ranks`` holds now, one ``reduce_group`` per communicator size, and its
    rows kept (``Reduced.keep``, in communicator order); returns the clock refinement steps of
    those that have one, in communicator order. Changes nothing in ``ranks``."""
    if not done:
        return []
    by_n: dict[int, list[int]] = {}
    for i, (c, _) in enumerate(done):
        by_n.setdefault(c.n, []).append(i)
    results: list[tuple[Reduced, int]] = [None] * len(done)  # type: ignore[list-item]
    for _n, idx in sorted(by_n.items()):
        red = reduce_group([done[i][0] for i in idx], [done[i][1] for i in idx], ranks, gain)
        red.sample(sampler)
        for j, i in enumerate(idx):
            results[i] = (red, j)
    steps = []
    for (c, _), (red, j) in zip(done, results, strict=True):
        red.keep(j)
        if red.writer[j]:
            steps.append(Step(c.grank, red.res[j], c.id))
    return steps


def apply_steps(steps: Sequence[Step], ranks: RankTable, gain: float) -> None:
    """Apply a chunk's clock refinement steps (``reduce_each``'s, in communicator order) at
    once: the clock islands a step's domains (a node, or a rank whose node is unknown) span are
    joined (``RankTable.join_islands``, in step order), then every domain refined by k steps
    moves by the mean, over them, of each step's move for it (``RankTable.add_residuals``'s:
    the mean of its members' residuals on the node), times ``contraction(k, gain)``.

    Each step measured the same offset error e from the same starting offsets and moves the
    domain by ``gain`` x e. Their sum would move a node in k data-parallel groups by k x gain
    x e, past the truth for k x gain > 1 (further from it each chunk for k x gain > 2). Their
    mean alone moves it by gain x e a chunk whatever k, where applying the k steps one after the
    other (each reading the offsets the previous left: Gauss-Seidel order) leaves (1 - gain)^k
    of it. Scaled, the mean moves it by e x (1 - (1 - gain)^k): the same contraction as one
    after the other, and never past e (docs/engine-shards.md: the measured errors, and where
    the steps disagree).
    A step whose members share one host clock is zero (``reduce_group``): it only marks its
    node refined, and is not one of the k."""
    if not steps:
        return
    lens = [len(s.grank) for s in steps]
    g = np.concatenate([s.grank for s in steps])
    res = np.concatenate([s.res for s in steps])
    step = np.repeat(np.arange(len(steps), dtype=np.int64), lens)
    heads = np.r_[0, np.cumsum(lens)[:-1]]
    nd = ranks.node[g]
    lab = np.where(nd >= 0, ranks.isl_node[np.maximum(nd, 0)], ranks.isl_rank[g])
    # islands only join (never split), so a step whose domains are one island at the start
    # stays within one: it joins nothing
    for i in np.flatnonzero(np.minimum.reduceat(lab, heads) != np.maximum.reduceat(lab, heads)).tolist():
        ranks.join_islands(steps[i].grank)
    lo = np.minimum.reduceat(nd, heads)
    one = (lo >= 0) & (lo == np.maximum.reduceat(nd, heads))
    if one.any():
        ranks.mark_refined(lo[one])
        keep = ~one[step]
        g, res, step, nd = g[keep], res[keep], step[keep], nd[keep]
    has = nd >= 0
    if has.any():
        k = len(ranks.node_names)
        # one bin per (step, node), ordered by step, then node: each step's move of each node
        # (its members' residuals summed in member order, as add_residuals sums them)
        key, inv = np.unique(step[has] * k + nd[has], return_inverse=True)
        move = np.bincount(inv, weights=res[has], minlength=len(key)) / np.bincount(inv, minlength=len(key))
        node = key % k
        tot = np.bincount(node, weights=move, minlength=k)  # summed in step order
        cnt = np.bincount(node, minlength=k)
        ranks.rel_node += np.where(cnt > 0, tot / np.maximum(cnt, 1) * _contractions(cnt, gain), 0.0)
        ranks.rel_node_refined |= cnt > 0
    if (~has).any():
        gr, rr = g[~has], res[~has]  # in step order
        ur, inv = np.unique(gr, return_inverse=True)
        cnt = np.bincount(inv)
        ranks.rel_rank[ur] += np.bincount(inv, weights=rr) / cnt * _contractions(cnt, gain)
        ranks.rel_rank_refined[ur] = True


def contraction(k: int, gain: float) -> float:
    """What ``apply_steps`` scales the mean of k steps by, each ``gain`` of a domain's offset
    error: (1 - (1 - gain)^k) / gain, so that the domain moves by that share of its error, as
    k steps applied one after the other would move it (exactly 1 for k = 1: one step as is)."""
    if k <= 1 or not 0 < gain < 1:
        return 1.0
    return (1.0 - (1.0 - gain) ** k) / gain


def _contractions(k: np.ndarray, gain: float) -> np.ndarray:
    """``contraction`` of each of ``k`` (one Python float power per distinct k, as the
    reference computes it one by one: numpy's vectorised power may round otherwise)."""
    u, inv = np.unique(k, return_inverse=True)
    return np.array([contraction(int(x), gain) for x in u.tolist()])[inv]


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
