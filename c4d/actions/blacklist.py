"""The blacklist file: one node name a line, no duplicates, always replaced atomically.

A scheduler or ``c4d run`` reads it to keep the culprit nodes out of the next launch.
Writers never leave a half-written file: the new content goes to a temporary file in the
same directory, is flushed to disk, then renamed over the old one (rename is atomic on
POSIX). Called from the master thread; concurrent writers from other processes are not
serialised (the last rename wins, and each one is a complete file).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from c4d.record import names


def read_nodes(path: str | os.PathLike) -> list[str]:
    """Node names in the file, in order, without blanks or duplicates ([] if it does not exist)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out: list[str] = []
    for line in text.splitlines():
        name = line.strip()
        if name and name not in out:
            out.append(name)
    return out


def _valid(name: str) -> bool:
    """Only names already in c4d.record.names' safe form: the master sanitizes wire names on arrival, so
    anything else here did not come through it and is refused, never rewritten."""
    return names.is_clean(name)


def append_nodes(path: str | os.PathLike, nodes: Iterable[str]) -> list[str]:
    """Add ``nodes`` not yet listed; return the ones added (the file is untouched if none)."""
    p = Path(path)
    have = read_nodes(p)
    added = []
    for n in nodes:
        n = str(n).strip()
        if _valid(n) and n not in have and n not in added:
            added.append(n)
    if not added:
        return []
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{n}\n" for n in have + added))
            f.flush()
            os.fsync(f.fileno())
        if p.exists():
            os.chmod(tmp, p.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return added


def apply(diagnosis: Any, path: str | os.PathLike) -> list[str]:
    """Blacklist the culprit nodes of a diagnosis if it calls for it (a localized ERROR)."""
    return append_nodes(path, getattr(diagnosis, "blacklist_nodes", ()))
