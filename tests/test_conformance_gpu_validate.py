"""scripts/gpu-validate, the one command for a GPU machine, exercised here on simnccl (--sim).

The whole script runs as it would on a GPU: it builds libc4d.so (and simnccl) into its own
build folder, starts worker processes with and without the shim preloaded, collects their
records over ZeroMQ and prints one JSON summary line. On a GPU the same checks run against
PyTorch and NVIDIA's NCCL (docs/gpu-validation.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_shim import base_env

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-validate"


def run(*args: str, timeout: float = 600, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    e = base_env(None, PYTHON=sys.executable, **env)
    p = subprocess.run(["bash", str(SCRIPT), *args], env=e, capture_output=True, text=True, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    assert lines, f"no stdout; stderr:\n{p.stderr}"
    return p, json.loads(lines[-1])


@pytest.mark.slow
def test_sim_run_passes_and_prints_one_json_line():
    p, s = run("--sim")
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(p.stdout.strip().splitlines()) == 1  # the summary is the only stdout line
    assert "gpu-validate: built in" in p.stderr
    assert s["ok"] is True and s["mode"] == "sim" and s["device"] == "simnccl"
    checks = s["checks"]
    assert set(checks) == {"records", "times", "overhead", "graph", "nonblocking", "contexts"}
    assert checks["records"]["ok"] is True and checks["records"]["runs"] == 3
    first = checks["records"]["first"]
    assert first["all_arrived"] and first["failed_results"] == 0 and first["untimed"] == 0
    assert all(first["records"][op] >= first["calls"][op] > 0 for op in first["calls"])
    assert first["profiler_plugin"]  # NCCL_PROFILER_PLUGIN=STATIC_PLUGIN found the shim's plugin
    assert checks["times"]["ok"] is True and len(checks["times"]["runs"]) == 3
    for r in checks["times"]["runs"]:
        assert 0 < r["busy_us"] <= 1.2 * r["step_us"] + 50
    ov = checks["overhead"]
    assert ov["ok"] is True and ov["pairs"] == 3 and isinstance(s["overhead_pct"], float)
    assert s["overhead_pct"] == ov["overhead_pct"] and ov["step_ms_plain"] > 0
    # simnccl has graph capture, non-blocking communicators and a record of which devices got a
    # CUDA context (issue 8): the checks that need them ran, and passed.
    for name in ("graph", "nonblocking", "contexts"):
        assert checks[name]["ok"] is True, checks[name]
    assert checks["graph"]["replays"] > 0 and checks["graph"]["step_ms"]["c4d"] > 0
    nb = checks["nonblocking"]
    assert nb["allreduce_transfer_us"]["nonblocking"] > 0 and nb["busy_us"] <= 1.2 * nb["step_us"] + 50
    assert checks["contexts"]["contexts"] and all(c == [1] for c in checks["contexts"]["contexts"])
    assert s["device_index"] == 1  # the last of simnccl's 2 devices, as on a GPU machine
    assert s["errors"] == [] and s["seconds"] < 300


@pytest.mark.slow
def test_a_preload_that_records_nothing_fails_the_summary(tmp_path):
    """The checks can fail: a 'libc4d.so' that is an empty library sends no record, so the
    records and times checks fail and the exit status is 2 (the run worked, found a problem)."""
    built = REPO / "build-gpu-validate" / "native"
    if not (built / "simnccl" / "libnccl.so.2").is_file():
        run("--sim")  # the build this test borrows simnccl from
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    assert cc, "no C compiler"
    fake = tmp_path / "native"
    fake.mkdir()
    (tmp_path / "empty.c").write_text("int c4d_not_the_shim;\n")
    lib = [cc, "-shared", "-fPIC", "-o", str(fake / "libc4d.so"), str(tmp_path / "empty.c")]
    subprocess.run(lib, check=True)
    (fake / "simnccl").symlink_to(built / "simnccl")
    env = base_env(None, PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_validate.py"), "--sim", "--native-dir", str(fake)]
    p = subprocess.run([*cmd, "--pairs", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["ok"] is False and s["checks"]["records"]["ok"] is False and s["checks"]["times"]["ok"] is False
    assert s["checks"]["records"]["first"]["registered"] == 0
    assert s["checks"]["overhead"]["ok"] is True  # both loops ran: only the shim's part is missing


@pytest.mark.slow
@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU machine: the script would validate on it")
def test_gpu_mode_without_a_gpu_is_an_operational_error():
    """No CUDA PyTorch here: exit 1 with one clear line on stderr and the JSON line on stdout,
    before any build."""
    p, s = run(timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert s["ok"] is False and "no PyTorch with CUDA and NCCL" in s["error"]
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("gpu-validate: ") and "--sim" in line


def test_a_usage_error_is_one_line_and_exit_1():
    p, s = run("--sim", "--pairs", "many", timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert s["ok"] is False and "--pairs" in s["error"]
    assert p.stderr.strip().splitlines()[-1].startswith("gpu-validate: argument --pairs")


def test_a_groups_send_and_recv_count_once_in_the_steps_busy_time():
    """They share the group's events, so their transfer times are one span (the non-blocking
    check summed both and failed a healthy run on a busy host: 1.22x the step)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_validate
    finally:
        sys.path.remove(str(REPO / "scripts"))
    med = {op: {"transfer_us": t} for op, t in (("AllReduce", 100.0), ("Send", 40.0), ("Recv", 50.0))}
    assert gpu_validate.busy_us(med) == 150.0
    assert gpu_validate.busy_us({"AllReduce": {"transfer_us": 7.0}}) == 7.0
