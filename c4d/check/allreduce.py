"""AllReduceTest: an all-reduce across the node's devices, every element verified.

One process per GPU with NCCL where torch sees GPUs; otherwise the same check over gloo
processes on the CPU (``procs`` of them), so a CPU machine exercises the same code path.
"""

from __future__ import annotations

import os
import sys
import time

from c4d.check import faults
from c4d.check.dist import WorkerPool, import_torch
from c4d.check.result import CheckResult, Status


def allreduce_check(
    procs: int | None = None, backend: str = "auto", timeout_s: float = 60.0, numel: int = 1 << 18
):
    """Run the check; ``procs`` defaults to the GPU count (NCCL) or 2 (gloo)."""
    torch, why = import_torch()
    if torch is None:
        return CheckResult("AllReduceTest", "", Status.SKIPPED, None, None, why or "torch not available")
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        return CheckResult(
            "AllReduceTest", "nccl", Status.FAILED, None, None, "nccl needs CUDA torch and a GPU"
        )
    if procs is None:
        procs = torch.cuda.device_count() if backend == "nccl" else 2
    if procs < 1:
        return CheckResult("AllReduceTest", backend, Status.FAILED, None, None, "no device to run on")
    for msg in faults.parse(os.environ.get(faults.ENV))[1]:
        print(msg, file=sys.stderr)
    from c4d.check.worker import allreduce_worker

    target = f"{backend} x{procs}"
    t0 = time.monotonic()
    with WorkerPool(
        allreduce_worker,
        [(r, procs, backend, timeout_s, numel) for r in range(procs)],
        cuda=backend == "nccl",
    ) as pool:
        answers = pool.collect(
            list(range(procs)), time.monotonic() + timeout_s + (120 if backend == "nccl" else 30)
        )
        dead = dict(pool.dead)
    wall = time.monotonic() - t0
    problems = []
    times = []
    wrong = 0
    for r in range(procs):
        a = answers.get(r)
        if a is None:
            problems.append(f"rank {r}: {dead.get(r, 'no answer')}")
        elif "error" in a:
            problems.append(f"rank {r}: {a['error']}")
        else:
            wrong += a["wrong"]
            times.append(a["time_s"])
            if a["wrong"]:
                problems.append(f"rank {r}: {a['wrong']} of {numel} elements wrong")
    value = {
        "backend": backend,
        "procs": procs,
        "elements": numel,
        "wrong": wrong,
        "max_time_s": max(times) if times else None,
        "wall_s": round(wall, 3),
    }
    if problems:
        return CheckResult("AllReduceTest", target, Status.FAILED, value, {"wrong": 0}, "; ".join(problems))
    detail = f"{numel} float32 summed over {procs} ranks, all correct, {max(times) * 1e3:.1f} ms"
    return CheckResult("AllReduceTest", target, Status.SUCCEED, value, {"wrong": 0}, detail)
