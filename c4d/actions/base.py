"""What an isolation action is (``Action``: the argv ``Command``s it runs for a node and a
diagnosis) and the diagnosis as the one-line JSON actions hand their commands. The actions
(``command``, ``kubernetes``, ``slurm``) build on this; ``isolate`` runs them; ``factory``
makes them from ``--isolate`` values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Command:
    """One program run: its argv (argv[0] looked up on PATH) and what it reads on stdin."""

    argv: tuple[str, ...]
    stdin: str | None = None


class Action(Protocol):
    name: str
    """How the operator named it: ``kubernetes``, ``slurm``, ``cmd:PATH``."""

    def commands(self, node: str, diagnosis: Mapping[str, Any]) -> list[Command]: ...


def compact_json(diagnosis: Mapping[str, Any], limit: int) -> str:
    """The diagnosis as one JSON line of at most ``limit`` bytes: stacks are dropped first
    (they are in the run's evidence files), then the detail."""
    full = json.dumps(diagnosis, separators=(",", ":"), sort_keys=True)
    if len(full.encode()) <= limit:
        return full
    slim = dict(diagnosis)
    detail = dict(slim.get("detail") or {})
    if "stacks" in detail:
        detail["stacks"] = "omitted (too long): see the evidence file of c4d run"
    slim["detail"] = detail
    out = json.dumps(slim, separators=(",", ":"), sort_keys=True)
    if len(out.encode()) <= limit:
        return out
    slim["detail"] = {"omitted": "too long: see the evidence file of c4d run"}
    return json.dumps(slim, separators=(",", ":"), sort_keys=True)[:limit]
