"""Stacks in the live view and in ``c4d report``: a few lines per rank, the full text on demand.

``live_lines`` turns the diagnoses that carry ``detail["stacks"]`` into one line per dumped
rank (the innermost frames of each thread that are not libc plumbing); ``html_section``
renders the same for the report page, with each full stack in a collapsed block. The
report finds the stacks beside the trace: ``c4d run --trace FILE`` writes
``FILE.stacks.json`` (``sidecar_path``).
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from c4d.util.stacks import digest

log = logging.getLogger("c4d.run")


def sidecar_path(trace: str | Path) -> Path:
    return Path(f"{trace}.stacks.json")


def load_sidecar(trace: str | Path) -> list[dict[str, Any]]:
    """The stacks ``c4d run`` kept for a trace ([] when there are none or the file is unreadable)."""
    p = sidecar_path(trace)
    if not p.is_file():
        return []
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        log.warning("c4d: ignoring %s: %s", p, e)
        return []
    return (
        [e for e in data if isinstance(e, dict) and isinstance(e.get("stacks"), dict)]
        if isinstance(data, list)
        else []
    )


def _entries(diagnoses: Iterable[Any]) -> list[Mapping[str, Any]]:
    """Latest diagnosis with stacks per hang, newest first."""
    seen: dict[tuple, Mapping[str, Any]] = {}
    for d in diagnoses:
        j = d.to_json() if hasattr(d, "to_json") else d
        st = _stacks(j)
        if st:
            seen[(j.get("kind"), j.get("comm"), j.get("seq"))] = j
    return sorted(seen.values(), key=lambda j: -(j.get("time") or 0))


def _stacks(j: Mapping[str, Any]) -> dict[str, Any]:
    """A diagnosis's ``detail["stacks"]``, or a sidecar entry's ``stacks``."""
    st = (j.get("detail") or {}).get("stacks") or j.get("stacks")
    return dict(st) if isinstance(st, dict) else {}


def rank_line(rank: str, s: Mapping[str, Any]) -> str:
    """``rank 4 culprit: a ← b | c ← d`` (Python frames first), or why there is no stack.

    Native threads doing something (more frames above the libc plumbing) before threads parked
    in their own loop: a process has several helper threads (NCCL's proxy, the shim's agent,
    stream workers) whose idle one-frame lines would otherwise crowd the stuck one out."""
    parts = digest(s.get("python")) or []
    native = sorted(digest(s.get("native")), key=lambda p: -p.count(" ← "))  # stable: gdb's order on ties
    parts += [p for p in native if p not in parts]
    body = " | ".join(parts[:3]) if parts else (s.get("error") or "no frames")
    who = f"rank {rank}" if str(rank).isdigit() else str(rank).replace(":", " ")  # "pid:N": not a rank
    return f"{who} {s.get('role', '')}: {body}"


def live_lines(diagnoses: Iterable[Any], limit: int = 6) -> list[str]:
    out: list[str] = []
    for j in _entries(diagnoses):
        st = _stacks(j)
        for r in sorted(st, key=lambda r: (st[r].get("role") != "culprit", int(r) if r.isdigit() else 0)):
            out.append(rank_line(r, st[r]))
            if len(out) >= limit:
                return out
    return out


def stacks_text(lines: list[str], width: int, limit: int = 6):
    """The live view's stacks panel body (a rich Text): culprit lines in red."""
    from rich.text import Text

    return Text("\n").join(
        Text(line[: width - 4], style="red" if " culprit:" in line else "") for line in lines[:limit]
    )


def html_section(entries: Iterable[Mapping[str, Any]]) -> str:
    """``<h2>Stacks of hung ranks</h2>`` and per rank a digest line plus the full stacks; "" if none."""
    items = _entries(entries)
    if not items:
        return ""
    parts = ["<h2>Stacks of hung ranks (c4d run)</h2>"]
    for j in items:
        nodes = ", ".join(map(str, j.get("nodes") or []))
        parts.append(
            f"<h3>{html.escape(str(j.get('kind')))} {html.escape(str(j.get('op') or ''))} "
            f"#{html.escape(str(j.get('seq')))} on {html.escape(nodes)}</h3>"
        )
        st = _stacks(j)
        for r in sorted(st, key=lambda r: (st[r].get("role") != "culprit", r)):
            s = st[r]
            parts.append(f"<p><code>{html.escape(rank_line(r, s))}</code></p>")
            for label in ("python", "native"):
                if s.get(label):
                    parts.append(
                        f"<details><summary>rank {html.escape(r)} {label} stack (pid {s.get('pid')})"
                        "</summary>"
                        f"<pre>{html.escape(str(s[label]))}</pre></details>"
                    )
    return "\n".join(parts)
