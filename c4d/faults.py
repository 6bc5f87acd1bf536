"""Fault SPECs (DESIGN.md): ``KIND@key=value,...`` parsed, validated and lowered for simnccl.

``node=NAME`` is resolved here, against the job's actual layout (which node each rank
runs on), to the ranks on that node, so the native side only ever sees ``rank=`` and
``link=`` (global ranks). A node fault follows the hardware: when the node is excluded
from a relaunch (``c4d sim --exclude-nodes``), no rank runs there and the fault is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("noncomm-hang", "comm-hang", "noncomm-slow", "comm-slow", "crash")
COMM_KINDS = ("comm-hang", "comm-slow")
SLOW_KINDS = ("noncomm-slow", "comm-slow")


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None
    node: str | None = None
    link: tuple[int, int] | None = None
    step: int = 0
    factor: float | None = None

    def ranks(self, layout: Sequence[str]) -> list[int]:
        """Global ranks this fault applies to (both ends for a link); ``layout[r]`` is rank r's node."""
        if self.link is not None:
            return list(self.link)
        if self.node is not None:
            return [r for r, name in enumerate(layout) if name == self.node]
        return [self.rank] if self.rank is not None else []

    def lower(self, layout: Sequence[str]) -> list[str]:
        """Native spec strings (rank/link form) for SIMNCCL_FAULTS."""
        tail = f",step={self.step}" + (f",factor={self.factor:g}" if self.factor is not None else "")
        if self.link is not None:
            return [f"{self.kind}@link={self.link[0]}-{self.link[1]}{tail}"]
        return [f"{self.kind}@rank={r}{tail}" for r in self.ranks(layout)]


def block_layout(world: int, ranks_per_node: int) -> list[str]:
    """The plain layout: ranks ``ranks_per_node`` at a time on node-0, node-1, ..."""
    return [f"node-{r // ranks_per_node}" for r in range(world)]


def parse(spec: str, world: int | None = None, nodes: int | None = None) -> Fault:
    """Parse one SPEC; raise FaultSpecError with a one-line reason."""
    kind, sep, rest = spec.strip().partition("@")
    if kind not in KINDS:
        raise FaultSpecError(f"fault {spec!r}: kind must be one of {', '.join(KINDS)}")
    if not sep or not rest:
        raise FaultSpecError(f"fault {spec!r}: expected {kind}@rank=R|node=NAME|link=R-S[,step=S][,factor=F]")
    vals: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, val = item.partition("=")
        if not eq or key not in ("rank", "node", "link", "step", "factor") or not val:
            raise FaultSpecError(f"fault {spec!r}: bad item {item!r}")
        if key in vals:
            raise FaultSpecError(f"fault {spec!r}: {key} given twice")
        vals[key] = val
    where = [k for k in ("rank", "node", "link") if k in vals]
    if len(where) != 1:
        raise FaultSpecError(f"fault {spec!r}: give exactly one of rank=, node=, link=")
    try:
        rank = int(vals["rank"]) if "rank" in vals else None
        step = int(vals.get("step", "0"))
        factor = float(vals["factor"]) if "factor" in vals else None
        link = None
        if "link" in vals:
            a, dash, b = vals["link"].partition("-")
            if not dash:
                raise ValueError
            link = (int(a), int(b))
    except ValueError:
        raise FaultSpecError(
            f"fault {spec!r}: rank, step and link ends must be integers, factor a number"
        ) from None
    node = vals.get("node")
    if node is not None and not (node.startswith("node-") and node[5:].isdigit()):
        raise FaultSpecError(f"fault {spec!r}: sim node names are node-0, node-1, ...")
    if link is not None and kind not in COMM_KINDS:
        raise FaultSpecError(f"fault {spec!r}: link= applies to comm-hang and comm-slow only")
    if factor is not None and kind not in SLOW_KINDS:
        raise FaultSpecError(f"fault {spec!r}: factor= applies to slow kinds only")
    if factor is not None and factor <= 1:
        raise FaultSpecError(f"fault {spec!r}: factor must be > 1")
    if step < 0:
        raise FaultSpecError(f"fault {spec!r}: step must be ≥ 0")
    for r in [rank] if rank is not None else list(link or ()):
        if r is not None and (r < 0 or (world is not None and r >= world)):
            raise FaultSpecError(f"fault {spec!r}: rank {r} outside 0..{(world or 1) - 1}")
    if link is not None and link[0] == link[1]:
        raise FaultSpecError(f"fault {spec!r}: a link joins two different ranks")
    if node is not None and nodes is not None and int(node[5:]) >= nodes:
        raise FaultSpecError(f"fault {spec!r}: no {node} (the job has node-0..node-{nodes - 1})")
    return Fault(kind=kind, rank=rank, node=node, link=link, step=step, factor=factor)
