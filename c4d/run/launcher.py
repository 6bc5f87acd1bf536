"""Starting and stopping the job's processes.

Each launched process leads its own process group (a new session), so a stop reaches
what it forked. Stop = SIGTERM to every group and to every descendant that left it (a
launcher that gives each rank its own session), then SIGKILL to whatever is left after
the grace period. A launched process also gets SIGKILL if ``c4d run`` itself dies, and
declares ``c4d run`` its ptracer (Yama ``ptrace_scope=1``), so that the stack dumpers
``c4d run`` starts may attach to it without root (the shim does the same in every rank).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from c4d.run import proctree
from c4d.run.logs import LogCapture

log = logging.getLogger("c4d.run")

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61  # "Yama"


def _child_setup(supervisor: int) -> None:
    """In the forked child, before exec: die with ``c4d run``; let its tools ptrace us."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc.prctl(_PR_SET_PTRACER, supervisor, 0, 0, 0)  # EINVAL without Yama: harmless


def exit_status(rc: int | None) -> int | None:
    """A Popen return code as a shell reports it: a death by signal N is 128 + N."""
    if rc is None:
        return None
    return 128 - rc if rc < 0 else rc


@dataclass
class Job:
    """The processes of one attempt."""

    procs: list[subprocess.Popen]
    started: float = field(default_factory=time.monotonic)
    exited_at: dict[int, float] = field(default_factory=dict)
    """index → monotonic time its process was seen exited."""

    def poll(self) -> list[int | None]:
        rcs = [p.poll() for p in self.procs]
        now = time.monotonic()
        for i, rc in enumerate(rcs):
            if rc is not None and i not in self.exited_at:
                self.exited_at[i] = now
        return rcs

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def tree(self) -> set[int]:
        """Every live process of the job (the launched ones and their descendants)."""
        live = {p.pid for p in self.procs if p.poll() is None}
        return live | proctree.descendants(self.pids)

    def _in_groups(self, pids: set[int]) -> set[int]:
        """The pids that are in one of the launched processes' groups (a killpg reaches them)."""
        groups = {p.pid for p in self.procs}
        out = set()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) in groups:
                    out.add(pid)
        return out

    def stop(self, grace_s: float) -> list[int | None]:
        """SIGTERM to everything, SIGKILL after ``grace_s``; returns the exit statuses."""
        victims = self.tree()
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        # Then those that left the groups, once: a second SIGTERM to a process that is
        # cleaning up after the first (c4d sim removing its shared memory) would cut that short.
        for pid in victims - self._in_groups(victims):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs) and not any(proctree.alive(v) for v in victims):
                break
            time.sleep(0.05)
        left = self.tree() | {v for v in victims if proctree.alive(v)}
        if left:
            log.warning(
                "c4d run: %d process(es) still running %.0f s after SIGTERM: SIGKILL", len(left), grace_s
            )
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("c4d run: process %d did not exit after SIGKILL", p.pid)
        return self.poll()


def launch(argv: Sequence[str], env: Mapping[str, str], nprocs: int, capture: LogCapture) -> Job:
    """Start ``nprocs`` copies of ``argv`` (LOCAL_RANK 0..nprocs-1 when more than one).

    Raises OSError (a missing or non-executable program) before anything is started.
    """
    me = os.getpid()
    procs: list[subprocess.Popen] = []
    try:
        for i in range(nprocs):
            penv = dict(env)
            if nprocs > 1:
                penv.update(LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(nprocs))
            p = subprocess.Popen(
                list(argv),
                env=penv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=lambda: _child_setup(me),  # prctl only: no lock a thread could hold
            )
            procs.append(p)
            assert p.stdout is not None and p.stderr is not None
            capture.attach(p.stdout, i, "out")
            capture.attach(p.stderr, i, "err")
    except OSError:
        Job(procs).stop(1.0)
        raise
    return Job(procs)
