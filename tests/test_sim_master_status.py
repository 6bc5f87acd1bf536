"""``c4d sim --master EP`` against a running ``c4d master``: the sim hears the master's verdicts on
its status endpoint (c4d/master/status.py) and stops the job on its ERROR with exit status 2, within
T x TIMES + 2 s of the hang, as it does with a master of its own; the master (live and in its
trace) ends the incident *stopped with the job*, not *resolved*.

Real processes: the master, c4d sim and its rank processes, on real sockets.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import c4d_cmd, wait_for
from tests.masterproc import MasterProc

T_S, TIMES = 1.0, 3  # --quick


@pytest.mark.serial
@pytest.mark.slow
def test_sim_on_a_running_master_stops_on_its_error_within_t_times_plus_2s(tmp_path):
    master = MasterProc(tmp_path)
    try:
        wait_for(lambda: "answers status requests" in master.stderr(), 30, "the status endpoint")
        sim = subprocess.Popen(
            c4d_cmd("sim", "--master", master.endpoint, "--quick", "--ranks", "8", "--ranks-per-node", "4",
                    "--tp", "2", "--fault", "noncomm-hang@rank=6,step=8", "--max-seconds", "120"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
        )  # fmt: skip
        # the exit is timed by polling: communicate() would only say when the pipes closed
        wait_for(lambda: sim.poll() is not None, 150, "c4d sim to stop")
        exited = time.time()
        _, err = sim.communicate(timeout=30)
        assert sim.returncode == 2, err[-2000:]
        said = "stopped on the master's ERROR diagnosis (RankNonCommHang: rank 6 [node-1])"
        assert said in err, err[-2000:]
        [first] = [d for d in master.diagnoses() if d["level"] == "ERROR"][:1]
        onset = first["time"] - first["detail"]["waited_s"]  # when rank 6's op began to wait
        assert first["ranks"] == [6]
        print(f"c4d sim exited {exited - onset:.2f} s after the hang began")
        assert exited - onset <= T_S * TIMES + 2, f"exited {exited - onset:.2f} s after the hang began"
        # the job is gone, the master runs on: its incident ends as stopped, once 1.5 T passed
        wait_for(lambda: "stopped with the job" in master.stderr(), 30, "the incident to end")
        assert "resolved" not in master.stderr()
    finally:
        master.stop()
    p = subprocess.run(c4d_cmd("analyze", master.trace), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    [row] = [ln for ln in p.stdout.splitlines() if "RankNonCommHang" in ln]
    assert row.rstrip().endswith("stopped with the job"), p.stdout
