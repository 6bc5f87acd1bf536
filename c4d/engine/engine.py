"""The engine: ``feed`` record batches, ``tick`` at a master time, read ``state``.

Driven identically by ``c4d master`` (live: records stamped with the latest tick's master
time, ``tick`` every ~0.2 s) and ``c4d analyze`` (replay: the trace's records between its
TICK records, ``tick`` at each TICK's time), so a replay reproduces the live diagnoses.
Everything is deterministic in the feed/tick sequence: no wall clock, no randomness, no
iteration over unordered containers in an order that could vary.

Call from one thread (the master's); nothing here blocks or sleeps.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import numpy as np

from c4d import schema
from c4d.columns import Columns
from c4d.engine import clock, hang
from c4d.engine.chunking import Chunk, Chunker, apart
from c4d.engine.comm import Comm
from c4d.engine.compute import compute_before, compute_gaps
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.consistency import Consistency
from c4d.engine.emission import Emission
from c4d.engine.p2p_pairs import P2PPairs
from c4d.engine.pool import MAX_COMMS_EVER, P2PDone, Pool, budget_from_env
from c4d.engine.ranks import RankTable
from c4d.engine.reduce import Complete, reduce_comms
from c4d.engine.rows import (
    END_SYNC,
    GONE_EVENTS,
    IN_GROUP,
    MAX_NRANKS,
    MAX_RANK,
    OP_SPLIT,
    P2P,
    OpCols,
    lexsort,
    take,
)
from c4d.engine.slow import SlowJudge
from c4d.engine.snapshot import engine_snapshot
from c4d.engine.stage import Stages
from c4d.engine.summaries import Summaries
from c4d.engine.types import Diagnosis, EngineSnapshot
from c4d.ratelog import RateLimitedLog
from c4d.schema import Kind, Op, OpFlag

log = logging.getLogger("c4d.engine")

COMPUTE_GIVEN = int(OpFlag.COMPUTE_GIVEN)
HB_FIELDS = (  # (Pool member array, HEARTBEAT field) copied as they are (Comm.add_heartbeats)
    ("n_issued", "n_issued"), ("n_arrived", "n_arrived"), ("n_done", "n_done"),
    ("last_arrive", "last_arrive_ns"), ("pend_op", "pend_op"), ("pend_peer", "pend_peer"),
    ("pend_flags", "pend_flags"), ("pend_issue", "pend_issue_ns"), ("pend_start", "pend_start_ns"),
    ("p2p_in_flight", "p2p_in_flight"),
    ("pend_count", "pend_count"), ("pend_dtype", "pend_dtype"), ("pend_redop", "pend_redop"),
)  # fmt: skip
# A chunk's OP and HEARTBEAT rows of all communicators ingested together (Engine._collectives,
# reduce.reduce_comms, Engine._heartbeats); False: one communicator at a time
# (Comm.add_collectives, Comm.add_heartbeats), the reference tests/test_engine_batched.py compares with
BATCHED = True


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


class Engine:
    def __init__(self, cfg: EngineConfig | None = None, split: bool = False) -> None:
        """``split``: keep every completed op's per-rank wait / transfer split (``OP_SPLIT`` rows)
        for ``take_split`` — the one wait/transfer computation the metrics, the report and
        ``ops_split`` use."""
        self.cfg = cfg or EngineConfig()
        self._split = split
        self.ranks = RankTable()
        self.comms: dict[int, Comm] = {}  # by index (stable, never reused), in creation order
        self._comm_index: dict[int, int] = {}  # comm id -> index
        self._lk: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the same, sorted arrays (_lookup)
        self._next_idx = 0
        self._max_comms = budget_from_env("C4D_MAX_COMMS_EVER", MAX_COMMS_EVER)
        self._epoch = [-1]
        self._slow = SlowJudge(self.cfg)
        self._pairs = P2PPairs()
        self._pool = Pool()  # every communicator's membership and ring tags, for _collectives
        self.stages = Stages()  # the training code's staged hang timeouts (stage.py)
        # members of one collective that call it differently (consistency.py)
        self.consistency = Consistency(lambda i: self.comms[i].grank if i in self.comms else None)
        self._now = 0
        self._ratelog = RateLimitedLog(log)
        self.stats = {"records": 0, "invalid": 0, "batches": 0, "ticks": 0}
        self._chunks = Chunker()  # fed, not yet ingested
        self._chunk_recv = 0  # master time stamped on the chunk being ingested
        # a send and its receive that differ in count or dtype (paired by P2PPairs)
        self._pairs.on_disagree = lambda S, R: self.consistency.p2p_disagree(S, R, self._chunk_recv)
        self._emission = Emission(self.cfg, self.ranks, self.comms, self._pool, self.consistency, self.stages)

    # -- input -------------------------------------------------------------------------
    def thresholds(self) -> ResolvedThresholds:
        return self.cfg.resolve(self.ranks.job)

    def _invalid(self, what: str, n: int) -> None:
        self.stats["invalid"] += n
        self._ratelog(what, "c4d engine: dropped %d record(s) with %s", n, what, n=n)

    def _comm(self, cid: int, n: int) -> Comm | None:
        i = self._comm_index.get(cid)
        if i is None:
            if not 1 <= n <= MAX_NRANKS:
                return None
            if self._next_idx >= self._max_comms:
                # indices are never reused: what each ever admitted costs stays bounded
                self._pool.refuse("communicator indices", "C4D_MAX_COMMS_EVER", 1, "new communicator(s)")
                return None
            i = self._comm_index[cid] = self._next_idx
            self._lk = None
            self._next_idx += 1
            c = Comm(i, cid, n, self._pool)
            if self._split:
                c.split = []
            self.comms[i] = c
        c = self.comms[i]
        return c if c.n == n else None

    def _lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index and size of each known communicator id (-1, -1 unknown)."""
        if self._lk is None:
            known = sorted(self._comm_index.items())
            self._lk = (
                np.array([k for k, _ in known], np.uint64),
                np.array([i for _, i in known], np.int64),
                np.array([self.comms[i].n for _, i in known], np.int64),
            )
        lk_ids, lk_idx, lk_n = self._lk
        if not len(lk_ids):
            return np.full(len(ids), -1, np.int64), np.full(len(ids), -1, np.int64)
        pos = np.minimum(np.searchsorted(lk_ids, ids), len(lk_ids) - 1)
        hit = lk_ids[pos] == ids
        return np.where(hit, lk_idx[pos], -1), np.where(hit, lk_n[pos], -1)

    def _by_comm(
        self, rows: np.ndarray, what: str, extra: np.ndarray | None = None
    ) -> Iterator[tuple[Comm, np.ndarray, np.ndarray]]:
        """Yield (comm, its rows, the matching slice of ``extra``) in comm-id order, rows kept in order."""
        rows, extra, spans = self._comm_slices(rows, what, extra)
        for c, h, t in spans:
            yield c, rows[h:t], extra[h:t]

    def _comm_slices(
        self, rows: np.ndarray, what: str, extra: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[Comm, int, int]]]:
        """The valid rows sorted by comm id (stable: each communicator's in arrival order), the
        matching ``extra``, and each communicator's (comm, first row, end row), in comm-id order.

        PEER records carry no communicator size: they only attach to a communicator some
        other record already announced.
        """
        if extra is None:
            extra = np.zeros(len(rows), np.int8)
        sized = "comm_nranks" in (rows.dtype.names or ())
        ok = (rows["comm_id"] != 0) & (rows["comm_rank"] >= 0)
        if sized:
            nr = rows["comm_nranks"]
            ok &= (nr >= 1) & (nr <= MAX_NRANKS) & (rows["comm_rank"] < nr)
        if not ok.all():
            self._invalid(f"a bad comm id/rank/size in {what} records", int((~ok).sum()))
            rows, extra = take(rows, ok), extra[ok]
        if not len(rows):
            return rows, extra, []
        order = np.argsort(rows["comm_id"], kind="stable")
        rows, extra = take(rows, order), extra[order]
        cid = rows["comm_id"]
        heads = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
        tails = np.r_[heads[1:], len(rows)]
        ids = cid[heads]
        idx, n = self._lookup(ids)
        if sized:
            nr = rows["comm_nranks"]
            lo, hi = np.minimum.reduceat(nr, heads), np.maximum.reduceat(nr, heads)
            for k in np.flatnonzero(idx < 0).tolist():  # new communicators (in comm-id order)
                c = self._comm(int(ids[k]), int(nr[heads[k]]))
                idx[k], n[k] = (c.idx, c.n) if c is not None else (-1, -1)
            good = (idx >= 0) & (lo == n) & (hi == n)
        else:
            good = (idx >= 0) & (np.maximum.reduceat(rows["comm_rank"], heads) < n)
        bad_rows = not good.all()
        for k in np.flatnonzero(~good).tolist():
            n_bad = int(tails[k] - heads[k])
            self._invalid(f"an unknown communicator or a changed size in {what} records", n_bad)
        comms = self.comms
        spans = [
            (comms[i], h, t)
            for i, h, t in zip(idx[good].tolist(), heads[good].tolist(), tails[good].tolist(), strict=True)
        ]
        if bad_rows:  # keep the good ones' rows only
            idx = np.concatenate([np.arange(h, t) for _, h, t in spans]) if spans else np.empty(0, np.int64)
            rows, extra = take(rows, idx), extra[idx]
            cut = np.cumsum([0] + [t - h for _, h, t in spans]).tolist()
            spans = [(c, cut[k], cut[k + 1]) for k, (c, _, _) in enumerate(spans)]
        return rows, extra, spans

    def _comm_groups(
        self, rows: np.ndarray, what: str, extra: np.ndarray | None = None, cols: OpCols | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Comm]]:
        """What ``_comm_slices`` finds, rows not reordered: the valid rows in arrival order, the
        matching ``extra``, each row's group and each group's communicator (groups in comm-id
        order). A copy of a chunk's OP rows sorted by communicator (a gather of whole records in
        no order the cache likes) is a pass the chunk can do without: the collective and p2p
        paths sort their own rows again. ``cols``: OP rows' columns."""
        if extra is None:
            extra = np.zeros(len(rows), np.int8)
        sized = "comm_nranks" in (rows.dtype.names or ())
        cr = rows["comm_rank"] if cols is None else cols.comm_rank
        cid = rows["comm_id"] if cols is None else cols.cid
        ok = (cid != 0) & (cr >= 0)
        if sized:
            nr = rows["comm_nranks"] if cols is None else cols.nranks
            ok &= (nr >= 1) & (nr <= MAX_NRANKS) & (cr < nr)
        if not ok.all():
            self._invalid(f"a bad comm id/rank/size in {what} records", int((~ok).sum()))
            rows, extra = take(rows, ok), extra[ok]
            cols = None if cols is None else cols.take(ok)
        if not len(rows):
            return rows, extra, np.empty(0, np.int64), []
        ids, first, ci = schema.unique_runs(rows["comm_id"] if cols is None else cols.cid)
        idx, n = self._lookup(ids)
        if sized:
            nr = rows["comm_nranks"].astype(np.int64) if cols is None else cols.nranks
            for k in np.flatnonzero(idx < 0).tolist():  # new communicators (in comm-id order)
                c = self._comm(int(ids[k]), int(nr[first[k]]))
                idx[k], n[k] = (c.idx, c.n) if c is not None else (-1, -1)
            changed = np.bincount(ci[nr != n[ci]], minlength=len(ids)) > 0  # a row of another size
            good = (idx >= 0) & ~changed
        else:
            top = np.full(len(ids), -1, np.int64)
            np.maximum.at(top, ci, rows["comm_rank"].astype(np.int64))
            good = (idx >= 0) & (top < n)
        if not good.all():
            count = np.bincount(ci, minlength=len(ids))
            for k in np.flatnonzero(~good).tolist():
                self._invalid(f"an unknown communicator or a changed size in {what} records", int(count[k]))
            keep = good[ci]
            rows, extra = take(rows, keep), extra[keep]
            ci = (np.cumsum(good) - 1)[ci[keep]]
            idx = idx[good]
        comms = self.comms
        return rows, extra, ci, [comms[i] for i in idx.tolist()]

    def drops(self) -> dict[str, int]:
        """What the byte budgets refused or let go, by reason (Pool.drops)."""
        return self._pool.drops()

    def free_comms(self, cids) -> int:
        """Forget communicators (destroyed, or silent for long: c4d/validate.py, Edge.expire): their
        arrays, memberships, unpaired p2p halves and slow-window state. Returns how many were known."""
        freed = []
        for cid in cids:
            i = self._comm_index.pop(int(cid), None)
            self._lk = None
            if i is None:
                continue
            c = self.comms.pop(i)
            self._pool.detach(c)
            freed.append(i)
            for g in np.unique(c.grank[c.grank >= 0]).tolist():
                self.ranks.comms_of[g] = [t for t in self.ranks.comms_of[g] if t[0] != i]
        if freed:
            self.consistency.forget(freed)
            self._pairs.forget(freed)
            self._slow.forget(freed)
        return len(freed)

    def _member(self, c: Comm, cr: np.ndarray, g: np.ndarray) -> None:
        new = c.grank[cr] != g
        if new.any():
            c.version += 1
            for a, b in zip(cr[new].tolist(), g[new].tolist(), strict=True):
                c.grank[a] = b
                if (c.idx, a) not in self.ranks.comms_of[b]:
                    self.ranks.comms_of[b].append((c.idx, a))

    def feed(
        self, raw: np.ndarray, recv_ns: int, cols: Columns | None = None, summaries: Summaries | None = None
    ) -> None:
        """Take HEADER-typed rows in arrival order; ``recv_ns`` = master time stamped on them.

        Rows are held and ingested in fixed chunks of ``chunking.CHUNK`` rows (cut at multiples
        of the running row count, whatever the feed sizes) and at each tick: a replay that
        feeds the same rows in other slices ingests exactly the same chunks, so it reproduces
        the live diagnoses bit for bit.

        ``cols``: the rows' columns when the caller cut them (the master's edge), read for
        their node summaries now; ``summaries``: those read already (c4d.engine.summaries:
        row by row, so neither changes what a chunk gives).
        """
        raw = np.asarray(raw)
        if raw.dtype != schema.HEADER:
            if raw.ndim != 1 or raw.dtype.itemsize != schema.RECORD_SIZE:
                self._invalid("a wrong record size", len(raw) if raw.ndim else 1)
                return
            raw = raw.view(schema.HEADER)
        if not len(raw):
            return
        self.stats["batches"] += 1
        rest, sums = apart(raw, cols, summaries)
        self._hold(rest, recv_ns, sums, len(raw))

    def feed_apart(self, rest: np.ndarray, recv_ns: int, summaries: Summaries, n: int) -> None:
        """``feed`` of a batch of ``n`` rows that comes apart: its node summaries read
        (``summaries``, at their positions in the batch) and its other rows (``rest``, HEADER
        rows in order). An engine in a process of its own gets them so from the master's loop
        (c4d.engine_process): the summaries' rows themselves neither travel nor are joined.
        The same chunks, the same steps, the same results as ``feed`` of the whole batch
        (which takes it apart so)."""
        rest = np.asarray(rest)
        fits = rest.dtype == schema.HEADER and len(rest) + len(summaries) == n
        if fits and len(summaries):
            fits = int(summaries.pos[-1]) < n and bool((summaries.pos[1:] > summaries.pos[:-1]).all())
        if not fits or (len(rest) and (rest["kind"] == Kind.OPSUM).any()):
            self._invalid("a batch apart whose parts do not fit together", n)
            return
        if not n:
            return
        self.stats["batches"] += 1
        self._hold(rest, recv_ns, summaries, n)

    def _hold(self, rest: np.ndarray, recv_ns: int, sums: Summaries, n: int) -> None:
        if self._chunks.add(rest, int(recv_ns), sums, n):
            self._flush(whole_chunks=True)

    def _flush(self, whole_chunks: bool = False) -> None:
        """Ingest held rows: whole chunks only (from feed), or everything (at a tick)."""
        for chunk in self._chunks.cut(whole_chunks):
            self._ingest(chunk)

    def _ingest(self, chunk: Chunk) -> None:
        """One chunk: its node summaries read, at ``sums.pos``, and its other rows, at
        ``rpos``; ``recv`` by position. The header checks and updates take the summaries'
        header fields."""
        rest, rpos, recv, sums = chunk
        self.stats["records"] += len(rest) + len(sums)
        kind = np.ascontiguousarray(rest["kind"])  # header fields read once (docs/engine.md)
        rank = rest["rank"].astype(np.int64)
        version = rest["version"]
        ok = _header_ok(kind, rank, version)
        srank = sums.rank.astype(np.int64)
        ok_s = _header_ok(None, srank, sums.version)
        if not (ok.all() and ok_s.all()):
            bad = int((~ok & (kind != Kind.TICK)).sum()) + int((~ok_s).sum())
            if bad:
                self._invalid("an unknown kind, a bad rank or a newer schema version", bad)
            rest, rpos, kind, rank = take(rest, ok), rpos[ok], kind[ok], rank[ok]
            sums, srank = sums.take(ok_s), srank[ok_s]
            if not len(rest) and not len(sums):
                return
        R = self.ranks
        g = _then(rank, srank)
        R.ensure(int(g.max()))
        R.seen[g] = True
        # (rows at every position, as when no node summaries came: their times as they are)
        recv_r, recv_s = recv if len(rpos) == len(recv) else recv[rpos], recv[sums.pos]
        np.maximum.at(R.last_recv, g, _then(recv_r, recv_s))
        t = _then(rest["time_ns"].astype(np.int64), sums.time.astype(np.int64))
        pos = t > 0
        clock.note_records(R, g[pos], t[pos])
        parts = schema.by_kind(rest, kind)
        self._chunk_recv = int(
            recv[max(int(rpos[-1]) if len(rpos) else -1, int(sums.pos[-1]) if len(sums) else -1)]
        )
        self._kinds(parts, kind, rank, recv_r, sums, recv_s)

    def _kinds(
        self,
        parts: dict[Kind, np.ndarray],
        kind: np.ndarray,
        rank: np.ndarray,
        recv: np.ndarray,
        sums: Summaries,
        sums_recv: np.ndarray,
    ) -> None:
        """A chunk's rows other than node summaries, split by kind (``kind``, ``rank``, ``recv``: of the
        rows they were split from), and its node summaries read (``sums``, received at
        ``sums_recv``), into the engine's state, kind after kind."""
        R = self.ranks
        if len(parts[Kind.REGISTER]):
            R.register(parts[Kind.REGISTER])
        if len(parts[Kind.COMM]):
            self._feed_comm(parts[Kind.COMM])
        if len(parts[Kind.HEARTBEAT]):
            self._feed_heartbeats(parts[Kind.HEARTBEAT])
        if len(parts[Kind.OP]):
            self._feed_ops(parts[Kind.OP], rank[kind == Kind.OP])
        if len(sums):
            self._feed_opsum(sums, sums_recv)
        if len(parts[Kind.STAGE]):
            self.stages.feed(parts[Kind.STAGE], recv[kind == Kind.STAGE])
        if len(parts[Kind.PEER]):
            for c, rows, _ in self._by_comm(parts[Kind.PEER], "PEER"):
                ok = (rows["peer"] >= 0) & (rows["peer"] < c.n)
                if len(rows[ok]):
                    c.add_peers(rows[ok])

    def _feed_comm(self, rows: np.ndarray) -> None:
        for c, part, _ in self._by_comm(rows, "COMM"):
            cr = part["comm_rank"].astype(np.int64)
            self._member(c, cr, part["rank"].astype(np.int64))
            parent = part["parent_id"]
            if parent.any():
                c.parent = int(parent[parent != 0][-1])
            gone = np.isin(part["event"], GONE_EVENTS)
            c.version += 1
            c.gone[cr[gone]] = True
            c.gone[cr[~gone]] = False

    def _feed_heartbeats(self, hb: np.ndarray) -> None:
        proc = hb["comm_id"] == 0
        if proc.any():
            p = take(hb, proc)
            fin = (p["hb_flags"] & schema.HBF_FINAL) != 0
            self.ranks.final[p["rank"][fin]] = True
            hb = take(hb, ~proc)
        if not BATCHED:
            for c, part, _ in self._by_comm(hb, "HEARTBEAT"):
                self._member(c, part["comm_rank"].astype(np.int64), part["rank"].astype(np.int64))
                c.add_heartbeats(part)
            return
        rows, _, ci, groups = self._comm_groups(hb, "HEARTBEAT")
        if not groups:
            return
        member = self._members(rows, ci, groups)
        for c in groups:
            c.version += 1
        # Comm.add_heartbeats for every communicator: the latest row per member
        _, first_rev = np.unique(member[::-1], return_index=True)
        idx = len(member) - 1 - first_rev
        rows, member = take(rows, idx), member[idx]
        M = self._pool.member
        t = rows["time_ns"].astype(np.int64)
        newer = t >= M["hb_time"][member]
        rows, member, t = take(rows, newer), member[newer], t[newer]
        M["hb_seen"][member] = True
        M["hb_time"][member] = t
        M["grank"][member] = rows["rank"]
        for k, f in HB_FIELDS:
            M[k][member] = rows[f]
        ps = rows["pend_seq"]
        M["pend_seq"][member] = np.where(ps == schema.UINT64_MAX, -1, ps.astype(np.int64))

    def _feed_ops(self, ops: np.ndarray, rank: np.ndarray) -> None:
        """``rank``: the rows' rank field, as ``_ingest`` read it."""
        cols = OpCols.of(ops, rank)
        ok = cols.op < len(Op)
        if not ok.all():
            self._invalid("an unknown op kind", int((~ok).sum()))
            ops, cols = take(ops, ok), cols.take(ok)
            if not len(ops):  # (an empty chunk of ops once crashed _gaps: issue 14)
                return
        gaps, cum = self._gaps(ops, cols)
        self._slow.own.feed(cols, gaps, cum, self.ranks, self.thresholds().period_ns)
        extra = np.stack([self._shares_events(ops, cols), cum], axis=1)
        if not BATCHED:
            self._feed_ops_each(ops, extra)
            return
        rows, ex, ci, groups = self._comm_groups(ops, "OP", extra, cols)
        if not groups:
            return
        if rows is not ops:  # rows dropped: the columns of those kept
            cols = OpCols.of(rows)  # (rare: a bad or unknown communicator)
        member = self._members(rows, ci, groups, cols)
        gidx = np.array([c.idx for c in groups], np.int64)
        self._pool.rate.note(self._chunk_recv, gidx, np.bincount(ci, minlength=len(groups)))
        p2p = (cols.flags & P2P) != 0
        if not p2p.all():
            coll = np.flatnonzero(~p2p)
            self._collectives(rows, coll, ci[coll], member[coll], ex[coll, 1], groups, cols.take(coll))
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
                self._pool.p2p.update(P2PDone.key(idx, pp.comm_rank, pp.op, pp.peer), pp.seq)
                # one pass over every communicator's sends and receives
                self._pairs.feed(pp, idx, ex[pi, 0] != 0, self.comms, self.ranks)

    def _members(
        self, rows: np.ndarray, ci: np.ndarray, groups: list[Comm], cols: OpCols | None = None
    ) -> np.ndarray:
        """``_member`` for the rows of every communicator at once (as ``_comm_groups`` gives
        them: ``ci`` each row's group); returns each row's member's Pool index. ``cols``: the
        rows' columns when they are OP rows."""
        mbase = np.array([c.mbase for c in groups], np.int64)
        cr = rows["comm_rank"].astype(np.int64) if cols is None else cols.comm_rank
        member = mbase[ci] + cr
        g = rows["rank"].astype(np.int64) if cols is None else cols.rank
        new = self._pool.member["grank"][member] != g
        if new.any():
            rows_new = np.flatnonzero(new)
            for i in rows_new[np.argsort(ci[rows_new], kind="stable")].tolist():  # communicator order
                c = groups[ci[i]]
                a, b = int(cr[i]), int(g[i])
                c.grank[a] = b
                if (c.idx, a) not in self.ranks.comms_of[b]:
                    self.ranks.comms_of[b].append((c.idx, a))
            for k in np.unique(ci[new]).tolist():
                groups[k].version += 1
        return member

    def _collectives(
        self,
        rows: np.ndarray,
        coll: np.ndarray,
        ci: np.ndarray,
        member: np.ndarray,
        cum: np.ndarray,
        groups: list[Comm],
        cols: OpCols,
    ) -> None:
        """Collective OP rows of every communicator of a chunk (``rows[coll]``, not copied: a
        whole-record copy of nearly every row of a chunk is a pass of its own; ``cols`` their
        columns, ``ci`` each one's group, rows in arrival order): what Comm.add_collectives does one
        communicator at a time, at once. An op whose every member's row is in the chunk and
        whose ring slot nothing else of the chunk claims (the common case) is reduced straight
        from the rows; the others go through the communicator's ring (Comm.scatter)."""
        P = self._pool
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
                                     cols.peer[o], heads, nn[ci_o[heads]], self._chunk_recv)  # fmt: skip
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
        reduce_comms(done, self.ranks, self.cfg.clock_gain)  # exactly what add_collectives one by one gives

    def _feed_ops_each(self, ops: np.ndarray, extra: np.ndarray) -> None:
        """One communicator at a time (Comm.add_collectives): the reference the batched path is
        tested against (engine.BATCHED)."""
        gain = self.cfg.clock_gain
        p2p_rows, p2p_comm, p2p_shared = [], [], []
        for c, part, ex in self._by_comm(ops, "OP", extra):
            n = len(part)
            self._member(c, part["comm_rank"].astype(np.int64), part["rank"].astype(np.int64))
            self._pool.rate.note(self._chunk_recv, np.array([c.idx]), np.array([n]))
            p2p = (part["flags"] & P2P) != 0
            c.p2p_rows += int(p2p.sum())
            if p2p.any():
                pp = part[p2p]
                okp = (pp["peer"] >= 0) & (pp["peer"] < c.n)
                if okp.any():
                    c.add_p2p(pp[okp])
                    p2p_rows.append(pp[okp])
                    p2p_comm.append(np.full(int(okp.sum()), c.idx, np.int64))
                    p2p_shared.append(ex[p2p][okp, 0] != 0)
            if (~p2p).any():
                self._consistent_each(c, part[~p2p])
                c.add_collectives(part[~p2p], ex[~p2p, 1], self.ranks, gain)
        if p2p_rows:  # one pass over every communicator's sends and receives
            pc = OpCols.of(np.concatenate(p2p_rows))
            self._pairs.feed(pc, np.concatenate(p2p_comm), np.concatenate(p2p_shared), self.comms, self.ranks)

    def _consistent_each(self, c: Comm, rows: np.ndarray) -> None:
        """``Consistency.feed_sorted`` of one communicator's collective rows (the reference path)."""
        pc = OpCols.of(rows)
        o = lexsort((pc.comm_rank, pc.seq))
        seq = pc.seq[o]
        heads = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
        self.consistency.feed_sorted(np.full(len(o), c.idx, np.int64), seq, pc.comm_rank[o], pc.rank[o],
                                     pc.elems[o], pc.kinds[o], pc.peer[o], heads,
                                     np.full(len(heads), c.n, np.int64), self._chunk_recv)  # fmt: skip

    def _feed_opsum(self, rows: Summaries, recv: np.ndarray) -> None:
        """Node agents' summaries of node-local collectives, read row by row already
        (c4d.engine.summaries), checked and kept for every communicator at once. A summary of
        a communicator whose members the master knows on more than one node (or not all yet)
        claims one host clock it does not have: dropped. A summary is a report from every
        member (each sent the agent its OP record): the agent forwards few heartbeats of
        ranks that progress (c4d/agent/heartbeats.py)."""
        n = rows.comm_nranks
        ok = (rows.cid != 0) & (n >= 1) & (n <= schema.OPSUM_MAX_MEMBERS)
        ok &= (rows.comm_rank >= 0) & (rows.comm_rank < n)
        if not ok.all():
            self._invalid("a bad comm id/rank/size in OPSUM records", int((~ok).sum()))
            rows, recv = rows.take(ok), recv[ok]
        if not len(rows):
            return
        cid = rows.cid
        heads = _grouped(cid, rows.seq)
        if heads is not None:
            idx, cn = self._lookup(cid[heads])
        if heads is None or (idx < 0).any():  # new communicators are made in comm-id order
            order = _comm_seq_order(cid, rows.seq)
            rows, recv = rows.take(order), recv[order]
            cid = rows.cid
            heads = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
            idx, cn = self._lookup(cid[heads])
        tails = np.r_[heads[1:], len(rows)]
        out, gaps = rows.aligned(self.ranks), rows.gaps
        # Every communicator's checks at once over its members' ranges of the Pool (a chunk of
        # a 4,096-rank job holds 512 tensor-parallel groups' summaries: a dozen numpy calls
        # per group was most of this path); a member change goes through _member first.
        nr = rows.comm_nranks.astype(np.int64)
        ids = cid[heads]
        for k in np.flatnonzero(idx < 0).tolist():  # new communicators (in comm-id order)
            c = self._comm(int(ids[k]), int(nr[heads[k]]))
            idx[k], cn[k] = (c.idx, c.n) if c is not None else (-1, -1)
        C = len(heads)
        seg = np.repeat(np.arange(C), tails - heads)
        ok_c = (cn >= 1) & ~np.logical_or.reduceat(nr != cn[seg], heads)
        if not ok_c.all():
            bad = ~ok_c[seg]
            self._invalid("an unknown communicator or a changed size in OPSUM records", int(bad.sum()))
        if not ok_c.any():
            return
        M = self._pool.member
        base = np.where(ok_c, self._pool.cbase[np.maximum(idx, 0)], 0)
        cr = rows.comm_rank.astype(np.int64)
        g_last = rows.rank.astype(np.int64)
        new = ok_c[seg] & (M["grank"][np.where(ok_c[seg], base[seg] + cr, 0)] != g_last)
        if new.any():
            for j in np.unique(seg[new]).tolist():
                h, t = int(heads[j]), int(tails[j])
                self._member(self.comms[int(idx[j])], cr[h:t], g_last[h:t])
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
        comms = self.comms
        u = np.flatnonzero(use)
        # the OP records they stand for (the live view's rate): one per member
        self._pool.rate.note(self._chunk_recv, idx[u], (tails - heads)[u] * cn[u])
        self._pool.keep_summaries(out, gaps, idx[u], heads[u], tails[u], la_min[u])
        for i in idx[u].tolist():
            c = comms[i]
            c.version += 1
            c.has_coll = True

    @staticmethod
    def _shares_events(ops: np.ndarray, cols: OpCols) -> np.ndarray:
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

    def flush(self) -> None:
        """Ingest everything fed so far without evaluating (tick does this first)."""
        self._flush()

    def take_split(self) -> np.ndarray:
        """OP_SPLIT rows of the ops completed since the last call (needs ``split=True``).

        Rows of ops still in the feed buffer come at a later call (after the next tick)."""
        parts = []
        for c in self.comms.values():
            if c.split:
                parts.extend(c.split)
                c.split = []
        return np.concatenate(parts) if parts else np.empty(0, OP_SPLIT)

    # -- evaluation --------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[Diagnosis]:
        """Evaluate at master time ``now_ns``; return the diagnoses that are new at this tick."""
        now = int(now_ns)
        # records fed since the last tick are stamped with its time; when ticks come late (a
        # master that falls behind) a rank that reported in that interval is not silent
        self.ranks.prev_tick_ns = self._now or now
        self._now = now
        self.stats["ticks"] += 1
        self._flush()
        clock.on_tick(self.ranks, now, self._epoch)
        th = self.thresholds()
        ev = hang.evaluate(self.ranks, self.comms, th, now, self._pool, self.cfg.likelihoods())
        out = self._emission.hangs(ev.findings, th, now)
        for s in self._slow.judge(self.ranks, self.comms, th, now, ev.oldest_wait, self._pool):
            out.append(self._emission.slow(s, now))
        return out

    # -- live view ---------------------------------------------------------------------
    def state(self) -> EngineSnapshot:
        return engine_snapshot(
            self.ranks, self.comms, self._pool, self._slow.slow_ranks, self._emission.active,
            self.thresholds(), self._now, self._next_idx,
        )  # fmt: skip


def _then(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` then ``b`` (``a`` itself when ``b`` is empty: a chunk without node summaries)."""
    return np.concatenate([a, b]) if len(b) else a


def _header_ok(kind: np.ndarray | None, rank: np.ndarray, version: np.ndarray) -> np.ndarray:
    """Rows whose header the engine takes: a rank in range, a schema it reads, a kind it knows
    (``kind`` None: node summaries, whose kind is known)."""
    ok = (rank >= 0) & (rank < MAX_RANK) & (version >= 1) & (version <= schema.SCHEMA_VERSION)
    if kind is not None:
        ok &= (kind >= Kind.REGISTER) & (kind <= Kind.OPSUM) & (kind != Kind.TICK)
    return ok


def _comm_seq_order(cid: np.ndarray, seq: np.ndarray) -> np.ndarray:
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


def _grouped(cid: np.ndarray, seq: np.ndarray) -> np.ndarray | None:
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
