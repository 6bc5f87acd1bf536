"""`c4d check nodes` across hosts: separate worker processes that meet only through the
rendezvous endpoint, as torchrun's agents, srun's tasks or a Job's pods start them on N hosts.

Every "host" here is a process of its own: its own session (process group leader, so a kill takes
the whole host's processes), its own node name (C4D_NODE_NAME), nothing shared with the others
but the rendezvous endpoint on loopback. Faults come from C4D_CHECK_SIM_FAULT (c4d/check/faults.py),
read by each worker for its own node name; a host that dies is SIGKILLed with its process group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from c4d.check import faults, multihost
from tests.conftest import free_port, wait_for

pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[1]
NAMES = ["node-a", "node-b", "node-c", "node-d"]
# a group with a dead or missing member fails within this; a silent host is lost after 5 s
TIMEOUT = ["--timeout", "3"]


class Host:
    """One worker process standing for one host."""

    def __init__(self, tmp: Path, rank: int, name: str, args: list[str], env: dict[str, str]):
        self.rank, self.name = rank, name
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "c4d.check", "nodes", *args],
                stdout=out,
                stderr=err,
                env={**env, "C4D_NODE_NAME": name},
                start_new_session=True,
            )

    def wait(self, timeout: float = 180) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()


# what a launcher or an injected fault would set: a host's worker starts without the test's own
LAUNCH_VARS = (
    faults.ENV,
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "C4D_NODE_NAME",
)


def _env(fault: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for k in LAUNCH_VARS:
        env.pop(k, None)
    if fault:
        env[faults.ENV] = fault
    return env


def start_hosts(tmp, names, port, extra=(), fault=None, ranks=None, world=None) -> list[Host]:
    world = world or len(names)
    hosts = []
    for r, name in enumerate(names):
        if ranks is not None and r not in ranks:
            continue
        args = ["--rdzv-endpoint", f"127.0.0.1:{port}", "--nodes", str(world), "--node-rank", str(r)]
        hosts.append(Host(tmp, r, name, [*args, *TIMEOUT, *extra], _env(fault)))
    return hosts


def finish(hosts: list[Host], timeout: float = 180) -> list[int]:
    try:
        return [h.wait(timeout) for h in hosts]
    finally:
        for h in hosts:
            h.kill()


def report_of(hosts: list[Host], rc) -> dict:
    rank0 = hosts[0]
    assert rank0.rank == 0
    text = rank0.stdout()
    assert text.strip(), f"rank 0 printed nothing (status {rc}): {rank0.stderr()[-3000:]}"
    return json.loads(text)


# -- the launch environment ---------------------------------------------------------------------
def test_detect_reads_torchrun_slurm_and_the_endpoint():
    torchrun = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "29500",
                "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "1"}  # fmt: skip
    la = multihost.detect(torchrun)
    assert (la.how, la.rank, la.world, la.host, la.port, la.agent_store) == (
        "torchrun",
        2,
        4,
        "h0",
        29500,
        True,
    )
    assert la.prefix == "c4d-check-nodes/1/" and not la.hosts_store
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "12345",
             "SLURM_STEP_NODELIST": "gpu[07-08],login1"}  # fmt: skip
    la = multihost.detect(slurm)
    assert (la.how, la.rank, la.world, la.host, la.port) == ("slurm", 0, 3, "gpu07", 22345)
    assert la.hosts_store and [la.placeholder(r) for r in range(3)] == ["gpu07", "gpu08", "login1"]
    assert multihost.detect({**slurm, "MASTER_ADDR": "b", "MASTER_PORT": "7"}).host == "b"
    # a batch script (no step) is not a task of a multi-host run; nor is a plain shell
    assert multihost.detect({k: v for k, v in slurm.items() if k != "SLURM_STEP_ID"}) is None
    assert multihost.detect({}) is None
    la = multihost.detect({"JOB_COMPLETION_INDEX": "3"}, "check-0.check:29400", nodes=4)
    assert (la.how, la.rank, la.world, la.host, la.port) == ("rdzv-endpoint", 3, 4, "check-0.check", 29400)
    assert [la.placeholder(r) for r in (0, 3)] == ["rank-0", "rank-3"]
    assert multihost.expand_hostlist("n[1-2,010-011]x,m") == ["n1x", "n2x", "n010x", "n011x", "m"]
    assert multihost.expand_hostlist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]


ENV4 = {"WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
SLURM2 = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}


@pytest.mark.parametrize(
    "env,kw,message",
    [
        ({**ENV4, "RANK": "x"}, {}, "RANK='x' is not an integer"),
        ({**ENV4, "RANK": "0", "WORLD_SIZE": "1"}, {}, "needs at least 2 nodes"),
        ({**ENV4, "RANK": "0"}, {"nodes": 3}, "--nodes 3 but this env run has 4 ranks"),
        ({}, {"rdzv_endpoint": "h:1"}, "--rdzv-endpoint needs --nodes N"),
        ({}, {"rdzv_endpoint": "h:1", "nodes": 2}, "needs --node-rank R"),
        ({}, {"rdzv_endpoint": "h", "nodes": 2, "node_rank": 0}, "expected HOST:PORT"),
        ({}, {"rdzv_endpoint": "h:1", "nodes": 2, "node_rank": 2}, "rank 2 is outside 0..1"),
        ({**SLURM2, "SLURM_STEP_NODELIST": "n[a-b]"}, {}, "cannot read the range 'a-b'"),
    ],
)
def test_bad_launch_input(env, kw, message):
    with pytest.raises(multihost.LaunchError, match=re.escape(message)):
        multihost.detect(env, **kw)


@pytest.mark.parametrize(
    "env,args,message",
    [
        ({**ENV4, "RANK": "x"}, [], "c4d check nodes: RANK='x' is not an integer"),
        (
            {},
            ["--rdzv-endpoint", "h:1", "--nodes", "2"],
            "c4d check nodes: --rdzv-endpoint needs --node-rank R",
        ),
    ],
)
def test_bad_launch_input_is_one_line(env, args, message):
    p = subprocess.run(
        [sys.executable, "-m", "c4d.check", "nodes", *args],
        capture_output=True,
        text=True,
        env={**_env(), **env},
        timeout=120,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.startswith(message) and len(p.stderr.splitlines()) == 1


@pytest.mark.slow
def test_unreachable_store_is_one_line():
    port = free_port()  # nothing listens there: rank 1 gives up after --join-timeout
    p = subprocess.run(
        [sys.executable, "-m", "c4d.check", "nodes", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nodes", "2",
         "--node-rank", "1", "--join-timeout", "2"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("c4d check nodes: rank 1 (")
        and f"cannot reach the rendezvous store at 127.0.0.1:{port}" in last
    )


# -- separate hosts through the endpoint --------------------------------------------------------
BY_HAND = re.search(
    r"<!-- test: nodes-by-hand -->\n```bash\n(.*?)```", (REPO / "docs" / "check.md").read_text(), re.S
)[1]


@pytest.mark.slow
def test_separate_hosts_name_the_slow_node(tmp_path):
    """docs/check.md's by-hand command on 4 "hosts" (check-host -> 127.0.0.1, port -> a free one,
    each host in a folder of its own, $R its rank; the short --timeout and a blacklist added)."""
    port = free_port()
    cmd = BY_HAND.replace("check-host", "127.0.0.1").replace("29400", str(port)).strip()
    cmd += f" {' '.join(TIMEOUT)} --blacklist bad-nodes.txt"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "c4d").write_text(f'#!/bin/sh\nexec {sys.executable} -m c4d "$@"\n')
    (bin_ / "c4d").chmod(0o755)
    procs = []
    for r, name in enumerate(NAMES):
        d = tmp_path / name
        d.mkdir()
        env = {
            **_env("slow:node-c:6"),
            "C4D_NODE_NAME": name,
            "R": str(r),
            "PATH": f"{bin_}:{os.environ['PATH']}",
        }
        with open(d / "out", "w") as out, open(d / "err", "w") as err:
            procs.append(
                subprocess.Popen(
                    ["bash", "-c", cmd], cwd=d, env=env, stdout=out, stderr=err, start_new_session=True
                )
            )
    try:
        rc = [p.wait(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    a, b, c, d = (tmp_path / n for n in NAMES)
    assert rc == [2, 2, 2, 2], [(x / "err").read_text()[-2000:] for x in (a, b, c, d)]  # the check's status
    report = json.loads((a / "out").read_text())
    assert report["stragglers"] == ["node-c"], report
    assert report["faulty"] == [] and report["unresolved"] == []
    assert [v["node"] for v in report["nodes"]] == NAMES
    assert report["launch"]["how"] == "rdzv-endpoint" and report["launch"]["world_size"] == 4
    assert [(w["rank"], w["node"], w["joined"]) for w in report["workers"]] == [
        (r, n, True) for r, n in enumerate(NAMES)
    ]
    assert len({w["pid"] for w in report["workers"]}) == 4  # four processes, one per "host"
    assert report["rounds"] >= 2
    assert json.loads((a / "node-check.json").read_text()) == report  # --report, on rank 0's host only
    assert (a / "bad-nodes.txt").read_text().split() == ["node-c"]
    assert not any((x / "node-check.json").exists() or (x / "bad-nodes.txt").exists() for x in (b, c, d))
    # the slow node's own host says so in one line; the other non-zero ranks stay quiet
    assert (
        "c4d check nodes: node-c (rank 2): straggler: every group it ran in was slow"
        in (c / "err").read_text()
    )
    assert (b / "out").read_text() == (c / "out").read_text() == (d / "out").read_text() == ""


@pytest.mark.slow
def test_host_killed_mid_round_is_named_and_the_rest_report(tmp_path):
    """node-d is slow (so that it is still inside its round-1 group when it dies) and its host is
    killed once it has its round-1 work; the others finish their rounds and rank 0 reports."""
    import torch.distributed as dist

    port = free_port()
    # 100x: each of its steps sleeps 100x its natural time (still under the 5 s group timeout)
    hosts = start_hosts(tmp_path, NAMES, port, ["--json", "--timeout", "5"], fault="slow:node-d:100")
    try:
        launch = multihost.Launch("rdzv-endpoint", 1, 4, "127.0.0.1", port)
        store = dist.PrefixStore(
            launch.prefix, dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
        )
        wait_for(lambda: store.check(["cmd/3/0"]), timeout=150, what="node-d's round-1 work")
        hosts[3].kill()
        assert not store.check(["ans/3/0"])  # it died inside its group, before it answered
    finally:
        rc = finish(hosts)
    report = report_of(hosts, rc)
    assert rc[:3] == [2, 2, 2] and rc[3] == -signal.SIGKILL
    assert report["faulty"] == ["node-d"], report
    v = {v["node"]: v for v in report["nodes"]}
    assert v["node-d"]["reason"].startswith("worker died: lost: no heartbeat from rank 3 (node-d, pid ")
    for n in ("node-a", "node-b", "node-c"):  # the rest: measured and passed
        assert v[n]["status"] == "ok" and v[n]["time_s"] > 0, v[n]
    r1 = [g for g in report["groups"] if g["round"] == 1]
    assert [g["ok"] for g in r1] == [True, False]  # node-c's group broke with node-d
    assert any(g["ok"] and "node-c" in g["nodes"] for g in report["groups"] if g["round"] == 2)


@pytest.mark.slow
def test_rank_that_never_joins_is_named(tmp_path):
    hosts = start_hosts(tmp_path, NAMES, free_port(), ["--join-timeout", "10"], ranks={0, 1, 2})
    rc = finish(hosts)
    out = hosts[0].stdout()
    assert rc == [2, 2, 2], out + hosts[0].stderr()
    assert "NodeCheck join rank-3: Failed (rank 3 did not join within 10 s)" in out
    assert "NodeCheck join: Failed (3 of 4 ranks joined through rdzv-endpoint" in out
    assert "NodeCheck round 1 node-a+node-b+node-c: Succeed" in out  # the three that came, as a triple
    assert "NodeCheck rank-3: Failed (faulty: worker died: did not join within 10 s)" in out
    for n in ("node-a", "node-b", "node-c"):
        assert f"NodeCheck {n}: Succeed" in out


@pytest.mark.slow
def test_ranks_give_up_when_rank_0_dies(tmp_path):
    """Rank 0 holds the result and the store: when its host dies mid-round, the other rank says
    so in one line and exits 1 instead of waiting forever."""
    import torch.distributed as dist

    port = free_port()
    hosts = start_hosts(tmp_path, NAMES[:2], port, fault="slow:node-a:100")
    try:
        store = dist.PrefixStore(
            multihost.Launch("rdzv-endpoint", 1, 2, "127.0.0.1", port).prefix,
            dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120)),
        )
        wait_for(lambda: store.check(["cmd/1/0"]), timeout=150, what="round 1")
        hosts[0].kill()
    finally:
        rc = finish(hosts[1:], timeout=120)
    assert rc == [1]
    last = hosts[1].stderr().strip().splitlines()[-1]
    assert last.startswith("c4d check nodes: rank 1 (node-b): "), last
    assert (
        "lost the rendezvous store at 127.0.0.1" in last
        or "the coordinator (rank 0) has sent no heartbeat" in last
    )
    assert hosts[1].stdout() == ""


@pytest.mark.slow
def test_node_worker_that_crashes_is_named_with_its_status(tmp_path):
    """node-b's node worker (the child behind its relay) exits when given work: its host stays
    up, says how the child died, and exits with the check's status like the others."""
    hosts = start_hosts(tmp_path, NAMES, free_port(), ["--json"], fault="crash:node-b")
    rc = finish(hosts)
    report = report_of(hosts, rc)
    assert rc == [2, 2, 2, 2]
    assert report["faulty"] == ["node-b"], report
    v = {v["node"]: v for v in report["nodes"]}
    assert v["node-b"]["reason"] == f"worker died: worker exited with status {faults.CRASH_STATUS}"
    assert all(v[n]["status"] == "ok" for n in ("node-a", "node-c", "node-d"))


