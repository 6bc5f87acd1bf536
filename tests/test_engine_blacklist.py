"""c4d/actions/blacklist.py: one node a line, no duplicates, atomic replace, only localized ERRORs."""

from __future__ import annotations

import os

from factories import Fault, Job, run_cached

from c4d.actions import blacklist
from c4d.engine import CycleMember, DiagKind, Diagnosis, How, Level, Localization, OpRef, Target


def diag(level: Level, nodes: tuple[str, ...], localized: bool, kind=DiagKind.RankNonCommHang) -> Diagnosis:
    target = Target.rank if localized else Target.suspects
    loc = Localization(How.arrival if localized else How.none, target, (5,), 0.9, "test", "test")
    return Diagnosis(0, level, kind, 1, "AllReduce", 3, (5,), nodes, 3, loc)


def test_a_mismatch_error_never_blacklists(tmp_path):
    """A wait cycle is a program-order bug: no node is at fault."""
    a, b = OpRef(1, 5, "AllReduce"), OpRef(2, 3, "AllReduce")
    cyc = (CycleMember(2, a, b), CycleMember(3, b, a))
    loc = Localization(How.cycle, Target.cycle, (2, 3), 0.9, "test", "cycle", cycle=cyc)
    d = Diagnosis(
        0, Level.ERROR, DiagKind.CollectiveMismatch, 1, "AllReduce", 5, (2, 3), ("n0", "n1"), 18, loc
    )
    assert d.localized and not loc.isolates
    assert d.blacklist_nodes == ()
    assert blacklist.apply(d, tmp_path / "bl") == []


def test_append_dedups_and_keeps_existing_lines(tmp_path):
    p = tmp_path / "sub" / "blacklist.txt"
    assert blacklist.append_nodes(p, ["node-2"]) == ["node-2"]
    assert blacklist.append_nodes(p, ["node-2", "node-3", "node-3", "", "?"]) == ["node-3"]
    assert blacklist.append_nodes(p, ["node-3"]) == []
    assert p.read_text() == "node-2\nnode-3\n"
    p.write_text("manual-node\n\nnode-2\n")  # an operator edited it
    assert blacklist.append_nodes(p, ["node-4"]) == ["node-4"]
    assert blacklist.read_nodes(p) == ["manual-node", "node-2", "node-4"]
    assert [f.name for f in p.parent.iterdir()] == ["blacklist.txt"]  # no temporary left behind


def test_replace_is_atomic_rename(tmp_path):
    p = tmp_path / "bl"
    blacklist.append_nodes(p, ["a"])
    os.chmod(p, 0o600)
    ino = p.stat().st_ino
    blacklist.append_nodes(p, ["b"])
    assert p.stat().st_ino != ino  # a new file renamed over the old one, never rewritten in place
    assert p.stat().st_mode & 0o777 == 0o600  # permissions kept


def test_only_localized_errors_blacklist(tmp_path):
    p = tmp_path / "bl"
    assert blacklist.apply(diag(Level.WARNING, ("node-1",), True), p) == []
    assert blacklist.apply(diag(Level.ERROR, ("node-1",), False), p) == []
    assert not p.exists()
    assert blacklist.apply(diag(Level.ERROR, ("node-1",), True), p) == ["node-1"]


def test_a_hang_run_blacklists_exactly_the_culprit_node(tmp_path):
    j = Job(
        tp=2,
        pp=2,
        dp=4,
        ranks_per_node=4,
        steps=30,
        skew_ms=50.0,
        faults=[Fault("noncomm-hang", rank=13, step=9)],
    )
    p = tmp_path / "bl"
    for d in run_cached(j).diagnoses:
        blacklist.apply(d, p)
    assert blacklist.read_nodes(p) == ["node-3"]


def test_an_error_isolates_only_at_the_isolate_confidence(tmp_path):
    """C4D_ISOLATE_CONFIDENCE: a link named at 0.31 (one link seen stopped, its ends' other links
    invisible) cordons neither node; the same at 0.95, or the threshold lowered, does. The JSON
    says which (detail.isolates), for c4d run and other consumers."""
    from dataclasses import replace

    from c4d.engine.config import EngineConfig

    loc = Localization(How.peer_progress, Target.link, (3, 4), 0.31, "test", "test", link=(3, 4))
    d = Diagnosis(
        0, Level.ERROR, DiagKind.RankCommHang, 1, "AllReduce", 6, (3, 4), ("node-0", "node-1"), 3, loc
    )
    assert d.blacklist_nodes == () and d.to_json()["detail"]["isolates"] is False
    assert blacklist.apply(d, tmp_path / "bl") == []
    sure = replace(d, localization=replace(loc, confidence=0.95))
    assert sure.blacklist_nodes == ("node-0", "node-1") and sure.to_json()["detail"]["isolates"] is True
    lowered = replace(d, isolate_confidence=0.3)
    assert lowered.blacklist_nodes == ("node-0", "node-1")
    assert EngineConfig.from_env({"C4D_ISOLATE_CONFIDENCE": "0.3"}).isolate_confidence == 0.3
    assert EngineConfig.from_env({"C4D_ISOLATE_CONFIDENCE": "1.5"}).isolate_confidence == 0.9  # refused
    assert replace(d, level=Level.WARNING).to_json()["detail"].get("isolates") is None
