"""A chunk into the engine's memory: the rank-level header step (checks, liveness, clock
bounds) on its rows and its node summaries alike, then each kind in turn: REGISTER (RankTable),
COMM (membership), HEARTBEAT, OP (ingest_ops.py), node summaries (ingest_summaries.py), STAGE
and PEER. Every communicator's rows of a kind at once (a chunk's per-communicator work is
paid once per chunk)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from c4d.engine import clock
from c4d.engine.chunking import Chunk
from c4d.engine.comm_index import CommIndex, new_in
from c4d.engine.config import EngineConfig
from c4d.engine.consistency import Consistency
from c4d.engine.ingest_ops import OpIngest
from c4d.engine.ingest_summaries import SummaryIngest
from c4d.engine.own_pace import OwnPace
from c4d.engine.p2p_pairs import P2PPairs
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.reduce import Step, apply_steps
from c4d.engine.rows import GONE_EVENTS, MAX_RANK, OpCols, take
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


class CommRows(NamedTuple):
    """A chunk's rows of communicators after its rank-level half (``Ingest.front``): what a
    shard of an engine sharded by communicator ingests (``Ingest.comms``)."""

    comm: np.ndarray  # COMM rows
    hb: np.ndarray  # HEARTBEAT rows of communicators
    ops: np.ndarray  # OP rows of known op kinds
    cols: OpCols | None  # their columns (None: read them again)
    extra: np.ndarray | None  # per OP row: shares its group's events, the rank's compute so far
    sums: Summaries  # node summaries read
    sums_recv: np.ndarray  # master time of each
    peer: np.ndarray  # PEER rows
    recv: int  # master time stamped on the chunk
    new: list[tuple[int, int]]  # communicators the chunk names first: (id, size), in order


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
        self.cfg, self.ranks, self.index, self.pool, self.stages = cfg, ranks, index, pool, stages
        self._invalid, self._stats = invalid, stats
        self.ops = OpIngest(cfg, ranks, index, pool, pairs, consistency, own, invalid)
        self.summaries = SummaryIngest(cfg, ranks, index, pool, invalid)
        self.chunk_recv = 0  # master time stamped on the chunk being ingested
        self._steps: list[Step] = []  # the last chunk's clock steps, not applied yet (settle)

    def chunk(self, chunk: Chunk) -> None:
        """One chunk: its rank-level half (``front``), its communicators' half (``comms``),
        then the clock refinement steps the chunk before it gave (``settle``): the steps of a
        chunk's collectives are applied together (Jacobi order, clock.py), once the next chunk
        is ingested or at the tick, whichever comes first. So an engine sharded by
        communicator ingests a chunk in its shards while its front reads the next one, with the
        clock one engine would publish (c4d/engine/shards.py); a tick's chunks are rarely
        more than one or two, and a tick reads the clock with every step applied."""
        rows = self.front(chunk)
        if rows is not None:
            self.pool.fit(self.ranks.registered)  # (the chunk's REGISTERs count for its rows)
            self.index.make(rows.new)
            steps = self.comms(rows)
            self.settle()
            self._steps = steps

    def settle(self) -> None:
        """Apply the clock refinement steps of the last chunk ingested, if not yet applied."""
        steps, self._steps = self._steps, []
        if steps:
            self.apply_steps(steps)

    def front(self, chunk: Chunk) -> CommRows | None:
        """The rank-level half of a chunk, which an engine sharded by communicator does once,
        before any shard (docs/engine-shards.md): the header checks and updates (on its node
        summaries' header fields too), REGISTER, STAGE, processes' final heartbeats, and each
        OP row's compute gap and the ranks' own pace (per rank over every communicator); returns
        the rows of communicators, with the communicators the chunk names first (``new_in``).
        ``chunk``: its node summaries read, at ``sums.pos``, and its other rows, at ``rpos``;
        ``recv`` by position."""
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
                return None
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
        if len(parts[Kind.REGISTER]):
            R.register(parts[Kind.REGISTER])
        hb = parts[Kind.HEARTBEAT]
        if len(hb):
            proc = hb["comm_id"] == 0
            if proc.any():
                p = take(hb, proc)
                fin = (p["hb_flags"] & schema.HBF_FINAL) != 0
                R.final[p["rank"][fin]] = True
                hb = take(hb, ~proc)
        ops, cols, extra = parts[Kind.OP], None, None
        if len(ops):
            ops, cols, extra = self.ops.front(ops, rank[kind == Kind.OP])
        if len(parts[Kind.STAGE]):
            self.stages.feed(parts[Kind.STAGE], recv_r[kind == Kind.STAGE])
        new = new_in(self.index.known, parts[Kind.COMM], hb, ops, sums)
        return CommRows(
            parts[Kind.COMM], hb, ops, cols, extra, sums, recv_s, parts[Kind.PEER], self.chunk_recv, new
        )

    def comms(self, r: CommRows) -> list[Step]:
        """The communicators' half of a chunk (``front``'s rows), kind after kind: membership,
        heartbeats, OP rows, node summaries, PEER. Returns the clock refinement steps of the
        collectives it completed, in communicator order (``apply_steps`` at the chunk's end)."""
        steps: list[Step] = []  # (the communicators' steps of the chunk, for ``settle``)
        if len(r.comm):
            self._comm_rows(r.comm)
        if len(r.hb):
            self.heartbeats_by_comm(r.hb)
        if len(r.ops) and r.extra is not None:  # (``front`` gives OP rows their extra)
            steps = self.ops.by_comm(
                r.ops, r.cols if r.cols is not None else OpCols.of(r.ops), r.extra, r.recv
            )
        if len(r.sums):
            self.summaries.feed(r.sums, r.sums_recv, r.recv)
        if len(r.peer):
            for c, rows, _ in self.index.by_comm(r.peer, "PEER"):
                ok = (rows["peer"] >= 0) & (rows["peer"] < c.n)
                if len(rows[ok]):
                    c.add_peers(rows[ok])
        return steps

    def apply_steps(self, steps: list[Step]) -> None:
        apply_steps(steps, self.ranks, self.cfg.clock_gain)

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
