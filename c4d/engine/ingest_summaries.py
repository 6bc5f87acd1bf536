"""Node agents' summaries of a chunk (OPSUM rows, read row by row already: summaries.py)
checked and kept for every communicator at once (Pool.keep_summaries), in the order they came
when each communicator's rows are one run in seq order, as an agent sends them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from c4d.engine.comm_index import CommIndex
from c4d.engine.config import EngineConfig
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.rows import END_SYNC, take
from c4d.engine.sampling import sampled
from c4d.engine.summaries import Summaries
from c4d.record import schema


class SummaryIngest:
    def __init__(
        self,
        cfg: EngineConfig,
        ranks: RankTable,
        index: CommIndex,
        pool: Pool,
        invalid: Callable[[str, int], None],
    ) -> None:
        self.cfg, self.ranks, self.index, self.pool, self._invalid = cfg, ranks, index, pool, invalid

    def feed(self, rows: Summaries, recv: np.ndarray, chunk_recv: int) -> None:
        """Node agents' summaries of node-local collectives, read row by row already
        (c4d.engine.summaries), checked and kept for every communicator at once. A summary of
        a communicator whose members the master knows on more than one node (or not all yet)
        claims one host clock it does not have: dropped. A summary is a report from every
        member (each sent the agent its OP record): the agent forwards few heartbeats of
        ranks that progress (c4d/agent/heartbeats.py). ``recv``: each summary's master time;
        ``chunk_recv``: the chunk's."""
        n = rows.comm_nranks
        ok = (rows.cid != 0) & (n >= 1) & (n <= schema.OPSUM_MAX_MEMBERS)
        ok &= (rows.comm_rank >= 0) & (rows.comm_rank < n)
        if not ok.all():
            self._invalid("a bad comm id/rank/size in OPSUM records", int((~ok).sum()))
            rows, recv = rows.take(ok), recv[ok]
        if not len(rows):
            return
        cid = rows.cid
        heads = grouped(cid, rows.seq)
        if heads is not None:
            idx, cn = self.index.lookup(cid[heads])
        if heads is None or (idx < 0).any():  # new communicators are made in comm-id order
            order = comm_seq_order(cid, rows.seq)
            rows, recv = rows.take(order), recv[order]
            cid = rows.cid
            heads = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
            idx, cn = self.index.lookup(cid[heads])
        tails = np.r_[heads[1:], len(rows)]
        out, gaps = rows.aligned(self.ranks), rows.gaps
        # Every communicator's checks at once over its members' ranges of the Pool (a chunk of
        # a 4,096-rank job holds 512 tensor-parallel groups' summaries: a dozen numpy calls
        # per group was most of this path); a member change goes through CommIndex.member first.
        nr = rows.comm_nranks.astype(np.int64)
        ids = cid[heads]
        for k in np.flatnonzero(idx < 0).tolist():  # new communicators (in comm-id order)
            c = self.index.comm(int(ids[k]), int(nr[heads[k]]))
            idx[k], cn[k] = (c.idx, c.n) if c is not None else (-1, -1)
        C = len(heads)
        seg = np.repeat(np.arange(C), tails - heads)
        ok_c = (cn >= 1) & ~np.logical_or.reduceat(nr != cn[seg], heads)
        if not ok_c.all():
            bad = ~ok_c[seg]
            self._invalid("an unknown communicator or a changed size in OPSUM records", int(bad.sum()))
        if not ok_c.any():
            return
        M = self.pool.member
        base = np.where(ok_c, self.pool.cbase[np.maximum(idx, 0)], 0)
        cr = rows.comm_rank.astype(np.int64)
        g_last = rows.rank.astype(np.int64)
        new = ok_c[seg] & (M["grank"][np.where(ok_c[seg], base[seg] + cr, 0)] != g_last)
        if new.any():
            for j in np.unique(seg[new]).tolist():
                h, t = int(heads[j]), int(tails[j])
                self.index.member(self.index.comms[int(idx[j])], cr[h:t], g_last[h:t])
        # each communicator's whole membership: known, one node, clocks aligned
        lens = np.where(ok_c, cn, 0)
        starts = np.r_[0, np.cumsum(lens)[:-1]]
        mem = np.repeat(base - starts, lens) + np.arange(int(lens.sum()))
        g = M["grank"][mem]
        nd = np.where(g >= 0, self.ranks.node[np.maximum(g, 0)], -1)
        al = (g >= 0) & self.ranks.aligned(np.maximum(g, 0))
        has = lens > 0
        at = starts[has]
        one = np.zeros(C, bool)
        known = np.zeros(C, bool)
        lo = np.minimum.reduceat(nd, at)
        one[has] = (lo >= 0) & (lo == np.maximum.reduceat(nd, at))
        known[has] = np.logical_and.reduceat(al, at)
        if not (one | ~ok_c).all():
            off = ok_c & ~one
            self._invalid("a summary of a communicator not known on one node", int(off[seg].sum()))
        use = ok_c & one
        if not use.any():
            return
        # kept as Comm._reduce keeps its own rows, with what one host's members give the clock
        # refinement (a zero residual); the members' compute at their latest op here is the
        # agent's, so a later OP record of the communicator gets an unknown gap
        seq_max = np.maximum.reduceat(rows.seq.astype(np.int64), heads)
        um = np.repeat(use & has, lens)
        # the OP records they stand for (the live view's rate): one per member and op since the
        # communicator's last summary (an agent sends a sample of a busy one's: c4d/agent/sample.py)
        before = np.zeros(C, np.int64)
        before[has] = np.maximum.reduceat(M["op_done"][mem], at)
        ops = np.maximum(tails - heads, np.where(before > 0, seq_max + 1 - before, 0))
        M["op_done"][mem[um]] = np.maximum(M["op_done"][mem[um]], np.repeat(seq_max + 1, lens)[um])
        M["last_cum"][mem[um]] = -1
        heard = um & (g >= 0)
        recv_c = np.repeat(np.maximum.reduceat(recv, heads), lens)
        np.maximum.at(self.ranks.last_recv, g[heard], recv_c[heard])
        out["aligned"] = known[seg]
        sync = np.logical_or.reduceat(out["ends_known"] & END_SYNC[out["op"]], heads)
        refine = use & known & sync & (cn >= 2)
        if self.cfg.clock_gain > 0 and refine.any():
            self.ranks.mark_refined(nd[starts[refine]])
        la_min = np.minimum.reduceat(out["last_arrive"], heads)
        comms = self.index.comms
        u = np.flatnonzero(use)
        self.pool.rate.note(chunk_recv, idx[u], ops[u] * cn[u])
        for i in idx[u].tolist():
            c = comms[i]
            c.version += 1
            c.has_coll = True
        if rows.shift.any():  # an agent's progress rows, outside its sample: not kept
            ins = sampled(rows.seq, rows.shift)
            per = np.add.reduceat(ins.astype(np.int64), heads)
            u = u[per[u] > 0]
            if not len(u):
                return
            out, gaps = take(out, ins), gaps[ins]
            tails = np.cumsum(per)
            heads = tails - per  # (la_min stays a lower bound, as after Pool's own sample)
        self.pool.keep_summaries(out, gaps, idx[u], heads[u], tails[u], la_min[u])


