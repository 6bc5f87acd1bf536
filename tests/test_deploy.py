"""docs/deploy.md, exercised: every command block is read from the page and run here, as far as
this machine allows.

* `c4d` is this checkout's CLI (a two-line wrapper on PATH: `python -m c4d "$@"`).
* `train.py` is played by simnccl's training loop (`c4d-simtrain`, real NCCL calls into simnccl,
  the shim preloaded); torch's real `torchrun` (CPU build) launches it with `--no-python`.
* Placeholders are substituted and said so: `master-host` → 127.0.0.1, ports → free ports,
  4 nodes × 8 GPUs → 2 × 2 processes on this host.
* Slurm's `sbatch` and `srun` and Kubernetes' `kubectl` are not here: recording fakes stand in
  for them (written below; each says what it does). `hostname` is a fake printing `localhost`
  so that the batch host's address resolves on any test machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from c4d.record import schema, trace
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "deploy.md"


def blocks() -> dict[str, str]:
    """Code blocks of deploy.md by the marker comment above them (<!-- test: X --> / <!-- file: X -->)."""
    text = DOC.read_text()
    out = {}
    for m in re.finditer(r"<!-- (?:test|file): (\S+) -->\n```\w*\n(.*?)```", text, re.S):
        out[m[1]] = m[2]
    return out


BLOCKS = blocks()


def test_every_block_is_tested():
    assert set(BLOCKS) == {
        "reach",
        "torchrun-single",
        "torchrun-multi",
        "torchrun-agents",
        "slurm-script",
        "slurm-submit",
        "c4d-master.yaml",
        "train.yaml",
        "kubectl",
        # the node check's section: run by tests/test_check_nodes_launchers.py
        "nodes-torchrun",
        "nodes-slurm",
        "node-check.yaml",
        "nodes-kubectl",
    }
    # and no command block on the page escapes the markers
    text = DOC.read_text()
    fenced = re.findall(r"```(bash|yaml)\n", text)
    assert len(fenced) == len(BLOCKS)


def _exe(path: Path, body: str) -> None:
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture()
def tools(tmp_path):
    """A bin/ folder put first on PATH: the c4d wrapper, python, and the fakes."""
    b = tmp_path / "bin"
    b.mkdir()
    py, root = shlex.quote(sys.executable), shlex.quote(str(ROOT))
    _exe(b / "c4d", f'#!/bin/sh\nPYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}} exec {py} -m c4d "$@"\n')
    # a wrapper, not a symlink: a virtualenv's interpreter reached through a link elsewhere
    # finds no pyvenv.cfg beside it and starts without the virtualenv's packages
    _exe(b / "python", f'#!/bin/sh\nexec {py} "$@"\n')
    _exe(b / "hostname", "#!/bin/sh\necho localhost\n")
    return b


def _env(tools: Path, **extra) -> dict[str, str]:
    # then the interpreter's own bin/ (torchrun, as an activated virtualenv has it)
    path = f"{tools}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}
    env.pop("C4D_MASTER_ADDR", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _train(simtrain: Path, job_dir: Path, steps: int = 10) -> str:
    return f"--no-python {simtrain} --steps {steps} --tp 2 --job-dir {job_dir}"


def _bash(script: str, env, cwd, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# -- ports and reach --------------------------------------------------------------------------
def test_reach_a_master(tools, tmp_path, libc4d, simtrain):
    port = free_port()
    master = subprocess.Popen(
        [
            str(tools / "c4d"),
            "master",
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--trace",
            str(tmp_path / "m.c4d"),
        ],
        env=_env(tools),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (tmp_path / "m.c4d").exists(), timeout=60, what="the master to start")
        cmd = BLOCKS["reach"].replace("master-host:5555", f"127.0.0.1:{port}")
        p = _bash(cmd, _env(tools), tmp_path)
        assert p.returncode == 0, p.stderr
    finally:
        master.send_signal(signal.SIGTERM)
        master.communicate(timeout=30)
    assert master.returncode == 0
    assert sorted(trace.load(tmp_path / "m.c4d").nodes) == [0, 1]


# -- torchrun ---------------------------------------------------------------------------------
def test_torchrun_single_node(tools, tmp_path, libc4d, simtrain):
    port = free_port()
    job = tmp_path / "job"
    job.mkdir()
    cmd = BLOCKS["torchrun-single"].replace("train.py", _train(simtrain, job))
    # the page relies on the default address; the test moves it to a free port for both sides
    env = _env(tools, C4D_MASTER_ADDR=f"tcp://127.0.0.1:{port}", SIMNCCL_JOB=f"d{uuid.uuid4().hex[:8]}")
    p = _bash(cmd, env, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr  # the master's status: nothing found
    assert "c4d master listening on tcp://127.0.0.1:" in (tmp_path / "c4d-master.log").read_text()
    tr = trace.load(tmp_path / "job.c4d")
    assert sorted(tr.nodes) == list(range(8)) and tr.raw.truncated_bytes == 0
    assert len(tr.ops) > 0 and not (tmp_path / "bad-nodes.txt").exists()


def test_torchrun_several_nodes(tools, tmp_path, libc4d, simtrain):
    port, rdzv = free_port(), free_port()
    master_part, node_part = BLOCKS["torchrun-multi"].split("# on each of the 4 nodes")
    master_part = master_part.replace("5555", str(port)) + "echo $! > master.pid; wait\n"
    master = subprocess.Popen(["bash", "-c", master_part], env=_env(tools), cwd=tmp_path)
    wait_for(lambda: (tmp_path / "job.c4d").exists(), timeout=60, what="the master to start")
    job = tmp_path / "job"
    job.mkdir()
    node_part = (
        node_part.replace("master-host", "127.0.0.1")
        .replace("5555", str(port))
        .replace("29500", str(rdzv))
        .replace("--nnodes 4", "--nnodes 2")
        .replace("--nproc-per-node 8", "--nproc-per-node 2")
        .replace("train.py", _train(simtrain, job))
    )
    sim_job = f"d{uuid.uuid4().hex[:8]}"
    nodes = [
        subprocess.Popen(
            ["bash", "-c", node_part],
            env=_env(tools, C4D_NODE_NAME=name, SIMNCCL_JOB=sim_job),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("node-a", "node-b")
    ]
    try:
        outs = [n.communicate(timeout=240)[0] for n in nodes]
        assert [n.returncode for n in nodes] == [0, 0], outs
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
        pid = (tmp_path / "master.pid").read_text().strip()
        os.kill(int(pid), signal.SIGTERM)
        master.wait(timeout=30)
    tr = trace.load(tmp_path / "job.c4d")
    assert sorted(tr.nodes) == [0, 1, 2, 3]
    assert sorted(set(tr.nodes.values())) == ["node-a", "node-b"]


def test_torchrun_several_nodes_through_agents(tools, tmp_path, libc4d, simtrain):
    """Two "nodes" on this host, each with its agent on a port of its own; the master's trace
    has every rank, and each agent kept its node's full stream."""
    port, rdzv = free_port(), free_port()
    master_part, node_part = BLOCKS["torchrun-agents"].split("# on each of the 4 nodes")
    master_part = master_part.replace("5555", str(port)) + "echo $! > master.pid; wait\n"
    master = subprocess.Popen(["bash", "-c", master_part], env=_env(tools), cwd=tmp_path)
    wait_for(lambda: (tmp_path / "job.c4d").exists(), timeout=60, what="the master to start")
    job = tmp_path / "job"
    job.mkdir()
    sim_job = f"d{uuid.uuid4().hex[:8]}"
    nodes = []
    for name in ("node-a", "node-b"):
        (tmp_path / name).mkdir()
        part = (
            node_part.replace("master-host:5555", f"127.0.0.1:{port}")
            .replace("master-host", "127.0.0.1")
            .replace("5556", str(free_port()))
            .replace("29500", str(rdzv))
            .replace("--nnodes 4", "--nnodes 2")
            .replace("--nproc-per-node 8", "--nproc-per-node 2")
            .replace("train.py", _train(simtrain, job, steps=60))  # see the OPSUM assert
        )
        env = _env(tools, C4D_NODE_NAME=name, SIMNCCL_JOB=sim_job)
        out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        nodes.append(subprocess.Popen(["bash", "-c", part], env=env, cwd=tmp_path / name, **out))
    try:
        outs = [n.communicate(timeout=240)[0] for n in nodes]
        assert [n.returncode for n in nodes] == [0, 0], outs
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
        pid = (tmp_path / "master.pid").read_text().strip()
        os.kill(int(pid), signal.SIGTERM)
        master.wait(timeout=30)
    tr = trace.load(tmp_path / "job.c4d")
    assert sorted(tr.nodes) == [0, 1, 2, 3]
    assert sorted(set(tr.nodes.values())) == ["node-a", "node-b"]
    # the TP all-reduces came summarised, once both ranks of a node had registered with its
    # agent (the ops before that went raw: a rank's first batch may come after its peer's
    # first ops; 60 steps, so that most come after)
    assert (tr.raw.raw["kind"] == schema.Kind.OPSUM).any()
    for name in ("node-a", "node-b"):
        local = trace.load(tmp_path / name / "node.c4d")
        assert set(local.nodes.values()) == {name} and len(local.ops) > 0


