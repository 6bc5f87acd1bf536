"""``c4d check nodes`` across hosts: one worker per host, met through torch.distributed's rendezvous.

Every host runs the same command, under ``torchrun --nnodes N --nproc-per-node 1``, ``srun
--ntasks-per-node 1``, as one pod of an indexed Kubernetes Job, or by hand with
``--rdzv-endpoint``. Rank 0 coordinates: the same rounds, pairing and verdicts as the local check
(``nodes.drive_rounds``, ``pairing``); every rank, rank 0 included, runs its node's groups.

The ranks talk through the rendezvous ``TCPStore`` only: torchrun's agent store
(``TORCHELASTIC_USE_AGENT_STORE``), else one that rank 0 hosts on ``MASTER_ADDR:MASTER_PORT``
(or the endpoint), as ``env://`` would, but without waiting for every rank to connect, so that a
rank that never comes can be named instead of failing everyone.

* Each rank runs its node worker (``worker.node_worker``) in a child process, as the local check
  does, behind a *relay* that carries commands from the store to the child and answers back, and
  says how the child died (its exit status) when it does.
* Keys, under one prefix per run: ``config`` (rank 0's settings, so every host runs the same
  check), ``join/R`` (rank R's node name, host and pid, or why its worker did not start),
  ``hb/R`` and ``hb/coord`` (heartbeat counters), ``cmd/R/K`` and ``ans/R/K`` (the K-th command
  to rank R and its answer), ``ack/R`` (rank R got its ``stop``), ``exit`` (rank 0 lets the ranks
  that took their stop go: their list) and ``bye/R`` (rank R is leaving).
* Under torchrun the agent that hosts the rendezvous leaves last: the other agents poll it until they
  see their own worker exit, and one that loses it first fails on a connection error and kills a
  worker that was about to leave with the check's status. Its worker (found through /proc: the
  parent that listens on its ``--rdzv-endpoint`` port) waits for the others' ``bye`` and lingers.
* A rank whose heartbeat stands still for ``lost_after_s`` is lost: named, and the rounds go on
  without it. A relay whose coordinator's heartbeat stands still gives up with one line.
* Groups form on the same store under keys of their own (a ``PrefixStore`` per group, as
  locally), so a dead member fails only its own group, within ``--timeout``.

The store is read by polling (``check``), never by a ``wait`` that times out: a TCPStore client
whose wait timed out may take the late reply as the answer to its next request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from c4d.check import pairing
from c4d.check.dist import LOCALHOST, WorkerPool
from c4d.check.nodes import NodeCheckConfig, NodesReport, drive_rounds, require_backend
from c4d.check.pairing import GroupResult

PREFIX = "c4d-check-nodes"
POLL_S = 0.05
HEARTBEAT_S = 0.5
STOP_ACK_S = 15.0
LEAVE_LAST_S = 2.0
"""How long the rank whose torchrun agent hosts the rendezvous outlives the others' ``bye``: their
agents see their workers' exit within ``--monitor-interval`` (0.1 s by default)."""


class LaunchError(ValueError):
    """The launcher's environment or the rendezvous options are malformed."""


class MultiHostError(RuntimeError):
    """This rank cannot take part: the store is unreachable, or the coordinator went away."""


