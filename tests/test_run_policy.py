"""``c4d run``'s restart policy: the pure rules (c4d/run/policy.py) on hand-made histories, then
the same rules on real processes: tiny shell jobs started, logged, stopped and restarted by
``python -m c4d run`` (no simnccl needed; the shim is preloaded and idle, as in a job that has
not called NCCL yet)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import c4d_cmd, wait_for

from c4d.run.policy import (
    RETRYABLE_PATTERNS,
    Attempt,
    End,
    Policy,
    PolicyConfig,
    compile_patterns,
    decide,
    is_retryable,
    signature,
)

ROOT = Path(__file__).resolve().parents[1]


# -- the rules ----------------------------------------------------------------------------
def failed(i: int, sig: str = "exit 1: boom", retry: str | None = None, isolated=()) -> Attempt:
    return Attempt(i, End.failed, 1, sig, retry, tuple(isolated))


def test_success_and_interruption_stop():
    assert not decide(PolicyConfig(), [Attempt(1, End.succeeded, 0)]).restart
    d = decide(PolicyConfig(), [Attempt(1, End.interrupted, 130)])
    assert not d.restart and not d.failed


def test_exit_code_and_error_msg_restarts_only_retryable_failures():
    cfg = PolicyConfig()
    assert decide(cfg, [failed(1, retry="log matches 'NCCL error'")]).restart
    d = decide(cfg, [failed(1)])
    assert not d.restart and d.failed and "no retryable error" in d.why


def test_on_failure_restarts_any_failure_and_never_restarts_none():
    assert decide(PolicyConfig(policy=Policy.OnFailure), [failed(1)]).restart
    never = PolicyConfig(policy=Policy.Never)
    assert not decide(never, [failed(1, retry="x")]).restart
    assert not decide(
        never, [Attempt(1, End.c4d_error, 143, "c4d-error RankNonCommHang", isolated=("n1",))]
    ).restart


def test_c4d_stopped_attempts_restart_under_both_restarting_policies():
    for end in (End.log_hang, End.exit_hang, End.c4d_error):
        for pol in (Policy.OnFailure, Policy.ExitCodeAndErrorMsg):
            assert decide(PolicyConfig(policy=pol), [Attempt(1, end, 143, end.value)]).restart


def test_max_restarts():
    cfg = PolicyConfig(policy=Policy.OnFailure, max_restarts=2)
    hist = [failed(1, "a"), failed(2, "b")]
    assert decide(cfg, hist).restart
    d = decide(cfg, [*hist, failed(3, "c")])
    assert not d.restart and "--max-restarts 2" in d.why


def test_the_same_error_max_same_error_times_marks_it_failed():
    cfg = PolicyConfig(policy=Policy.OnFailure, max_restarts=100, max_same_error=4)
    # each isolated a node, so the three-identical rule does not apply; max-same-error does
    hist = [failed(i, "same", isolated=[f"n{i}"]) for i in range(1, 4)]
    assert decide(cfg, hist).restart
    d = decide(cfg, [*hist, failed(4, "same", isolated=["n4"])])
    assert not d.restart and d.failed and "4 times in a row" in d.why
    # interrupted by a different error: the count starts again
    assert decide(cfg, [*hist, failed(4, "other"), failed(5, "same", isolated=["n5"])]).restart


def test_three_identical_failures_without_isolation_blame_the_code():
    cfg = PolicyConfig(policy=Policy.OnFailure, max_restarts=100)
    d = decide(cfg, [failed(1), failed(2), failed(3)])
    assert not d.restart and "the code, not a machine" in d.why
    # one of the three isolated a node: the machine was suspect, try again
    assert decide(cfg, [failed(1), failed(2, isolated=["n2"]), failed(3)]).restart
    assert decide(cfg, [failed(1), failed(2, "different"), failed(3)]).restart


def test_retryable_classification():
    pats = compile_patterns([*RETRYABLE_PATTERNS, r"my flaky storage"])
    assert is_retryable(1, ["x", "RuntimeError: NCCL error in: ... unhandled system error"], pats)
    assert is_retryable(1, ["ECONNRESET: Connection reset by peer"], pats)
    assert is_retryable(1, ["OSError: my flaky storage went away"], pats) == "log matches 'my flaky storage'"
    assert is_retryable(137, ["plain"], pats) == "killed by SIGKILL"
    assert is_retryable(1, ["ValueError: shapes do not match"], pats) is None
    assert is_retryable(139, ["Segmentation fault"], pats) is None  # SIGSEGV: a bug, not the machine
    with pytest.raises(ValueError, match="not a regular expression"):
        compile_patterns(["(unclosed"])


def test_signatures_ignore_numbers_so_reruns_of_one_bug_match():
    a = signature(End.failed, 1, ["step 41", "RuntimeError: rank 3 failed at 0x7f12 pid 991", "bye"])
    b = signature(End.failed, 1, ["step 97", "RuntimeError: rank 5 failed at 0x7e00 pid 1204", "bye"])
    assert a == b and "RuntimeError: rank N failed" in a
    assert signature(End.failed, 2, ["x"]) != signature(End.failed, 1, ["x"])
    assert signature(End.log_hang, 143, [], "no output for 5 s") == "log-hang no output for 5 s"


# -- real processes -----------------------------------------------------------------------
def c4d_run(tmp_path: Path, *opts: str, job: str, timeout: float = 120, env=None):
    """``c4d run OPTS -- sh -c JOB``; (completed process, summary.json)."""
    e = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    run_dir = tmp_path / "run"
    cmd = c4d_cmd("run", "--run-dir", run_dir, "--grace-period", "2", *opts, "--", "sh", "-c", job)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=tmp_path)
    summ = run_dir / "summary.json"
    return p, (json.loads(summ.read_text()) if summ.exists() else None)


def ended(summary) -> list[str]:
    return [a["ended"] for a in summary["attempts"]]


# fails with a retryable error until the third start, then succeeds
FLAKY = 'echo "start $C4D_PROC_START_COUNT restarts $C4D_RESTART_COUNT"; '
FLAKY += '[ "$C4D_RESTART_COUNT" -ge 2 ] && exit 0; '
FLAKY += 'echo "NCCL WARN NET/IB : Got completion with error" >&2; exit 1'


@pytest.mark.slow
def test_a_retryable_failure_is_restarted_and_the_job_sees_its_history(tmp_path):
    p, s = c4d_run(tmp_path, job=FLAKY)
    assert p.returncode == 0, p.stderr
    assert ended(s) == ["failed", "failed", "succeeded"]
    assert s["attempts"][0]["retryable"].startswith("log matches")
    assert p.stdout.splitlines() == [f"start {n} restarts {n - 1}" for n in (1, 2, 3)]  # passed through


@pytest.mark.slow
def test_a_non_retryable_failure_is_not_restarted_and_keeps_its_status(tmp_path):
    p, s = c4d_run(tmp_path, job='echo "ValueError: shapes do not match" >&2; exit 3')
    assert p.returncode == 3
    assert ended(s) == ["failed"] and "no retryable error" in s["attempts"][0]["decision"]["why"]
    assert "c4d run: exit status 3" in p.stderr


@pytest.mark.slow
def test_a_user_pattern_makes_a_failure_retryable(tmp_path):
    p, s = c4d_run(tmp_path, "--retryable-error", "shapes? do not", "--max-restarts", "1",
                   job='echo "ValueError: shapes do not match" >&2; exit 3')  # fmt: skip
    assert p.returncode == 3 and ended(s) == ["failed", "failed"]
    assert s["attempts"][1]["decision"]["why"] == "--max-restarts 1 reached"


@pytest.mark.slow
def test_never_never_restarts(tmp_path):
    p, s = c4d_run(tmp_path, "--fault-tolerant-policy", "Never", job=FLAKY)
    assert p.returncode == 1 and ended(s) == ["failed"]


@pytest.mark.slow
def test_on_failure_restarts_until_max_restarts(tmp_path):
    p, s = c4d_run(tmp_path, "--fault-tolerant-policy", "OnFailure", "--max-restarts", "2",
                   job='echo "attempt $C4D_PROC_START_COUNT" >&2; exit 4')  # fmt: skip
    assert p.returncode == 4 and ended(s) == ["failed"] * 3


@pytest.mark.slow
def test_max_same_error_stops_a_repeating_failure(tmp_path):
    p, s = c4d_run(tmp_path, "--fault-tolerant-policy", "OnFailure", "--max-restarts", "9",
                   "--max-same-error", "2",
                   job='echo "OSError: disk full at step $$" >&2; exit 5')  # fmt: skip
    assert p.returncode == 5 and ended(s) == ["failed", "failed"]
    assert "2 times in a row" in s["attempts"][1]["decision"]["why"]


def test_three_identical_failures_stop_even_with_restarts_left(tmp_path):
    p, s = c4d_run(tmp_path, "--fault-tolerant-policy", "OnFailure", "--max-restarts", "9",
                   job='echo "KeyError: layer.$$" >&2; exit 6')  # fmt: skip
    assert p.returncode == 6 and ended(s) == ["failed"] * 3
    assert "the code, not a machine" in s["attempts"][2]["decision"]["why"]


@pytest.mark.slow
def test_a_silent_job_is_killed_after_the_hang_interval(tmp_path):
    t0 = time.monotonic()
    p, s = c4d_run(tmp_path, "--job-hang-interval", "1.5", "--max-restarts", "1",
                   job="echo started; exec sleep 600")  # fmt: skip
    assert ended(s) == ["log-hang", "log-hang"]
    assert s["attempts"][0]["exit_status"] == 128 + signal.SIGTERM  # stopped with SIGTERM
    assert p.returncode == 128 + signal.SIGTERM  # the job's own status (c4d stopped it)
    assert time.monotonic() - t0 < 60
    log = (tmp_path / "run" / "job.log").read_text()
    assert log.count("out started") == 2


@pytest.mark.slow
def test_exit_hang_one_process_done_the_other_not(tmp_path):
    job = '[ "$LOCAL_RANK" = 0 ] && { echo done; exit 0; }; echo "rank $LOCAL_RANK stuck"; exec sleep 600'
    p, s = c4d_run(tmp_path, "--nprocs", "2", "--job-exit-hang-interval", "1", "--max-restarts", "0",
                   "--job-hang-interval", "600", job=job)  # fmt: skip
    assert ended(s) == ["exit-hang"]
    assert p.returncode == 128 + signal.SIGTERM
    log = (tmp_path / "run" / "job.log").read_text()
    assert ":0 out done" in log and ":1 out rank 1 stuck" in log


@pytest.mark.slow
def test_the_exit_status_survives_the_logging(tmp_path):
    """Lots of output on both pipes, then a status: the log has every line, prefixed, and
    c4d run exits with the job's status (not a pipeline's)."""
    job = (
        "i=0; while [ $i -lt 3000 ]; do echo out-$i; echo err-$i >&2; i=$((i+1)); done; printf tail; exit 42"
    )
    p, s = c4d_run(tmp_path, "--node-name", "gpu-7", job=job)
    assert p.returncode == 42 and ended(s) == ["failed"]
    lines = (tmp_path / "run" / "job.log").read_text().splitlines()
    outs = [ln for ln in lines if " gpu-7:0 out " in ln]
    errs = [ln for ln in lines if " gpu-7:0 err " in ln]
    assert len(outs) == 3001 and len(errs) == 3000  # 3000 + the unterminated "tail"
    assert outs[0].endswith(" gpu-7:0 out out-0") and outs[-1].endswith(" out tail")
    stamp = outs[0].split(" ", 1)[0]
    assert stamp.endswith("Z") and stamp[4] == "-" and stamp[10] == "T"  # ISO-8601 UTC
    assert p.stdout.splitlines()[:2] == ["out-0", "out-1"] and p.stdout.endswith("tail")


@pytest.mark.slow
def test_keep_on_failure_waits_before_exiting(tmp_path):
    t0 = time.monotonic()
    p, _ = c4d_run(tmp_path, "--keep-on-failure", "2", job="exit 9")
    assert p.returncode == 9 and time.monotonic() - t0 >= 2.0
    assert "keeping its environment for 2 s" in p.stderr


def test_bad_input_is_one_line_and_status_1(tmp_path):
    p, _ = c4d_run(tmp_path, "--isolate", "ansible", job="true")
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "c4d run: --isolate 'ansible': expected kubernetes, slurm or cmd:PATH"
    ]
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(c4d_cmd("run", "--run-dir", tmp_path / "r"), capture_output=True, text=True, env=e)
    assert p.returncode == 1 and "no command" in p.stderr
    p = subprocess.run(c4d_cmd("run", "--run-dir", tmp_path / "r", "--", tmp_path / "missing"),
                       capture_output=True, text=True, env=e)  # fmt: skip
    assert p.returncode == 1 and "c4d run: cannot start" in p.stderr


def test_sigterm_stops_the_job_and_writes_the_summary(tmp_path):
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    run_dir = tmp_path / "run"
    cmd = c4d_cmd("run", "--run-dir", run_dir, "--", "sh", "-c", "echo up; exec sleep 600")
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "up"
    job_pid = int(wait_for(lambda: _child_sleep(p.pid), 10, "the job's process"))
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 128 + signal.SIGTERM
    assert not Path(f"/proc/{job_pid}").exists() or _zombie(job_pid)
    s = json.loads((run_dir / "summary.json").read_text())
    assert ended(s) == ["interrupted"]


def _child_sleep(parent: int) -> int | None:
    from c4d.run.proctree import descendants

    for pid in descendants([parent]):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"):
                return pid
        except OSError:
            pass
    return None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


RANK_PY = """
import ctypes, os, sys, time
ctypes.CDLL(os.environ["SIMNCCL_LIB"], mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)  # the preloaded shim's hooks first
class UID(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid, comm, s = UID(), ctypes.c_void_p(), ctypes.c_void_p()
assert g.ncclGetUniqueId(ctypes.byref(uid)) == 0
assert g.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0  # a world of one: no partner needed
assert g.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
buf = (ctypes.c_float * 16)()
assert g.ncclAllReduce(buf, buf, 16, 7, 0, comm, s) == 0 and g.cudaStreamSynchronize(s) == 0
os.write(1, f"rank {os.environ['RANK']} trained\\n".encode())  # one write: the ranks share a pipe
if os.environ["RANK"] == "1":
    open("rank1.trained", "w").close()
    time.sleep(600)  # never follows rank 0 out
deadline = time.monotonic() + 60  # rank 0 leaves only once rank 1 is past its collective too:
while not os.path.exists("rank1.trained") and time.monotonic() < deadline:  # a slow start of
    time.sleep(0.01)  # rank 1 on a busy host must not end the attempt before it trained
assert g.ncclCommDestroy(comm) == 0
"""


def test_exit_hang_from_the_ranks_final_heartbeats(tmp_path, simnccl_dir):
    """One launched process (a launcher) starts two ranks; rank 0 exits cleanly (its shim sends
    the FINAL heartbeat the hosted master sees), rank 1 does not follow: exit hang."""
    (tmp_path / "rank.py").write_text(RANK_PY)
    job = f"RANK=0 {sys.executable} rank.py & RANK=1 {sys.executable} rank.py & wait"
    env = dict(os.environ, SIMNCCL_LIB=str(simnccl_dir / "libnccl.so.2"), WORLD_SIZE="2")
    p, s = c4d_run(tmp_path, "--job-exit-hang-interval", "2", "--max-restarts", "0", job=job, env=env)
    assert ended(s) == ["exit-hang"], p.stderr
    assert "a rank exited successfully and the rest did not follow" in p.stderr
    log = (tmp_path / "run" / "job.log").read_text()
    assert "out rank 0 trained" in log and "out rank 1 trained" in log, log
