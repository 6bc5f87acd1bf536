"""`c4d check nccl` and `c4d check troubleshoot` end to end, as subprocesses.

No GPU and no real nccl-tests here: binaries are played by tests/fake_bin/all_reduce_perf, a
recording fake that prints a real capture and logs its arguments (the only stand-in; the
parser and the check logic are the real ones).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from c4d.actions import blacklist
from tests.conftest import nccl_tests_data

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "fake_bin" / "all_reduce_perf"
DATA = nccl_tests_data()
# only the tests that read a capture skip without the data (not the whole module)
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"no nccl-tests captures at {DATA}")


def check(*args, env=None, timeout=120):
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "c4d.check", *args], capture_output=True, text=True, env=e, timeout=timeout
    )


@needs_data
def test_from_file_json_object():
    p = check("nccl", "--from", str(DATA / "nccl-tests-sample-1.txt"), "--json", "--min-busbw", "50")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["avg_busbw_gbs"] == 70.742 and obj["wrong_total"] == 0 and obj["passed"] is True
    assert len(obj["rows"]) == 31 and len(obj["devices"]) == 16
    last = obj["rows"][-1]
    assert last["size"] == 8589934592 and last["count"] == 2147483648 and last["root"] == -1
    assert last["out_of_place"] == {"time_us": 47535.0, "algbw_gbs": 180.71, "busbw_gbs": 338.82, "wrong": 0}
    assert last["in_place"]["busbw_gbs"] == 337.35
    assert obj["devices"][15] == {
        "rank": 15,
        "group": 0,
        "pid": 6740,
        "host": "ztan-mig-gq73",
        "device": 7,
        "pci": "0000:8c:00",
        "name": "NVIDIA H100 80GB HBM3",
    }


@needs_data
def test_from_file_below_bar_and_errors():
    p = check("nccl", "--from", str(DATA / "nccl-tests-sample-1.txt"), "--json", "--min-busbw", "100")
    assert p.returncode == 2
    assert json.loads(p.stdout)["passed"] is False
    p = check("nccl", "--from", str(DATA / "nccl-tests-sample-3.txt"))
    assert p.returncode == 2
    assert "128 wrong elements (size 1048576)" in p.stdout and "Test failure" in p.stdout
    assert "NCCLTest all_reduce_perf: Failed" in p.stdout
    assert "1048576" in p.stdout and "#wrong" in p.stdout  # the per-size table


@needs_data
def test_from_bad_inputs_are_one_line():
    p = check("nccl", "--from", "/nonexistent/out.txt")
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "cannot read" in p.stderr
    p = check("nccl", "--from", "-", "--json", env=None)  # empty stdin: no table
    assert p.returncode == 2 and "no nccl-tests result" in json.loads(p.stdout)["problems"][0]
    p = check("nccl", "--from", str(DATA / "nccl-tests-sample-1.txt"), "--min-busbw", "fast")
    assert p.returncode == 1 and "not a number" in p.stderr and "Traceback" not in p.stderr


def test_missing_binary_says_where_it_looked(tmp_path):
    p = check("nccl", "--nccl-tests-dir", str(tmp_path))
    assert p.returncode == 1
    assert "all_reduce_perf not found in" in p.stderr and "Traceback" not in p.stderr
    p = check("nccl", env={"PATH": str(tmp_path)})
    assert p.returncode == 1 and "not found on PATH" in p.stderr


@pytest.fixture()
def fake_dir(tmp_path):
    d = tmp_path / "build"
    d.mkdir()
    for name in ("all_reduce_perf", "all_gather_perf"):
        shutil.copy(FAKE, d / name)
    return d


@needs_data
def test_runs_binaries_with_sensible_args(fake_dir, tmp_path):
    argv_log = tmp_path / "argv.jsonl"
    env = {
        "FAKE_NCCL_TESTS_OUTPUT": str(DATA / "nccl-tests-sample-1.txt"),
        "FAKE_NCCL_TESTS_ARGV": str(argv_log),
    }
    p = check(
        "nccl",
        "--nccl-tests-dir",
        str(tmp_path),  # binaries are looked up in DIR and DIR/build
        "--test",
        "all_reduce_perf",
        "--test",
        "all_gather_perf",
        "--gpus",
        "8",
        "--json",
        env=env,
    )
    assert p.returncode == 0, p.stderr
    calls = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert [c[0] for c in calls] == ["all_reduce_perf", "all_gather_perf"]
    args = calls[0][1:]
    assert args[args.index("-g") + 1] == "8" and args[args.index("-c") + 1] == "1"
    assert args[args.index("-b") + 1] == "8M" and args[args.index("-e") + 1] == "1G"
    outs = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(outs) == 2 and all(o["returncode"] == 0 and o["passed"] for o in outs)

    # On PATH, with explicit arguments and a launcher prefix; a non-zero exit fails the check.
    env = {**env, "PATH": f"{fake_dir}:{os.environ['PATH']}", "FAKE_NCCL_TESTS_RC": "3"}
    argv_log.unlink()
    p = check("nccl", "--nccl-args", "-b 1G -e 1G -g 1", "--launcher", "env", "--json", env=env)
    assert p.returncode == 2
    assert json.loads(p.stdout)["problems"] == ["exit status 3"]
    assert json.loads(argv_log.read_text())[1:] == ["-b", "1G", "-e", "1G", "-g", "1"]


@needs_data
def test_hung_run_is_killed_at_the_deadline(fake_dir):
    env = {
        "FAKE_NCCL_TESTS_OUTPUT": str(DATA / "nccl-tests-sample-1.txt"),
        "FAKE_NCCL_TESTS_HANG": "1",
    }
    t0 = time.monotonic()
    p = check("nccl", "--nccl-tests-dir", str(fake_dir), "--nccl-timeout", "1", "--json", env=env)
    assert time.monotonic() - t0 < 30
    assert p.returncode == 2
    obj = json.loads(p.stdout)
    assert obj["problems"][0].startswith("no result after 1 s (hung?)")


@needs_data
def test_troubleshoot_passes_and_says_restart(tmp_path):
    p = check(
        "troubleshoot",
        "--disk",
        str(tmp_path),
        "--disk-mb",
        "4",
        "--from",
        str(DATA / "nccl-tests-sample-1.txt"),
        "--min-busbw",
        "50",
        "--allreduce-timeout",
        "30",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "Check Finished, task will be restarted."
    assert any(" DiskTest " in s and s.endswith(")") and ": Succeed" in s for s in lines)
    assert any(" AllReduceTest gloo x2: Succeed" in s for s in lines)
    assert any(" NCCLTest all_reduce_perf: Succeed" in s for s in lines)


@needs_data
def test_troubleshoot_lists_failed_node_and_blacklists_it(tmp_path):
    bl = tmp_path / "blacklist"
    bl.write_text("node-7\n")
    args = ["troubleshoot", "--no-allreduce", "--from", str(DATA / "nccl-tests-sample-3.txt")]
    p = check(*args, "--node-name", "node-3", "--blacklist", str(bl))
    assert p.returncode == 2
    assert "Check Finished, failed nodes: node-3 (failed: NCCLTest all_reduce_perf)" in p.stdout
    assert blacklist.read_nodes(bl) == ["node-7", "node-3"]
    p = check(*args, "--json", env={"C4D_NODE_NAME": "node-3"}, timeout=60)
    summary = json.loads(p.stdout.splitlines()[-1])
    assert summary["failed_nodes"] == ["node-3"] and summary["passed"] is False


def test_troubleshoot_without_nccl_tests_on_cpu_skips_bandwidth(tmp_path):
    # a disk was checked, so the node has a verdict; the skipped bandwidth check is named
    disk = tmp_path / "disk"
    disk.mkdir()
    args = ["--nccl-tests-dir", str(tmp_path), "--disk", str(disk), "--disk-mb", "1"]
    p = check("troubleshoot", "--no-allreduce", *args)
    assert p.returncode == 0, p.stdout
    assert "NCCLTest: Skipped (no GPU and all_reduce_perf not found in" in p.stdout
    *_, skipped, last = p.stdout.splitlines()
    assert last == "Check Finished, task will be restarted."
    assert skipped.startswith("Not checked here (skipped): ") and "NCCLTest" in skipped
    assert not list(disk.iterdir())


def test_troubleshoot_that_checked_nothing_gives_no_verdict(tmp_path):
    # no disk, no all-reduce, no nccl-tests, no GPU: every check that exercises the node is
    # skipped, so it must not say "task will be restarted" (exit 1: the check could not run)
    p = check("troubleshoot", "--no-allreduce", "--nccl-tests-dir", str(tmp_path), "--node-name", "node-5")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "task will be restarted" not in p.stdout
    assert p.stdout.splitlines()[-1].startswith("Check Finished, nothing verified on node-5:")
    p = check("troubleshoot", "--no-allreduce", "--nccl-tests-dir", str(tmp_path), "--json")
    summary = json.loads(p.stdout.splitlines()[-1])
    assert p.returncode == 1 and summary["passed"] is False and summary["checked"] == 0
    assert "NCCLTest" in summary["skipped"]


@needs_data
def test_write_expected_turns_a_passing_run_into_the_masters_reference(tmp_path):
    # a real 2-node x 8 H100 capture: class net (its devices are on two hosts), AllReduce per size
    out = tmp_path / "expected.json"
    p = check("nccl", "--from", str(DATA / "nccl-tests-sample-1.txt"), "--write-expected", str(out))
    assert p.returncode == 0, p.stderr
    assert f"c4d master --expected-busbw {out}" in p.stderr
    from c4d.engine.expected import ExpectedBusbw
    from c4d.record.schema import Op

    table = ExpectedBusbw.load(out)
    assert set(table.table) == {("net", int(Op.AllReduce))}
    sizes = [b for b, _ in table.table[("net", int(Op.AllReduce))]]
    assert sizes == sorted(sizes) and len(sizes) > 10
    big = table.at("net", int(Op.AllReduce), 1 << 30, 16)
    assert big is not None and big > 50  # H100s over the network reach tens of GB/s at 1 GiB
    assert table.at("intra", int(Op.AllReduce), 1 << 30, 16) is None  # not measured: no expectation
    # a second run of another class merges into the same file; this launcher log does not name
    # its binary: --test says which
    args = ["nccl", "--from", str(DATA / "nccl-tests-sample-2.txt"), "--write-expected", str(out)]
    p = check(*args, "--link-class", "intra")
    assert p.returncode == 1 and "--test all_reduce_perf" in p.stderr, p.stderr
    p = check(*args, "--link-class", "intra", "--test", "all_reduce_perf")
    assert p.returncode == 0, p.stderr
    assert set(ExpectedBusbw.load(out).table) == {("net", 0), ("intra", 0)}


def test_write_expected_from_a_failed_run_writes_nothing(tmp_path):
    out = tmp_path / "expected.json"
    p = check("nccl", "--from", str(DATA / "nccl-tests-sample-3.txt"), "--write-expected", str(out))
    assert p.returncode == 2 and "no passing run" in p.stderr and not out.exists()


def test_master_refuses_a_bad_expected_busbw_file_in_one_line(tmp_path):
    bad = tmp_path / "e.json"
    row = {"class": "wan", "op": "AllReduce", "bytes": 1, "busbw_gbs": 2}
    bad.write_text(json.dumps({"version": 1, "rows": [row]}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "c4d", "master", "--expected-busbw", str(bad)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "row 0: class one of" in p.stderr and "Traceback" not in p.stderr
