"""The one sanitizer for strings that come from the wire (node, job names): safe to print, log,
write to a file, put in HTML or hand to a scheduler.

A rank's REGISTER carries its node and job name as raw bytes; anything can be in them (a
buggy launcher, a hostile sender): ``../``, ``$(…)``, backticks, ESC sequences that rewrite
the operator's terminal, newlines that forge log lines. Where such a string enters the master
(c4d/intake/validate.py rewrites the records the engine and the bookkeeping see) it becomes
``clean(raw)``: the characters of host names, Kubernetes pod names and Slurm node names
(``A-Z a-z 0-9 . _ - : @ +``), every other character replaced by ``_``, no leading ``.`` or
``-`` (no hidden file, no command-line option), at most ``MAX_LEN`` characters, ``?`` when
nothing is left. The original bytes stay only in the trace file.
"""

from __future__ import annotations

import re

MAX_LEN = 64
UNKNOWN = "?"
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-:@+]")


def clean(raw: bytes | str, limit: int = MAX_LEN) -> str:
    """The safe form of a wire string (a C string: cut at the first NUL)."""
    if isinstance(raw, bytes):
        raw = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    else:
        raw = raw.split("\0", 1)[0]
    s = _UNSAFE.sub("_", raw[:limit])
    if s[:1] in (".", "-"):
        s = "_" + s[1:]
    return s or UNKNOWN


def is_clean(name: str) -> bool:
    """Whether ``name`` is already in the safe form (what the blacklist accepts)."""
    return bool(name) and name != UNKNOWN and clean(name) == name
