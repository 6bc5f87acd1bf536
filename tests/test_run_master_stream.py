"""``c4d run --master EP --diagnoses-from FILE``: the ranks report to an external ``c4d master
--json``, and c4d run acts on the diagnoses that master writes (it tails the file).

Real processes: the external master, c4d run, c4d sim and its ranks. The stacks are taken
without registrations (the master is elsewhere): ranks are found by RANK in the
environment of c4d run's own job processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import c4d_cmd, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_an_external_masters_error_stops_and_isolates(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), C4D_HANG_TIMEOUT="1000000", C4D_HANG_TIMES="3")
    ep = f"tcp://127.0.0.1:{free_port()}"
    diag_file = tmp_path / "diagnoses.jsonl"
    with open(diag_file, "w") as out:
        master = subprocess.Popen(c4d_cmd("master", "--bind", ep, "--json"), env=env, stdout=out,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert master.stderr is not None
        wait_for(lambda: "listening" in master.stderr.readline(), 30, "the master to listen")
        cmd = c4d_cmd("run", "--run-dir", tmp_path / "run", "--master", ep, "--diagnoses-from", diag_file,
                      "--max-restarts", "0", "--", sys.executable, "-m", "c4d", "sim", "--ranks", "4",
                      "--ranks-per-node", "2", "--fault", "noncomm-hang@node=node-1,step=3")  # fmt: skip
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    finally:
        master.terminate()
        master.wait(30)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    [a] = s["attempts"]
    assert a["ended"] == "c4d-error" and a["isolated"] == ["node-1"], p.stderr[-2000:]
    assert p.returncode != 0  # stopped by c4d, not restarted: the job's own (non-zero) status
    assert (tmp_path / "run" / "blacklist.txt").read_text() == "node-1\n"
    [err] = a["errors"]
    assert err["nodes"] == ["node-1"] and set(err["ranks"]) <= {2, 3}
    ev = json.loads(Path(err["evidence_file"]).read_text())
    culprit = {r: st for r, st in ev["detail"]["stacks"].items() if st["role"] == "culprit"}
    assert culprit and all("simnccl_hung_kernel" in st["native"] for st in culprit.values())
