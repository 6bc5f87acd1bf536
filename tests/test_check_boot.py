"""`c4d check boot`: seed-style lines, JSON objects, disks that fail (read-only, full, missing)
as failed checks rather than tracebacks, torch absent, and the all-reduce catching bad data."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from c4d.check import faults
from c4d.check.disk import disk_test
from c4d.check.result import Status

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (\w+)( [^:]+)?: (Succeed|Failed|Skipped)( \(.*\))?$")


def check(*args, env=None, timeout=120, prefix=(), preexec_fn=None):
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "c4d.check", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )


def test_boot_passes_here_with_seed_lines(tmp_path):
    p = check("boot", "--disk", "/tmp", "--disk", str(tmp_path), "--disk-mb", "8")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert all(LINE.match(s) for s in lines), lines
    names = [LINE.match(s).group(1) for s in lines]
    assert names == [
        "DiskTest",
        "DiskTest",
        "GPUTest",
        "CUDAVersion",
        "PyTorchVersion",
        "NCCLVersion",
        "AllReduceTest",
    ]
    assert lines[0].split(" ", 2)[2].startswith("DiskTest /tmp: Succeed (write ")
    assert "AllReduceTest gloo x2: Succeed" in p.stdout
    # the versions it checked are printed, with where each came from
    import torch

    assert f"PyTorchVersion: Succeed ({torch.__version__} from torch)" in p.stdout
    assert not list(tmp_path.iterdir()), "the disk test must clean up its file"


def test_boot_json_objects():
    p = check("boot", "--disk", "/tmp", "--disk-mb", "4", "--json", "--allreduce-procs", "3")
    assert p.returncode == 0, p.stderr
    objs = [json.loads(s) for s in p.stdout.splitlines()]
    assert {"check", "status", "value", "threshold", "passed"} <= set(objs[0])
    disk = objs[0]
    assert disk["check"] == "DiskTest" and disk["value"]["bytes"] == 4 << 20
    assert disk["value"]["write_mbs"] > 0 and disk["value"]["read_mbs"] > 0
    assert disk["threshold"] == {"min_write_mbs": 0.0, "min_read_mbs": 0.0}
    ar = objs[-1]
    assert ar["check"] == "AllReduceTest" and ar["value"]["procs"] == 3 and ar["value"]["wrong"] == 0


def test_thresholds_fail_the_boot():
    p = check("boot", "--disk", "/tmp", "--disk-mb", "4", "--min-disk-write-mbs", "1e12", "--no-allreduce")
    assert p.returncode == 2
    assert re.search(r"DiskTest /tmp: Failed \(write below 1e\+12 MB/s; write [\d.]+ MB/s", p.stdout)
    p = check("boot", "--expect-gpus", "8", "--expect-torch", "1.0", "--no-allreduce", "--json")
    objs = {o["check"]: o for o in map(json.loads, p.stdout.splitlines())}
    assert p.returncode == 2
    assert objs["GPUTest"]["status"] == "Failed" and objs["GPUTest"]["threshold"] == 8
    assert objs["PyTorchVersion"]["status"] == "Failed" and objs["PyTorchVersion"]["threshold"] == "1.0"


def test_missing_path_and_file_are_failed_checks(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    p = check("boot", "--disk", str(tmp_path / "nope"), "--disk", str(f), "--no-allreduce")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"DiskTest {tmp_path / 'nope'}: Failed ({tmp_path / 'nope'} does not exist)" in p.stdout
    assert f"DiskTest {f}: Failed ({f} is not a directory)" in p.stdout


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs /mnt",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="user+mount namespaces not permitted here")


@needs_unshare
@pytest.mark.parametrize(
    "mount_opts,errname",
    [("ro,size=4m", "EROFS"), ("size=1m", "ENOSPC")],
    ids=["read-only", "full"],
)
def test_read_only_or_full_filesystem_fails_cleanly(tmp_path, mount_opts, errname):
    # A real tmpfs in a private mount namespace: read-only, or 1 MiB for a 4 MiB test.
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (
        f"mount -t tmpfs -o {mount_opts} tmpfs {mnt} && "
        f"exec {sys.executable} -m c4d.check boot --disk {mnt} --disk-mb 4 --no-allreduce --json"
    )
    p = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    disk = json.loads(p.stdout.splitlines()[0])
    assert disk["status"] == "Failed" and disk["value"] == {"error": errname}
    assert disk["detail"].startswith(("create:", "write:", "fsync:"))


def test_file_size_limit_fails_cleanly(tmp_path):
    # Works without privileges: the kernel refuses writes past RLIMIT_FSIZE (EFBIG), as a full
    # disk refuses them past its end.
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    p = check("boot", "--disk", str(tmp_path), "--disk-mb", "4", "--no-allreduce", preexec_fn=limit)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert re.search(r"DiskTest \S+: Failed \(write: File too large \[EFBIG\]\)", p.stdout), p.stdout
    assert not list(tmp_path.iterdir())


def test_disk_test_verifies_and_cleans_up(tmp_path):
    r = disk_test(str(tmp_path), (4 << 20) + 12345)
    assert r.status is Status.SUCCEED and r.value["bytes"] == (4 << 20) + 12345
    assert not list(tmp_path.iterdir())


def test_without_torch_says_not_available(tmp_path):
    # torch made unimportable in the child: every torch-based check degrades to "not available".
    code = (
        "import sys; sys.modules['torch'] = None; from c4d.check.__main__ import main; "
        f"sys.exit(main(['boot', '--disk', {str(tmp_path)!r}, '--disk-mb', '1']))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "PATH": str(tmp_path)},
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PyTorchVersion: Skipped (not available: torch not available (ModuleNotFoundError" in p.stdout
    assert "GPUTest: Skipped (no GPU found)" in p.stdout
    assert "AllReduceTest: Skipped (torch not available" in p.stdout
    code = code.split("sys.exit")[0] + "sys.exit(main(['nodes']))"
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert p.returncode == 1 and p.stderr.startswith("c4d check nodes: torch not available")


def test_allreduce_catches_wrong_data_and_a_dead_rank():
    p = check("boot", "--json", "--allreduce-procs", "3", env={faults.ENV: "corrupt:rank-1"})
    ar = json.loads(p.stdout.splitlines()[-1])
    assert p.returncode == 2 and ar["status"] == "Failed"
    assert ar["value"]["wrong"] == 3  # the one corrupted element, wrong on each of 3 ranks
    p = check("boot", "--json", "--allreduce-timeout", "2", env={faults.ENV: "crash:rank-0"})
    ar = json.loads(p.stdout.splitlines()[-1])
    assert p.returncode == 2 and "rank 0: worker exited with status 17" in ar["detail"]
    assert "rank 1: " in ar["detail"]  # its partner timed out waiting for rank 0


def test_bad_fault_spec_is_one_clear_line():
    p = check("boot", "--allreduce-procs", "2", env={faults.ENV: "explode:rank-0"})
    assert p.returncode == 0
    assert p.stderr.strip() == (
        f"{faults.ENV}: ignoring 'explode:rank-0' "
        "(expected KIND:TARGET[:FACTOR], KIND one of slow, fail, crash, corrupt)"
    )


@pytest.mark.parametrize("as_json", [False, True])
def test_a_boot_that_checked_nothing_says_so_and_exits_1(tmp_path, as_json):
    """No torch, no GPU (no nvidia-smi on PATH), no NCCL, no disk asked: every check is skipped.
    That is not a pass (it would vouch for a node nothing looked at): one line, exit status 1."""
    argv = ["boot", *(["--json"] if as_json else [])]
    code = (
        "import sys; sys.modules['torch'] = None; from c4d.check.__main__ import main; "
        f"sys.exit(main({argv!r}))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": str(tmp_path), "LD_LIBRARY_PATH": str(tmp_path)}
    env.pop("LD_PRELOAD", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    statuses = (
        [json.loads(s)["status"] for s in p.stdout.splitlines()]
        if as_json
        else [LINE.match(s).group(3) for s in p.stdout.splitlines()]
    )
    if statuses.count("Skipped") != 5:
        pytest.skip(f"something is checkable here after all (a libnccl.so.2 the loader finds?): {p.stdout}")
    assert p.returncode == 1, p.stdout + p.stderr
    [line] = p.stderr.splitlines()
    assert line.startswith("c4d check boot: nothing was checked on this node: every check was skipped")
    assert "GPUTest, CUDAVersion, PyTorchVersion, NCCLVersion, AllReduceTest" in line


def test_a_boot_that_checked_something_still_passes_with_skips(tmp_path):
    """The same node with a disk to test: the disk was checked, the skips fail nothing (exit 0)."""
    code = (
        "import sys; sys.modules['torch'] = None; from c4d.check.__main__ import main; "
        f"sys.exit(main(['boot', '--disk', {str(tmp_path)!r}, '--disk-mb', '1']))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "nothing was checked" not in p.stderr, p.stdout + p.stderr
