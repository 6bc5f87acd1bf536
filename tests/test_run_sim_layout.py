"""``c4d sim`` as ``c4d run`` relaunches it: ``--exclude-nodes`` (default $C4D_EXCLUDE_NODES_FILE)
and ``--spare-nodes`` lay the ranks out on the nodes left, a ``node=`` fault stays with its node,
and bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import c4d_cmd

from c4d.record import trace

ROOT = Path(__file__).resolve().parents[1]


def sim(*args, env_extra=None, timeout=180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("C4D_RUN_ID", "C4D_EXCLUDE_NODES_FILE")}
    env.update(PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.run(c4d_cmd("sim", *args), env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_excluded_node_is_skipped_and_its_fault_is_gone(tmp_path):
    bl = tmp_path / "blacklist.txt"
    bl.write_text("node-1\nsomewhere-else\n")
    t = tmp_path / "t.c4d"
    p = sim("--ranks", 4, "--ranks-per-node", 2, "--spare-nodes", 1, "--steps", 10, "--trace", t,
            "--fault", "noncomm-hang@node=node-1,step=3", "--hang-timeout", 1_000_000, "--hang-times", 2,
            env_extra={"C4D_EXCLUDE_NODES_FILE": str(bl)})  # fmt: skip
    assert p.returncode == 0, p.stderr  # the hang was bound to node-1, which no rank uses now
    assert trace.load(t).nodes == {0: "node-0", 1: "node-0", 2: "node-2", 3: "node-2"}


@pytest.mark.slow
def test_the_fault_follows_its_node_to_other_ranks(tmp_path):
    """node-0 excluded: node-1 now hosts ranks 0-1, and its fault hangs them."""
    bl = tmp_path / "bl"
    bl.write_text("node-0\n")
    p = sim("--ranks", 4, "--ranks-per-node", 2, "--spare-nodes", 1, "--exclude-nodes", bl, "--json",
            "--fault", "noncomm-hang@node=node-1,step=3",
            "--hang-timeout", 1_000_000, "--hang-times", 2)  # fmt: skip
    assert p.returncode == 2, p.stderr  # stopped on the ERROR
    errors = [json.loads(x) for x in p.stdout.splitlines() if '"ERROR"' in x]
    assert errors and errors[0]["nodes"] == ["node-1"] and set(errors[0]["ranks"]) <= {0, 1}


def test_bad_layouts_are_one_line(tmp_path):
    p = sim("--ranks", 4, "--exclude-nodes", tmp_path / "missing")
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "no such file" in p.stderr
    bl = tmp_path / "bl"
    bl.write_text("node-0\n")
    p = sim("--ranks", 4, "--ranks-per-node", 2, "--exclude-nodes", bl)
    assert p.returncode != 0 and "add --spare-nodes" in p.stderr and p.stderr.strip().count("\n") == 0