# the fakes run on this interpreter: `env python3` may find one without pyyaml, or (a pyenv
# shim) one that puts another install's bin/ first on PATH
PY_SHEBANG = f"#!{sys.executable}\n"


# -- Slurm ------------------------------------------------------------------------------------
FAKE_SBATCH = (
    PY_SHEBANG
    + """# Recording fake of sbatch: logs its argv (JSON line to $FAKE_LOG), then runs the batch script
# the way the batch host would (bash, in the submit folder, SLURM_* from the environment) and
# exits with its status (as `sbatch --wait` would).
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(["sbatch", *args]) + "\\n")
script = [a for a in args if not a.startswith("-")][-1]
sys.exit(subprocess.run(["bash", script]).returncode)
"""
)

FAKE_SRUN = (
    PY_SHEBANG
    + """# Recording fake of srun: logs its argv and the c4d variables it was given (JSON line to
# $FAKE_LOG), then starts $SLURM_NTASKS tasks of the command on this host, $SLURM_NTASKS_PER_NODE
# per "node" (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME=node-K), and exits
# with the worst task status, or $FAKE_SRUN_RC when set (a job that failed).
import json, os, subprocess, sys
args = sys.argv[1:]
keep = ("C4D_MASTER_ADDR", "C4D_LIB", "NCCL_PROFILER_PLUGIN", "LD_PRELOAD")
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(["srun", *args, {k: os.environ.get(k) for k in keep}]) + "\\n")
cmd = args[next(i for i, a in enumerate(args) if not a.startswith("-")):]
n, per = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
procs = [subprocess.Popen(cmd, env={**os.environ, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i % per),
                                    "SLURM_NODEID": str(i // per), "SLURMD_NODENAME": f"node-{i // per}"})
         for i in range(n)]
rc = max(p.wait() for p in procs)
sys.exit(int(os.environ.get("FAKE_SRUN_RC", rc)))
"""
)

