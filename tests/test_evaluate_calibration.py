"""The benchmark's calibration bookkeeping (analysis/evaluate.py): a table learned from recorded
jobs, and recorded jobs re-scored under a table learned on other seeds."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

from rich.console import Console

from c4d.engine import calibration

ROOT = Path(__file__).resolve().parents[1]


def _evaluate():
    spec = importlib.util.spec_from_file_location("c4d_evaluate", ROOT / "analysis" / "evaluate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["c4d_evaluate"] = mod
    spec.loader.exec_module(mod)
    return mod


def _job(basis: str, outcomes: list[bool], conf: float) -> dict:
    return {"diagnoses": [{"basis": basis, "fault": 0 if ok else -1, "exact": ok, "confidence": conf}
                          for ok in outcomes]}  # fmt: skip


def test_learned_table_is_a_module_that_counts_exact_diagnoses_per_basis(tmp_path):
    ev = _evaluate()
    rows = [
        _job("RankLost:heartbeat/rank", [True] * 9 + [False], 0.5),
        _job("RankCommHang:none/suspects", [False] * 4, 0.5),
    ]
    out = tmp_path / "table.py"
    table = ev.learn(rows, out)
    assert table == {"RankCommHang:none/suspects": (4, 0), "RankLost:heartbeat/rank": (10, 9)}
    ns: dict = {}
    exec(out.read_text(), ns)
    assert ns["TABLE"] == table


def test_a_basis_the_jobs_never_produced_keeps_its_counts_and_one_they_did_is_measured_anew(tmp_path):
    ev = _evaluate()
    rare = "RankCommSlow:peer-progress/link/equivalent"
    before = {"RankCommHang:none/suspects": (50, 1), rare: (18, 0)}
    table = ev.learn([_job("RankCommHang:none/suspects", [False] * 4, 0.5)], tmp_path / "t.py", keep=before)
    assert table == {"RankCommHang:none/suspects": (4, 0), rare: (18, 0)}


def test_rescore_takes_confidences_from_the_current_table(monkeypatch):
    ev = _evaluate()
    monkeypatch.setattr(calibration, "TABLE", {"A:x/rank": (20, 2)})
    # recorded at 0.9, but the table says 2 of 20: re-scored into the lowest bucket
    rows = [_job("A:x/rank", [False] * 5, 0.9), _job("B:y/link", [True] * 3, 0.45)]
    buckets = ev.rescore(rows, Console(file=io.StringIO()))
    by_lo = {b["lo"]: b for b in buckets}
    assert by_lo[0.0]["n"] == 5 and by_lo[0.0]["right"] == 0.0
    assert by_lo[0.4]["n"] == 3 and by_lo[0.4]["right"] == 1.0  # a basis the table lacks keeps its own


def test_a_node_verdict_on_its_faults_node_counts_as_right(tmp_path):
    # a node verdict claims the fault is on that node, not which rank: right when it is there
    ev = _evaluate()
    node = {"basis": "RankCommHang:exclusion/node/equivalent", "fault": 0, "exact": False, "confidence": 0.5}
    rows = [{"diagnoses": [{**node, "on_node": True}] * 3 + [{**node, "on_node": False}]}]
    assert ev.learn(rows, tmp_path / "t.py") == {"RankCommHang:exclusion/node/equivalent": (4, 3)}


def test_a_node_fault_named_by_some_of_its_ranks_is_on_its_node_and_not_beyond_it():
    from c4d.sim.scenarios import Scenario

    sc = Scenario(ranks=8, ranks_per_node=4, tp=1, pp=4, fault="noncomm-hang@node=node-0,step=33")
    e = sc.expect(sc.fault)
    said = {"kind": "RankNonCommHang", "localization": {"target": "rank"}}
    assert e.on_its_node({**said, "ranks": [0, 1]}, 4)  # the first stage: the others wait behind it
    assert not e.exact({**said, "ranks": [0, 1]})
    assert not e.on_its_node({**said, "ranks": [1, 4]}, 4)  # a rank of another node with it
    link = sc.expect("comm-hang@link=1-2,step=3")  # a fault on one rank or link: the node rule only
    assert not link.on_its_node({"kind": "RankCommHang", "ranks": [1], "localization": {"target": "rank"}}, 4)


def test_a_hung_rank_named_as_its_pair_link_is_among_the_equivalents_only_when_the_verdict_lists_it():
    """The benchmark's second final-verdict count: a rank whose first stuck op is a pipeline pair
    is named as that pair's link, the rank among what nothing observable tells from it."""
    from c4d.sim.scenarios import Scenario

    sc = Scenario(ranks=8, ranks_per_node=1, tp=1, pp=2, fault="comm-hang@rank=0,step=34")
    e = sc.expect(sc.fault)
    said = {"kind": "RankCommHang", "ranks": [0, 4],
            "localization": {"target": "link", "basis": "RankCommHang:p2p-pair/link/equivalent",
                             "alternatives": ["rank 0", "rank 4", "node node-0", "node node-4"]}}  # fmt: skip
    assert not e.exact(said) and e.among_equivalents(said)
    told = {**said, "localization": {**said["localization"], "basis": "RankCommHang:p2p-pair/link"}}
    assert not e.among_equivalents(told)  # told apart: the rank is not named, so not right
    other = {**said, "localization": {**said["localization"], "alternatives": ["rank 4"]}}
    assert not e.among_equivalents(other)
    link = sc.expect("comm-hang@link=0-4,step=3")
    assert link.exact(said) and link.among_equivalents(said)
