"""Node names that may reach an isolation command: a strict pattern, checked before any argv is built.

A node name comes from the ranks' registration records (``C4D_NODE_NAME`` or the host
name), i.e. from the job's side of the wire: it is data, and it will be an argument of
``kubectl``/``scontrol``/an operator's script. Kubernetes node names are DNS subdomains
(RFC 1123: ≤ 253 characters of ``[a-z0-9.-]``, alphanumeric at both ends); Slurm's are host
names. The pattern accepts those (upper case and ``_`` too, for Slurm) and nothing else: no
leading ``-`` (an option to the tool), no ``/`` or ``..`` (a path), no whitespace, quotes,
shell metacharacters or control characters.
"""

from __future__ import annotations

import re

PATTERN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")


class BadNodeName(ValueError):
    """A node name an isolation action refuses to pass on."""


def check(name: str) -> str:
    """``name`` if it is a plain node name; else BadNodeName with a one-line, printable reason."""
    if not isinstance(name, str) or not PATTERN.fullmatch(name) or ".." in name:
        raise BadNodeName(f"refusing node name {name!r}: not a plain host name ([A-Za-z0-9._-], ≤ 253)")
    return name


def is_valid(name: str) -> bool:
    try:
        check(name)
    except BadNodeName:
        return False
    return True