@dataclass(frozen=True)
class Launch:
    """Where this rank stands in a multi-host check, and where the rendezvous store is."""

    how: str
    """``torchrun``, ``env`` (RANK/WORLD_SIZE/MASTER_* set by another launcher), ``slurm`` or
    ``rdzv-endpoint``."""
    rank: int
    world: int
    host: str
    port: int
    local_rank: int = 0
    agent_store: bool = False
    """torchrun's agent hosts the store: every rank is a client of it."""
    attempt: str = "0"
    hosts: tuple[str, ...] = ()
    """Slurm: the step's hosts in task order (one task per node), to name ranks that never join."""

    @property
    def prefix(self) -> str:
        return f"{PREFIX}/{self.attempt}/"

    @property
    def hosts_store(self) -> bool:
        return self.rank == 0 and not self.agent_store

    def placeholder(self, rank: int) -> str:
        """A name for a rank that never said which node it is."""
        return self.hosts[rank] if len(self.hosts) == self.world else f"rank-{rank}"

    def to_json(self) -> dict:
        return {"how": self.how, "store": f"{self.host}:{self.port}", "world_size": self.world}


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``gpu[01-03,07],login1``) as host names, in order."""

    def items(s: str) -> list[str]:  # split on the commas outside brackets
        out, depth, cur = [], 0, ""
        for ch in s:
            depth += (ch == "[") - (ch == "]")
            if ch == "," and depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += ch
        return [*out, cur]

    def expand(item: str) -> list[str]:
        m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
        if not m:
            return [item]
        head, spec, rest = m.groups()
        names = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise LaunchError(f"host list '{text}': cannot read the range '{part}'")
            for n in range(int(lo), int(hi or lo) + 1):
                names.append(f"{head}{n:0{len(lo)}d}")
        return [n + tail for n in names for tail in expand(rest)]

    return [h for item in items(text.strip()) if item for h in expand(item)]


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise LaunchError(f"{key}='{env[key]}' is not an integer") from None


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"--rdzv-endpoint '{text}': expected HOST:PORT")
    return host, int(port)


def detect(
    env: Mapping[str, str],
    rdzv_endpoint: str | None = None,
    nodes: int | None = None,
    node_rank: int | None = None,
) -> Launch | None:
    """This rank's place in a multi-host check, from the options or the launcher's environment;
    ``None`` when nothing says this is one (the local check then runs)."""
    launch: Launch | None = None
    if rdzv_endpoint:
        host, port = parse_endpoint(rdzv_endpoint)
        if nodes is None:
            raise LaunchError("--rdzv-endpoint needs --nodes N (how many hosts take part)")
        if node_rank is None:
            if "JOB_COMPLETION_INDEX" not in env:
                raise LaunchError("--rdzv-endpoint needs --node-rank R (or $JOB_COMPLETION_INDEX)")
            node_rank = _int(env, "JOB_COMPLETION_INDEX")
        launch = Launch("rdzv-endpoint", node_rank, nodes, host, port)
    elif all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        launch = Launch(
            "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env",
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            env["MASTER_ADDR"],
            _int(env, "MASTER_PORT"),
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            agent_store=agent,
            attempt=env.get("TORCHELASTIC_RESTART_COUNT", "0") if agent else "0",
        )
    elif (
        "SLURM_PROCID" in env and "SLURM_NTASKS" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)
    ):
        nodelist = (
            env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        )
        hosts = tuple(expand_hostlist(nodelist)) if nodelist else ()
        host = env.get("MASTER_ADDR") or (hosts[0] if hosts else "")
        if not host:
            raise LaunchError("under srun: neither MASTER_ADDR nor SLURM_STEP_NODELIST says where rank 0 is")
        job = _int(env, "SLURM_JOB_ID") if "SLURM_JOB_ID" in env else 0
        port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else 20000 + job % 10000
        launch = Launch(
            "slurm",
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_NTASKS"),
            host,
            port,
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            attempt=f"{job}.{env.get('SLURM_STEP_ID', env.get('SLURM_STEPID', '0'))}",
            hosts=hosts,
        )
    if launch is None:
        return None
    if launch.world < 2:
        raise LaunchError(f"a node check needs at least 2 nodes; this {launch.how} run has {launch.world}")
    if not 0 <= launch.rank < launch.world:
        raise LaunchError(f"rank {launch.rank} is outside 0..{launch.world - 1}")
    if nodes is not None and nodes != launch.world:
        raise LaunchError(f"--nodes {nodes} but this {launch.how} run has {launch.world} ranks")
    return launch


def node_name(explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """``--node-name``, else ``$C4D_NODE_NAME``, else Slurm's name for the node, else the hostname."""
    return explicit or env.get("C4D_NODE_NAME") or env.get("SLURMD_NODENAME") or socket.gethostname()


