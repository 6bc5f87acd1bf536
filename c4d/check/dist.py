"""Local worker processes for the distributed checks, and torch as an optional import.

Topology: the coordinator (this process) starts N workers, each with a duplex pipe for control
messages, then hosts a ``torch.distributed.TCPStore`` on a port the kernel picks (port 0, so no
race with other users of the machine) and sends its address down every pipe. Workers build
their process groups on that store under a per-group key prefix, so a group can be formed, fail
and be torn down without disturbing any other group.

Workers are forked on CPU (torch is already imported here, so they start in milliseconds; no
torch thread pool has run yet) and spawned when CUDA is involved (CUDA cannot be used in a
forked child once the parent has touched it).

All waiting is event-driven (``multiprocessing.connection.wait`` on pipes and process
sentinels) with a deadline; nothing polls.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

LOCALHOST = "127.0.0.1"


def import_torch() -> tuple[Any, str | None]:
    """``(torch, None)``, or ``(None, reason)`` where torch is missing or broken."""
    # c10d logs every store timeout as a C++ warning; the checks report those failures themselves.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return None, "torch.distributed is not available in this torch build"
        return torch, None
    except Exception as e:  # a broken install raises OSError etc., not only ImportError
        return None, f"torch not available ({type(e).__name__}: {e})"


class WorkerPool:
    """N local worker processes: ``target(*args, conn)`` each; ``conn`` is their control pipe."""

    def __init__(
        self,
        target,
        args_per_worker: list[tuple],
        cuda: bool,
        store_timeout_s: float = 600.0,
        store_addr: tuple[str, int] | None = None,
    ):
        """``store_addr``: a store the workers use instead of one of our own (the rendezvous
        store of a multi-host check, which may not be up yet: the workers retry connecting)."""
        import torch.distributed as dist

        ctx = mp.get_context("spawn" if cuda else "fork")
        self.procs: list[mp.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.dead: dict[int, str] = {}
        self.killed: set[int] = set()
        for args in args_per_worker:
            parent, child = ctx.Pipe(duplex=True)
            # typeshed's BaseContext lacks Process; the fork/spawn contexts have it
            p = ctx.Process(target=target, args=(*args, child), daemon=True)  # type: ignore[attr-defined]
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self.store = None
        if store_addr is None:
            self.store = dist.TCPStore(
                LOCALHOST,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=store_timeout_s),
            )
            store_addr = (LOCALHOST, self.store.port)
        for c in self.conns:
            c.send({"store": store_addr})

    def send(self, i: int, msg: dict) -> bool:
        if i in self.dead:
            return False
        try:
            self.conns[i].send(msg)
            return True
        except (BrokenPipeError, OSError):
            self._mark_dead(i)
            return False

    def _mark_dead(self, i: int) -> None:
        if i not in self.dead:
            p = self.procs[i]
            p.join(timeout=1.0)
            code = p.exitcode
            self.dead[i] = (
                f"worker exited with status {code}" if code is not None else "worker stopped answering"
            )

    def collect(self, indices: list[int], deadline: float) -> dict[int, dict | None]:
        """One message from each of ``indices`` (``None`` for a worker that died or did not
        answer by ``deadline``, a ``time.monotonic()`` value)."""
        out: dict[int, dict | None] = {i: None for i in indices if i in self.dead}
        pending = {i for i in indices if i not in self.dead}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables: dict[Any, int] = {}
            for i in pending:
                waitables[self.conns[i]] = i
                waitables[self.procs[i].sentinel] = i
            for ready in wait(list(waitables), timeout=left):
                i = waitables[ready]
                if i not in pending:
                    continue
                conn = self.conns[i]
                try:
                    if conn.poll():  # a message, possibly sent just before the worker exited
                        out[i] = conn.recv()
                        pending.discard(i)
                        continue
                    if self.procs[i].is_alive():
                        continue
                except (EOFError, OSError):  # pipe closed: the worker is gone
                    pass
                self._mark_dead(i)
                out[i] = None
                pending.discard(i)
        for i in pending:  # no answer in time: the worker is wedged; stop it so it can't linger
            self.kill(i, "no answer before the deadline")
            out[i] = None
        return out

    def kill(self, i: int, why: str) -> None:
        self.killed.add(i)
        p = self.procs[i]
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)
        self.dead.setdefault(i, why)

    def close(self, grace_s: float = 5.0) -> None:
        for i in range(len(self.procs)):
            self.send(i, {"cmd": "stop"})
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        for c in self.conns:
            c.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def worker_store(conn: Connection, timeout_s: float):
    """In a worker: wait for the coordinator's store address and connect to it."""
    import torch.distributed as dist

    if not conn.poll(timeout_s):
        raise TimeoutError("coordinator sent no store address")
    host, port = conn.recv()["store"]
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
