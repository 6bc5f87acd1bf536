"""compute.compute_gaps, vectorised over ranks, gives what the per-rank loop it replaced gave
(kept here as the reference), chunk after chunk, on random streams: unknown starts and ends,
one-rank communicators, ranks whose previous end is long ago. And the running compute sum
counts the time between two synchronizing ops once, whatever one-rank ops lie between."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.engine.compute import compute_gaps
from c4d.record import schema


def _reference(ops, last_end, compute_ns):
    start = ops["start_ns"].astype(np.int64)
    arr = np.where(start > 0, start, ops["issue_ns"].astype(np.int64))
    end = np.where(ops["comm_nranks"] >= 2, ops["end_ns"].astype(np.int64), 0)
    g = ops["rank"].astype(np.int64)
    gaps = np.full(len(ops), -1, np.int64)
    cum = np.zeros(len(ops), np.int64)
    order = np.lexsort((arr, g))
    gs = g[order]
    cuts = np.flatnonzero(gs[1:] != gs[:-1]) + 1
    for seg in np.split(order, cuts):
        r = int(g[seg[0]])
        prev = np.maximum.accumulate(np.r_[last_end[r], end[seg][:-1]])
        gaps[seg] = np.where(prev > 0, np.maximum(arr[seg] - prev, 0), -1)
        ends = ops["comm_nranks"][seg] >= 2  # only a synchronizing op's gap adds up
        cum[seg] = compute_ns[r] + np.cumsum(np.where(ends, np.maximum(gaps[seg], 0), 0))
        compute_ns[r] = cum[seg][-1]
        last_end[r] = max(int(last_end[r]), int(end[seg].max()))
    return gaps, cum


def _chunk(rng, n, t0, far):
    a = np.zeros(n, schema.OP)
    a["rank"] = rng.integers(0, 6, n)
    a["issue_ns"] = t0 + rng.integers(0, 10**9, n)
    known = rng.random(n) < 0.8
    a["start_ns"] = np.where(known, a["issue_ns"] + rng.integers(0, 10**6, n), 0)
    done = rng.random(n) < 0.9
    a["end_ns"] = np.where(done, a["issue_ns"] + rng.integers(10**6, 10**8, n), 0)
    a["comm_nranks"] = np.where(rng.random(n) < 0.2, 1, 4)
    if far:
        for f in ("issue_ns", "start_ns", "end_ns"):  # decades before the others: the per-rank fallback
            a[f][: n // 3] = np.where(a[f][: n // 3] > 0, a[f][: n // 3] - 10**18, 0)
    return a


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31), sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5), far=st.booleans()
)
def test_vectorised_compute_gaps_equals_the_loop(seed, sizes, far):
    rng = np.random.default_rng(seed)
    le1, cn1 = np.zeros(8, np.int64), np.zeros(8, np.int64)
    le2, cn2 = le1.copy(), cn1.copy()
    t0 = 1_700_000_000 * 10**9
    for i, n in enumerate(sizes):
        ops = _chunk(rng, n, t0 + i * 10**9, far)
        g1, c1 = _reference(ops, le1, cn1) if n else (np.zeros(0, np.int64),) * 2
        g2, c2 = compute_gaps(ops, le2, cn2)
        np.testing.assert_array_equal(g1, g2)
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_array_equal(le1, le2)
        np.testing.assert_array_equal(cn1, cn2)


def test_one_rank_ops_between_two_synchronizing_ops_do_not_count_the_gap_twice():
    a = np.zeros(3, schema.OP)  # a p2p op, a one-rank (TP group of one) op, a p2p op
    a["start_ns"] = [100, 115, 120]
    a["end_ns"] = [110, 116, 130]
    a["comm_nranks"] = [2, 1, 2]
    gaps, cum = compute_gaps(a, np.zeros(1, np.int64), np.zeros(1, np.int64))
    assert gaps.tolist() == [-1, 5, 10]  # each op's gap since the p2p op's end
    assert cum.tolist() == [0, 0, 10]  # 10 ns of compute between the two p2p ops, not 15