def lost_after(cfg: NodeCheckConfig) -> float:
    """How long a heartbeat may stand still before its rank (or the coordinator) counts as lost."""
    return max(5.0, cfg.timeout_s)


def _store(host: str, port: int, timeout_s: float, master: bool = False):
    import torch.distributed as dist

    return dist.TCPStore(
        host, port, is_master=master, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def _keyed(raw, launch: Launch):
    import torch.distributed as dist

    return dist.PrefixStore(launch.prefix, raw)


class Heartbeat:
    """A thread that bumps this process's heartbeat counters on a client connection of its own."""

    def __init__(self, addr: tuple[str, int], launch: Launch, keys: list[str]):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(addr, launch, keys), daemon=True)
        self._thread.start()

    def _run(self, addr, launch, keys) -> None:
        try:
            store = _keyed(_store(addr[0], addr[1], 60.0), launch)
            while True:
                for k in keys:
                    store.add(k, 1)
                if self._stop.wait(HEARTBEAT_S):
                    return
        except Exception:  # the store is gone: the peers will notice the silence
            return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


class Liveness:
    """When each heartbeat counter last moved, on this host's clock (the hosts' clocks differ)."""

    def __init__(self, store):
        self.store = store
        self.seen: dict[str, tuple[int | None, float, float]] = {}

    def silent_for(self, key: str) -> float:
        now = time.monotonic()
        value, changed, checked = self.seen.get(key, (None, now, 0.0))
        if now - checked >= HEARTBEAT_S:
            v = self.store.add(key, 0)
            if v != value:
                value, changed = v, now
            checked = now
        self.seen[key] = (value, changed, checked)
        return now - changed


class StorePool:
    """The coordinator's side of the relays: ``dist.WorkerPool``'s interface (``send``,
    ``collect``, ``dead``, ``killed``) over the store, worker ``i`` being rank ``i``."""

    def __init__(self, store, world: int, lost_after_s: float, grace_s: float = 10.0):
        self.store = store
        self.world = world
        self.lost_after_s = lost_after_s
        self.grace_s = grace_s
        self.dead: dict[int, str] = {}
        self.killed: set[int] = set()
        self.sent = [0] * world
        self.got = [0] * world
        self.live = Liveness(store)
        self.where: dict[int, str] = {}

    def send(self, i: int, msg: dict) -> bool:
        if i in self.dead:
            return False
        self.store.set(f"cmd/{i}/{self.sent[i]}", json.dumps(msg))
        self.sent[i] += 1
        return True

    def collect(self, indices: list[int], deadline: float) -> dict[int, dict | None]:
        """One answer from each of ``indices`` (``None`` for a rank that is dead, lost, or
        silent past ``deadline`` plus the relays' own grace)."""
        out: dict[int, dict | None] = {i: None for i in indices if i in self.dead}
        pending = {i for i in indices if i not in self.dead}
        deadline += self.grace_s
        while pending:
            for i in sorted(pending):
                key = f"ans/{i}/{self.got[i]}"
                if self.store.check([key]):
                    answer = json.loads(self.store.get(key))
                    self.got[i] += 1
                    pending.discard(i)
                    if "dead" in answer:  # the relay saw its node worker die
                        self.dead[i] = answer["dead"]
                        out[i] = None
                    else:
                        out[i] = answer
                elif (silent := self.live.silent_for(f"hb/{i}")) > self.lost_after_s:
                    where = self.where.get(i, "")
                    self.dead[i] = f"lost: no heartbeat from rank {i}{where} for {silent:.0f} s"
                    pending.discard(i)
                    out[i] = None
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        for i in pending:
            self.killed.add(i)
            self.dead.setdefault(i, "no answer before the deadline")
            out[i] = None
        return out


