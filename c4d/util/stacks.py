"""Stacks of a live process: Python frames with py-spy, native frames with py-spy, gdb or eu-stack.

All of them attach with ptrace. Whether that is allowed depends on the kernel and the
container, not on us: root or CAP_SYS_PTRACE always may; otherwise the target must have
our uid, and under Yama ``ptrace_scope=1`` (Ubuntu's default) be our descendant or have
named us with PR_SET_PTRACER (``c4d run``'s processes and the shim do: see launcher.py);
``ptrace_scope=2`` needs CAP_SYS_PTRACE; ``3`` forbids it. ``ptrace_blocker`` says which
rule stops us before a tool is tried, and a tool's own "Operation not permitted" is turned
into the same kind of one-line reason: a dump that cannot be taken says so, with the fix.

A Python process gets ``py-spy dump`` (its Python stack) and ``py-spy dump --native`` (the
Python frames interleaved with the native ones); a native process (``c4d-simtrain``,
anything without libpython) gets ``gdb -batch ... thread apply all bt``, else ``eu-stack``.
Each tool is bounded by a timeout and its output by a size cap.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CAP_SYS_PTRACE = 19
OUTPUT_CAP = 24 * 1024
_DENIED = re.compile(r"Operation not permitted|Permission denied|EPERM|ptrace.*not permitted", re.IGNORECASE)
_TRACED = re.compile(r"already traced", re.IGNORECASE)
FIX = "run c4d run as root, give it CAP_SYS_PTRACE, or set kernel.yama.ptrace_scope=1"


@dataclass
class StackDump:
    pid: int
    python: str | None = None
    """py-spy's dump of the Python threads (None: not a Python process, or it failed)."""
    native: str | None = None
    """Native frames of every thread (py-spy --native, gdb or eu-stack)."""
    tools: list[str] = field(default_factory=list)
    error: str | None = None
    """Why (part of) the dump is missing, in one line."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, [])}


def _cap_eff() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def yama_scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None  # no Yama: only the uid / capability rules apply


def ptrace_blocker(pid: int) -> str | None:
    """Why we certainly may not ptrace ``pid`` (one line), or None if we may (or can't tell)."""
    privileged = bool(_cap_eff() >> CAP_SYS_PTRACE & 1)
    scope = yama_scope()
    if scope == 3:
        return "ptrace is disabled on this host (kernel.yama.ptrace_scope=3)"
    if scope == 2 and not privileged:
        return f"ptrace needs CAP_SYS_PTRACE here (kernel.yama.ptrace_scope=2): {FIX}"
    if not privileged:
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            return None  # gone, or hidden: the tool will say
        if uid != os.geteuid():
            return f"process {pid} belongs to uid {uid}, we run as uid {os.geteuid()}: {FIX}"
    return None


def is_python(pid: int) -> bool:
    """A CPython process: its executable or a mapped library is python / libpython."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    if exe.startswith("python"):
        return True
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return any("libpython" in line for line in f)
    except OSError:
        return False


def py_spy() -> str | None:
    """The py-spy installed with this Python (a dependency of c4d), else one on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which("py-spy")


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"{os.path.basename(argv[0])} timed out after {timeout:g} s"
    except OSError as e:
        return 126, "", f"{os.path.basename(argv[0])}: {e.strerror or e}"
    return p.returncode, p.stdout, p.stderr


def _cap(text: str) -> str:
    if len(text) <= OUTPUT_CAP:
        return text
    return text[:OUTPUT_CAP] + f"\n… ({len(text) - OUTPUT_CAP} more characters cut)\n"


def _why(tool: str, rc: int, err: str, out: str) -> str:
    text = f"{err}\n{out}".strip()
    if _DENIED.search(text):
        return f"{tool}: ptrace not permitted ({_telling(text)})"
    return f"{tool} failed (status {rc}): {_telling(text)}"


def _telling(text: str) -> str:
    """The line of a tool's output that says most: the one about ptrace, else its error, else its first."""
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    for pick in (_TRACED.search, _DENIED.search, lambda s: s.startswith(("Error", "error", "ptrace"))):
        hit = [s for s in lines if pick(s)]
        if hit:
            return re.sub(r"^\d+: ", "", hit[0])[:200]
    return (lines[0] if lines else "no output")[:200]


def _summary(errors: list[str]) -> str:
    """Each reason once; the fix once, when ptrace was refused."""
    seen = list(dict.fromkeys(errors))
    text = "; ".join(seen)
    if any("ptrace not permitted" in e for e in seen):
        if any(_TRACED.search(e) for e in seen):
            text += ": another debugger or tracer holds the process"
        else:
            text += f": {FIX}"
    return text


def gdb_stacks(pid: int, timeout: float) -> tuple[str | None, str | None]:
    """(native stacks of every thread, None) or (None, why not)."""
    gdb = shutil.which("gdb")
    if gdb:
        rc, out, err = _run(
            [gdb, "-batch", "-nx", "-q", "-iex", "set debuginfod enabled off", "-p", str(pid),
             "-ex", "set pagination off",
             "-ex", "set print frame-arguments none", "-ex", "thread apply all bt"],
            timeout,
        )  # fmt: skip
        frames = [s for s in out.splitlines() if s.startswith(("Thread ", "#"))]
        if frames:
            return _cap("\n".join(frames) + "\n"), None
        return None, _why("gdb", rc, err, out)
    eu = shutil.which("eu-stack")
    if eu:
        rc, out, err = _run([eu, "-p", str(pid)], timeout)
        if rc == 0 and out.strip():
            return _cap(out), None
        return None, _why("eu-stack", rc, err, out)
    return None, "no native stack tool (install gdb or elfutils' eu-stack)"


def dump(pid: int, timeout: float = 15.0) -> StackDump:
    """Every stack of ``pid`` we can get; what we cannot is said in ``error``."""
    t0 = time.monotonic()
    d = StackDump(pid)
    blocked = ptrace_blocker(pid)
    if blocked:
        d.error = blocked
        return d
    if not os.path.exists(f"/proc/{pid}"):
        d.error = f"process {pid} is gone"
        return d
    errors = []
    if is_python(pid):
        spy = py_spy()
        if spy is None:
            errors.append("py-spy not found (pip install py-spy)")
        else:
            rc, out, err = _run([spy, "dump", "--pid", str(pid)], timeout)
            if rc == 0 and out.strip():
                d.python = _cap(out)
                d.tools.append("py-spy")
            else:
                errors.append(_why("py-spy", rc, err, out))
            rc, out, err = _run([spy, "dump", "--native", "--pid", str(pid)], timeout)
            if rc == 0 and out.strip():
                d.native = _cap(out)
                d.tools.append("py-spy --native")
            else:
                errors.append(_why("py-spy --native", rc, err, out))
    if d.native is None:
        native, why = gdb_stacks(pid, timeout)
        if native is not None:
            d.native = native
            d.tools.append("gdb" if shutil.which("gdb") else "eu-stack")
        elif why:
            errors.append(why)
    if errors and (d.python is None or d.native is None):
        d.error = _summary(errors)
    d.seconds = round(time.monotonic() - t0, 3)
    return d


_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+ in )?(.+?) \(|^\s{4}(\S.*?) \(")
_ARGS = re.compile(r"\([^()]*\)$")
_NOISE = re.compile(
    r"^(__|_dl_|\?\?|0x|clone|start_thread|execute_native_thread_routine|pthread_|futex|syscall|"
    r"epoll_wait|poll|select|nanosleep|clock_nanosleep|std::|<module>$)"
)


def digest(text: str | None, frames: int = 3) -> list[str]:
    """Per thread, its innermost frames that are not libc/pthread plumbing: ``a ← b ← c``."""
    out: list[str] = []
    cur: list[str] = []

    def close() -> None:
        if cur:
            line = " ← ".join(cur[:frames])
            if line not in out:
                out.append(line)

    for raw in (text or "").splitlines():
        if raw.startswith("Thread ") or raw.startswith("TID"):
            close()
            cur = []
            continue
        m = _FRAME.match(raw)
        if not m:
            continue
        name = _ARGS.sub("", (m.group(1) or m.group(2) or "").strip()).replace("(anonymous namespace)::", "")
        if name and not _NOISE.match(name):
            cur.append(name)
    close()
    return out
