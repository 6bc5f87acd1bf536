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

import numpy as np
import pytest

from c4d.record import schema
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
        assert r["busy_us"] > 0 and r["fit"] <= 1.2
    ov = checks["overhead"]
    assert ov["ok"] is True and ov["pairs"] == 3 and isinstance(s["overhead_pct"], float)
    assert s["overhead_pct"] == ov["overhead_pct"] and ov["step_ms_plain"] > 0
    # simnccl has graph capture, non-blocking communicators and a record of which devices got a
    # CUDA context (issue 8): the checks that need them ran, and passed.
    for name in ("graph", "nonblocking", "contexts"):
        assert checks[name]["ok"] is True, checks[name]
    assert checks["graph"]["replays"] > 0 and checks["graph"]["step_ms"]["c4d"] > 0
    nb = checks["nonblocking"]
    assert nb["allreduce_transfer_us"]["nonblocking"] > 0 and nb["fit"] <= 1.2
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


def test_a_runs_busy_time_is_held_against_the_same_runs_span():
    """The run's transfers against its span, both from the records (a group's Send and Recv
    share its events: one span). The worker's median step against medians over every op failed
    a healthy non-blocking run on a busy host (busy 2x the step); ends read late still fail."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_validate
    finally:
        sys.path.remove(str(REPO / "scripts"))

    def records(steps: list[list[tuple[str, int, int, int]]]) -> dict:
        rows = [(op, i, s, e) for step in steps for op, i, s, e in step]
        ops = np.zeros(len(rows), schema.DTYPES[schema.Kind.OP])
        for k, (op, i, s, e) in enumerate(rows):
            grouped = schema.OpFlag.IN_GROUP if op in ("Send", "Recv") else 0
            ops[k]["op"], ops[k]["flags"] = schema.Op[op], schema.OpFlag.DEVICE_TIMING | grouped
            ops[k]["issue_ns"], ops[k]["start_ns"], ops[k]["end_ns"] = i, s, e
        return {schema.Kind.OP: ops}

    def step(t: int, slow: int = 1) -> list[tuple[str, int, int, int]]:
        us = 1000 * slow  # a load burst stretches a step's times and its period alike
        return [
            ("AllReduce", t, t + 10 * us, t + 110 * us),
            ("Send", t + 120 * us, t + 130 * us, t + 180 * us),
            ("Recv", t + 121 * us, t + 130 * us, t + 180 * us),
        ]

    t, steps = 0, []
    for slow in (1, 1, 5, 5, 5, 1):
        steps.append(step(t, slow))
        t += 200_000 * slow
    fit = gpu_validate.step_fit(records(steps))
    assert fit["busy_us"] == (3 * 150 + 3 * 750) / 6 and fit["step_us"] == round(
        3580 / 6, 1
    )  # 3 steps 5x slower
    assert gpu_validate.fits(fit) and fit["fit"] == round((450 - 50) / (3580 / 6), 3)
    late = [[(op, i, s, e + 1_000_000 if op == "AllReduce" else e) for op, i, s, e in st] for st in steps]
    assert not gpu_validate.fits(gpu_validate.step_fit(records(late)))  # an end read 1 ms late
    assert not gpu_validate.fits(gpu_validate.step_fit(None))  # no records: nothing fits
