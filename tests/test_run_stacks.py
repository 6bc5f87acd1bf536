"""Last words (c4d/util/stacks.py, evidence.py): real stacks of real processes, and a clear line
where the kernel refuses ptrace.

Python processes are read with py-spy, the native c4d-simtrain driver with gdb; the hung
rank of a noncomm-hang must show simnccl's never-ending kernel. The refusals are real too:
an unprivileged user (setpriv, uid 65534) asking for a root process, and a process another
tracer already holds (ptrace allows one tracer).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import c4d_cmd, wait_for

from c4d.run.evidence import Evidence, ranks_by_environment
from c4d.run.proctree import descendants
from c4d.util import stacks, stacks_view

ROOT = Path(__file__).resolve().parents[1]

PY_TARGET = textwrap.dedent(
    """
    import sys, time
    def evaluate_forever():
        print("ready", flush=True)
        time.sleep(600)
    evaluate_forever()
    """
)


@pytest.fixture
def py_target():
    p = subprocess.Popen([sys.executable, "-c", PY_TARGET], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    yield p
    p.kill()
    p.wait()


def test_python_stack_names_the_function(py_target):
    if stacks.py_spy() is None:
        pytest.fail("py-spy is a dependency of c4d: pip install py-spy")
    d = stacks.dump(py_target.pid)
    assert d.error is None, d.error
    assert "evaluate_forever (<string>:" in d.python
    assert "py-spy" in d.tools and d.native  # the native frames beside the Python ones
    assert stacks.digest(d.python) == ["evaluate_forever"]


@pytest.fixture
def hung_sim(tmp_path):
    """A 4-rank c4d sim whose rank 1 stops computing at step 3; no diagnosis ends it early."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = c4d_cmd("sim", "--ranks", 4, "--ranks-per-node", 2, "--fault", "noncomm-hang@rank=1,step=3",
                  "--hang-timeout", 60_000_000, "--max-seconds", 120)  # fmt: skip
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    ranks = wait_for(lambda: _ranks(p.pid), 30, "4 simtrain ranks")
    time.sleep(1.0)  # well past step 3 (a few ms a step): rank 1's stream is stuck, the others wait
    yield ranks
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(30)


def _ranks(pid: int) -> dict[int, int] | None:
    found = {
        r: q
        for r, q in ranks_by_environment(descendants([pid])).items()
        if Path(f"/proc/{q}/exe").resolve().name == "c4d-simtrain"
    }
    return found if len(found) == 4 else None


@pytest.mark.skipif(
    not shutil.which("gdb") and not shutil.which("eu-stack"), reason="no gdb or eu-stack here"
)
def test_native_stack_of_the_hung_rank_shows_the_hung_kernel(hung_sim):
    culprit = stacks.dump(hung_sim[1])
    assert culprit.error is None, culprit.error
    assert culprit.python is None  # c4d-simtrain is not a Python process
    assert "simnccl_hung_kernel" in culprit.native
    assert any("simnccl_hung_kernel" in line for line in stacks.digest(culprit.native))
    victim = stacks.dump(hung_sim[0])
    assert "simnccl_hung_kernel" not in victim.native  # it waits in the collective instead
    assert "cudaStreamSynchronize" in victim.native


def test_evidence_dumps_culprits_and_victims_once_and_enriches_later_diagnoses(hung_sim):
    ev = Evidence(lambda: set(hung_sim.values()))
    d = {"level": "WARNING", "kind": "RankNonCommHang", "comm": "00ab", "seq": 7, "ranks": [1],
         "nodes": ["node-0"], "detail": {"victims": [0, 2, 3], "localized": True}}  # fmt: skip
    assert ev.on_diagnosis(d, hung_sim)
    assert not ev.on_diagnosis({**d, "level": "ERROR"}, hung_sim)  # same hang: not again
    st = ev.stacks_for(d, wait_s=60)
    assert st is not None and set(st) == {"0", "1", "2", "3"}
    assert st["1"]["role"] == "culprit" and "simnccl_hung_kernel" in st["1"]["native"]
    assert {st[r]["role"] for r in "023"} == {"victim"}
    later = ev.enrich({**d, "level": "ERROR"})
    assert later["detail"]["stacks"] == st
    # a second hang of the same attempt: its culprits only, the victims were dumped once
    d2 = {**d, "seq": 8, "ranks": [2]}
    assert ev.on_diagnosis(d2, hung_sim)
    assert set(ev.stacks_for(d2, wait_s=60)) == {"2"}
    # a pid that is not one of this node's job processes is not touched
    d3 = {**d, "seq": 9, "ranks": [3]}
    ev.on_diagnosis(d3, {3: os.getpid()})
    assert "not a live process of this node's job" in ev.stacks_for(d3, wait_s=10)["3"]["error"]
    lines = stacks_view.live_lines([later])
    assert lines[0].startswith("rank 1 culprit: ") and "simnccl_hung_kernel" in lines[0]
    ev.close()


