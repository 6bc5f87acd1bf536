"""docs/deploy.md's node check, exercised: the torchrun, srun and Kubernetes forms of `c4d check
nodes` across hosts, read from the page and run here as far as this machine allows.

* `c4d` is this checkout's CLI (a wrapper on PATH); every "host" is a process of its own on this
  one (its own session and folder, its own node name), joined only through the rendezvous.
* Placeholders are substituted and said so: `master-host` -> 127.0.0.1, port 29400 -> a free
  port; `hostname` is a fake printing `localhost` (the batch host's address, as in test_deploy).
* torchrun is torch's own (CPU build): four real agents with the c10d rendezvous backend.
* srun and kubectl are not here: tests/fake_bin/srun-tasks and tests/fake_bin/kubectl-job stand
  in for them (each says what it plays); the tasks and pods they start are real `c4d` processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from c4d.check import faults, multihost
from tests.conftest import free_port, wait_for
from tests.test_check_nodes_multihost import LAUNCH_VARS

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "deploy.md"
FAKES = ROOT / "tests" / "fake_bin"
BLOCKS = {
    m[1]: m[2] for m in re.finditer(r"<!-- (?:test|file): (\S+) -->\n```\w*\n(.*?)```", DOC.read_text(), re.S)
}


def _exe(path: Path, body: str) -> None:
    path.write_text(body)
    path.chmod(0o755)


@pytest.fixture()
def tools(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    py = sys.executable
    _exe(b / "c4d", f'#!/bin/sh\nPYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} exec {py} -m c4d "$@"\n')
    _exe(b / "hostname", "#!/bin/sh\necho localhost\n")
    _exe(b / "srun", f'#!/bin/sh\nexec {py} {FAKES / "srun-tasks"} "$@"\n')
    _exe(b / "kubectl", f'#!/bin/sh\nexec {py} {FAKES / "kubectl-job"} "$@"\n')
    return b


def _env(tools: Path, **extra) -> dict[str, str]:
    # the interpreter's bin/ next: torchrun, as an activated virtualenv has it
    env = {**os.environ, "PATH": f"{tools}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env["PYTHONPATH"] = str(ROOT)
    for k in LAUNCH_VARS:
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _wait_all(procs: list[subprocess.Popen], timeout: float = 240) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_host(p.pid)


def test_the_page_has_every_form():
    assert {"nodes-torchrun", "nodes-slurm", "node-check.yaml", "nodes-kubectl"} <= set(BLOCKS)


# -- torchrun -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_torchrun_four_agents_name_the_slow_node(tools, tmp_path):
    port = free_port()
    cmd = BLOCKS["nodes-torchrun"].replace("master-host", "127.0.0.1").replace("29400", str(port))
    procs = []
    for k in range(4):
        d = tmp_path / f"node-{k}"
        d.mkdir()
        env = _env(tools, C4D_NODE_NAME=f"node-{k}", **{faults.ENV: "slow:node-2:6"})
        with open(d / "log", "w") as log:
            procs.append(
                subprocess.Popen(
                    ["bash", "-c", cmd],
                    cwd=d,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    rc = _wait_all(procs)
    logs = {k: (tmp_path / f"node-{k}" / "log").read_text() for k in range(4)}
    reports = [p for p in tmp_path.glob("node-*/node-check.json")]
    assert len(reports) == 1, logs  # rank 0's agent's folder only
    report = json.loads(reports[0].read_text())
    assert report["stragglers"] == ["node-2"] and report["faulty"] == [], report
    assert report["launch"]["how"] == "torchrun" and report["launch"]["world_size"] == 4
    assert sorted(w["node"] for w in report["workers"]) == [f"node-{k}" for k in range(4)]
    rank0 = reports[0].parent
    assert (rank0 / "bad-nodes.txt").read_text().split() == ["node-2"]
    assert "Stragglers (> 2x median): node-2" in (rank0 / "log").read_text()
    # each worker exited 2 (the check's status), which each agent reports as its worker's failure
    assert all(r != 0 for r in rc), (rc, logs)
    assert all("exitcode  : 2" in text for text in logs.values()), logs


def _tree(root: int) -> set[int]:
    """``root`` and every process below it."""
    parent: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    below, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in below} - below
        below |= more
        grew = bool(more)
    return below


def _worker_env(agent: int) -> dict[str, str] | None:
    """The environment torchrun gave the worker under process ``agent`` (the agent, or the shell
    that started it), once the worker runs: its RANK and where the workers' store is."""
    for pid in sorted(_tree(agent) - {agent}):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
            return env
    return None


