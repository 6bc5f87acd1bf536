"""The pure logic of `c4d check nodes` (pairing, re-pairing, verdicts) on hand-made group
results, and the fault spec parser."""

from __future__ import annotations

import pytest

from c4d.check import faults
from c4d.check.pairing import GroupResult, NodeStatus, first_round, localize, retest_round, suspects

F = 2.0


def ok(rnd, *nodes, t=0.010):
    return GroupResult(rnd, nodes, True, t, {n: t / 4 for n in nodes})


def bad(rnd, *nodes, who=None):
    return GroupResult(
        rnd, nodes, False, None, {}, {n: "timeout" for n in nodes} | ({who: "boom"} if who else {})
    )


def status(loc):
    return {v.node: v.status for v in loc.verdicts}


def test_first_round_pairs_and_odd_triple():
    assert first_round(["a", "b", "c", "d"]) == [("a", "b"), ("c", "d")]
    assert first_round(["a", "b", "c", "d", "e"]) == [("a", "b"), ("c", "d", "e")]
    assert first_round(["a", "b", "c"]) == [("a", "b", "c")]
    with pytest.raises(ValueError):
        first_round(["a"])


def test_suspects_failed_or_slow_against_lower_median():
    r1 = [ok(1, "a", "b"), ok(1, "c", "d", t=0.05)]  # two groups: the fast one is the reference
    assert suspects(r1, F) == ["c", "d"]
    r1 = [ok(1, "a", "b"), ok(1, "c", "d", t=0.019), bad(1, "e", "f")]
    assert suspects(r1, F) == ["e", "f"]
    assert suspects([ok(1, "a", "b", t=1.0)], F) == []  # one group: no reference, nothing slow


def test_retest_pairs_each_suspect_with_good_and_spares_together():
    assert retest_round(["c", "d"], ["a", "b"]) == [("c", "a"), ("d", "b")]
    assert retest_round(["e", "f"], ["a", "b", "c", "d"]) == [("e", "a"), ("f", "b"), ("c", "d")]
    assert retest_round(["c", "d", "e"], ["a"]) == [("c", "a")]


def test_failed_node_is_the_one_that_fails_with_known_good():
    nodes = ["n0", "n1", "n2", "n3"]
    groups = [
        ok(1, "n0", "n1"),
        bad(1, "n2", "n3", who="n3"),
        ok(2, "n2", "n0"),
        bad(2, "n3", "n1", who="n3"),
    ]
    loc = localize(nodes, groups, F)
    assert status(loc) == {
        "n0": NodeStatus.OK,
        "n1": NodeStatus.OK,
        "n2": NodeStatus.OK,
        "n3": NodeStatus.FAULTY,
    }
    assert loc.faulty == ["n3"] and not loc.passed
    assert "known-good n1 in round 2" in loc.verdicts[3].reason


def test_straggler_is_slow_in_every_round_its_partners_are_not():
    nodes = ["n0", "n1", "n2", "n3"]
    # Round 2 ran on a less loaded machine: every time is lower, the ratios are what count.
    groups = [
        ok(1, "n0", "n1", t=0.013),
        ok(1, "n2", "n3", t=0.050),
        ok(2, "n2", "n0", t=0.018),
        ok(2, "n3", "n1", t=0.003),
    ]
    loc = localize(nodes, groups, F)
    assert loc.stragglers == ["n2"] and loc.faulty == []
    v = {v.node: v for v in loc.verdicts}
    assert v["n2"].ratio == pytest.approx(0.050 / 0.013, abs=0.01)
    assert v["n3"].ratio == 1.0 and v["n0"].ratio == 1.0
    assert loc.references_s == {1: 0.013, 2: 0.003}


def test_two_nodes_cannot_localize():
    loc = localize(["n0", "n1"], [bad(1, "n0", "n1", who="n1")], F)
    assert status(loc) == {"n0": NodeStatus.UNRESOLVED, "n1": NodeStatus.UNRESOLVED}
    assert loc.faulty == [] and any("cannot localize with 2 nodes" in n for n in loc.notes)
    loc = localize(["n0", "n1"], [ok(1, "n0", "n1", t=9.0)], F)
    assert loc.passed and any("cannot localize" in n for n in loc.notes)


def test_all_partners_bad_is_unresolved_and_dead_worker_is_faulty():
    nodes = ["n0", "n1", "n2", "n3"]
    loc = localize(
        nodes, [bad(1, "n0", "n1"), bad(1, "n2", "n3")], F, died={"n3": "worker exited with status 17"}
    )
    assert status(loc) == {
        "n0": NodeStatus.UNRESOLVED,
        "n1": NodeStatus.UNRESOLVED,
        "n2": NodeStatus.UNRESOLVED,
        "n3": NodeStatus.FAULTY,
    }
    assert any("cannot localize every failure" in n for n in loc.notes)


def test_link_failure_blames_no_node():
    nodes = ["n0", "n1", "n2", "n3"]
    groups = [ok(1, "n0", "n1"), bad(1, "n2", "n3"), ok(2, "n2", "n0"), ok(2, "n3", "n1")]
    loc = localize(nodes, groups, F)
    assert loc.passed and loc.suspect_links == (("n2", "n3"),)
    assert "n2<->n3" in loc.notes[0]


def test_fault_spec_parsing():
    got, errs = faults.parse("slow:node-2:5, fail:node-3;crash:rank-0,corrupt:node-1")
    assert got["node-2"] == faults.SimFault("slow", "node-2", 5.0)
    assert got["node-3"].kind == "fail" and got["rank-0"].kind == "crash" and got["node-1"].kind == "corrupt"
    assert errs == []
    assert faults.parse("slow:node-1")[0]["node-1"].factor == 5.0
    got, errs = faults.parse("slow:node-1:x,boom:node-2,fail:,slow:node-3:0.5")
    assert got == {} and len(errs) == 4 and all(e.startswith(faults.ENV) for e in errs)


def test_slow_with_one_proven_fast_partner_is_not_convicted():
    # n0 looked slow with n1 only; its other group failed (n2 broke), so one noisy measurement
    # is all there is: a note, not a verdict.
    nodes = ["n0", "n1", "n2", "n3"]
    groups = [ok(1, "n0", "n1", t=0.03), ok(1, "n2", "n3"), bad(2, "n0", "n2", who="n2"), ok(2, "n1", "n3")]
    loc = localize(nodes, groups, F)
    assert loc.stragglers == [] and status(loc)["n0"] is NodeStatus.OK
    assert any(n.startswith("n0 was slow (3.0x)") and "not confirmed" in n for n in loc.notes)
