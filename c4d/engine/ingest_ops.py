"""A chunk's OP records into the engine's memory, every communicator at once: each rank's
compute gaps and own pace, the members' agreement (consistency.py), complete collectives
reduced (reduce.reduce_comms) straight from the rows or through a communicator's ring, and
p2p sends paired with their receives (P2PPairs)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from c4d.engine.comm import Comm
from c4d.engine.comm_index import CommIndex
from c4d.engine.compute import compute_before, compute_gaps
from c4d.engine.config import EngineConfig
from c4d.engine.consistency import Consistency
from c4d.engine.own_pace import OwnPace
from c4d.engine.p2p_pairs import P2PPairs
from c4d.engine.pool import P2PDone, Pool
from c4d.engine.ranks import RankTable
from c4d.engine.reduce import Complete, Step, reduce_each
from c4d.engine.rows import IN_GROUP, P2P, OpCols, lexsort, take
from c4d.record.schema import Op, OpFlag

COMPUTE_GIVEN = int(OpFlag.COMPUTE_GIVEN)


class OpIngest:
    def __init__(
        self,
        cfg: EngineConfig,
        ranks: RankTable,
        index: CommIndex,
        pool: Pool,
        pairs: P2PPairs,
        consistency: Consistency,
        own: OwnPace,
        invalid: Callable[[str, int], None],
    ) -> None:
        self.cfg, self.ranks, self.index, self.pool = cfg, ranks, index, pool
        self.pairs, self.consistency, self.own, self._invalid = pairs, consistency, own, invalid

    def front(self, ops: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, OpCols, np.ndarray]:
        """A chunk's OP rows' rank-level half (``rank``: their rank field, as the chunk's header
        step read it): rows of an unknown op kind dropped, each rank's compute gaps and own
        pace (over its ops of every communicator). Returns the rows kept, their columns and
        ``by_comm``'s ``extra``."""
        cols = OpCols.of(ops, rank)
        ok = cols.op < len(Op)
        if not ok.all():
            self._invalid("an unknown op kind", int((~ok).sum()))
            ops, cols = take(ops, ok), cols.take(ok)
            if not len(ops):  # (an empty chunk of ops once crashed _gaps: issue 14)
                return ops, cols, np.zeros((0, 2), np.int64)
        gaps, cum = self._gaps(ops, cols)
        self.own.feed(cols, gaps, cum, self.ranks, self.cfg.resolve(self.ranks.job).period_ns)
        return ops, cols, np.stack([shares_events(ops, cols), cum], axis=1)

    def by_comm(self, ops: np.ndarray, cols: OpCols, extra: np.ndarray, recv: int) -> list[Step]:
        """A chunk's OP rows (``cols`` their columns; ``extra``: per row whether it shares its
        group's events, and the rank's compute so far) of every communicator at once: their
        members, rates, collectives (``_collectives``) and p2p transfers (P2PPairs).
        (tests/one_comm_at_a_time.py: the reference it is compared with, Comm.add_collectives one
        communicator at a time.)"""
        rows, ex, ci, groups = self.index.groups(ops, "OP", extra, cols)
        if not groups:
            return []
        if rows is not ops:  # rows dropped: the columns of those kept
            cols = OpCols.of(rows)  # (rare: a bad or unknown communicator)
        member = self.index.members(rows, ci, groups, cols)
        gidx = np.array([c.idx for c in groups], np.int64)
        self.pool.rate.note(recv, gidx, np.bincount(ci, minlength=len(groups)))
        p2p = (cols.flags & P2P) != 0
        steps: list[Step] = []
        if not p2p.all():
            coll = np.flatnonzero(~p2p)
            steps = self._collectives(
                rows, coll, ci[coll], member[coll], ex[coll, 1], groups, cols.take(coll), recv
            )
        if p2p.any():
            pi = np.flatnonzero(p2p)
            nn = np.array([c.n for c in groups])
            peer = cols.peer[pi]
            ok = (peer >= 0) & (peer < nn[ci[pi]])
            valid = np.zeros(len(groups), bool)
            valid[ci[pi[ok]]] = True
            k, cnt = np.unique(ci[pi], return_counts=True)
            for k1, v in zip(k.tolist(), cnt.tolist(), strict=True):
                c = groups[k1]
                c.p2p_rows += v
                if valid[k1]:  # Comm.add_p2p for every communicator at once
                    c.version += 1
                    c.has_p2p = True
            pi = pi[ok]
            if len(pi):
                pp, idx = cols.take(pi), gidx[ci[pi]]
                self.pool.p2p.update(P2PDone.key(idx, pp.comm_rank, pp.op, pp.peer), pp.seq)
                # one pass over every communicator's sends and receives
                self.pairs.feed(pp, idx, ex[pi, 0] != 0, self.index.comms, self.ranks)
        return steps

    def _collectives(
        self,
        rows: np.ndarray,
        coll: np.ndarray,
        ci: np.ndarray,
        member: np.ndarray,
        cum: np.ndarray,
        groups: list[Comm],
        cols: OpCols,
        recv: int,
    ) -> list[Step]:
        """Collective OP rows of every communicator of a chunk (``rows[coll]``, not copied: a
        whole-record copy of nearly every row of a chunk is a pass of its own; ``cols`` their
        columns, ``ci`` each one's group, rows in arrival order; ``recv``: the chunk's master
        time): what Comm.add_collectives does one communicator at a time, at once. An op whose
        every member's row is in the chunk and whose ring slot nothing else of the chunk claims
        (the common case) is reduced straight from the rows; the others go through the
        communicator's ring (Comm.scatter)."""
        P = self.pool
        seq = cols.seq
        cr = cols.comm_rank
        present = np.flatnonzero(np.bincount(ci, minlength=len(groups))).tolist()
        for k in present:
            c = groups[k]
            c.version += 1
            c.has_coll = True
        P.member["grank"][member] = cols.rank
        np.maximum.at(P.member["op_done"], member, seq + 1)
        comp = compute_before(P.member["last_cum"], member, seq, cum)
        nn = np.array([c.n for c in groups], np.int64)
        W = np.array([c.W for c in groups], np.int64)
        sbase = np.array([c.sbase for c in groups], np.int64)
        gslot = sbase[ci] + seq % W[ci]  # Pool slot index
        m = len(coll)
        o = lexsort((cr, seq, ci))
        ci_o, seq_o, cr_o, gs_o = ci[o], seq[o], cr[o], gslot[o]
        head = np.r_[True, (ci_o[1:] != ci_o[:-1]) | (seq_o[1:] != seq_o[:-1])]
        heads = np.flatnonzero(head)
        size = np.diff(np.r_[heads, m])
        run = np.cumsum(head) - 1
        gi = np.array([c.idx for c in groups], np.int64)  # the members' agreement (consistency.py)
        self.consistency.feed_sorted(gi[ci_o], seq_o, cr_o, cols.rank[o], cols.elems[o], cols.kinds[o],
                                     cols.peer[o], heads, nn[ci_o[heads]], recv)  # fmt: skip
        # complete: n rows, comm ranks 0..n-1; the slot: no other op of the chunk, older than this op
        complete = (size == nn[ci_o[heads]]) & np.logical_and.reduceat(
            cr_o == np.arange(m) - heads[run], heads
        )
        per_slot = _rows_per_slot(ci_o, seq_o, gslot, o, heads, size, W)
        tag_old = P.slot["tag"][gs_o[heads]]
        fast = complete & (per_slot == size) & (seq_o[heads] > tag_old)
        parts: dict[int, list[Complete]] = {}
        if fast.any():
            fh = heads[fast]
            gs = gs_o[fh]
            evicted = (tag_old[fast] >= 0) & ~P.slot["processed"][gs]
            if evicted.any():
                for k, v in zip(*np.unique(ci_o[fh][evicted], return_counts=True), strict=True):
                    groups[int(k)].incomplete += int(v)
            last_row = np.maximum.reduceat(o, heads)[fast]  # the ring keeps the op kind of the last row
            P.slot["tag"][gs] = seq_o[fh]
            P.slot["processed"][gs] = True
            op = cols.op[last_row]
            P.slot["opk"][gs] = op
            nbytes = cols.nbytes[last_row]
            arr = cols.arr[o]
            end, gap = cols.end[o], comp[o]
            fast_rows = fast[run]
            n_f, ci_f, seq_f = nn[ci_o[fh]], ci_o[fh], seq_o[fh]
            for n in np.unique(n_f).tolist():
                sel = np.flatnonzero(fast_rows & (nn[ci_o] == n))
                og = np.flatnonzero(n_f == n)
                A, E, G = (x[sel].reshape(-1, n) for x in (arr, end, gap))
                cs = ci_f[og]
                cuts = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]]).tolist() + [len(og)]
                for a, b in itertools.pairwise(cuts):
                    q = og[a:b]
                    parts.setdefault(int(cs[a]), []).append(
                        Complete(A[a:b], E[a:b], G[a:b], op[q], nbytes[q], seq_f[q])
                    )
            ring = np.ones(m, bool)
            ring[o[fast_rows]] = False
        else:
            ring = np.ones(m, bool)
        ri = np.flatnonzero(ring)
        if len(ri):  # per communicator (in order), its rows in arrival order: one sort, not a pass each
            ri = ri[np.argsort(ci[ri], kind="stable")]
            rc = ci[ri]
            cuts = np.flatnonzero(np.r_[True, rc[1:] != rc[:-1]]).tolist() + [len(ri)]
            for a, b in itertools.pairwise(cuts):
                k, sel = int(rc[a]), ri[a:b]
                c = groups[k]
                slots = c.scatter(take(rows, coll[sel]), seq[sel], cr[sel], comp[sel])
                if len(slots):
                    parts.setdefault(k, []).append(c.complete_ops(slots))
        done = [(groups[k], Complete.join(parts[k])) for k in sorted(parts)]
        # what add_collectives one by one gives with the clock steps deferred to the chunk's end
        return reduce_each(done, self.ranks, self.cfg.clock_gain, self.pool.sampler)

    def _gaps(self, ops: np.ndarray, cols: OpCols) -> tuple[np.ndarray, np.ndarray]:
        """Per op: its compute gap and the rank's compute so far (compute.compute_gaps). An agent's
        forwarded OP records carry the compute so far (the agent saw the rank's summarised ops,
        the master did not): those are taken as given."""
        R = self.ranks
        given = (cols.flags & COMPUTE_GIVEN) != 0
        if not given.any():
            return compute_gaps(ops, R.last_end, R.compute_ns, cols)
        gaps = np.full(len(ops), -1, np.int64)
        cum = cols.compute.copy()
        if not given.all():
            own = np.flatnonzero(~given)
            gaps[own], cum[own] = compute_gaps(ops[own], R.last_end, R.compute_ns, cols.take(own))
        return gaps, cum


