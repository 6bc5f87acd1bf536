"""A chunk into the engine's memory: the rank-level header step (checks, liveness, clock
bounds) on its rows and its node summaries alike, then each kind in turn: REGISTER (RankTable),
COMM (membership), HEARTBEAT, OP (ingest_ops.py), node summaries (ingest_summaries.py), STAGE
and PEER. Every communicator's rows of a kind at once (a chunk's per-communicator work is
paid once per chunk)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from c4d.engine import clock
from c4d.engine.chunking import Chunk
from c4d.engine.comm_index import CommIndex
from c4d.engine.config import EngineConfig
from c4d.engine.consistency import Consistency
from c4d.engine.ingest_ops import OpIngest
from c4d.engine.ingest_summaries import SummaryIngest
from c4d.engine.own_pace import OwnPace
from c4d.engine.p2p_pairs import P2PPairs
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.rows import GONE_EVENTS, MAX_RANK, take
from c4d.engine.stage import Stages
from c4d.engine.summaries import Summaries
from c4d.record import schema
from c4d.record.schema import Kind

HB_FIELDS = (  # (Pool member array, HEARTBEAT field) copied as they are (Comm.add_heartbeats)
    ("n_issued", "n_issued"), ("n_arrived", "n_arrived"), ("n_done", "n_done"),
    ("last_arrive", "last_arrive_ns"), ("pend_op", "pend_op"), ("pend_peer", "pend_peer"),
    ("pend_flags", "pend_flags"), ("pend_issue", "pend_issue_ns"), ("pend_start", "pend_start_ns"),
    ("p2p_in_flight", "p2p_in_flight"),
    ("pend_count", "pend_count"), ("pend_dtype", "pend_dtype"), ("pend_redop", "pend_redop"),
)  # fmt: skip


class Ingest:
    def __init__(
        self,
        cfg: EngineConfig,
        ranks: RankTable,
        index: CommIndex,
        pool: Pool,
        pairs: P2PPairs,
        consistency: Consistency,
        own: OwnPace,
        stages: Stages,
        invalid: Callable[[str, int], None],
        stats: dict[str, int],
    ) -> None:
        """``invalid`` counts dropped rows; ``stats["records"]`` counts the rows ingested."""
        self.ranks, self.index, self.pool, self.stages = ranks, index, pool, stages
        self._invalid, self._stats = invalid, stats
        self.ops = OpIngest(cfg, ranks, index, pool, pairs, consistency, own, invalid)
        self.summaries = SummaryIngest(cfg, ranks, index, pool, invalid)
        self.chunk_recv = 0  # master time stamped on the chunk being ingested

    def chunk(self, chunk: Chunk) -> None:
        """One chunk: its node summaries read, at ``sums.pos``, and its other rows, at
        ``rpos``; ``recv`` by position. The header checks and updates take the summaries'
        header fields."""
        rest, rpos, recv, sums = chunk
        self._stats["records"] += len(rest) + len(sums)
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
        self.chunk_recv = int(
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
        """A chunk's rows other than node summaries, split by kind (``kind``, ``rank``,
        ``recv``: of the rows they were split from), and its node summaries read (``sums``,
        received at ``sums_recv``), into the engine's state, kind after kind."""
        R = self.ranks
        if len(parts[Kind.REGISTER]):
            R.register(parts[Kind.REGISTER])
        if len(parts[Kind.COMM]):
            self._comm_rows(parts[Kind.COMM])
        if len(parts[Kind.HEARTBEAT]):
            self._heartbeats(parts[Kind.HEARTBEAT])
        if len(parts[Kind.OP]):
            self.ops.feed(parts[Kind.OP], rank[kind == Kind.OP], self.chunk_recv)
        if len(sums):
            self.summaries.feed(sums, sums_recv, self.chunk_recv)
        if len(parts[Kind.STAGE]):
            self.stages.feed(parts[Kind.STAGE], recv[kind == Kind.STAGE])
        if len(parts[Kind.PEER]):
            for c, rows, _ in self.index.by_comm(parts[Kind.PEER], "PEER"):
                ok = (rows["peer"] >= 0) & (rows["peer"] < c.n)
                if len(rows[ok]):
                    c.add_peers(rows[ok])

    def _comm_rows(self, rows: np.ndarray) -> None:
        for c, part, _ in self.index.by_comm(rows, "COMM"):
            cr = part["comm_rank"].astype(np.int64)
            self.index.member(c, cr, part["rank"].astype(np.int64))
            parent = part["parent_id"]
            if parent.any():
                c.parent = int(parent[parent != 0][-1])
            gone = np.isin(part["event"], GONE_EVENTS)
            c.version += 1
            c.gone[cr[gone]] = True
            c.gone[cr[~gone]] = False

    def _heartbeats(self, hb: np.ndarray) -> None:
        proc = hb["comm_id"] == 0
        if proc.any():
            p = take(hb, proc)
            fin = (p["hb_flags"] & schema.HBF_FINAL) != 0
            self.ranks.final[p["rank"][fin]] = True
            hb = take(hb, ~proc)
        self.heartbeats_by_comm(hb)

    def heartbeats_by_comm(self, hb: np.ndarray) -> None:
        """A chunk's HEARTBEAT rows of communicators, every communicator at once: its members,
        and each member's latest heartbeat (what Comm.add_heartbeats keeps, one communicator at
        a time: tests/one_comm_at_a_time.py)."""
        rows, _, ci, groups = self.index.groups(hb, "HEARTBEAT")
        if not groups:
            return
        member = self.index.members(rows, ci, groups)
        for c in groups:
            c.version += 1
        # the latest row per member
        _, first_rev = np.unique(member[::-1], return_index=True)
        idx = len(member) - 1 - first_rev
        rows, member = take(rows, idx), member[idx]
        M = self.pool.member
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