def _kill_host(root: int) -> None:
    """SIGKILL a "host": the agent's process group and everything below it (torchrun starts its
    workers in sessions of their own)."""
    pids = _tree(root)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(root, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_torchrun_agent_killed_mid_round_is_named(tools, tmp_path):
    """node-3's "host" (its agent and worker) is killed once its worker has its round-1 work; the other
    three finish and rank 0 names it. node-3 is slow, so that it is still inside its group then.
    node-0's agent starts first: it hosts the c10d rendezvous (torchrun cannot lose that one)
    and, with the lowest pid on this one host, gets rank 0. node-3's worker is found by its
    agent's session; its rank and the workers' store are in its environment."""
    import torch.distributed as dist

    port = free_port()
    cmd = BLOCKS["nodes-torchrun"].replace("master-host", "127.0.0.1").replace("29400", str(port))
    cmd = cmd.replace("--report", "--timeout 5 --report")  # each slow step is under it
    procs = []

    def start(k: int) -> None:
        d = tmp_path / f"node-{k}"
        d.mkdir()
        env = _env(tools, C4D_NODE_NAME=f"node-{k}", **{faults.ENV: "slow:node-3:100"})
        with open(d / "log", "w") as log:
            out = {"stdout": log, "stderr": subprocess.STDOUT}
            procs.append(subprocess.Popen(["bash", "-c", cmd], cwd=d, env=env, start_new_session=True, **out))

    try:
        start(0)
        wait_for(lambda: _listening(port), timeout=120, what="node-0's agent to host the rendezvous")
        for k in (1, 2, 3):
            start(k)
        env = wait_for(lambda: _worker_env(procs[3].pid), timeout=150, what="node-3's worker")
        rank = int(env["RANK"])
        assert rank != 0, "node-3's agent got rank 0: the victim would be the coordinator"
        launch = multihost.Launch("torchrun", rank, 4, env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                                  agent_store=True, attempt=env["TORCHELASTIC_RESTART_COUNT"])  # fmt: skip
        raw = dist.TCPStore(launch.host, launch.port, is_master=False, timeout=timedelta(seconds=60))
        store = dist.PrefixStore(launch.prefix, raw)
        wait_for(lambda: store.check([f"cmd/{rank}/0"]), timeout=150, what="node-3's round-1 work")
        _kill_host(procs[3].pid)
        assert not store.check([f"ans/{rank}/0"])  # it died inside its group, before it answered
        rc = [p.wait(timeout=180) for p in procs[:3]]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_host(p.pid)
    logs = {k: (tmp_path / f"node-{k}" / "log").read_text() for k in range(4)}
    (report_file,) = tmp_path.glob("node-*/node-check.json")
    report = json.loads(report_file.read_text())
    assert report["faulty"] == ["node-3"] and report["stragglers"] == [], (report, logs)
    v = {v["node"]: v for v in report["nodes"]}
    assert v["node-3"]["reason"].startswith(f"worker died: lost: no heartbeat from rank {rank} (node-3, pid ")
    for n in ("node-0", "node-1", "node-2"):  # the rest: measured and passed
        assert v[n]["status"] == "ok" and v[n]["time_s"] > 0, v[n]
    assert rc == [1, 1, 1], (rc, logs)  # each surviving agent: its worker exited 2, torchrun's failure
    assert all("exitcode  : 2" in logs[k] for k in range(3)), logs


# -- Slurm ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_slurm_one_task_per_node_names_the_slow_node(tools, tmp_path):
    (tmp_path / "node-check.sbatch").write_text(BLOCKS["nodes-slurm"])
    jid = str(uuid.uuid4().int % 10**6)
    log = tmp_path / "calls.jsonl"
    # what sbatch would give the batch script; MASTER_PORT moves the rendezvous to a free port
    env = _env(tools, SLURM_JOB_ID=jid, SLURM_NNODES=4, FAKE_LOG=log, MASTER_PORT=free_port(),
               **{faults.ENV: "slow:node-1:6"})  # fmt: skip
    p = subprocess.run(
        ["bash", "node-check.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 2, p.stdout + p.stderr  # the worst task's status: a node failed
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call[:5] == ["srun", "--ntasks-per-node=1", "c4d", "check", "nodes"]
    report = json.loads((tmp_path / f"node-check-{jid}.json").read_text())
    assert report["stragglers"] == ["node-1"], report
    assert report["launch"]["how"] == "slurm" and report["launch"]["store"].startswith("localhost:")
    assert [w["node"] for w in report["workers"]] == [
        f"node-{k}" for k in range(4)
    ]  # Slurm's names, in rank order
    assert (tmp_path / "bad-nodes.txt").read_text().split() == ["node-1"]  # ready for sbatch --exclude
    assert "Stragglers (> 2x median): node-1" in p.stdout


# -- Kubernetes -----------------------------------------------------------------------------------
def _manifests() -> tuple[dict, dict]:
    docs = {d["kind"]: d for d in yaml.safe_load_all(BLOCKS["node-check.yaml"])}
    return docs["Service"], docs["Job"]


def test_kubernetes_manifest_is_consistent():
    svc, job = _manifests()
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    cmd = c["command"]
    assert cmd[:3] == ["c4d", "check", "nodes"]
    host, port = cmd[cmd.index("--rdzv-endpoint") + 1].rsplit(":", 1)
    # one pod per index, as many as --nodes; rank = JOB_COMPLETION_INDEX, no --node-rank needed
    assert spec["completionMode"] == "Indexed" and "--node-rank" not in cmd
    assert spec["completions"] == spec["parallelism"] == int(cmd[cmd.index("--nodes") + 1])
    assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    # the endpoint is pod 0 (rank 0) through the headless Service that selects the Job's pods
    name = job["metadata"]["name"]
    assert host == f"{name}-0.{svc['metadata']['name']}" and pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}  # the label Jobs give their pods
    (sport,) = svc["spec"]["ports"]
    assert sport["port"] == int(port) and {"containerPort": int(port)}.items() <= c["ports"][0].items()
    # one pod per node, named as Kubernetes names the node (for kubectl cordon)
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == svc["spec"]["selector"]
    env = {e["name"]: e.get("valueFrom") for e in c["env"]}
    assert env["C4D_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.slow
def test_kubectl_runs_the_job_and_reads_rank_0(tools, tmp_path):
    (tmp_path / "node-check.yaml").write_text(BLOCKS["node-check.yaml"])
    log, state = tmp_path / "calls.jsonl", tmp_path / "cluster"
    env = _env(tools, FAKE_LOG=log, FAKE_K8S_DIR=state, FAKE_K8S_PORTS=f"29400={free_port()}")
    script = BLOCKS["nodes-kubectl"].replace("sleep 5", "sleep 0.5")  # polls the fake more often
    p = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "service/node-check created" in p.stdout and "job/node-check created" in p.stdout
    # rank 0's pod: every node joined under its Kubernetes name, and passed
    assert "NodeCheck join: Succeed (4 of 4 ranks joined through rdzv-endpoint at 127.0.0.1:" in p.stdout
    for k in range(4):
        assert re.search(rf"NodeCheck k8s-node-{k}: Succeed \([\d.]+ ms", p.stdout), p.stdout
    assert "All 4 nodes passed." in p.stdout and "job/node-check deleted" in p.stdout
    assert [(state / f"pod-{k}" / "rc").read_text().strip() for k in range(4)] == ["0"] * 4
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0] == ["apply", "-f", "node-check.yaml"] and calls[-1] == ["delete", "-f", "node-check.yaml"]
    assert calls[-2][0] == "logs" and calls[-3][:3] == ["get", "job", "node-check"]
