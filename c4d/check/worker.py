"""Code that runs inside the check's worker processes (see ``dist.WorkerPool``).

Every worker reads ``C4D_CHECK_SIM_FAULT`` for its own name (``faults.py``) and answers its
coordinator on its pipe with plain dicts. A worker never raises out: errors become answers.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from datetime import timedelta
from multiprocessing.connection import Connection

from c4d.check import faults


def _device(torch, backend: str, index: int):
    if backend == "nccl":
        torch.cuda.set_device(index % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _err(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def allreduce_worker(
    rank: int, world: int, backend: str, timeout_s: float, numel: int, conn: Connection
) -> None:
    """One rank of the boot all-reduce check: sum ``(i % 1024) + rank`` and verify every element."""
    import torch
    import torch.distributed as dist

    name = f"rank-{rank}"
    fault = faults.for_worker(name)
    try:
        store = _store(conn, timeout_s)
        if fault and fault.kind == "crash":
            os._exit(faults.CRASH_STATUS)
        torch.set_num_threads(1)
        dev = _device(torch, backend, rank)
        if fault and fault.kind == "fail":
            raise RuntimeError(f"simulated fault on {name} ({faults.ENV})")
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("allreduce", store),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        base = torch.arange(numel, dtype=torch.float32, device=dev) % 1024
        x = base + rank
        if fault and fault.kind == "corrupt":
            x[numel // 3] += 0.5
        expected = base * world + world * (world - 1) / 2
        _sync(torch, dev)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        _sync(torch, dev)
        elapsed = time.perf_counter() - t0
        if fault and fault.kind == "slow":
            time.sleep(elapsed * (fault.factor - 1))
            elapsed *= fault.factor
        wrong = int((x != expected).sum().item())
        conn.send({"rank": rank, "ok": wrong == 0, "wrong": wrong, "time_s": elapsed})
    except Exception as e:
        conn.send({"rank": rank, "ok": False, "error": _err(e)})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        conn.close()


def _store(conn: Connection, timeout_s: float):
    from c4d.check.dist import worker_store

    return worker_store(conn, max(timeout_s, 60.0))


def _fresh_store(store):
    """A new client connection to the coordinator's store. One per group: after a timed-out
    wait, a TCPStore client may read the late reply to that wait as the answer to its next
    request, so a connection that saw a timeout is never reused."""
    import torch.distributed as dist

    return dist.TCPStore(store.host, store.port, is_master=False, timeout=store.timeout)


def node_worker(name: str, index: int, backend: str, cfg: dict, conn: Connection) -> None:
    """A simulated node of ``c4d check nodes``: waits for group assignments, runs each, reports.

    Messages in: ``{"cmd": "run", "group": id, "rank": r, "size": n, "timeout_s": t}`` or
    ``{"cmd": "stop"}``. Out: ``{"ready": name}`` once, then one result dict per ``run``.
    """
    import torch

    fault = faults.for_worker(name)
    try:
        store = _store(conn, cfg["timeout_s"])
        torch.set_num_threads(1)
        dev = _device(torch, backend, index)
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
        n = cfg["gemm_size"]
        gen = torch.Generator(device="cpu").manual_seed(index)
        a = torch.randn(n, n, generator=gen).to(dev, dtype)
        b = torch.randn(n, n, generator=gen).to(dev, dtype)
        conn.send({"ready": name, "pid": os.getpid(), "device": str(dev)})
    except Exception as e:
        conn.send({"ready": name, "error": _err(e)})
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # coordinator gone
            return
        if msg.get("cmd") != "run":
            return
        if fault and fault.kind == "crash":
            os._exit(faults.CRASH_STATUS)
        result = _run_group(torch, store, backend, dev, a, b, msg, cfg, name, fault)
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            return


def _low_quartile(xs: list[float]) -> float:
    """The iteration time the node sustains: preemption and jitter only ever add time, so the
    lower quartile of the iterations is steadier than the median on a loaded machine."""
    return sorted(xs)[(len(xs) - 1) // 4]


def _new_group(backend: str, store, rank: int, size: int, timeout: timedelta):
    """A process group object of our own, outside torch's global group registry: a failed or
    abandoned group leaves no state behind that would skew the next one."""
    import torch.distributed as dist

    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _run_group(torch, store, backend, dev, a, b, msg, cfg, name, fault) -> dict:
    import torch.distributed as dist

    base = {"node": name, "group": msg["group"]}
    if fault and fault.kind == "fail":
        return {**base, "ok": False, "error": f"simulated fault ({faults.ENV})"}
    size, rank = msg["size"], msg["rank"]
    numel = max(cfg["allgather_bytes"] // 4, 1)
    pg = None
    try:
        timeout = timedelta(seconds=msg["timeout_s"])
        pg = _new_group(backend, dist.PrefixStore(msg["group"], _fresh_store(store)), rank, size, timeout)
        chunk = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=dev)
        if fault and fault.kind == "corrupt":
            chunk[numel // 2] += 0.5
        outs = [torch.empty_like(chunk) for _ in range(size)]
        gemm, comm, total = [], [], []
        warm: list[float] = []  # a slow fault's unit: this group's own unimpaired step time
        for it in range(cfg["warmup"] + cfg["iters"]):
            _sync(torch, dev)
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(torch, dev)
            if fault and fault.kind == "slow" and it >= cfg["warmup"]:
                # F x slower: each step takes (F-1) x the step's natural time longer, spent
                # before the collective so the partners wait for it as they would for a slow node.
                time.sleep(statistics.median(warm) * (fault.factor - 1))
            t1 = time.perf_counter()
            pg.allgather([outs], [chunk]).wait()
            _sync(torch, dev)
            t2 = time.perf_counter()
            if it < cfg["warmup"]:
                warm.append(t2 - t0)
            else:
                gemm.append(t1 - t0)
                comm.append(t2 - t1)
                total.append(t2 - t0)
        bad = [r for r, o in enumerate(outs) if not bool((o == float(r + 1)).all())]
        res = {
            **base,
            "ok": not bad,
            "gemm_s": _low_quartile(gemm),
            "allgather_s": _low_quartile(comm),
            "time_s": _low_quartile(total),
        }
        if bad:
            res["error"] = f"all-gather data from group rank(s) {bad} is wrong"
        return res
    except Exception as e:
        if pg is not None and backend == "nccl":
            with contextlib.suppress(Exception):
                pg.abort()  # a broken NCCL communicator must not linger into the next group
            pg = None
        return {**base, "ok": False, "error": _err(e)}
    finally:
        if pg is not None and backend == "nccl":
            with contextlib.suppress(Exception):
                pg.shutdown()  # release the communicator before the next group builds its own
        del pg