def test_the_worker_of_the_torchrun_agent_that_hosts_the_rendezvous_knows_it(tmp_path):
    """The rank that must leave last finds its agent through /proc: a parent started with
    ``--rdzv-endpoint host:PORT`` (or PET_RDZV_ENDPOINT) that listens on PORT. A real parent
    process and child here, standing in for torchrun's agent and its worker."""
    child = (
        "import os; from c4d.check import multihost as m; a = os.getppid(); p = m.rendezvous_port(a); "
        "print(p, m.listens_on(a, p) if p else None)"
    )
    parent = (
        "import socket, subprocess, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[2]))); "
        "s.listen() if sys.argv[3] == 'listen' else None; "
        f"r = subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True); "
        "print(r.stdout, end='')"
    )
    port = free_port()

    def run(*args: str, env: dict | None = None) -> str:
        env = {**os.environ, **(env or {})}
        out = subprocess.run(
            [sys.executable, "-c", parent, *args], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert run("-", str(port), "listen") == "None None"  # no endpoint: not torchrun's agent
    assert run("--rdzv-endpoint", str(port), "listen") == "29400 False"  # a host name: the default port
    assert run(f"--rdzv-endpoint=127.0.0.1:{port}", str(port), "listen") == f"{port} True"
    assert run(f"--rdzv_endpoint=127.0.0.1:{port}", str(port), "bound") == f"{port} False"  # not listening
    assert run("-", str(port), "listen", env={"PET_RDZV_ENDPOINT": f"localhost:{port}"}) == f"{port} True"
    assert run("-", str(port), "listen", env={"PET_RDZV_ENDPOINT": "localhost"}) == "29400 False"
