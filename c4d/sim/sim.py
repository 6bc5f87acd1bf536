"""`c4d sim`: a simulated multi-node job on simnccl, with the shim preloaded, and its master.

Each rank is a real process running the native driver ``c4d-simtrain`` (linked against
simnccl's ``libnccl.so.2`` exactly as libtorch_cuda links NVIDIA's) with ``libc4d.so``
in ``LD_PRELOAD``. The simulated cluster has nodes ``node-0``, ``node-1``, ... (enough
for the ranks, plus ``--spare-nodes``); ranks are laid out ``ranks_per_node`` at a time on
the nodes that are not excluded (``--exclude-nodes``: the blacklist ``c4d run`` keeps), so
a relaunch after an isolation runs on the spare. ``--clock-skew`` gives each node its own
clock offset (it belongs to the node, wherever the ranks go).

``SimResult.status``: 0 the job finished; 1 a rank failed and nothing was diagnosed;
2 stopped on an ERROR diagnosis; 3 ``--max-seconds`` reached (``c4d sim`` maps these onto
the CLI's exit-status convention, c4d/cli/__init__.py). With a master of its own the diagnoses come
from stepping it; with a running one (``--master EP``) from that master's status endpoint
(c4d/master/status.py), so the job stops on its ERROR all the same.

``--quick`` (``QUICK_ENV``) scales the thresholds down so that every fault kind is diagnosed
within seconds of its onset. Warnings the shim or simnccl print in a rank (a malformed
``C4D_*`` or ``SIMNCCL_*`` value) are read from the per-rank logs and logged once, with the
ranks that printed them, before those logs are deleted.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from c4d.cli_common import EXIT_BAD, EXIT_FOUND, EXIT_OK, found
from c4d.sim import faults as faultspec
from c4d.util import native

log = logging.getLogger("c4d.sim.sim")

EXIT_FINISHED, EXIT_RANK_FAILED, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 2, 3

# --quick: T = 1 s and ERROR after 3 x T, 1 s slow-detection windows, heartbeats at T/5 (so
# that silence is measurable at this T), and links at 1 GB/s inside a node and 0.25 GB/s
# across nodes: on a small machine running many rank processes, each simulated op also costs
# 0.1-0.5 ms of process wake-ups, as long as a transfer at simnccl's default 4 / 1 GB/s, so a
# slowed link would barely show; with the modeled transfer dominating, factor F reads as ~F.
QUICK_ENV = {
    "C4D_HANG_TIMEOUT": "1000000",
    "C4D_HANG_TIMES": "3",
    "C4D_CONN_BW_CHECK_PERIOD": "1",
    "C4D_HEARTBEAT_MS": "200",
    "SIMNCCL_INTRA_GBPS": "1",
    "SIMNCCL_INTER_GBPS": "0.25",
}
QUICK_STEPS = 300
"""Steps of a --quick job: room for a fault at step 20 and several slow windows after it."""

# what a rank's shim or simnccl prints about a malformed variable: "c4d: NAME=... "
_ENV_WARNING = re.compile(r"^(c4d|simnccl): [A-Z][A-Z0-9_]*=")


def quick_env(values: dict[str, str] | None = None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """``values`` (QUICK_ENV) without the variables already set in ``environ`` (the user's win)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in (QUICK_ENV if values is None else values).items() if k not in env}


@dataclass
class SimConfig:
    ranks: int = 8
    ranks_per_node: int = 4
    tp: int = 1
    pp: int = 1
    steps: int = 20
    faults: list[faultspec.Fault] = field(default_factory=list)
    clock_skew_s: float = 0.0
    seed: int = 0
    spare_nodes: int = 0
    exclude_nodes: tuple[str, ...] = ()
    preload: bool = True
    driver_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.ranks < 1:
            raise ValueError("--ranks must be ≥ 1")
        if self.ranks_per_node < 1:
            raise ValueError("--ranks-per-node must be ≥ 1")
        if self.tp < 1 or self.pp < 1 or self.ranks % (self.tp * self.pp):
            raise ValueError(f"--ranks {self.ranks} must be a multiple of tp × pp = {self.tp * self.pp}")
        if self.steps < 1:
            raise ValueError("--steps must be ≥ 1")
        if self.spare_nodes < 0:
            raise ValueError("--spare-nodes must be ≥ 0")
        usable = [n for n in self.cluster if n not in self.exclude_nodes]
        if len(usable) < self.nodes:
            out = sorted(set(self.cluster) & set(self.exclude_nodes))
            raise ValueError(
                f"{self.ranks} ranks need {self.nodes} nodes of {self.ranks_per_node} ranks; the cluster has "
                f"{len(self.cluster)} and {', '.join(out)} excluded: add --spare-nodes"
            )

    @property
    def nodes(self) -> int:
        """Nodes the job runs on."""
        return (self.ranks + self.ranks_per_node - 1) // self.ranks_per_node

    @property
    def cluster(self) -> list[str]:
        """Every node of the simulated cluster, excluded ones included: node-0 .. node-(nodes+spare-1)."""
        return [f"node-{i}" for i in range(self.nodes + self.spare_nodes)]

    @property
    def node_names(self) -> list[str]:
        """The nodes the job runs on, in layout order: the first ``nodes`` that are not excluded."""
        return [n for n in self.cluster if n not in self.exclude_nodes][: self.nodes]

    @property
    def layout(self) -> list[str]:
        """``layout[r]``: the node rank r runs on."""
        names = self.node_names
        return [names[r // self.ranks_per_node] for r in range(self.ranks)]

    def node_of(self, rank: int) -> str:
        return self.layout[rank]


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked child: get SIGKILL when the launcher dies, so no rank outlives `c4d sim`."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class SimJob:
    """The rank processes of one simulated job."""

    def __init__(
        self,
        cfg: SimConfig,
        master_endpoint: str,
        job_dir: Path | None = None,
        node_endpoints: dict[str, str] | None = None,
    ):
        cfg.validate()
        self.cfg = cfg
        self.endpoint = master_endpoint
        self.node_endpoints = dict(node_endpoints or {})  # a node's agent (c4d/agent), where it has one
        self._own_dir = job_dir is None
        self.job_dir = Path(job_dir or tempfile.mkdtemp(prefix="c4d-sim-"))
        self.job_id = f"sim{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen] = []
        self.layout = cfg.layout
        self.offsets_ns = self._node_offsets()
        self._warned: set[str] = set()

    def _node_offsets(self) -> dict[str, int]:
        """Clock offset of every cluster node (node-0 is the reference)."""
        rng = random.Random(self.cfg.seed)
        skew = self.cfg.clock_skew_s
        cluster = self.cfg.cluster
        return {n: (0 if i == 0 else int(rng.uniform(-skew, skew) * 1e9)) for i, n in enumerate(cluster)}

    def rank_env(self, rank: int) -> dict[str, str]:
        cfg = self.cfg
        env = dict(os.environ)
        env.update(cfg.env)
        native_faults = [s for f in cfg.faults for s in f.lower(self.layout)]
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(cfg.ranks),
            LOCAL_RANK=str(rank % cfg.ranks_per_node),
            C4D_MASTER_ADDR=self.node_endpoints.get(self.layout[rank], self.endpoint),
            C4D_NODE_NAME=self.layout[rank],
            C4D_JOB_ID=self.job_id,
            C4D_CLOCK_OFFSET_NS=str(self.offsets_ns[self.layout[rank]]),
            SIMNCCL_JOB=self.job_id,
            SIMNCCL_FAULTS=";".join(native_faults),
            SIMNCCL_RANKS_PER_NODE=str(cfg.ranks_per_node),
            SIMNCCL_SEED=str(cfg.seed * 100003 + rank),
        )
        if "C4D_LIBZMQ" not in env and (zmq_lib := native.libzmq_path()) is not None:
            env["C4D_LIBZMQ"] = str(zmq_lib)
        if cfg.preload:
            pre = env.get("LD_PRELOAD", "")
            env["LD_PRELOAD"] = str(native.lib_path()) + (":" + pre if pre else "")
            # NCCL (and simnccl) look the profiler plugin up in the preloaded shim: PEER records.
            env.setdefault("NCCL_PROFILER_PLUGIN", "STATIC_PLUGIN")
        return env

    def start(self) -> None:
        exe = str(native.simtrain_path())
        cfg = self.cfg
        args = [exe, "--steps", str(cfg.steps), "--tp", str(cfg.tp), "--pp", str(cfg.pp)]
        args += ["--job-dir", str(self.job_dir), *cfg.driver_args]
        for r in range(cfg.ranks):
            logf = open(self.job_dir / f"rank-{r}.log", "wb")  # noqa: SIM115 - handed to the child
            self.procs.append(
                subprocess.Popen(
                    args,
                    preexec_fn=_die_with_parent,
                    env=self.rank_env(r),
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            logf.close()

    def returncodes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def finished(self) -> bool:
        return all(rc is not None for rc in self.returncodes())

    def failed_ranks(self) -> list[int]:
        return [r for r, rc in enumerate(self.returncodes()) if rc not in (None, 0)]

    def log_tail(self, rank: int, lines: int = 5) -> str:
        try:
            text = (self.job_dir / f"rank-{rank}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def config_warnings(self) -> list[tuple[str, list[int]]]:
        """Lines about malformed variables the ranks printed and that were not returned before,
        each with the ranks that printed it (each rank prints it once, at start-up)."""
        seen: dict[str, list[int]] = {}
        for r in range(len(self.procs)):
            try:
                with open(self.job_dir / f"rank-{r}.log", errors="replace") as f:
                    head = [f.readline() for _ in range(32)]
            except OSError:
                continue
            for line in head:
                line = line.strip()
                if _ENV_WARNING.match(line):
                    seen.setdefault(line, []).append(r)
        new = [(line, ranks) for line, ranks in seen.items() if line not in self._warned]
        self._warned.update(line for line, _ in new)
        return new

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("rank process %d did not exit after SIGKILL", p.pid)

    def cleanup(self) -> None:
        for f in Path("/dev/shm").glob(f"simnccl-{self.job_id}*"):
            with contextlib.suppress(OSError):
                f.unlink()
        if self._own_dir:
            shutil.rmtree(self.job_dir, ignore_errors=True)


def _log_config_warnings(job: SimJob) -> None:
    n = len(job.procs)
    for line, ranks in job.config_warnings():
        who = "every rank" if len(ranks) == n and n > 1 else f"rank {', '.join(map(str, ranks))}"
        log.warning("%s: %s", who, line)


@dataclass
class SimResult:
    status: int
    reason: str
    seconds: float
    diagnoses: list = field(default_factory=list)
    returncodes: list = field(default_factory=list)
    heard: list = field(default_factory=list)
    """A running master's diagnoses (``status=``), as the JSON objects its ``--json`` prints."""


class _AgentThread(threading.Thread):
    """A node agent (c4d/agent) in its own thread, as `c4d agent` would run beside the node's ranks:
    its sockets live in that thread; it forwards at its own pace while the master steps here."""

    def __init__(self, master_endpoint: str, bind: str) -> None:
        super().__init__(daemon=True, name=f"c4d-agent {bind}")
        self.master_endpoint, self.endpoint = master_endpoint, bind
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.stats: dict[str, int] = {}

    def run(self) -> None:
        from c4d.agent.agent import Agent, AgentConfig

        try:
            a = Agent(AgentConfig(master=self.master_endpoint, bind=self.endpoint, flush_s=0.05))
        except BaseException as e:
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        try:
            a.run(self.stop.is_set)
            a.flush()
        finally:
            self.stats = {**a.summary.stats, **a.stats}
            a.close()


def _start_agents(cfg: SimConfig, master_endpoint: str, sock_dir: Path) -> dict[str, _AgentThread]:
    """One node agent per simulated node, on a private ipc endpoint."""
    out: dict[str, _AgentThread] = {}
    for i, node in enumerate(sorted(set(cfg.layout), key=cfg.layout.index)):
        t = out[node] = _AgentThread(master_endpoint, f"ipc://{sock_dir}/agent-{i}.sock")
        t.start()
        t.ready.wait()
        if t.error is not None:
            _stop_agents(out)
            raise OSError(f"cannot start the agent of {node}: {t.error}")
    return out


def _stop_agents(agents: dict[str, _AgentThread]) -> None:
    for t in agents.values():
        t.stop.set()
    for t in agents.values():
        t.join(5.0)


def run(
    cfg: SimConfig,
    master=None,
    endpoint: str | None = None,
    max_seconds: float = 600.0,
    on_poll=None,
    stop_on_error: bool = True,
    agents: bool = False,
    status: str | None = None,
    interrupted: Callable[[], None] | None = None,
) -> SimResult:
    """Run the job to its end (or to an ERROR diagnosis, or to ``max_seconds``).

    ``master`` (a c4d.master.master.Master) is driven in this thread; with ``endpoint`` only
    (an external master), the job is supervised and, given that master's ``status`` endpoint,
    stopped on its ERROR. ``agents``: every simulated node's ranks send to that node's agent
    (c4d/agent), stepped in this thread, which forwards to the master. ``interrupted`` is called
    between two polls: it raises to unwind (c4d/util/signals.py).
    """
    ep = master.endpoint if master is not None else endpoint
    if ep is None:
        raise ValueError("need a master or an endpoint")
    sock_dir = Path(tempfile.mkdtemp(prefix="c4d-agents-")) if agents else None
    node_agents = _start_agents(cfg, ep, sock_dir) if sock_dir else {}
    job = SimJob(cfg, ep, node_endpoints={n: a.endpoint for n, a in node_agents.items()})
    t0 = time.monotonic()
    result, reason = EXIT_TIMEOUT, f"stopped after --max-seconds {max_seconds:g}"
    next_scan = t0 + 0.5
    verdicts = _Verdicts(status, job.job_id, ep) if master is None and status else None
    try:
        job.start()
        while time.monotonic() - t0 < max_seconds:
            if interrupted is not None:
                interrupted()
            if time.monotonic() >= next_scan and next_scan - t0 < 10:
                next_scan += 1.0  # start-up warnings: in the first seconds only
                _log_config_warnings(job)
            if master is not None:
                new = master.step()
                if stop_on_error and any(d.level.name == "ERROR" for d in new):
                    result, reason = EXIT_ERROR, "stopped on an ERROR diagnosis"
                    break
            elif verdicts is not None:
                err = verdicts.poll(0.1, time.monotonic() - t0)
                if stop_on_error and err is not None:
                    result, reason = EXIT_ERROR, f"stopped on the master's ERROR diagnosis ({err})"
                    break
            else:
                time.sleep(0.1)
            if on_poll is not None:
                on_poll(job)
            if job.finished():
                failed = job.failed_ranks()
                if failed:
                    tails = "; ".join(f"rank {r}: {job.log_tail(r, 2)!r}" for r in failed[:3])
                    result, reason = EXIT_RANK_FAILED, f"ranks {failed} failed ({tails})"
                else:
                    result, reason = EXIT_FINISHED, "the job finished"
                break
        if master is not None:
            # let the last records (final heartbeats) land and be evaluated
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                master.step(timeout_s=0.05)
            master.tick(time.time_ns())
    finally:
        _stop_agents(node_agents)
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)
        rcs = job.returncodes()
        job.kill()
        _log_config_warnings(job)
        job.cleanup()
        if verdicts is not None:
            verdicts.close()
    return SimResult(
        status=result,
        reason=reason,
        seconds=time.monotonic() - t0,
        diagnoses=list(master.diagnoses) if master is not None else [],
        returncodes=rcs,
        heard=verdicts.heard if verdicts is not None else [],
    )


def _culprit(d: dict) -> str:
    """``RankNonCommHang: rank 6 [node-1]`` of a diagnosis as JSON."""
    ranks = [str(r) for r in d.get("ranks") or []]
    who = f" rank{'s' if len(ranks) > 1 else ''} {','.join(ranks)}" if ranks else ""
    nodes = d.get("nodes") or []
    return f"{d.get('kind')}:{who}" + (f" [{', '.join(map(str, nodes))}]" if nodes else "")


class _Verdicts:
    """A running master's diagnoses of this job, through its status endpoint (c4d/master/status.py):
    each one it raised at WARNING or above is logged here, and the first ERROR stops the job."""

    SILENT_S = 10.0
    """Say once that the master does not answer after this long."""

    def __init__(self, endpoint: str, job_id: str, master_endpoint: str) -> None:
        from c4d.master.collector import job_key
        from c4d.master.status import StatusFollower

        self.follower = StatusFollower(endpoint, job=job_key(job_id))
        self.endpoint, self.master_endpoint = endpoint, master_endpoint
        self.heard: list[dict] = []
        self._said: set[object] = set()

    def poll(self, timeout_s: float, elapsed_s: float) -> str | None:
        """Wait up to ``timeout_s`` for new diagnoses; the first new ERROR's summary, if any."""
        err = None
        for d in self.follower.poll(timeout_s):
            self.heard.append(d)
            level = d.get("level")
            if level in ("WARNING", "ERROR"):
                what = _culprit(d)
                if (level, what) not in self._said:
                    self._said.add((level, what))
                    log.log(getattr(logging, level), "the master at %s: %s", self.master_endpoint, what)
                if level == "ERROR" and err is None:
                    err = what
        if not self.follower.answered and elapsed_s > self.SILENT_S:
            self._once(
                "silent",
                f"no answer from the master's status endpoint {self.endpoint} (c4d master --status-bind): "
                "this job stops only when it ends or at --max-seconds",
            )
        if self.follower.other_job:
            self._once(
                "job",
                f"the master at {self.master_endpoint} serves job {self.follower.other_job}, not this one "
                "(its diagnoses are not this job's)",
            )
        return err

    def _once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("%s", line)

    def close(self) -> None:
        self.follower.close()


def exit_status(res) -> int:
    """``c4d sim``'s and ``c4d demo``'s exit status: 2 when something at WARNING or above was
    diagnosed; 1 when ranks failed with nothing diagnosed; else 0 (finished, or stopped at
    --max-seconds with nothing found)."""
    heard = any(d.get("level") in ("WARNING", "ERROR") for d in getattr(res, "heard", []))
    if found(res.diagnoses) or heard or res.status == EXIT_ERROR:
        return EXIT_FOUND
    if res.status == EXIT_RANK_FAILED:
        return EXIT_BAD
    return EXIT_OK
