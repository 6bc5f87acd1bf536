"""``c4d check nodes``: pairwise GEMM + all-gather rounds that isolate a bad or straggling node.

The coordinator (this module) starts one worker per simulated node (``worker.node_worker``),
drives the rounds planned by ``pairing``, and turns the group results into verdicts. On CPU the
nodes are local gloo processes named ``node-0`` .. ``node-(N-1)``; on a GPU host each node is one
GPU with NCCL. Workers live for the whole check (a gloo start-up costs more than a round), and
each group gets a fresh process group under its own store prefix.

The rounds themselves (``drive_rounds``) only send commands to workers and collect answers, so
the multi-host check (``multihost.py``: one worker per host, reached through the rendezvous
store) runs the very same rounds and verdicts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from c4d.check import faults, pairing
from c4d.check.dist import WorkerPool, import_torch
from c4d.check.pairing import GroupResult, Localization


@dataclass(frozen=True)
class NodeCheckConfig:
    nodes: int = 4
    backend: str = "gloo"
    straggler_factor: float = 2.0
    gemm_size: int = 256
    allgather_bytes: int = 1 << 20
    iters: int = 10
    warmup: int = 3
    timeout_s: float = 30.0
    max_rounds: int = 4
    parallel_groups: int = 0
    """Groups of a round run at once (0: all). Simulated CPU nodes share the machine's cores, so
    concurrent groups would mostly measure the scheduler; there the CLI runs one at a time."""

    def worker_cfg(self) -> dict:
        return {
            "gemm_size": self.gemm_size,
            "allgather_bytes": self.allgather_bytes,
            "iters": self.iters,
            "warmup": self.warmup,
            "timeout_s": self.timeout_s,
        }


@dataclass(frozen=True)
class NodesReport:
    config: NodeCheckConfig
    nodes: tuple[str, ...]
    groups: tuple[GroupResult, ...]
    localization: Localization
    wall_s: float
    workers: tuple[dict, ...] = ()
    """Multi-host only: per rank, who joined (``rank``, ``node``, ``host``, ``pid``, ``joined``)."""
    launch: dict | None = None
    """Multi-host only: how the workers met (``how``, ``store``, ``world_size``)."""
    unnamed: tuple[str, ...] = field(default=())
    """Placeholder names (``rank-K``) of ranks that never said which node they are: never
    blacklisted, since no scheduler knows them."""

    @property
    def passed(self) -> bool:
        return self.localization.passed

    def to_json(self) -> dict:
        loc = self.localization
        return {
            "passed": self.passed,
            "backend": self.config.backend,
            "nodes": [v.to_json() for v in loc.verdicts],
            "faulty": loc.faulty,
            "stragglers": loc.stragglers,
            "unresolved": loc.unresolved,
            "round_reference_s": {str(r): t for r, t in sorted(loc.references_s.items())},
            "straggler_factor": loc.factor,
            "suspect_links": [list(lk) for lk in loc.suspect_links],
            "notes": list(loc.notes),
            "rounds": max((g.round for g in self.groups), default=0),
            "groups": [g.to_json() for g in self.groups],
            "wall_s": round(self.wall_s, 3),
            **({"launch": self.launch, "workers": list(self.workers)} if self.launch else {}),
        }


class CheckUnavailable(RuntimeError):
    """The check cannot run here (no torch, no such backend)."""


def require_backend(backend: str) -> None:
    """Raise ``CheckUnavailable`` unless torch and ``backend`` work here; report malformed
    ``C4D_CHECK_SIM_FAULT`` entries once."""
    torch, why = import_torch()
    if torch is None:
        raise CheckUnavailable(why or "torch not available")
    import torch.distributed as dist

    if backend == "nccl" and not (dist.is_nccl_available() and torch.cuda.is_available()):
        raise CheckUnavailable("backend nccl needs a CUDA build of torch and a GPU")
    if backend != "nccl" and not dist.is_gloo_available():
        raise CheckUnavailable("backend gloo is not available in this torch build")
    for note in faults.parse(os.environ.get(faults.ENV))[1]:
        print(note, file=sys.stderr)


def run_node_check(
    cfg: NodeCheckConfig, on_group: Callable[[GroupResult], None] | None = None
) -> NodesReport:
    """Run every round and localize. ``on_group`` sees each group result as it arrives."""
    if cfg.nodes < 2:
        raise ValueError("--nodes must be at least 2")
    require_backend(cfg.backend)
    cuda = cfg.backend == "nccl"

    from c4d.check.worker import node_worker

    t_start = time.monotonic()
    names = [f"node-{i}" for i in range(cfg.nodes)]
    groups: list[GroupResult] = []
    died: dict[str, str] = {}
    wcfg = cfg.worker_cfg()
    with WorkerPool(node_worker, [(n, i, cfg.backend, wcfg) for i, n in enumerate(names)], cuda=cuda) as pool:
        startup = pool.collect(list(range(cfg.nodes)), time.monotonic() + (180.0 if cuda else 60.0))
        for i, msg in startup.items():
            if msg is None or "error" in msg:
                died[names[i]] = (msg or {}).get("error") or pool.dead.get(i, "did not start")
                pool.kill(i, died[names[i]])
        groups = drive_rounds(cfg, pool, names, died, on_group)
    loc = pairing.localize(names, groups, cfg.straggler_factor, died)
    return NodesReport(cfg, tuple(names), tuple(groups), loc, time.monotonic() - t_start)


class Pool(Protocol):
    """What the rounds need of the workers: ``dist.WorkerPool`` (local processes) or
    ``multihost.StorePool`` (one worker per host, through the rendezvous store)."""

    dead: dict[int, str]
    killed: set[int]

    def send(self, i: int, msg: dict) -> bool: ...

    def collect(self, indices: list[int], deadline: float) -> dict[int, dict | None]: ...


def drive_rounds(
    cfg: NodeCheckConfig,
    pool: Pool,
    names: list[str],
    died: dict[str, str],
    on_group: Callable[[GroupResult], None] | None = None,
    group_prefix: str = "",
) -> list[GroupResult]:
    """Round 1 and the re-test rounds over ``names`` (worker ``i`` of ``pool`` is ``names[i]``).
    Workers that die on the way are added to ``died``; ``group_prefix`` keeps the groups' store
    keys apart from another run's on a shared store."""
    index = {n: i for i, n in enumerate(names)}
    groups: list[GroupResult] = []

    def alive(n: str) -> bool:
        return index[n] not in pool.dead

    def run_round(rnd: int, plan: list[tuple[str, ...]]) -> list[GroupResult]:
        answers: dict[int, dict | None] = {}
        step = cfg.parallel_groups or len(plan)
        for start in range(0, len(plan), step):
            batch = plan[start : start + step]
            for gi, members in enumerate(batch, start):
                for rank, m in enumerate(members):
                    msg = {
                        "cmd": "run",
                        "group": f"{group_prefix}r{rnd}g{gi}",
                        "rank": rank,
                        "size": len(members),
                    }
                    pool.send(index[m], {**msg, "timeout_s": cfg.timeout_s})
            members_all = [index[m] for g in batch for m in g]
            answers.update(pool.collect(members_all, time.monotonic() + 2 * cfg.timeout_s + 30.0))
        out = []
        for members in plan:
            errors, gemm, times = {}, {}, []
            for m in members:
                a = answers.get(index[m])
                if a is None:
                    errors[m] = pool.dead.get(index[m], "no answer")
                    if index[m] not in pool.killed:
                        died[m] = errors[m]
                elif not a.get("ok"):
                    errors[m] = a.get("error", "failed")
                else:
                    gemm[m] = a["gemm_s"]
                    times.append(a["time_s"])
            ok = not errors
            g = GroupResult(rnd, tuple(members), ok, max(times) if ok else None, gemm, errors)
            out.append(g)
            if on_group:
                on_group(g)
        return out

    live = [n for n in names if alive(n)]
    if len(live) < 2:
        return groups
    groups += run_round(1, pairing.first_round(live))
    sus = [s for s in pairing.suspects(groups, cfg.straggler_factor) if s not in died]
    good = [n for n in live if n not in sus and n not in died and any(n in g.nodes and g.ok for g in groups)]
    tested: set[str] = set()
    rnd = 1
    while rnd < cfg.max_rounds:
        good = [n for n in good if alive(n)]
        pending = [s for s in sus if s not in tested and alive(s)]
        if not pending or not good:
            break
        rnd += 1
        plan = pairing.retest_round(pending, good)
        tested.update(s for g in plan for s in g if s in pending)
        groups += run_round(rnd, plan)
    return groups
