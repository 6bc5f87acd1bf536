"""`c4d check nodes` end to end: real gloo process groups between local worker processes (one
per simulated node), faults injected through C4D_CHECK_SIM_FAULT in the workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from c4d.actions import blacklist
from c4d.check import faults

pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[1]
# Short group timeout: a group with a broken member fails after this long, twice per failure case.
TIMEOUT = ["--timeout", "2"]


def nodes(n, fault=None, *extra, timeout=180):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    return subprocess.run(
        [sys.executable, "-m", "c4d.check", "nodes", "--nodes", str(n), *TIMEOUT, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "n,fault,kind,culprit",
    [
        (4, "slow:node-2:5", "stragglers", "node-2"),
        (6, "slow:node-5:5", "stragglers", "node-5"),
        (4, "fail:node-1", "faulty", "node-1"),
        (6, "fail:node-4", "faulty", "node-4"),
    ],
    ids=["4-slow", "6-slow", "4-fail", "6-fail"],
)
def test_names_the_bad_node(tmp_path, n, fault, kind, culprit):
    bl = tmp_path / "blacklist"
    p = nodes(n, fault, "--json", "--blacklist", str(bl))
    assert p.returncode == 2, p.stdout + p.stderr
    report = json.loads(p.stdout)
    assert report[kind] == [culprit], report
    other = "faulty" if kind == "stragglers" else "stragglers"
    assert report[other] == [] and report["unresolved"] == []
    assert [v["node"] for v in report["nodes"] if v["status"] != "ok"] == [culprit]
    assert report["rounds"] >= 2  # round 1 only finds a pair; round 2 splits it
    # The culprit's round-1 partner was re-tested with a known-good node and passed.
    r1 = next(g for g in report["groups"] if g["round"] == 1 and culprit in g["nodes"])
    partner = next(m for m in r1["nodes"] if m != culprit)
    assert any(g["ok"] and partner in g["nodes"] for g in report["groups"] if g["round"] > 1)
    assert blacklist.read_nodes(bl) == [culprit] and report["blacklist"] == [culprit]


@pytest.mark.slow
def test_two_nodes_cannot_localize(tmp_path):
    bl = tmp_path / "blacklist"
    p = nodes(2, "fail:node-1", "--blacklist", str(bl))
    assert p.returncode == 2, p.stdout + p.stderr
    out = p.stdout
    assert re.search(r"NodeCheck node-0: Unknown \(unresolved: cannot localize", out)
    assert re.search(r"NodeCheck node-1: Unknown \(unresolved: cannot localize", out)
    assert "Note: cannot localize with 2 nodes" in out
    assert "Faulty nodes" not in out and not bl.exists()  # nobody blacklisted on a guess

    p = nodes(2, "slow:node-1:5", "--json")  # slow: nothing to compare the one pair with
    report = json.loads(p.stdout)
    assert report["stragglers"] == [] and any("cannot localize with 2 nodes" in s for s in report["notes"])


@pytest.mark.slow
def test_healthy_nodes_pass_with_seed_lines():
    p = nodes(4)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "All 4 nodes passed."
    for i in range(4):
        assert any(re.search(rf" NodeCheck node-{i}: Succeed \([\d.]+ ms", s) for s in lines)
    assert any(re.search(r" NodeCheck round 1 node-0\+node-1: Succeed ", s) for s in lines)


@pytest.mark.slow
def test_crashed_worker_is_faulty_and_odd_count_works():
    p = nodes(5, "crash:node-4", "--json")
    report = json.loads(p.stdout)
    assert report["faulty"] == ["node-4"], report
    v = next(v for v in report["nodes"] if v["node"] == "node-4")
    assert v["reason"] == f"worker died: worker exited with status {faults.CRASH_STATUS}"
    assert report["groups"][1]["nodes"] == ["node-2", "node-3", "node-4"]  # the odd one joins a triple


def test_bad_arguments_are_one_line():
    p = nodes(1)
    says = "argument --nodes: '1' must be >= 2 (a node check needs at least 2 nodes)"
    assert p.returncode == 1 and says in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "c4d.check", "nodes", "--straggler-factor", "0.5"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 1 and "must be > 1" in p.stderr and "Traceback" not in p.stderr
