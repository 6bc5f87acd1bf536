"""``--isolate`` values made into actions (``kubernetes``, ``slurm``, ``cmd:PATH``)."""

from __future__ import annotations

from collections.abc import Sequence

from c4d.actions.base import Action
from c4d.actions.command import CommandAction
from c4d.actions.kubernetes import Kubernetes
from c4d.actions.slurm import Slurm


def parse_actions(specs: Sequence[str]) -> list[Action]:
    """``--isolate`` values → actions; ValueError with a one-line reason for a bad one."""
    out: list[Action] = []
    for spec in specs:
        if spec == "kubernetes":
            out.append(Kubernetes())
        elif spec == "slurm":
            out.append(Slurm())
        elif spec.startswith("cmd:"):
            out.append(CommandAction.from_spec(spec[4:]))
        else:
            raise ValueError(f"--isolate {spec!r}: expected kubernetes, slurm or cmd:PATH")
    return out
