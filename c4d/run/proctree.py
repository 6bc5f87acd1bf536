"""The process tree under a set of roots, read from /proc (Linux).

Used to stop everything a job started, including processes that left the job's process
group (``c4d sim`` puts each rank in its own session), and to check that a pid a rank
reported is one of ours before attaching a debugger to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; cut at the last ')'
    rest = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def children_map() -> dict[int, list[int]]:
    """ppid → child pids, for every process visible now."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        pp = _ppid(pid)
        if pp is not None:
            out.setdefault(pp, []).append(pid)
    return out


def descendants(roots: Iterable[int]) -> set[int]:
    """Every live process below ``roots`` (the roots themselves excluded)."""
    kids = children_map()
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    rest = stat[stat.rfind(b")") + 2 :].split()
    return bool(rest) and rest[0] != b"Z"
