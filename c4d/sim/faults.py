"""Fault SPECs (docs/cli.md): ``KIND@key=value,...`` parsed, validated and lowered for simnccl.

``node=NAME`` is resolved here, against the job's actual layout (which node each rank
runs on), to the ranks on that node, so the native side only ever sees ``rank=`` and
``link=`` (global ranks). A node fault follows the hardware: when the node is excluded
from a relaunch (``c4d sim --exclude-nodes``), no rank runs there and the fault is gone.

The model is hardware (native/simnccl/fault_spec.h): a comm fault at a rank hits both
directions of every link of that rank in every communicator; a link fault its link, both
directions unless ``dir=`` picks one. ``until=`` ends a slow fault at a step (it recovers),
``secs=`` makes a noncomm-hang a compute stall of that many seconds. ``mismatch`` is a
program-order bug: at its step the rank leaves out a collective and every rank joins a world
all-reduce (``what=skip``), or every rank joins a world collective the rank calls with another
op, count, dtype or root (``what=op|count|dtype|root``, ``count-hang|dtype-hang``: sizes that
hang every member).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("noncomm-hang", "comm-hang", "noncomm-slow", "comm-slow", "crash", "mismatch")
COMM_KINDS = ("comm-hang", "comm-slow")
SLOW_KINDS = ("noncomm-slow", "comm-slow")
DIRS = ("both", "fwd", "rev")
_KEYS = ("rank", "node", "link", "dir", "step", "until", "secs", "factor", "what")
WHATS = ("skip", "op", "count", "dtype", "root", "count-hang", "dtype-hang")
"""mismatch ``what=``: leave a collective out (the default), or call one with another op, count,
dtype or root than the other ranks; count-hang and dtype-hang: a count or dtype that moves more
bytes, so every member hangs (native/simnccl/fault_spec.h)."""


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
    what: str = "skip"
    """mismatch: what the rank gets wrong (``WHATS``)."""

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
        if self.what != "skip":
            tail += f",what={self.what}"
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
        if self.what != "skip":
            out += f",what={self.what}"
        return out


def block_layout(world: int, ranks_per_node: int) -> list[str]:
    """The plain layout: ranks ``ranks_per_node`` at a time on node-0, node-1, ..."""
    return [f"node-{r // ranks_per_node}" for r in range(world)]


GRAMMAR_KEYS = "rank=R|node=NAME|link=R-S[,dir=fwd|rev][,step=S][,until=U][,secs=X][,factor=F][,what=W]"
"""What follows ``KIND@`` (docs/cli.md, "Fault SPEC")."""


def _bad_kind(kind: str, sep: str) -> str:
    """Why the text before ``@`` is not a kind: a kind followed by another separator, or no kind."""
    for k in sorted(KINDS, key=len, reverse=True):
        if kind.startswith(k) and len(kind) > len(k) and not kind[len(k)].isalnum() and kind[len(k)] != "-":
            wrong = kind[len(k)]
            return f"the kind and its keys are separated by '@', not {wrong!r}: {k}@{kind[len(k) + 1 :]}"
    if not kind:
        return f"no kind before '@' (one of {', '.join(KINDS)})"
    hint = "" if sep else f", then '@' and {GRAMMAR_KEYS}"
    return f"unknown kind {kind!r}: one of {', '.join(KINDS)}{hint}"


def _number(spec: str, vals: dict[str, str], key: str, kind: type) -> Any:
    """``vals[key]`` as an int or float (None when absent); an error naming the key and the value."""
    if key not in vals:
        return None
    try:
        return kind(vals[key])
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise FaultSpecError(f"fault {spec!r}: {key}={vals[key]!r} is not {what}") from None


def parse(spec: str, world: int | None = None, nodes: int | None = None) -> Fault:
    """Parse one SPEC; raise FaultSpecError with a one-line reason that names the part that is wrong
    (the kind, the separator, a key, a value)."""
    text = spec.strip()
    kind, sep, rest = text.partition("@")
    if kind not in KINDS:
        raise FaultSpecError(f"fault {spec!r}: {_bad_kind(kind, sep)}")
    if not sep or not rest:
        raise FaultSpecError(f"fault {spec!r}: no keys after the kind: expected {kind}@{GRAMMAR_KEYS}")
    vals: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, val = (x.strip() for x in item.partition("="))
        if not item.strip():
            raise FaultSpecError(f"fault {spec!r}: an empty item (a stray ','); items are key=value")
        if not eq:
            raise FaultSpecError(f"fault {spec!r}: {item!r} is not key=value")
        if key not in _KEYS:
            raise FaultSpecError(f"fault {spec!r}: unknown key {key!r} (keys: {', '.join(_KEYS)})")
        if not val:
            raise FaultSpecError(f"fault {spec!r}: {key}= has no value")
        if key in vals:
            raise FaultSpecError(f"fault {spec!r}: {key} given twice")
        vals[key] = val
    where = [k for k in ("rank", "node", "link") if k in vals]
    if len(where) != 1:
        raise FaultSpecError(f"fault {spec!r}: give exactly one of rank=, node=, link=")
    rank = _number(spec, vals, "rank", int)
    step = _number(spec, vals, "step", int)
    step = 0 if step is None else step
    until = _number(spec, vals, "until", int)
    factor = _number(spec, vals, "factor", float)
    secs = _number(spec, vals, "secs", float)
    link = None
    if "link" in vals:
        a, dash, b = vals["link"].partition("-")
        if not (dash and a.strip().isdigit() and b.strip().isdigit()):
            raise FaultSpecError(f"fault {spec!r}: link={vals['link']!r} is not R-S (two ranks, '-' between)")
        link = (int(a), int(b))
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
    what = vals.get("what", "skip")
    if "what" in vals and kind != "mismatch":
        raise FaultSpecError(f"fault {spec!r}: what= applies to mismatch only")
    if what not in WHATS:
        raise FaultSpecError(f"fault {spec!r}: what must be one of {', '.join(WHATS)}")
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
    return Fault(kind, rank, node, link, step, factor, dir=direction, until=until, secs=secs, what=what)
