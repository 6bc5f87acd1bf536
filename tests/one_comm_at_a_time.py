"""The reference the engine's batched ingest is compared with (tests/test_engine_batched.py,
tests/test_consistency.py): a chunk's OP and HEARTBEAT rows taken one communicator at a time,
through Comm.add_collectives, Comm.add_p2p and Comm.add_heartbeats. ``use(monkeypatch)`` puts
it in place of the batched steps (OpIngest.by_comm, Ingest.heartbeats_by_comm); everything
else of the chunk (header step, compute gaps, own pace, node summaries) is the engine's own."""

from __future__ import annotations

import numpy as np

from c4d.engine.comm import Comm
from c4d.engine.ingest import Ingest
from c4d.engine.ingest_ops import OpIngest
from c4d.engine.rows import P2P, OpCols, lexsort


def ops_each(self: OpIngest, ops: np.ndarray, cols: OpCols, extra: np.ndarray, recv: int) -> None:
    """OpIngest.by_comm, one communicator at a time (``cols`` unused: each part reads its own)."""
    gain = self.cfg.clock_gain
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
            c.add_collectives(part[~p2p], ex[~p2p, 1], self.ranks, gain)
    if p2p_rows:  # one pass over every communicator's sends and receives
        pc = OpCols.of(np.concatenate(p2p_rows))
        comm, shared = np.concatenate(p2p_comm), np.concatenate(p2p_shared)
        self.pairs.feed(pc, comm, shared, self.index.comms, self.ranks)


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
