"""Each rank's compute between its synchronizing ops, from the arrival and end times of its
OP rows: the gap before each op and the running sum that makes the compute between any two ops
a difference.

Apart because the master's engine and a node agent (c4d/agent/summary.py) both run it on a
rank's stream and must compute the same values, and the agent keeps no other engine state.
"""

from __future__ import annotations

import numpy as np

from c4d.engine.rows import OpCols, lexsort


def compute_gaps(
    ops: np.ndarray, last_end: np.ndarray, compute_ns: np.ndarray, cols: OpCols | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per op: arrival minus the end of the same rank's previous synchronizing op (its compute
    gap), -1 unknown; and the rank's compute so far, this gap included (a running sum, so
    the compute between any two of its synchronizing ops is a difference). Ops of one-rank communicators
    (a pure data-parallel job's TP and PP groups) wait for nobody, so they do not end a
    compute gap: a rank's compute before its DP all-reduce spans them.

    ``last_end`` and ``compute_ns`` (indexed by global rank, updated here) carry each rank's
    latest end and running sum from chunk to chunk: the master's engine and a node agent
    (c4d/agent/summary.py) keep their own, and compute the same values from a rank's stream.
    ``cols``: ``OpCols.of(ops)`` when the caller has it."""
    if cols is None:
        cols = OpCols.of(ops)
    arr, g = cols.arr, cols.rank
    sync = cols.nranks >= 2
    end = np.where(sync, cols.end, 0)
    m = len(ops)
    gaps = np.full(m, -1, np.int64)
    cum = np.zeros(m, np.int64)
    if not m:
        return gaps, cum
    order = lexsort((arr, g))
    gs, a, e, sy = g[order], arr[order], end[order], sync[order]
    first = np.ones(m, bool)
    first[1:] = gs[1:] != gs[:-1]
    seg = np.cumsum(first) - 1  # segment (rank) of each sorted row
    heads = np.flatnonzero(first)
    ranks_ = gs[heads]
    # prev[i] = the latest end before row i in its rank's order: a running max per segment of
    # (the rank's last end, then its rows' ends), done at once by lifting each segment above the
    # previous ones (times relative to the chunk's earliest, so nothing overflows)
    before = np.empty(m, np.int64)  # the value each row's running max takes in before it
    before[first] = last_end[ranks_]
    nf = ~first
    before[nf] = e[np.flatnonzero(nf) - 1]
    pos = before > 0
    if pos.any():
        lo = int(before[pos].min())
        span = int(before.max()) - lo + 2
        if span * (len(heads) + 1) < (1 << 62):
            lifted = np.where(pos, before - lo + 1, 0) + seg * span
            prev = np.maximum.accumulate(lifted) - seg * span
            prev = np.where(prev > 0, prev + lo - 1, 0)
        else:  # times too far apart to lift: one running max per rank
            prev = np.empty(m, np.int64)
            for h, t in zip(heads.tolist(), [*heads[1:].tolist(), m], strict=True):
                prev[h:t] = np.maximum.accumulate(before[h:t])
    else:
        prev = np.zeros(m, np.int64)
    gp = np.where(prev > 0, np.maximum(a - prev, 0), -1)
    # only the gaps that end (ops of two ranks or more) add up: a one-rank op's gap is a part
    # of the gap the next synchronizing op ends, counted there once
    add = np.where(sy, np.maximum(gp, 0), 0)
    run = np.cumsum(add)
    base = run[heads] - add[heads]  # the running sum before each segment
    cs = compute_ns[ranks_][seg] + run - base[seg]
    gaps[order], cum[order] = gp, cs
    tails = np.r_[heads[1:] - 1, m - 1]
    compute_ns[ranks_] = cs[tails]
    seg_end = np.maximum.reduceat(e, heads)
    last_end[ranks_] = np.maximum(last_end[ranks_], seg_end)
    return gaps, cum


def compute_before(last_cum: np.ndarray, member: np.ndarray, seq: np.ndarray, cum: np.ndarray) -> np.ndarray:
    """Each member's compute before op k of its communicator: its running compute sum now minus
    at its previous op there (a rank's ops arrive in its stream's order), so every gap in
    between counts, in whatever communicator (a pipeline stage's compute ends at a p2p send,
    not at the DP all-reduce that follows). Unknown (-1) at its first op. ``member`` indexes
    ``last_cum`` (a comm rank, or a Pool member index for many communicators at once), which
    is updated to each member's latest op."""
    order = lexsort((seq, member))
    m_o, cum_o = member[order], cum[order]
    first = np.r_[True, m_o[1:] != m_o[:-1]]
    prev = np.where(first, last_cum[m_o], np.r_[-1, cum_o[:-1]])
    comp = np.empty_like(cum)
    comp[order] = np.where(prev >= 0, cum_o - prev, -1)
    last = np.r_[m_o[1:] != m_o[:-1], True]
    last_cum[m_o[last]] = cum_o[last]
    return comp
