"""Clock alignment: each rank's offset = its clock minus the master's, in two layers.

1. *Receipt bound* (``theta``). Every record fed between two ticks was received before the
   later tick at master time ``now``, and was written on the rank at ``time_ns`` = true
   time + offset, so ``offset >= time_ns - now``. The engine keeps, per rank, the largest of
   these lower bounds over a sliding epoch (two epochs of ``EPOCH_NS``); with records
   flowing continuously it is short of the true offset only by the freshest record's
   age at a tick (network latency plus batching, ~ms). Ranks that registered the same node
   share the host's clock, so they share the node's best bound (many more samples, and no
   spurious offsets between ranks of one host). It needs no assumption about the job and
   works in an offline replay, where the trace's TICK records give the same ``now``.
2. *End-time consensus* (``rel``, in ``reduce.reduce_group``). All-reduce, all-gather,
   reduce-scatter and all-to-all finish at (nearly) the same instant on every member, so
   after layer 1 each member's median residual ``end_r - median_end`` over the ops
   completed in a batch is its remaining error; ``clock_gain`` of it is applied per batch,
   averaged per node and centred per communicator so the common clock does not drift.
   Jacobi order (``reduce.reduce_comms``): every communicator of a chunk reads the offsets as
   the chunk found them, and at the chunk's end a domain that k communicators refine moves by
   the mean of their steps times (1 - (1 - gain)^k) / gain (their sum would overshoot: each
   measured the same error; so scaled, the mean contracts it as the k steps one after the
   other would), so a communicator's reduction needs no other's result (an engine sharded by
   communicator: docs/engine-shards.md).

Offset = ``rel`` + the anchor of its island. A clock domain (a node, or a rank whose node
is unknown) follows its receipt bound until the consensus refines it; from then on only
the consensus moves its ``rel``, so a better receipt bound later cannot jolt the ranks'
relative alignment. Domains the consensus links form an island (merged as communicators
link them); each island's anchor (median of bound minus ``rel`` over its domains) ties it
to the master clock. Islands that nothing links (pipeline stages on other nodes exchange
only p2p, whose grouped events do not end together) are each anchored on their own bounds,
to within the bounds' few ms.

The result is applied before any cross-rank comparison of arrival times and whenever a
rank time is compared with the master clock (hang durations).
"""

from __future__ import annotations

import numpy as np

from c4d.engine.ranks import RankTable

EPOCH_NS = 30_000_000_000  # bounds older than one to two epochs are forgotten (clock steps, drift)


def note_records(ranks: RankTable, g: np.ndarray, time_ns: np.ndarray) -> None:
    """Remember the newest write time per rank among records fed since the last tick."""
    np.maximum.at(ranks.pend_tmax, g, time_ns)


def on_tick(ranks: RankTable, now_ns: int, epoch_state: list[int]) -> None:
    """Turn the records fed since the last tick into offset lower bounds (see module doc)."""
    epoch = now_ns // EPOCH_NS
    if epoch != epoch_state[0]:
        ranks.theta_prev[:] = ranks.theta_cur if epoch == epoch_state[0] + 1 else np.iinfo(np.int64).min
        ranks.theta_cur[:] = np.iinfo(np.int64).min
        epoch_state[0] = epoch
    got = ranks.pend_tmax > 0
    if not got.any():
        _note_lag(ranks, now_ns, None)
        return
    _note_lag(ranks, now_ns, got)
    cand = ranks.pend_tmax[got] - np.int64(now_ns)
    ranks.theta_cur[got] = np.maximum(ranks.theta_cur[got], cand)
    ranks.pend_tmax[got] = 0
    lo = np.iinfo(np.int64).min
    new = np.maximum(ranks.theta_cur, ranks.theta_prev)
    # ranks of one node share the host clock: the node's best bound holds for all of them
    nd = ranks.node
    known = (nd >= 0) & (new > lo)
    if known.any() and ranks.node_names:
        best = np.full(len(ranks.node_names), lo, np.int64)
        np.maximum.at(best, nd[known], new[known])
        new = np.where(nd >= 0, best[np.maximum(nd, 0)], new)
    have = new > lo
    ranks.theta[have] = new[have]
    ranks.theta_ok[have] = True
    _place(ranks)


LAG_WINDOW_NS = 5_000_000_000  # the delivery lag is the worst of the last few seconds