def relay(store, rank: int, pool: WorkerPool, lost_after_s: float, watch_coordinator: bool) -> dict:
    """Carry rank ``rank``'s commands to its node worker and the answers back, until a command
    other than ``run`` (``stop``), which is returned."""
    live = Liveness(store)
    k = 0
    while True:
        key = f"cmd/{rank}/{k}"
        while not store.check([key]):
            if watch_coordinator and (silent := live.silent_for("hb/coord")) > lost_after_s:
                raise MultiHostError(f"the coordinator (rank 0) has sent no heartbeat for {silent:.0f} s")
            time.sleep(2 * POLL_S)
        msg = json.loads(store.get(key))
        k += 1
        if msg.get("cmd") != "run":
            return msg
        answer: dict[str, Any] | None = None
        if 0 not in pool.dead and pool.send(0, msg):
            answer = pool.collect([0], time.monotonic() + 2 * msg["timeout_s"] + 30.0)[0]
        if answer is None:
            answer = {"dead": pool.dead.get(0, "worker stopped answering")}
        store.set(f"ans/{rank}/{k - 1}", json.dumps(answer))


def _start_worker(name: str, launch: Launch, cfg: NodeCheckConfig, addr: tuple[str, int]) -> WorkerPool:
    from c4d.check.worker import node_worker

    args = (name, launch.local_rank, cfg.backend, cfg.worker_cfg())
    return WorkerPool(node_worker, [args], cuda=cfg.backend == "nccl", store_addr=addr)


def _ready(pool: WorkerPool, cfg: NodeCheckConfig) -> tuple[dict, str | None]:
    """The node worker's start-up message, and why it did not start (``None`` if it did)."""
    msg = pool.collect([0], time.monotonic() + (180.0 if cfg.backend == "nccl" else 60.0))[0]
    if msg is None or "error" in msg:
        why = (msg or {}).get("error") or pool.dead.get(0, "did not start")
        with contextlib.suppress(Exception):
            pool.kill(0, why)
        return msg or {}, why
    return msg, None