TRAIN_PY = """import os, sys
# what a train.py does under srun: Slurm's task ids become the ranks; here the training itself
# is simnccl's loop
env = {**os.environ, "RANK": os.environ["SLURM_PROCID"], "WORLD_SIZE": os.environ["SLURM_NTASKS"],
       "LOCAL_RANK": os.environ["SLURM_LOCALID"], "SIMNCCL_JOB": "s" + os.environ["SLURM_JOB_ID"]}
os.execve(@SIMTRAIN@, [@SIMTRAIN@, "--steps", "10", "--tp", "2", "--job-dir", @JOBDIR@], env)
"""


@pytest.mark.parametrize("job_rc", [0, 3])
def test_slurm_batch_script(tools, tmp_path, libc4d, simtrain, job_rc):
    _exe(tools / "sbatch", FAKE_SBATCH)
    _exe(tools / "srun", FAKE_SRUN)
    job = tmp_path / "job"
    job.mkdir()
    (tmp_path / "train.py").write_text(
        TRAIN_PY.replace("@SIMTRAIN@", repr(str(simtrain))).replace("@JOBDIR@", repr(str(job)))
    )
    (tmp_path / "train.sbatch").write_text(BLOCKS["slurm-script"])
    (tmp_path / "bad-nodes.txt").write_text("node-3\nnode-7\n")
    log = tmp_path / "calls.jsonl"
    jid = str(uuid.uuid4().int % 10**6)
    env = _env(
        tools,
        FAKE_LOG=log,
        SLURM_JOB_ID=jid,
        SLURM_NTASKS=4,
        SLURM_NTASKS_PER_NODE=2,
        C4D_PORT=free_port(),
        **({"FAKE_SRUN_RC": job_rc} if job_rc else {}),
    )
    p = _bash(BLOCKS["slurm-submit"], env, tmp_path)
    assert p.returncode == job_rc, p.stdout + p.stderr  # the job's status comes through
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0] == ["sbatch", "--exclude=node-3,node-7", "train.sbatch"]
    srun = calls[1]
    assert srun[0] == "srun" and srun[-1]["C4D_MASTER_ADDR"].startswith("tcp://localhost:")
    assert srun[-1]["C4D_LIB"] == str(libc4d) and srun[-1]["LD_PRELOAD"] is None  # only the tasks preload
    tr = trace.load(tmp_path / f"c4d-{jid}.c4d")
    assert tr.raw.truncated_bytes == 0  # the trap stopped the master cleanly
    assert tr.nodes == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}  # Slurm's names, for --exclude
    assert "listening on tcp://0.0.0.0:" in (tmp_path / f"c4d-master-{jid}.log").read_text()
    # nothing blacklisted: the file is only ever appended to, by localized ERRORs
    assert (tmp_path / "bad-nodes.txt").read_text() == "node-3\nnode-7\n"