def comm_seq_order(cid: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """``np.lexsort((seq, cid))`` from the rows' runs: node agents send each node-local
    communicator's summaries as a run in seq order, and a chunk holds a few messages of each
    agent, so sorting the runs (a tenth of the rows at 16,384 ranks) and laying their rows out
    in that order is the sort, unless one communicator's runs overlap in seq (checked; then
    every row is sorted). Equal (cid, seq) pairs also take the full sort, whose order is
    stable."""
    n = len(cid)
    head = np.empty(n, bool)
    head[0] = True
    np.not_equal(cid[1:], cid[:-1], out=head[1:])
    head[1:] |= seq[1:] <= seq[:-1]  # a run also ends where its seq does not rise
    h = np.flatnonzero(head)
    if 4 * len(h) > n:
        return np.lexsort((seq, cid))
    by = np.lexsort((seq[h], cid[h]))
    lens = np.diff(np.r_[h, n])[by]
    order = np.repeat(h[by] - (np.cumsum(lens) - lens), lens) + np.arange(n)
    c, s = cid[order], seq[order]
    if ((c[1:] != c[:-1]) | (s[1:] > s[:-1])).all():
        return order
    return np.lexsort((seq, cid))


def grouped(cid: np.ndarray, seq: np.ndarray) -> np.ndarray | None:
    """Where each communicator's rows start, when every communicator's rows are one run in seq
    order, as a node agent sends its summaries (one agent's message per node-local
    communicator, in seq order); None when they are not and a sort must group them. Only the
    order of the communicators' runs then differs from a sort's, which no step reads."""
    head = np.empty(len(cid), bool)
    head[0] = True
    np.not_equal(cid[1:], cid[:-1], out=head[1:])
    if not (head[1:] | (seq[1:] >= seq[:-1])).all():
        return None
    heads = np.flatnonzero(head)
    ids = cid[heads]
    if len(ids) > 1 and len(np.unique(ids)) != len(ids):
        return None
    return heads
