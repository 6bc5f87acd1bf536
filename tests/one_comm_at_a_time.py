"""The reference the engine's batched ingest is compared with (tests/test_engine_batched.py,
tests/test_consistency.py): a chunk's OP and HEARTBEAT rows taken one communicator at a time,
through Comm.add_collectives, Comm.add_p2p and Comm.add_heartbeats, every communicator's
reduction reading the clock offsets as the chunk found them and the clock refinement steps
applied at the chunk's end, after its node summaries (Jacobi order: each domain moved by the
scaled mean of its steps).
``use(monkeypatch)`` puts it in place of the batched steps (OpIngest.by_comm,
Ingest.heartbeats_by_comm); everything else of the chunk (header step, compute gaps, own pace,
node summaries) is the engine's own."""

from __future__ import annotations

import copy

import numpy as np

from c4d.engine.comm import Comm
from c4d.engine.ingest import Ingest
from c4d.engine.ingest_ops import OpIngest
from c4d.engine.ranks import RankTable
from c4d.engine.rows import P2P, OpCols, lexsort


class ChunkStart:
    """The clock as a chunk found it, for every communicator's reduction to read (a copy of the
    RankTable); the refinement steps the reductions give (``add_residuals``) are kept instead
    of applied, for ``apply`` at the chunk's end."""

    def __init__(self, ranks: RankTable) -> None:
        self.start = copy.deepcopy(ranks)
        self.steps: list[tuple[np.ndarray, np.ndarray]] = []

    def __getattr__(self, name: str):
        return getattr(self.start, name)

    def add_residuals(self, g: np.ndarray, res: np.ndarray) -> None:
        self.steps.append((g.copy(), res.copy()))

    def apply(self, ranks: RankTable, gain: float) -> None:
        """The steps, in communicator order: each joins its domains' islands; then each domain
        that k steps move moves by the mean of what each step alone would move it by
        (add_residuals: the mean of its members' residuals on a node), times
        (1 - (1 - gain)^k) / gain: k steps of gain x its error each, applied one after the
        other, would leave (1 - gain)^k of it. A step whose members all share one host clock is
        zero: it marks its node refined and is not one of the k."""
        moves: dict[tuple[bool, int], list[float]] = {}  # (a node?, node or rank) -> moves
        for g, res in self.steps:
            ranks.join_islands(g)
            nd = ranks.node[g].tolist()
            if nd[0] >= 0 and len(set(nd)) == 1:
                ranks.mark_refined(nd[0])
                continue
            for d in dict.fromkeys(nd):  # in member order
                on = [r for r, x in zip(res.tolist(), nd, strict=True) if x == d]
                if d >= 0:
                    moves.setdefault((True, d), []).append(sum(on) / len(on))
            for r, x, gr in zip(res.tolist(), nd, g.tolist(), strict=True):
                if x < 0:
                    moves.setdefault((False, gr), []).append(r)
        for (is_node, d), m in moves.items():
            k = len(m)
            scale = (1.0 - (1.0 - gain) ** k) / gain if k > 1 and 0 < gain < 1 else 1.0
            if is_node:
                ranks.rel_node[d] += sum(m) / k * scale
                ranks.rel_node_refined[d] = True
            else:
                ranks.rel_rank[d] += sum(m) / k * scale
                ranks.rel_rank_refined[d] = True


def ops_each(self: OpIngest, ops: np.ndarray, cols: OpCols, extra: np.ndarray, recv: int) -> list:
    """OpIngest.by_comm, one communicator at a time (``cols`` unused: each part reads its own);
    returns the chunk's clock (``ChunkStart``) for its steps at the chunk's end."""
    gain = self.cfg.clock_gain
    clock = ChunkStart(self.ranks)
    p2p_rows, p2p_comm, p2p_shared = [], [], []
    for c, part, ex in self.index.by_comm(ops, "OP", extra):
        n = len(part)
        self.index.member(c, part["comm_rank"].astype(np.int64), part["rank"].astype(np.int64))
        self.pool.rate.note(recv, np.array([c.idx]), np.array([n]))
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
            _consistent_each(self, c, part[~p2p], recv)
            c.add_collectives(part[~p2p], ex[~p2p, 1], clock, gain)  # type: ignore[arg-type]
    if p2p_rows:  # one pass over every communicator's sends and receives
        pc = OpCols.of(np.concatenate(p2p_rows))
        comm, shared = np.concatenate(p2p_comm), np.concatenate(p2p_shared)
        self.pairs.feed(pc, comm, shared, self.index.comms, self.ranks)
    return [clock]


def apply_each(self: Ingest, steps: list) -> None:
    """Ingest.apply_steps of the chunk's clock ``ops_each`` returned (none: no OP rows)."""
    for clock in steps:
        clock.apply(self.ranks, self.cfg.clock_gain)


def _consistent_each(self: OpIngest, c: Comm, rows: np.ndarray, recv: int) -> None:
    """``Consistency.feed_sorted`` of one communicator's collective rows."""
    pc = OpCols.of(rows)
    o = lexsort((pc.comm_rank, pc.seq))
    seq = pc.seq[o]
    heads = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    self.consistency.feed_sorted(np.full(len(o), c.idx, np.int64), seq, pc.comm_rank[o], pc.rank[o],
                                 pc.elems[o], pc.kinds[o], pc.peer[o], heads,
                                 np.full(len(heads), c.n, np.int64), recv)  # fmt: skip


def heartbeats_each(self: Ingest, hb: np.ndarray) -> None:
    """Ingest.heartbeats_by_comm, one communicator at a time."""
    for c, part, _ in self.index.by_comm(hb, "HEARTBEAT"):
        self.index.member(c, part["comm_rank"].astype(np.int64), part["rank"].astype(np.int64))
        c.add_heartbeats(part)


def use(monkeypatch) -> None:
    """The engines made from now on (in this test) ingest one communicator at a time."""
    monkeypatch.setattr(OpIngest, "by_comm", ops_each)
    monkeypatch.setattr(Ingest, "heartbeats_by_comm", heartbeats_each)
    monkeypatch.setattr(Ingest, "apply_steps", apply_each)
