"""Where a fault is (c4d/engine/blame.py), on jobs shaped as users run them: tensor-parallel
groups inside nodes, rings whose edges are partly inside nodes (NCCL reports no transfer there),
a node's every link at fault, faults present from the job's first step.

Factory-built streams (tests/factories.py) with ``peer_intra=False``: PEER records only for
transfers across nodes, as NCCL's profiler gives them.
"""

from __future__ import annotations

import pytest
from factories import Fault, Job, run_cached

from c4d.engine import DiagKind, Level, Target
from c4d.engine.expected import ExpectedBusbw

PERIOD_S = 1


def _job(**kw) -> Job:
    base = dict(
        tp=2, pp=1, dp=4, ranks_per_node=4, steps=160, skew_ms=20.0, period_s=PERIOD_S, peer_intra=False
    )
    base.update(kw)
    return Job(**base)


def _said(run) -> list[str]:
    return [f"{d.summary()} {d.localization.basis}" for d in run.diagnoses]


def test_a_slow_rank_with_its_tp_partner_inside_a_node_is_the_rank_never_one_of_its_links():
    """Rank 7's DP ring (1, 3, 5, 7) crosses nodes only on 7 -> 1 and 3 -> 5; its TP pair (6, 7)
    is inside node 1, invisible to PEER. The ring's pace names link 1-7 or its ends; the TP pair,
    slow too, tells rank 7 from the link. No diagnosis may name the link (it would cordon a
    healthy node-0), whatever order the units are judged in."""
    run = run_cached(_job(faults=[Fault("comm-slow", rank=7, step=40, factor=3.0)]))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    assert not [d for d in ds if d.localization.target is Target.link], _said(run)
    assert all(7 in d.ranks for d in ds), _said(run)
    named = [d for d in ds if d.localization.target is Target.rank]
    assert named and named[0].ranks == (7,) and ds[-1].ranks == (7,), _said(run)
    assert 0 < named[0].time - run.onset_s() <= 2 * PERIOD_S + 0.5


def test_a_stopped_network_link_in_a_ring_with_edges_inside_nodes_is_that_link():
    """dp 8, 4 ranks a node: the ring 0..7 crosses nodes on 3 -> 4 and 7 -> 0 only. Link 3-4
    stops: PEER shows 3 -> 4 at 0 of its steps while 7 -> 0 moved 4 (behind a stop, a ring's
    links move one step more per hop, then wait for data); the six edges inside the
    nodes report nothing, which is not evidence that they stopped. The link is named (its ends'
    other links are invisible: they are its alternatives, and the confidence says so: nothing
    is isolated)."""
    run = run_cached(_job(tp=1, dp=8, faults=[Fault("comm-hang", link=(3, 4), step=30)]))
    ds = [d for d in run.diagnoses if d.kind is DiagKind.RankCommHang]
    assert ds and {d.kind for d in run.diagnoses} == {DiagKind.RankCommHang}, _said(run)
    loc = ds[-1].localization
    assert ds[-1].level is Level.ERROR
    assert loc.target is Target.link and sorted(loc.link or ()) == [3, 4], _said(run)
    assert set(loc.alternatives) == {"rank 3", "rank 4"} and loc.confidence < 0.9
    assert ds[-1].blacklist_nodes == ()  # a link at this confidence cordons no node


@pytest.mark.parametrize("fault", [dict(link=(1, 2)), dict(rank=2), dict(link=(5, 6))], ids=str)
def test_a_stop_inside_a_rings_segment_within_a_node_is_placed_on_that_node(fault):
    """dp 8, 4 ranks a node: a stop on an edge inside node 0 (or 1) starves the ring's links
    after it, so the network link leaving the node moved a few steps and waits for data, and
    the one entering it moved more. The stop is on the unobserved edges between them: their
    node, named (nothing visible tells its ranks apart), never the network link leaving it."""
    f = Fault("comm-hang", step=30, **fault)
    run = run_cached(_job(tp=1, dp=8, faults=[f]))
    ds = [d for d in run.diagnoses if d.kind is DiagKind.RankCommHang]
    assert ds and {d.kind for d in run.diagnoses} == {DiagKind.RankCommHang}, _said(run)
    node = 0 if 2 in (f.link or (f.rank,)) else 1
    want = list(range(4 * node, 4 * node + 4))
    assert not [d for d in ds if d.localization.target is Target.link], _said(run)
    err = [d for d in ds if d.level is Level.ERROR][-1]
    assert err.localization.target is Target.node and sorted(err.ranks) == want, _said(run)
    assert err.detail["starved_link"] == f"{4 * node + 3}->{(4 * node + 4) % 8}"
    assert err.blacklist_nodes == (f"node-{node}",)


def test_a_slow_node_is_the_node():
    """Every rank of node 1 (ranks 4-7) slowed (its host, NIC or switch port): TP pairs 4-5 and
    6-7, both DP rings' network links into and out of the node. No single rank explains it."""
    faults = [Fault("comm-slow", rank=r, step=40, factor=3.0) for r in range(4, 8)]
    run = run_cached(_job(faults=faults))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    nodes = [d for d in ds if d.localization.target is Target.node]
    assert nodes and all(d.ranks == (4, 5, 6, 7) and d.nodes == ("node-1",) for d in nodes), _said(run)
    assert ds[-1].localization.target is Target.node, _said(run)
    assert not [d for d in ds if set(d.ranks) - {4, 5, 6, 7}], _said(run)


