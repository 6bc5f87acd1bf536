"""The command line's conventions: one-line usage errors with exit status 1, help texts with
defaults for every option, the exit-status convention (docs/cli.md), warnings from the ranks
surfaced by `c4d sim`, and `c4d demo`'s kept artifacts."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from c4d.cli import build_parser
from tests.conftest import c4d_cmd


def run(*args, env=None, timeout=180, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        c4d_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args, says",
    [
        ((), "the following arguments are required: COMMAND"),
        (("sim", "--ranks", "0"), "argument --ranks: '0' must be > 0"),
        (("sim", "--ranks", "x"), "argument --ranks: 'x' is not an integer"),
        (("sim", "--clock-skew", "nan"), "argument --clock-skew: 'nan' is not a finite number"),
        (("analyze", "x.c4d", "--max-import-seconds", "nan"), "'nan' is not a finite number"),
        # a port out of range was a traceback from the metrics server; a negative one a bind error
        # that named the master's own endpoint
        (("master", "--metrics-port", "70000"), "argument --metrics-port: '70000' must be <= 65535"),
        (("master", "--metrics-port", "-5"), "argument --metrics-port: '-5' must be >= 0"),
        (("master", "--engine-shards", "0"), "argument --engine-shards: '0' must be >= 1"),
        (("run", "--nprocs", "0", "--", "true"), "argument --nprocs: '0' must be > 0"),
        (("run", "--grace-period", "inf", "--", "true"), "--grace-period: 'inf' is not a finite number"),
        (("sim", "--bogus"), "unrecognized arguments: --bogus"),
        (("sim", "--fault", "explode@rank=1"), "unknown kind 'explode': one of noncomm-hang"),
        (("sim", "--fault", "noncomm-hang:rank=6"), "separated by '@', not ':'"),
        (("sim", "--fault", "crash@rank=1,color=red"), "unknown key 'color'"),
        (("sim", "--fault", "comm-slow@rank=1,factor=x"), "factor='x' is not a number"),
        (("sim", "--ranks", "6", "--tp", "4"), "must be a multiple of tp × pp"),
        (("demo", "--fault", "noncomm-hang@rank=99"), "rank 99 outside 0..15"),
        (("analyze",), "the following arguments are required: PATH"),
        (("analyze", "/nonexistent/job.c4d"), "/nonexistent/job.c4d"),
        (("master", "--bind", "nonsense://x"), "cannot bind the master to nonsense://x"),
        # the trace's path, not the endpoint, is what failed (it said "cannot bind tcp://...")
        # (--status-bind none: "auto" takes the port below the one bound, which another test's
        # socket may hold at that moment, and says so in a warning line of its own)
        (
            (
                "master",
                "--bind",
                "tcp://127.0.0.1:*",
                "--status-bind",
                "none",
                "--trace",
                "/nonexistent/dir/x.c4d",
            ),
            "c4d master: cannot write the trace /nonexistent/dir/x.c4d: No such file or directory",
        ),
        (("check",), "the following arguments are required"),
        (("check", "nodes", "--nodes", "1"), "a node check needs at least 2 nodes"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args, says, tmp_path):
    p = run(*args, env={"HOME": str(tmp_path)}, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert says in p.stderr and "Traceback" not in p.stderr and "usage:" not in p.stderr
    if p.stderr.startswith(("c4d: ", "c4d sim: argument", "c4d analyze: the")):
        assert "--help)" in p.stderr  # the hint in place of the usage block


def test_a_busy_metrics_port_is_named_not_the_endpoint(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run("master", "--bind", "tcp://127.0.0.1:*", "--status-bind", "none", "--metrics-port", str(port),
                env={"HOME": str(tmp_path)}, timeout=60)  # fmt: skip
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stderr.strip() == f"c4d master: cannot serve metrics on 127.0.0.1:{port}: Address already in use"


def _subparsers(ap: argparse.ArgumentParser, prefix: str = "c4d"):
    yield prefix, ap
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _subparsers(sp, f"{prefix} {name}")


def test_every_option_has_help_and_its_default():
    for name, ap in _subparsers(build_parser()):
        fmt = ap._get_formatter()
        for a in ap._actions:
            if isinstance(a, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
                continue
            what = f"{name} {'/'.join(a.option_strings) or a.dest}"
            assert a.help, f"{what} has no help text"
            d = a.default
            if d is not None and d is not False and d != [] and d is not argparse.SUPPRESS:
                assert "default" in fmt._expand_help(a), f"{what}: help does not show its default {d!r}"


def test_help_of_sim_shows_defaults_and_the_exit_status():
    p = run("sim", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    for want in (
        "--ranks N ranks (processes) in the job (default: 8)",
        "--ranks-per-node K ranks per simulated node (default: 4)",
        "--max-seconds S stop the job after S seconds (default: 600.0)",
        "default: 20, or 300 with --quick",
        "exit status: 0 ok",
    ):
        assert want in text, want


def test_sim_surfaces_the_ranks_warnings_about_bad_variables(libc4d, simtrain):
    p = run("sim", "--ranks", 4, "--ranks-per-node", 2, "--steps", 5, env={"C4D_HANG_TIMEOUT": "abc"})
    assert p.returncode == 0, p.stderr
    warn = [line for line in p.stderr.splitlines() if "C4D_HANG_TIMEOUT" in line]
    assert warn == [
        "c4d WARNING every rank: c4d: C4D_HANG_TIMEOUT='abc' is not a positive integer; using 10000000"
    ]


@pytest.mark.slow
def test_export_writes_hex_comm_ids(tmp_path, libc4d, simtrain):
    import pandas as pd

    tr = tmp_path / "j.c4d"
    p = run("sim", "--ranks", 4, "--ranks-per-node", 2, "--tp", 2, "--steps", 5, "--trace", tr)
    assert p.returncode == 0, p.stderr
    for table in ("ops", "comms"):
        out = tmp_path / f"{table}.parquet"
        p = run("export", tr, out, "--table", table)
        assert p.returncode == 0, p.stderr
        ids = pd.read_parquet(out)["comm_id"]
        assert ids.map(lambda s: isinstance(s, str) and len(s) == 16 and int(s, 16) > 0).all()
    p = run("analyze", tr)
    assert set(pd.read_parquet(tmp_path / "ops.parquet")["comm_id"]) <= set(p.stdout.split())


@pytest.mark.serial
@pytest.mark.slow
def test_demo_keeps_its_trace_and_blacklist(tmp_path, libc4d, simtrain):
    """By default in ./c4d-demo, which it names at its start, and nowhere else in the folder it runs in
    (the repository ignores c4d-demo/)."""
    out = tmp_path / "c4d-demo"
    p = run("demo", "--no-live", "--quick", timeout=300, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr  # it found (and isolated) the injected hang
    assert f"The trace and the blacklist are kept in {out}/" in p.stdout
    assert {f.relative_to(tmp_path).as_posix() for f in tmp_path.rglob("*")} == {
        "c4d-demo",
        "c4d-demo/demo.c4d",
        "c4d-demo/blacklist.txt",
    }
    assert "c4d report c4d-demo/demo.c4d -o c4d-demo/report" in p.stdout  # the report goes there too
    out = out.relative_to(tmp_path)  # as the demo prints it
    assert (tmp_path / out / "blacklist.txt").read_text() == "node-1\n"
    assert f"blacklist it would apply: node-1 ({out / 'blacklist.txt'})" in p.stdout
    row = next(line for line in p.stdout.splitlines() if line.startswith("1  RankNonCommHang"))
    assert "ERROR" in row and "rank 6" in row
    a = run("analyze", out / "demo.c4d", "--json", cwd=tmp_path)
    assert a.returncode == 2 and any(json.loads(line)["ranks"] == [6] for line in a.stdout.splitlines())
    written = ["c4d-demo/blacklist.txt", "c4d-demo/demo.c4d"]
    ignored = subprocess.run(["git", "check-ignore", *written], cwd=Path(__file__).resolve().parents[1],
                             capture_output=True, text=True)  # fmt: skip
    if "not a git repository" in ignored.stderr:
        return  # an unpacked source tree: nothing to ignore
    assert ignored.stdout.split() == written, "the repository must ignore what c4d demo writes"


@pytest.mark.serial
@pytest.mark.slow
def test_demo_with_a_slow_fault(tmp_path, libc4d, simtrain):
    out = tmp_path / "demo"
    p = run("demo", "--no-live", "--quick", "--out", out, "--fault", "noncomm-slow@rank=9,step=20,factor=4")
    assert p.returncode == 0, p.stdout + p.stderr  # INFO only: nothing at WARNING or above
    row = next(line for line in p.stdout.splitlines() if line.startswith("1  RankNonCommSlow"))
    assert "rank 9" in row and "node-2" in row
    assert "blacklist it would apply: (none)" in p.stdout and not (out / "blacklist.txt").exists()
    assert "c4d INFO #1 RankNonCommSlow: rank 9 [node-2]" in p.stderr


def test_json_and_live_do_not_mix_on_stdout(libc4d, simtrain):
    p = run("sim", "--quick", "--ranks", 4, "--ranks-per-node", 2, "--fault", "noncomm-hang@rank=1,step=5",
            "--json", "--live")  # fmt: skip
    assert p.returncode == 2, p.stderr
    objs = [json.loads(line) for line in p.stdout.splitlines()]  # stdout is JSON lines only
    assert objs and {o["kind"] for o in objs} == {"RankNonCommHang"} and objs[-1]["level"] == "ERROR"
    assert "ranks by node" in p.stderr  # the view went to stderr