def test_slurm_submit_without_a_blacklist(tools, tmp_path):
    _exe(tools / "sbatch", '#!/bin/sh\necho "$@" > "$FAKE_LOG"\n')  # recording only
    log = tmp_path / "argv"
    p = _bash(BLOCKS["slurm-submit"], _env(tools, FAKE_LOG=log), tmp_path)
    assert p.returncode == 0 and log.read_text().split() == ["train.sbatch"]


# -- Kubernetes -------------------------------------------------------------------------------
def _docs(name: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(BLOCKS[name])}


def _container_env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_kubernetes_manifests_are_consistent():
    m = _docs("c4d-master.yaml")
    j = _docs("train.yaml")
    assert set(m) == {"Deployment", "Service"} and set(j) == {"Job"}
    for d in (*m.values(), *j.values()):
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(d) and d["metadata"]["name"]
    dep, svc, job = m["Deployment"], m["Service"], j["Job"]
    assert dep["apiVersion"] == "apps/v1" and svc["apiVersion"] == "v1" and job["apiVersion"] == "batch/v1"
    tmpl = dep["spec"]["template"]
    labels = tmpl["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()  # the Service reaches the master pod
    (master,) = tmpl["spec"]["containers"]
    cmd = master["command"]
    assert cmd[:2] == ["c4d", "master"]
    bind = cmd[cmd.index("--bind") + 1]
    ports = {p["name"]: p["containerPort"] for p in master["ports"]}
    assert bind == f"tcp://0.0.0.0:{ports['c4d']}"  # listens on the pod's interfaces, on its declared port
    (sport,) = svc["spec"]["ports"]
    assert sport["targetPort"] in ports and sport["protocol"] == "TCP"
    vols = {v["name"] for v in tmpl["spec"]["volumes"]}
    mounts = {v["mountPath"]: v["name"] for v in master["volumeMounts"]}
    assert set(mounts.values()) <= vols
    for flag in ("--trace", "--blacklist"):  # written to the persistent volume
        assert any(cmd[cmd.index(flag) + 1].startswith(p + "/") for p in mounts)
    # the training pods: the shim from the init container's copy, the master's Service address
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    pvols = {v["name"] for v in pod["volumes"]}
    (init,) = pod["initContainers"]
    (trainer,) = pod["containers"]
    for c in (init, trainer):
        assert c["image"] and {v["name"] for v in c["volumeMounts"]} <= pvols
    env = _container_env(trainer)
    mount = next(v["mountPath"] for v in trainer["volumeMounts"] if v["name"] == "c4d")
    assert env["LD_PRELOAD"].startswith(mount + "/") and env["NCCL_PROFILER_PLUGIN"] == "STATIC_PLUGIN"
    host, port = re.fullmatch(r"tcp://([^:]+):(\d+)", env["C4D_MASTER_ADDR"]).groups()
    assert host.split(".")[0] == svc["metadata"]["name"] and int(port) == sport["port"]
    assert env["C4D_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_kubernetes_init_container_copy_preloads_a_rank(tools, tmp_path, libc4d, simtrain):
    """Run the init container's command for real into a folder, then start ranks preloaded from
    that folder only (no C4D_LIBZMQ): the shim must find the copied libzmq and reach a master."""
    pod = _docs("train.yaml")["Job"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (trainer,) = pod["containers"]
    vol = tmp_path / "vol"
    vol.mkdir()

    # the volume's mount point /c4d becomes a folder here (only where a path starts with it)
    def at_vol(text: str) -> str:
        return re.sub(r"(^|[\s\"'])/c4d\b", lambda m: m[1] + str(vol), text)

    script = at_vol(init["command"][2])
    p = subprocess.run(
        init["command"][:2] + [script], env=_env(tools), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    preload = at_vol(_container_env(trainer)["LD_PRELOAD"])
    assert preload == f"{vol}/c4d/_native/libc4d.so"
    assert Path(preload).is_file() and list((vol / "pyzmq.libs").glob("libzmq*.so*"))
    port = free_port()
    master = subprocess.Popen(
        [
            str(tools / "c4d"),
            "master",
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--trace",
            str(tmp_path / "k.c4d"),
        ],
        env=_env(tools),
        stderr=subprocess.DEVNULL,
    )
    job = tmp_path / "job"
    job.mkdir()
    try:
        wait_for(lambda: (tmp_path / "k.c4d").exists(), timeout=60, what="the master to start")
        base = _env(tools, LD_PRELOAD=preload, C4D_MASTER_ADDR=f"tcp://127.0.0.1:{port}", WORLD_SIZE=2,
                    SIMNCCL_JOB=f"k{uuid.uuid4().hex[:8]}", C4D_RUNTIME_LOG_LEVEL="DEBUG")  # fmt: skip
        base.pop("C4D_LIBZMQ", None)
        ranks = [
            subprocess.Popen(
                [str(simtrain), "--steps", "5", "--job-dir", str(job)],
                env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        errs = [r.communicate(timeout=60)[1] for r in ranks]
        assert [r.returncode for r in ranks] == [0, 0], errs
        for e in errs:  # the copied libzmq, found beside the copied libc4d.so
            m = re.search(r"libzmq [\d.]+ from (\S+)", e)
            assert m and Path(m[1]).resolve().parent == (vol / "pyzmq.libs").resolve(), e
    finally:
        master.send_signal(signal.SIGTERM)
        master.wait(timeout=30)
    assert sorted(trace.load(tmp_path / "k.c4d").nodes) == [0, 1]


FAKE_KUBECTL = (
    PY_SHEBANG
    + """# Recording fake of kubectl: logs its argv (JSON line to $FAKE_LOG). `apply -f F` parses F as
# YAML and fails like kubectl on a document without apiVersion/kind/metadata.name; `get pod -o
# name` prints one pod; `exec ... -- cat FILE` prints $FAKE_BLACKLIST; `cp POD:PATH DST` copies
# $FAKE_TRACE to DST (a real trace, so that the `c4d analyze` after it runs for real).
import json, os, shutil, sys, yaml
a = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(a) + "\\n")
if a[:2] == ["apply", "-f"]:
    for d in yaml.safe_load_all(open(a[2])):
        if not (d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name")):
            sys.exit("error: invalid object")
        print(f"{d['kind'].lower()}/{d['metadata']['name']} created")
elif a[:2] == ["get", "pod"]:
    print("pod/c4d-master-5d8f7c9b4-x2x7q")
elif a[0] == "exec":
    print(os.environ["FAKE_BLACKLIST"])
elif a[0] == "cp":
    shutil.copy(os.environ["FAKE_TRACE"], a[2])
"""
)


def test_kubectl_commands(tools, tmp_path, libc4d, simtrain):
    _exe(tools / "kubectl", FAKE_KUBECTL)
    for name in ("c4d-master.yaml", "train.yaml"):
        (tmp_path / name).write_text(BLOCKS[name])
    src = tmp_path / "src.c4d"
    p = subprocess.run([str(tools / "c4d"), "sim", "--ranks", "4", "--steps", "5", "--trace", str(src)],
                       env=_env(tools), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    log = tmp_path / "calls.jsonl"
    env = _env(tools, FAKE_LOG=log, FAKE_BLACKLIST="gpu-node-17", FAKE_TRACE=src)
    script = BLOCKS["kubectl"].replace("kubectl logs -f", "kubectl logs")  # not following forever
    p = _bash(script, env, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr  # the last line: c4d analyze of a clean trace
    assert "deployment/c4d-master created" in p.stdout and "job/train created" in p.stdout
    assert "4 ranks on" in p.stdout and "no diagnoses" in p.stdout
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    dep = _docs("c4d-master.yaml")["Deployment"]
    name = dep["metadata"]["name"]
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for c in calls:
        if c[0] in ("logs", "exec"):
            assert f"deploy/{name}" in c
        if c[0] == "exec":
            assert c[-1] == cmd[cmd.index("--blacklist") + 1]
        if c[:2] == ["get", "pod"]:
            sel = c[c.index("-l") + 1].split("=")
            assert labels.get(sel[0]) == sel[1]
        if c[0] == "cp":
            assert c[1].endswith(":" + cmd[cmd.index("--trace") + 1])
    assert [c[0] for c in calls] == ["apply", "apply", "logs", "exec", "get", "cp"]


def test_runbook_covers_every_kind():
    text = DOC.read_text()
    table = text.split("## What each diagnosis means", 1)[1].split("\n## ", 1)[0]
    kinds = re.findall(r"^\| \*\*(\w+)\*\* \|", table, re.M)
    assert set(kinds) >= {"RankNonCommHang", "RankCommHang", "RankNonCommSlow", "RankCommSlow", "RankLost"}
