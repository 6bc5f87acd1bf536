"""Fault SPECs (DESIGN.md): ``KIND@key=value,...`` parsed, validated and lowered for simnccl.

``node=NAME`` is resolved here, against the job's actual layout (which node each rank
runs on), to the ranks on that node, so the native side only ever sees ``rank=`` and
``link=`` (global ranks). A node fault follows the hardware: when the node is excluded
from a relaunch (``c4d sim --exclude-nodes``), no rank runs there and the fault is gone.

The model is hardware (native/simnccl/fault_spec.h): a comm fault at a rank hits both
directions of every link of that rank in every communicator; a link fault its link, both
directions unless ``dir=`` picks one. ``until=`` ends a slow fault at a step (it recovers),
``secs=`` makes a noncomm-hang a compute stall of that many seconds. ``mismatch`` is a
program-order bug: at its step the rank leaves out a collective and every rank joins a world
all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("noncomm-hang", "comm-hang", "noncomm-slow", "comm-slow", "crash", "mismatch")
COMM_KINDS = ("comm-hang", "comm-slow")
SLOW_KINDS = ("noncomm-slow", "comm-slow")
DIRS = ("both", "fwd", "rev")
_KEYS = ("rank", "node", "link", "dir", "step", "until", "secs", "factor")


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
    dir: str = "both"
    """Link faults: ``both`` directions, ``fwd`` (link[0] -> link[1]) or ``rev``."""
    until: int | None = None
    """Slow kinds: the first step no longer slowed (a transient fault); None = never recovers."""
    secs: float | None = None
    """noncomm-hang: the stall lasts this long, then the rank goes on; None = forever."""

    @property
    def transient(self) -> bool:
        return self.until is not None or self.secs is not None

    def ranks(self, layout: Sequence[str]) -> list[int]:
        """Global ranks this fault applies to (both ends for a link); ``layout[r]`` is rank r's node."""
        if self.link is not None:
            return list(self.link)
        if self.node is not None:
            return [r for r, name in enumerate(layout) if name == self.node]
        return [self.rank] if self.rank is not None else []

    def lower(self, layout: Sequence[str]) -> list[str]:
        """Native spec strings (rank/link form) for SIMNCCL_FAULTS."""
        tail = f",step={self.step}"
        if self.until is not None:
            tail += f",until={self.until}"
        if self.secs is not None:
            tail += f",secs={self.secs:g}"
        if self.factor is not None:
            tail += f",factor={self.factor:g}"
        if self.link is not None:
            d = f",dir={self.dir}" if self.dir != "both" else ""
            return [f"{self.kind}@link={self.link[0]}-{self.link[1]}{d}{tail}"]
        return [f"{self.kind}@rank={r}{tail}" for r in self.ranks(layout)]

    def spec(self) -> str:
        """This fault as a SPEC string again (``parse(f.spec()) == f``)."""
        if self.link is not None:
            where = f"link={self.link[0]}-{self.link[1]}" + (f",dir={self.dir}" if self.dir != "both" else "")
        elif self.node is not None:
            where = f"node={self.node}"
        else:
            where = f"rank={self.rank}"
        out = f"{self.kind}@{where},step={self.step}"
        if self.until is not None:
            out += f",until={self.until}"
        if self.secs is not None:
            out += f",secs={self.secs:g}"
        if self.factor is not None:
            out += f",factor={self.factor:g}"
        return out


def block_layout(world: int, ranks_per_node: int) -> list[str]:
    """The plain layout: ranks ``ranks_per_node`` at a time on node-0, node-1, ..."""
    return [f"node-{r // ranks_per_node}" for r in range(world)]


def parse(spec: str, world: int | None = None, nodes: int | None = None) -> Fault:
    """Parse one SPEC; raise FaultSpecError with a one-line reason."""
    kind, sep, rest = spec.strip().partition("@")
    if kind not in KINDS:
        raise FaultSpecError(f"fault {spec!r}: kind must be one of {', '.join(KINDS)}")
    if not sep or not rest:
        raise FaultSpecError(
            f"fault {spec!r}: expected {kind}@rank=R|node=NAME|link=R-S[,dir=D][,step=S][,until=U][,secs=X]"
            "[,factor=F]"
        )
    vals: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, val = item.partition("=")
        if not eq or key not in _KEYS or not val:
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
        until = int(vals["until"]) if "until" in vals else None
        factor = float(vals["factor"]) if "factor" in vals else None
        secs = float(vals["secs"]) if "secs" in vals else None
        link = None
        if "link" in vals:
            a, dash, b = vals["link"].partition("-")
            if not dash:
                raise ValueError
            link = (int(a), int(b))
    except ValueError:
        raise FaultSpecError(
            f"fault {spec!r}: rank, step, until and link ends must be integers, factor and secs numbers"
        ) from None
    node = vals.get("node")
    direction = vals.get("dir", "both")
    if node is not None and not (node.startswith("node-") and node[5:].isdigit()):
        raise FaultSpecError(f"fault {spec!r}: sim node names are node-0, node-1, ...")
    if link is not None and kind not in COMM_KINDS:
        raise FaultSpecError(f"fault {spec!r}: link= applies to comm-hang and comm-slow only")
    if "dir" in vals and link is None:
        raise FaultSpecError(f"fault {spec!r}: dir= applies to link= faults only")
    if direction not in DIRS:
        raise FaultSpecError(f"fault {spec!r}: dir must be one of {', '.join(DIRS)}")
    if factor is not None and kind not in SLOW_KINDS:
        raise FaultSpecError(f"fault {spec!r}: factor= applies to slow kinds only")
    if factor is not None and factor <= 1:
        raise FaultSpecError(f"fault {spec!r}: factor must be > 1")
    if until is not None and kind not in SLOW_KINDS:
        raise FaultSpecError(f"fault {spec!r}: until= applies to slow kinds only")
    if until is not None and until <= step:
        raise FaultSpecError(f"fault {spec!r}: until must be after step")
    if secs is not None and kind != "noncomm-hang":
        raise FaultSpecError(f"fault {spec!r}: secs= applies to noncomm-hang only")
    if secs is not None and not 0 < secs <= 1e6:
        raise FaultSpecError(f"fault {spec!r}: secs must be > 0")
    if kind == "mismatch" and rank is None:
        raise FaultSpecError(f"fault {spec!r}: mismatch needs rank=R")
    if step < 0:
        raise FaultSpecError(f"fault {spec!r}: step must be ≥ 0")
    for r in [rank] if rank is not None else list(link or ()):
        if r is not None and (r < 0 or (world is not None and r >= world)):
            raise FaultSpecError(f"fault {spec!r}: rank {r} outside 0..{(world or 1) - 1}")
    if link is not None and link[0] == link[1]:
        raise FaultSpecError(f"fault {spec!r}: a link joins two different ranks")
    if node is not None and nodes is not None and int(node[5:]) >= nodes:
        raise FaultSpecError(f"fault {spec!r}: no {node} (the job has node-0..node-{nodes - 1})")
    return Fault(kind, rank, node, link, step, factor, dir=direction, until=until, secs=secs)