def test_a_hung_node_is_the_node():
    """Every rank of node 1 (of three) stops transferring: both network links of the node (3 -> 4
    and 7 -> 8) stall in the stuck all-reduce while 11 -> 0 moved on; no one rank or link
    explains both. (With two nodes both network links of a ring touch both nodes: nothing could
    tell them apart.)"""
    faults = [Fault("comm-hang", rank=r, step=30) for r in range(4, 8)]
    run = run_cached(_job(tp=1, dp=12, faults=faults))
    ds = [d for d in run.diagnoses if d.kind is DiagKind.RankCommHang]
    assert ds, _said(run)
    assert ds[-1].localization.target is Target.node and ds[-1].nodes == ("node-1",), _said(run)


def test_a_rank_slow_from_the_first_step_is_named_against_its_siblings():
    """No clean past: rank 5 slowed from step 0. Its TP pair and DP ring are judged against the
    other pairs and the other ring of the same shape in the same windows."""
    run = run_cached(_job(faults=[Fault("comm-slow", rank=5, step=0, factor=3.0)]))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    assert all(5 in d.ranks for d in ds), _said(run)
    assert ds[-1].ranks == (5,) and ds[-1].localization.target is Target.rank, _said(run)


def test_a_link_slow_from_the_first_step_is_the_link():
    """Link 3-5 (the odd ring's network link from node 0 to node 1) slowed from step 0: the
    even ring is its sibling; ranks 3 and 5's TP pairs are clear, so the link, not an end."""
    run = run_cached(_job(faults=[Fault("comm-slow", link=(3, 5), step=0, factor=3.0)]))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    assert all(set(d.ranks) <= {3, 5} or d.localization.target is Target.suspects for d in ds), _said(run)
    last = ds[-1].localization
    assert last.target is Target.link and sorted(last.link or ()) == [3, 5], _said(run)


def _expected(gbs: float) -> ExpectedBusbw:
    """What ``c4d check nccl --write-expected`` would say of the factories' network (2 GB/s links)."""
    return ExpectedBusbw.from_rows(
        [{"class": "net", "op": "AllReduce", "bytes": b, "busbw_gbs": gbs} for b in (1 << 20, 64 << 20)]
    )


def test_a_ring_slow_from_the_first_step_with_no_siblings_is_judged_against_its_other_network_links():
    """One DP ring of 8 (tp=1), rank 4 slowed from step 0: its network link 3 -> 4 sets the
    ring's pace. No communicator of its shape to compare with, and its own past is the fault's;
    but its other network link, 7 -> 0, moves its steps at the network's pace (PEER wire times):
    against that the ring is slow. Rank 4's other link,
    inside node 1, is not observed: the link and its ends are named, not told apart."""
    run = run_cached(_job(tp=1, dp=8, faults=[Fault("comm-slow", rank=4, step=0, factor=3.0)]))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    assert ds[0].detail["compared_with"] == "network links" and ds[0].detail["ratio"] < 0.5, _said(run)
    assert all(4 in d.ranks for d in ds), _said(run)
    loc = ds[-1].localization
    assert loc.target is Target.link and sorted(loc.link or ()) == [3, 4], _said(run)
    assert {"rank 3", "rank 4"} <= set(loc.alternatives) and loc.confidence < 0.9, _said(run)


def test_the_network_links_find_nothing_on_a_healthy_ring():
    run = run_cached(_job(tp=1, dp=8))
    assert not run.diagnoses, _said(run)


def test_rings_whose_siblings_fell_alike_are_judged_against_their_own_past_not_their_network_links():
    """Both DP rings slowed on one network link each (2 -> 4, 3 -> 5) from step 40: each ring's
    sibling fell as far, so each is judged against its own clean past. Their other network links
    (6 -> 0, 7 -> 1) would say the same, but only a ring with no sibling at all is compared with
    them (a broader rule named noise in the random benchmark): the reference stays its past."""
    faults = [Fault("comm-slow", link=lk, step=40, factor=3.0) for lk in ((2, 4), (3, 5))]
    run = run_cached(_job(faults=faults))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    assert {d.detail["compared_with"] for d in ds} == {"own baseline"}, _said(run)
    last = {tuple(sorted(d.localization.link or ())) for d in ds[-2:]}
    assert last == {(2, 4), (3, 5)}, _said(run)


def test_a_ring_slow_from_the_first_step_with_no_siblings_is_judged_against_the_expected_busbw():
    """The same ring against the busbw healthy rings reach (C4D_EXPECTED_BUSBW), which comes
    first when given."""
    job = _job(tp=1, dp=8, faults=[Fault("comm-slow", rank=4, step=0, factor=3.0)])
    run = run_cached(job, expected_busbw=_expected(2.0))
    ds = run.diagnoses
    assert ds and {d.kind for d in ds} == {DiagKind.RankCommSlow}, _said(run)
    assert ds[0].detail["compared_with"] == "expected" and ds[0].detail["expected_gbs"] == 2.0
    assert all(4 in d.ranks for d in ds), _said(run)
    assert any(d.localization.localized for d in ds), _said(run)


def test_the_expected_busbw_finds_nothing_on_a_healthy_ring():
    run = run_cached(_job(tp=1, dp=8), expected_busbw=_expected(2.0))
    assert not run.diagnoses, _said(run)
