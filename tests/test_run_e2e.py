"""Issue 11, end to end: ``c4d run`` supervising ``c4d sim`` whose node-1 hangs.

    c4d run --max-restarts 2 --isolate cmd:./record-args -- c4d sim --ranks 8 --ranks-per-node 4
            --spare-nodes 1 --fault noncomm-hang@node=node-1,step=5

with small thresholds (C4D_HANG_TIMEOUT=1 s, C4D_HANG_TIMES=3). The first attempt is stopped
after the ERROR, node-1 is isolated (the recording executable gets the node and the
diagnosis, with the hung ranks' stacks), the second attempt runs on node-0 and the spare
node-2 (the fault stays with node-1), finishes, and ``c4d run`` exits 0 naming node-1.

Real processes throughout (c4d run, c4d sim, c4d-simtrain ranks on simnccl with the shim,
ZeroMQ, the hosted master, gdb). ``c4d`` is not installed in this checkout: a two-line
wrapper on PATH plays the console script. ``record-args`` (tests/fake_bin) plays the
operator's isolation script: it records its argv and stdin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from c4d.record import trace
from c4d.util.stacks_view import sidecar_path

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_bin" / "record-args"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    wd = tmp_path_factory.mktemp("e2e")
    bin_dir = wd / "bin"
    bin_dir.mkdir()
    (bin_dir / "c4d").write_text(f'#!/bin/sh\nexec {sys.executable} -m c4d "$@"\n')
    (bin_dir / "c4d").chmod(0o755)
    (wd / "record-args").symlink_to(FAKE)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT),
               FAKE_RECORD_FILE=str(wd / "calls.jsonl"),
               C4D_HANG_TIMEOUT="1000000", C4D_HANG_TIMES="3")  # fmt: skip
    env.pop("C4D_NODE_NAME", None)
    cmd = ["c4d", "run", "--run-dir", "run", "--trace", "run/job.c4d", "--max-restarts", "2",
           "--isolate", "cmd:./record-args", "--", "c4d", "sim", "--ranks", "8", "--ranks-per-node", "4",
           "--spare-nodes", "1", "--fault", "noncomm-hang@node=node-1,step=5"]  # fmt: skip
    p = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=300)
    return wd, p


@pytest.mark.serial
@pytest.mark.slow
def test_c4d_run_exits_0_with_a_summary_naming_node_1(e2e):
    wd, p = e2e
    assert p.returncode == 0, p.stderr[-3000:]
    assert "  nodes isolated: node-1" in p.stderr.splitlines()
    s = json.loads((wd / "run" / "summary.json").read_text())
    assert [a["ended"] for a in s["attempts"]] == ["c4d-error", "succeeded"]
    first = s["attempts"][0]
    assert first["isolated"] == ["node-1"] and first["errors"][0]["kind"] == "RankNonCommHang"
    assert s["nodes_isolated"] == ["node-1"] and s["exit_status"] == 0


@pytest.mark.serial
@pytest.mark.slow
def test_node_1_was_isolated_with_the_diagnosis(e2e):
    wd, _ = e2e
    [call] = [json.loads(x) for x in (wd / "calls.jsonl").read_text().splitlines()]
    assert call["argv"][:2] == ["record-args", "node-1"]
    diag = json.loads(call["stdin"])
    assert json.loads(call["argv"][2])["kind"] == diag["kind"] == "RankNonCommHang"
    assert diag["level"] == "ERROR" and diag["nodes"] == ["node-1"] and set(diag["ranks"]) <= {4, 5, 6, 7}
    assert diag["detail"]["localized"] is True
    assert (wd / "run" / "blacklist.txt").read_text() == "node-1\n"
    actions = [json.loads(x) for x in (wd / "run" / "actions.jsonl").read_text().splitlines()]
    assert [(a["action"], a["status"]) for a in actions] == [
        ("blacklist", "isolated"),
        (f"cmd:{wd / 'record-args'}", "isolated"),
    ]


@pytest.mark.serial
@pytest.mark.slow
def test_the_diagnosis_carries_the_hung_ranks_stacks(e2e):
    """Last words: the culprits' native stacks show simnccl's never-ending kernel."""
    wd, _ = e2e
    diag = json.loads(json.loads((wd / "calls.jsonl").read_text().splitlines()[0])["stdin"])
    stacks = diag["detail"]["stacks"]
    culprits = {r for r, s in stacks.items() if s["role"] == "culprit"}
    assert culprits == {"4", "5", "6", "7"} or culprits == {str(r) for r in diag["ranks"]}
    for r in culprits:
        assert "simnccl_hung_kernel" in stacks[r]["native"], (r, stacks[r].get("error"))
    victims = {r for r, s in stacks.items() if s["role"] == "victim"}
    assert victims and victims <= {"0", "1", "2", "3"}
    ev = json.loads((wd / diag["detail"]["evidence_file"]).read_text())  # relative to where c4d run ran
    assert ev["detail"]["stacks"] == stacks
    # the ERROR in the run's JSON lines carries them too (it waited for the dumps)
    diags = [json.loads(x) for x in (wd / "run" / "diagnoses.jsonl").read_text().splitlines()]
    errors = [d for d in diags if d["level"] == "ERROR"]
    assert errors and all(set(d["detail"]["stacks"]) == set(stacks) for d in errors)


@pytest.mark.serial
@pytest.mark.slow
def test_the_second_attempt_ran_on_node_0_and_the_spare(e2e):
    wd, _ = e2e
    t1 = trace.load(wd / "run" / "job.attempt1.c4d")
    t2 = trace.load(wd / "run" / "job.attempt2.c4d")
    assert set(t1.nodes.values()) == {"node-0", "node-1"}
    assert set(t2.nodes.values()) == {"node-0", "node-2"}
    assert sorted(t2.nodes) == list(range(8))
    log = (wd / "run" / "job.log").read_text()
    assert "c4d: attempt 2 starts" in log and "c4d sim: the job finished" in log


@pytest.mark.serial
@pytest.mark.slow
def test_report_and_live_view_show_the_stacks(e2e):
    wd, _ = e2e
    t1 = wd / "run" / "job.attempt1.c4d"
    assert sidecar_path(t1).is_file()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = wd / "report"
    p = subprocess.run([sys.executable, "-m", "c4d", "report", str(t1), "-o", str(out)], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    page = (out / "report.html").read_text()
    assert "Stacks of hung ranks" in page and "simnccl_hung_kernel" in page

    from c4d.master.live import LiveState, render
    from c4d.util.stacks_view import live_lines

    diags = [json.loads(x) for x in (wd / "run" / "diagnoses.jsonl").read_text().splitlines()]
    lines = live_lines(diags)
    assert lines and any("culprit" in ln and "simnccl_hung_kernel" in ln for ln in lines)
    from rich.console import Console

    con = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(render(LiveState("j", 8, 8, 2, 0.0, 0, 0.0, stacks=lines), 120, 40))
    shown = con.export_text()
    assert "stacks of hung ranks" in shown and "simnccl_hung_kernel" in shown


@pytest.mark.serial
@pytest.mark.slow
def test_the_stopped_attempt_left_no_shared_memory(e2e):
    """Stopping the job lets c4d sim clean up after itself (one SIGTERM, not two)."""
    wd, _ = e2e
    for n in (1, 2):
        jobs = set(trace.load(wd / "run" / f"job.attempt{n}.c4d").registrations["job"])
        assert len(jobs) == 1
        left = sorted(Path("/dev/shm").glob(f"simnccl-{jobs.pop()}*"))
        assert not left, left