DROP = ["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]


def _unprivileged() -> list[str]:
    """argv prefix that runs a command as uid 65534 without any capability."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root, setpriv and a system python3 to drop privileges")
    return [setpriv, *DROP]


@pytest.fixture
def readable_c4d():
    """A copy of the c4d package uid 65534 can import: the checkout may lie where only root
    reads (a clone in `mktemp -d`, mode 0700), and so does pytest's tmp_path."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="c4d-unpriv-"))
    d.chmod(0o755)
    shutil.copytree(ROOT / "c4d", d / "c4d", ignore=shutil.ignore_patterns("__pycache__", "_native"))
    for sub in [d, *d.rglob("*")]:
        sub.chmod(0o755 if sub.is_dir() else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_without_root_where_ptrace_allows(readable_c4d):
    """uid 65534 without capabilities dumps its own uid's process (no Yama here; under Yama
    ptrace_scope=1 the PR_SET_PTRACER declarations of launcher.py and the shim allow it)."""
    drop = _unprivileged()
    if not shutil.which("gdb"):
        pytest.skip("no gdb")
    target = subprocess.Popen([*drop, "/bin/sleep", "600"])
    try:
        wait_for(lambda: Path(f"/proc/{target.pid}/exe").exists(), 10, "the target")
        probe = f"import sys; sys.path.insert(0, {str(readable_c4d)!r})\nfrom c4d.util import stacks\n"
        probe += f"d = stacks.dump({target.pid}); print(d.error); print(d.native)"
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [*drop, "/usr/bin/python3", "-c", probe]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stderr
        error, native = p.stdout.split("\n", 1)
        assert error == "None" and "nanosleep" in native, p.stdout
    finally:
        target.kill()
        target.wait()


def test_an_unprivileged_user_is_told_why_not(py_target, readable_c4d):
    """uid 65534 without capabilities, asking for a root process: the kernel refuses ptrace,
    and stacks.dump says so in one line with the fix."""
    drop = _unprivileged()
    probe = textwrap.dedent(
        f"""
        import ctypes, os, sys
        sys.path.insert(0, {str(readable_c4d)!r})
        from c4d.util import stacks
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.ptrace(16, {py_target.pid}, 0, 0)  # PTRACE_ATTACH: what every stack tool does first
        print("attach", rc, os.strerror(ctypes.get_errno()))
        d = stacks.dump({py_target.pid})
        print(d.error)
        """
    )
    p = subprocess.run([*drop, "/usr/bin/python3", "-c", probe], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    attach, why = p.stdout.strip().splitlines()
    assert attach == "attach -1 Operation not permitted"  # the kernel's answer, not ours
    assert why.startswith(f"process {py_target.pid} belongs to uid 0, we run as uid 65534: ")
    assert stacks.FIX in why


def test_a_process_held_by_another_tracer_is_reported_not_crashed(py_target):
    """ptrace allows one tracer: while another holds the target, the tools get EPERM."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import ctypes,time; l=ctypes.CDLL(None); "
         f"print(l.ptrace(0x4206, {py_target.pid}, 0, 0), flush=True); time.sleep(600)"],  # PTRACE_SEIZE
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        d = stacks.dump(py_target.pid, timeout=20)
        assert d.python is None and d.native is None
        assert d.error and "ptrace not permitted" in d.error, d.error
        assert d.error.endswith("another debugger or tracer holds the process") and "\n" not in d.error
    finally:
        holder.kill()
        holder.wait()


SILENT_JOB = textwrap.dedent(
    """
    import time
    def wait_for_the_data_loader():
        print("started", flush=True)
        time.sleep(600)
    wait_for_the_data_loader()
    """
)


def test_a_hang_seen_only_in_the_logs_keeps_the_stacks_of_the_jobs_ranks(tmp_path):
    """No diagnosis names a rank (the job never calls NCCL); its output stops: before c4d run
    stops it, the evidence gets every rank's stack (ranks found by RANK, as torchrun sets it),
    and the report page of the attempt's trace shows them."""
    if stacks.py_spy() is None:
        pytest.fail("py-spy is a dependency of c4d: pip install py-spy")
    run_dir = tmp_path / "run"
    job = f"RANK=$LOCAL_RANK exec {shlex.quote(sys.executable)} -c {shlex.quote(SILENT_JOB)}"
    cmd = c4d_cmd("run", "--run-dir", run_dir, "--nprocs", 2, "--job-hang-interval", 2, "--max-restarts", 0,
                  "--grace-period", 2, "--trace", tmp_path / "t.c4d", "--", "sh", "-c", job)  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    s = json.loads((run_dir / "summary.json").read_text())
    a = s["attempts"][0]
    assert a["ended"] == "log-hang" and len(a["evidence"]) == 1, p.stderr[-3000:]
    ev = json.loads(Path(a["evidence"][0]).read_text())
    assert ev["kind"] == "log-hang" and ev["detail"]["silent_s"] == 2
    st = ev["detail"]["stacks"]
    assert sorted(st) == ["0", "1"], st
    for r in st.values():
        assert "wait_for_the_data_loader" in (r.get("python") or ""), r
        assert r["role"] == "silent" and r["pid"] > 0
    # the trace's sidecar: what `c4d report` shows beside the attempt's trace
    side = json.loads(stacks_view.sidecar_path(tmp_path / "t.attempt1.c4d").read_text())
    assert [e["kind"] for e in side] == ["log-hang"] and sorted(side[0]["stacks"]) == ["0", "1"]
    line = stacks_view.rank_line("0", st["0"])
    assert line.startswith("rank 0 silent: ") and "wait_for_the_data_loader" in line