def _rows_per_slot(
    ci_o: np.ndarray,
    seq_o: np.ndarray,
    gslot: np.ndarray,
    o: np.ndarray,
    heads: np.ndarray,
    size: np.ndarray,
    W: np.ndarray,
) -> np.ndarray:
    """For each op of a chunk (rows sorted by communicator, seq: ``o``; ``heads``: each op's
    first row), the chunk's rows whose ring slot is the op's. Its own ``size`` rows when its
    communicator's seqs in the chunk span less than its ring (slot = seq mod W: no two ops
    share one), the usual case; else counted (a sort of every row's slot)."""
    hc, hs = ci_o[heads], seq_o[heads]
    first = np.flatnonzero(np.r_[True, hc[1:] != hc[:-1]])
    last = np.r_[first[1:], len(heads)] - 1
    if ((hs[last] - hs[first]) < W[hc[first]]).all():
        return size
    _, inv, uc = np.unique(gslot, return_inverse=True, return_counts=True)
    return uc[inv.ravel()][o][heads]


def shares_events(ops: np.ndarray, cols: OpCols) -> np.ndarray:
    """Per op: 1 when another op of this chunk came from the same ncclGroup of the same rank
    (they share the group's events, so its times span the whole group), else 0."""
    out = np.zeros(len(ops), np.int64)
    ing = np.flatnonzero((cols.flags & IN_GROUP) != 0)
    if len(ing):
        r, gid = cols.rank[ing], ops["group_id"][ing]
        o = lexsort((gid, r))
        r, gid = r[o], gid[o]
        new = np.r_[True, (r[1:] != r[:-1]) | (gid[1:] != gid[:-1])]
        run = np.cumsum(new) - 1
        cnt = np.bincount(run)
        out[ing[o]] = cnt[run] > 1
    return out
