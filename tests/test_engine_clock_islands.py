"""The clock's island anchors (c4d/engine/clock.py ``_place``) for every island at once give
exactly what one ``np.median`` per island gave: the tick's clock work is a part of the engine
that no shard can take (docs/engine-shards.md), so it must not grow with islands x nodes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.engine import clock
from c4d.engine.ranks import RankTable

finite = st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-6, 6), finite | st.sampled_from([0.0, 1.5, -2.5])), min_size=1, max_size=80
    )
)
def test_medians_of_every_label_are_np_median_bit_for_bit(rows):
    lab = np.array([x for x, _ in rows], np.int64)
    d = np.array([y for _, y in rows], np.float64)
    u, med = clock._medians(lab, d)
    assert u.tolist() == np.unique(lab).tolist()
    want = np.array([np.median(d[lab == x]) for x in u.tolist()])
    assert med.tobytes() == want.tobytes()


def test_medians_keep_np_medians_nan():
    lab = np.array([0, 0, 1, 1, 1])
    d = np.array([1.0, np.nan, 2.0, 3.0, 4.0])
    u, med = clock._medians(lab, d)
    assert u.tolist() == [0, 1] and np.isnan(med[0]) and med[1] == 3.0


def _reference_place(R: RankTable) -> None:
    """``_place`` as it was: one median and two masks per island."""
    th, ok = R.theta.astype(np.float64), R.theta_ok
    nd = R.node
    k = len(R.node_names)
    labels, diffs = [], []
    if k:
        nth = np.full(k, np.nan)
        sel = ok & (nd >= 0)
        if sel.any():
            nth[nd[sel]] = th[sel]
        have = ~np.isnan(nth)
        follow = have & ~R.rel_node_refined
        R.rel_node[follow] = nth[follow]
        R.anc_node[follow] = 0.0
        R.rel_node_ok |= have
        m = have & R.rel_node_refined
        labels.append(R.isl_node[m])
        diffs.append(nth[m] - R.rel_node[m])
    solo = ok & (nd < 0)
    follow = solo & ~R.rel_rank_refined
    R.rel_rank[follow] = th[follow]
    R.anc_rank[follow] = 0.0
    R.rel_rank_ok |= solo
    m = solo & R.rel_rank_refined
    labels.append(R.isl_rank[m])
    diffs.append(th[m] - R.rel_rank[m])
    lab = np.concatenate(labels)
    if not len(lab):
        return
    d = np.concatenate(diffs)
    for label in np.unique(lab).tolist():
        a = float(np.median(d[lab == label]))
        if k:
            R.anc_node[(R.isl_node == label) & R.rel_node_refined] = a
        R.anc_rank[(R.isl_rank == label) & (nd < 0) & R.rel_rank_refined] = a


def _table(seed: int) -> RankTable:
    """Ranks on nodes and of unknown node, some refined, joined into islands at random."""
    rng = np.random.default_rng(seed)
    R = RankTable()
    n = int(rng.integers(1, 200))
    R.ensure(n - 1)
    nodes = int(rng.integers(1, 40))
    for g in range(n):
        if rng.random() < 0.85:
            R.set_node(g, f"node-{rng.integers(nodes)}")
    R.theta[:] = rng.integers(-(10**9), 10**9, R.n)
    R.theta_ok[:] = rng.random(R.n) < 0.9
    R.rel_node_refined[:] = rng.random(len(R.node_names)) < 0.7
    R.rel_rank_refined[:] = rng.random(R.n) < 0.5
    R.rel_node[:] = rng.normal(0, 1e6, len(R.node_names))
    R.rel_rank[:] = rng.normal(0, 1e6, R.n)
    for _ in range(int(rng.integers(0, 30))):  # islands joined as the consensus joins them
        nds = rng.choice(len(R.node_names), size=min(3, len(R.node_names)), replace=False)
        solo = np.flatnonzero(R.node < 0)[: int(rng.integers(0, 3))]
        R._merge(nds, solo)
    return R


def test_place_anchors_every_island_as_one_median_each_did():
    for seed in range(60):
        a, b = _table(seed), _table(seed)
        clock._place(a)
        _reference_place(b)
        for f in ("anc_node", "anc_rank", "rel_node", "rel_rank", "rel_node_ok", "rel_rank_ok"):
            assert getattr(a, f).tobytes() == getattr(b, f).tobytes(), (seed, f)
