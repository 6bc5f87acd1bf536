"""``--isolate slurm``: drain the node through ``scontrol``, the diagnosis as the reason.

``scontrol update NodeName=N State=DRAIN Reason=...``: running jobs finish (ours is being
stopped anyway), nothing new is scheduled there until an administrator resumes it. Slurm
shows the reason in ``sinfo -R``, so it is one short line: the diagnosis summary and where
the full evidence is. Draining a drained node only rewrites the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from c4d.actions.base import Command
from c4d.actions.node_name import check

REASON_LIMIT = 240


def reason(diagnosis: Mapping[str, Any]) -> str:
    """One printable line: ``c4d: ERROR RankNonCommHang ranks 4,5 AllReduce #41 (evidence ...)``."""
    ranks = ",".join(str(r) for r in list(diagnosis.get("ranks") or [])[:8])
    parts = ["c4d:", str(diagnosis.get("level", "")), str(diagnosis.get("kind", ""))]
    if ranks:
        parts.append(f"ranks {ranks}")
    if diagnosis.get("op"):
        parts.append(f"{diagnosis['op']} #{diagnosis.get('seq')}")
    ev = (diagnosis.get("detail") or {}).get("evidence_file")
    if ev:
        parts.append(f"(evidence {ev})")
    text = " ".join(p for p in parts if p)
    return "".join(ch if ch.isprintable() else " " for ch in text)[:REASON_LIMIT]


class Slurm:
    name = "slurm"

    def __init__(self, scontrol: str = "scontrol"):
        self.scontrol = scontrol

    def commands(self, node: str, diagnosis: Mapping[str, Any]) -> list[Command]:
        node = check(node)
        return [
            Command(
                (self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason(diagnosis)}")
            )
        ]
