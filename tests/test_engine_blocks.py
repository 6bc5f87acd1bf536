"""Node summaries kept per chunk by the pool (Pool.keep_summaries) reach each communicator in
the order they came, as if each chunk's rows had been handed to it at once: at a window's
close (Pool.settle), before rows of its own (Comm.keep_completed), and to the live view
(Comm.recent_ops) while still in the pool."""

from __future__ import annotations

import numpy as np

from c4d.engine import pool as pool_module
from c4d.engine.comm import RECENT_OPS, Comm
from c4d.engine.pool import Pool
from c4d.engine.rows import COMPLETED, NO_ROWS, cat


def _rows(seqs, la0: int) -> np.ndarray:
    out = np.zeros(len(seqs), COMPLETED)
    out["seq"] = seqs
    out["last_arrive"] = la0 + np.asarray(seqs, np.int64) * 1000
    return out


def _chunk(pool: Pool, runs: dict[Comm, list[int]], la0: int = 10**9) -> None:
    """One chunk's summaries: each communicator's run of seqs, in communicator order."""
    parts, idx, head, tail, la = [], [], [], [], []
    at = 0
    for c, seqs in runs.items():
        r = _rows(seqs, la0)
        parts.append(r)
        idx.append(c.idx)
        head.append(at)
        tail.append(at + len(r))
        la.append(int(r["last_arrive"].min()))
        at += len(r)
    out = cat(parts)
    gaps = np.tile(np.arange(8, dtype=np.float32), (len(out), 1)) + out["seq"][:, None].astype(np.float32)
    pool.keep_summaries(out, gaps, np.array(idx), np.array(head), np.array(tail), np.array(la))


def _pool(*sizes: int) -> tuple[Pool, list[Comm]]:
    pool = Pool()
    return pool, [Comm(i, 0x100 + i, n, pool) for i, n in enumerate(sizes)]


def test_settled_rows_come_in_the_order_they_came_per_communicator():
    pool, (a, b, c) = _pool(8, 4, 2)
    _chunk(pool, {a: [0, 1, 2], b: [0, 1], c: [5]})
    _chunk(pool, {b: [2, 3, 4], a: [3]})
    _chunk(pool, {a: [4, 5]})
    assert pool.pmin[a.idx] == 10**9 and pool.pmin[c.idx] == 10**9 + 5000
    assert a.pending == [] and pool.blocked[[a.idx, b.idx, c.idx]].all()
    pool.settle()
    assert pool.blocks == [] and not pool.blocked.any()
    for comm, seqs in ((a, [0, 1, 2, 3, 4, 5]), (b, [0, 1, 2, 3, 4]), (c, [5])):
        rows = cat(comm.pending)
        assert rows["seq"].tolist() == seqs
        gaps = np.concatenate(comm.pending_gaps)
        assert gaps.shape == (len(seqs), comm.n)  # its members' columns only
        assert (gaps[:, 0] == rows["seq"]).all()
        assert comm.pending_min_la == 10**9 + seqs[0] * 1000


def test_own_rows_after_summaries_keep_the_order_they_came():
    """A communicator's own rows (Comm.keep_completed) after summaries still in the pool: the
    summaries are handed to it first; the other communicators' stay in the pool."""
    pool, (a, b) = _pool(2, 2)
    _chunk(pool, {a: [0, 1], b: [0]})
    a.keep_completed(_rows([2, 3], 10**9), np.zeros((2, 2), np.float32))
    assert cat(a.pending)["seq"].tolist() == [0, 1, 2, 3]
    assert not pool.blocked[a.idx] and pool.blocked[b.idx]
    _chunk(pool, {a: [4], b: [1]})
    pool.settle()
    assert cat(a.pending)["seq"].tolist() == [0, 1, 2, 3, 4]  # handed out once: no repeats
    assert cat(b.pending)["seq"].tolist() == [0, 1]


def test_the_live_view_reads_summaries_still_in_the_pool():
    pool, (a, b) = _pool(8, 8)
    starts = range(0, 2 * RECENT_OPS, 50)
    for k in starts:
        _chunk(pool, {a: list(range(k, k + 50)), b: [k]})
    total = 50 * len(starts)
    recent = a.recent_ops()
    assert recent["seq"].tolist() == list(range(total - RECENT_OPS, total))
    assert len(a.kept()) == len(pool.blocks)  # all of them when no count is asked
    pool.settle()
    assert (a.recent_ops() == recent).all()  # the same rows, handed out


def test_blocks_kept_are_bounded_between_window_closes(monkeypatch):
    """The pool hands its blocks out every MAX_BLOCKS chunks, each communicator's new parts
    joined into one (the blocks freed; the parts joined before are not copied again)."""
    monkeypatch.setattr(pool_module, "MAX_BLOCKS", 4)
    pool, (a,) = _pool(4)
    for k in range(3):
        _chunk(pool, {a: [2 * k, 2 * k + 1]})
    blocks = [(b.out, b.gaps) for b in pool.blocks]
    _chunk(pool, {a: [6, 7]})
    assert pool.blocks == [] and len(a.pending) == 1 == len(a.pending_gaps)
    first = a.pending[0]
    assert first["seq"].tolist() == list(range(8))
    assert not any(np.shares_memory(first, o) or np.shares_memory(a.pending_gaps[0], g) for o, g in blocks)
    for k in range(4, 8):
        _chunk(pool, {a: [2 * k, 2 * k + 1]})
    assert len(a.pending) == 2 and a.pending[0] is first
    assert cat(a.pending)["seq"].tolist() == list(range(16))
    _chunk(pool, {a: [16]})
    assert len(pool.blocks) == 1 and a.pending_min_la == 10**9


def test_a_freed_communicators_summaries_are_dropped():
    pool, (a, b) = _pool(2, 2)
    _chunk(pool, {a: [0], b: [0]})
    pool.detach(a)
    pool.settle()
    assert a.pending == [] and cat(b.pending)["seq"].tolist() == [0]
    assert pool.pmin[a.idx] == NO_ROWS