def _note_lag(ranks: RankTable, now_ns: int, got: np.ndarray | None) -> None:
    """How much later than usual the freshest records reach the engine: a master that falls
    behind (a loaded host, a backlog of batches) delays every rank's records alike, and a
    rank is not silent for the time its records wait in that backlog. Per tick: the median,
    over the ranks that delivered, of their freshest record's age (master time minus its
    aligned write time; the offsets come from the best receipt bounds, so the usual latency
    is already in them); ``ranks.delivery_lag_ns`` = the worst of the last LAG_WINDOW_NS."""
    hist = ranks.lag_hist
    if got is not None:
        ok = got & ranks.theta_ok
        if ok.any():
            g = np.flatnonzero(ok)
            age = np.int64(now_ns) - (ranks.pend_tmax[g] - ranks.offsets(g))
            hist.append((int(now_ns), max(0, int(np.median(age)))))
    while hist and hist[0][0] < now_ns - LAG_WINDOW_NS:
        hist.popleft()
    ranks.delivery_lag_ns = max((lag for _, lag in hist), default=0)


def _place(ranks: RankTable) -> None:
    """A domain (a node, or a rank of unknown node) that no end-time consensus has refined
    yet follows its receipt bound (offset = bound). Refined domains form islands (the
    domains some communicator's end times link): their relative offsets are the
    consensus's, and each island is anchored on the master clock by the median of its
    domains' receipt bounds minus rel. Islands stay separate where nothing links them
    (pipeline stages on other nodes talk only p2p), so each needs its own anchor: one
    anchor for all would leave an island wherever its first bounds put it."""
    th, ok = ranks.theta.astype(np.float64), ranks.theta_ok
    nd = ranks.node
    k = len(ranks.node_names)
    labels, diffs = [], []
    if k:
        nth = np.full(k, np.nan)
        sel = ok & (nd >= 0)
        if sel.any():
            nth[nd[sel]] = th[sel]  # equal within a node (shared bound)
        have = ~np.isnan(nth)
        follow = have & ~ranks.rel_node_refined
        ranks.rel_node[follow] = nth[follow]
        ranks.anc_node[follow] = 0.0
        ranks.rel_node_ok |= have
        m = have & ranks.rel_node_refined
        labels.append(ranks.isl_node[m])
        diffs.append(nth[m] - ranks.rel_node[m])
    solo = ok & (nd < 0)
    follow = solo & ~ranks.rel_rank_refined
    ranks.rel_rank[follow] = th[follow]
    ranks.anc_rank[follow] = 0.0
    ranks.rel_rank_ok |= solo
    m = solo & ranks.rel_rank_refined
    labels.append(ranks.isl_rank[m])
    diffs.append(th[m] - ranks.rel_rank[m])
    lab = np.concatenate(labels)
    if not len(lab):
        return
    d = np.concatenate(diffs)
    uniq, med = _medians(lab, d)
    # each island's domains take its anchor (islands are disjoint: the order does not matter)
    if k:
        m = ranks.rel_node_refined & np.isin(ranks.isl_node, uniq)
        ranks.anc_node[m] = med[np.searchsorted(uniq, ranks.isl_node[m])]
    m = (nd < 0) & ranks.rel_rank_refined & np.isin(ranks.isl_rank, uniq)
    ranks.anc_rank[m] = med[np.searchsorted(uniq, ranks.isl_rank[m])]


def _medians(lab: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct labels and ``np.median`` of ``d`` over each one's rows, for every
    label at once: one median per island was a numpy pass over every node per island (thousands
    of islands before the consensus links the nodes), most of a tick's clock work."""
    if np.isnan(d).any():  # (np.median's NaN rule, by the reference)
        u = np.unique(lab)
        return u, np.array([np.median(d[lab == x]) for x in u.tolist()], np.float64)
    o = np.lexsort((d, lab))
    ls, ds = lab[o], d[o]
    starts = np.flatnonzero(np.r_[True, ls[1:] != ls[:-1]])
    cnt = np.diff(np.r_[starts, len(ls)])
    # np.median is np.mean of the middle value or the two middle ones: a sum from 0.0 (so -0.0
    # comes out 0.0), over their count
    lo = ds[starts + (cnt - 1) // 2] + 0.0
    hi = ds[starts + cnt // 2]
    return ls[starts], np.where(cnt % 2 == 1, lo, (lo + hi) / 2)