def _join_record(launch: Launch, name: str, ready: dict, error: str | None) -> str:
    rec: dict[str, Any] = {
        "rank": launch.rank,
        "node": name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    rec["device"] = ready.get("device")
    if error:
        rec["error"] = error
    return json.dumps(rec)


class Coordinator:
    """Rank 0: hosts the store (unless torchrun's agent does), runs its own node like any rank,
    and drives the rounds. ``run`` returns the report; ``finish`` hands every rank its stop."""

    def __init__(self, cfg: NodeCheckConfig, launch: Launch, name: str, join_timeout_s: float):
        require_backend(cfg.backend)
        self.cfg, self.launch, self.name, self.join_timeout_s = cfg, launch, name, join_timeout_s
        self.t_start = time.monotonic()
        # the child first (forked before any store or thread exists here); it connects when the
        # store is up. A store rank 0 hosts is reached on loopback from this host.
        local = (LOCALHOST if launch.hosts_store else launch.host, launch.port)
        self.pool = _start_worker(name, launch, cfg, local)
        self.hb: Heartbeat | None = None
        self.relay_thread: threading.Thread | None = None
        self.relay_error: list[BaseException] = []
        try:
            raw = _store(launch.host, launch.port, join_timeout_s, master=launch.hosts_store)
        except Exception as e:
            self.pool.close()
            what = "host" if launch.hosts_store else "reach"
            raise MultiHostError(
                f"cannot {what} the rendezvous store on {launch.host}:{launch.port}: {_one_line(e)}"
            ) from None
        self.store = _keyed(raw, launch)
        self.store.set("config", json.dumps(dataclasses.asdict(cfg)))
        self.hb = Heartbeat(local, launch, ["hb/coord", "hb/0"])
        self.spool = StorePool(self.store, launch.world, lost_after(cfg))
        self.relay_thread = threading.Thread(target=self._relay, args=(local,), daemon=True)
        self.relay_thread.start()

    def _relay(self, addr) -> None:
        try:
            ready, why = _ready(self.pool, self.cfg)
            store = _keyed(_store(addr[0], addr[1], 60.0), self.launch)
            store.set("join/0", _join_record(self.launch, self.name, ready, why))
            relay(store, 0, self.pool, lost_after(self.cfg), watch_coordinator=False)
        except BaseException as e:  # surfaces as rank 0 lost, and in the report
            self.relay_error.append(e)

    def _join(self, deadline: float) -> dict[int, dict]:
        joined: dict[int, dict] = {}
        while True:
            for r in range(self.launch.world):
                if r not in joined and self.store.check([f"join/{r}"]):
                    joined[r] = json.loads(self.store.get(f"join/{r}"))
            if len(joined) == self.launch.world or time.monotonic() > deadline:
                return joined
            time.sleep(2 * POLL_S)

    def run(
        self,
        on_join: Callable[[dict[int, dict], list[str], dict[str, str]], None] | None = None,
        on_group: Callable[[GroupResult], None] | None = None,
    ) -> NodesReport:
        launch, cfg = self.launch, self.cfg
        joined = self._join(self.t_start + self.join_timeout_s)
        names: list[str] = []
        for r in range(launch.world):
            node = joined.get(r, {}).get("node") or launch.placeholder(r)
            names.append(node if node not in names else f"{node}#{r}")
        died: dict[str, str] = {}
        for r, n in enumerate(names):
            rec = joined.get(r)
            if rec is None:
                why = f"did not join within {self.join_timeout_s:g} s"
            elif rec.get("error"):
                why = f"did not start: {rec['error']}"
            else:
                self.spool.where[r] = f" ({n}, pid {rec.get('pid')} on {rec.get('host')})"
                continue
            died[n] = why
            self.spool.dead[r] = why
        if on_join:
            on_join(joined, names, died)
        groups = drive_rounds(cfg, self.spool, names, died, on_group, group_prefix=launch.prefix)
        loc = pairing.localize(names, groups, cfg.straggler_factor, died)
        workers = tuple(
            {
                "rank": r,
                "node": n,
                "host": joined.get(r, {}).get("host"),
                "pid": joined.get(r, {}).get("pid"),
                "joined": r in joined,
            }
            for r, n in enumerate(names)
        )
        unnamed = tuple(n for r, n in enumerate(names) if r not in joined and n == f"rank-{r}")
        return NodesReport(
            cfg,
            tuple(names),
            tuple(groups),
            loc,
            time.monotonic() - self.t_start,
            workers,
            launch.to_json(),
            unnamed,
        )

    def finish(self, report: NodesReport | None, exit_code: int) -> list[int]:
        """Send every rank its stop (the exit status, its node's verdict), wait for the live ones
        to be ready to exit, then let them all go at once; the ranks that never said they were
        ready. Leaving together matters under torchrun (see ``_leave``)."""
        verdicts = {v.node: v.to_json() for v in report.localization.verdicts} if report else {}
        names = report.nodes if report else ()
        for r in range(self.launch.world):
            msg = {"cmd": "stop", "exit": exit_code}
            if r < len(names):
                msg["verdict"] = verdicts.get(names[r])
            self.store.set(f"cmd/{r}/{self.spool.sent[r]}", json.dumps(msg))
        if self.relay_thread is not None:
            self.relay_thread.join(timeout=5.0)
        self.pool.close()
        live = range(1, self.launch.world)
        waiting = [r for r in live if r not in self.spool.dead or r in self.spool.killed]
        deadline = time.monotonic() + STOP_ACK_S
        while waiting and time.monotonic() < deadline:
            waiting = [r for r in waiting if not self.store.check([f"ack/{r}"])]
            time.sleep(POLL_S)
        leaving = [0, *(r for r in live if r not in waiting and self.store.check([f"ack/{r}"]))]
        self.store.set("exit", json.dumps(leaving))
        _leave(self.store, self.launch, leaving)
        return waiting

    def close(self) -> None:
        if self.relay_thread is not None:
            self.relay_thread.join(timeout=5.0)
        if self.hb is not None:
            self.hb.stop()
        self.pool.close()


def serve(launch: Launch, name: str, join_timeout_s: float) -> dict:
    """Rank R > 0: join rank 0's check, run this node's groups, and return the ``stop``
    message (``exit``: the check's exit status; ``verdict``: this node's)."""
    deadline = time.monotonic() + join_timeout_s
    addr = (launch.host, launch.port)
    try:
        raw = _store(addr[0], addr[1], join_timeout_s)
    except Exception as e:
        raise MultiHostError(
            f"cannot reach the rendezvous store at {launch.host}:{launch.port} within "
            f"{join_timeout_s:g} s ({_one_line(e)})"
        ) from None
    store = _keyed(raw, launch)
    while not store.check(["config"]):
        if time.monotonic() > deadline:
            raise MultiHostError(f"rank 0 published no configuration within {join_timeout_s:g} s")
        time.sleep(2 * POLL_S)
    cfg = NodeCheckConfig(**json.loads(store.get("config")))
    del store, raw  # no connection of ours crosses the fork
    pool = _start_worker(name, launch, cfg, addr)
    hb = None
    try:
        store = _keyed(_store(addr[0], addr[1], 60.0), launch)
        hb = Heartbeat(addr, launch, [f"hb/{launch.rank}"])
        ready, why = _ready(pool, cfg)
        store.set(f"join/{launch.rank}", _join_record(launch, name, ready, why))
        stop = relay(store, launch.rank, pool, lost_after(cfg), watch_coordinator=True)
    except MultiHostError:
        raise
    except Exception as e:
        raise MultiHostError(
            f"lost the rendezvous store at {launch.host}:{launch.port}: {_one_line(e)}"
        ) from None
    finally:
        if hb is not None:
            hb.stop()
        pool.close()
    # ready to exit: say so, and leave when rank 0 lets every rank go (or is gone)
    with contextlib.suppress(Exception):
        store.set(f"ack/{launch.rank}", "1")
        deadline = time.monotonic() + STOP_ACK_S + 5.0
        while not store.check(["exit"]) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if store.check(["exit"]):
            _leave(store, launch, json.loads(store.get("exit")))
    return stop


def _leave(store, launch: Launch, leaving: list[int]) -> None:
    """Say bye; the rank whose torchrun agent hosts the rendezvous waits for the others' and lingers."""
    store.set(f"bye/{launch.rank}", "1")
    agent = os.getppid()
    port = rendezvous_port(agent) if launch.how == "torchrun" else None
    if port is None or not listens_on(agent, port):
        return
    others = [r for r in leaving if r != launch.rank]
    deadline = time.monotonic() + STOP_ACK_S
    while others and time.monotonic() < deadline:
        others = [r for r in others if not store.check([f"bye/{r}"])]
        time.sleep(POLL_S)
    time.sleep(LEAVE_LAST_S)


def rendezvous_port(pid: int) -> int | None:
    """The c10d rendezvous port of the torchrun agent ``pid`` (its ``--rdzv-endpoint`` or
    ``PET_RDZV_ENDPOINT``; torchrun's default port 29400), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split("=", 1) for v in f.read().decode(errors="replace").split("\0") if "=" in v)
    except OSError:
        return None
    endpoint = env.get("PET_RDZV_ENDPOINT")
    for i, a in enumerate(argv):
        if a in ("--rdzv-endpoint", "--rdzv_endpoint") and i + 1 < len(argv):
            endpoint = argv[i + 1]
        elif a.startswith(("--rdzv-endpoint=", "--rdzv_endpoint=")):
            endpoint = a.split("=", 1)[1]
    if not endpoint:
        return None
    host, _, port = endpoint.rpartition(":")
    return int(port) if host and port.isdigit() else 29400


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP socket listening on ``port`` (Linux's /proc)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    listening.add(f"socket:[{cols[9]}]")
    fds = f"/proc/{pid}/fd"
    with contextlib.suppress(OSError):
        for fd in os.listdir(fds):
            with contextlib.suppress(OSError):
                if os.readlink(f"{fds}/{fd}") in listening:
                    return True
    return False


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
