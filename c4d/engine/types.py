"""What the engine returns: verdict enums, the Diagnosis record and the live-view snapshot.

All frozen; a Diagnosis serialises to exactly DESIGN.md's JSON object with ``to_json()``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Level(enum.IntEnum):
    """Severity, ordered so that ``level >= Level.WARNING`` works."""

    INFO = 20
    """A finding that needs no action: the slow kinds (once per check period they hold)."""
    WARNING = 30
    """A hang or a silent rank that has lasted at least T (hang count n >= 1)."""
    ERROR = 40
    """The same after T x C4D_HANG_TIMES; with a localized culprit it triggers the action."""


class DiagKind(enum.Enum):
    """What went wrong (DESIGN.md, "Diagnosis semantics")."""

    RankNonCommHang = "RankNonCommHang"
    """Peers arrived at (C, k) and wait > T while the culprit has not arrived and is not itself
    blocked in another collective: its compute or host is stuck."""
    RankCommHang = "RankCommHang"
    """Every rank arrived at (C, k) and it is not done after > T: a transfer stopped. Culprit is
    the rank or link localized by peer progress, p2p pairing or cross-comm evidence."""
    RankNonCommSlow = "RankNonCommSlow"
    """In a check period the culprit arrives last by a clear margin in most ops of C because of
    its own compute (others wait for it)."""
    RankCommSlow = "RankCommSlow"
    """In a check period C's bus bandwidth is well below its baseline; culprit rank or link."""
    RankLost = "RankLost"
    """The rank stopped sending anything (no heartbeat) without a clean exit while others run."""


class RankState(enum.Enum):
    """Per-rank state in the live view (keys of c4d.live.STATE_STYLE)."""

    computing = "computing"
    in_collective = "in-collective"
    waiting = "waiting"
    hung = "hung"
    slow = "slow"
    lost = "lost"
    done = "done"
    unknown = "unknown"


@dataclass(frozen=True)
class Diagnosis:
    time_ns: int
    """Master time of the evaluation that produced it."""
    level: Level
    kind: DiagKind
    comm: int | None
    """Communicator id (None for RankLost)."""
    op: str | None
    seq: int | None
    ranks: tuple[int, ...]
    """The culprit global ranks (both ends for a link); all members when only suspects exist."""
    nodes: tuple[str, ...]
    hang_times: int
    """n = floor(duration / T) for hangs and RankLost; 0 for the slow kinds."""
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def time(self) -> float:
        return self.time_ns / 1e9

    @property
    def localized(self) -> bool:
        return bool(self.detail.get("localized", False))

    @property
    def blacklist_nodes(self) -> tuple[str, ...]:
        """Nodes to isolate: only an ERROR with a localized culprit triggers the action."""
        if self.level is Level.ERROR and self.localized:
            return tuple(n for n in self.nodes if n and n != "?")
        return ()

    def to_json(self) -> dict[str, Any]:
        return {
            "time": round(self.time_ns / 1e9, 6),
            "level": self.level.name,
            "kind": self.kind.value,
            "comm": None if self.comm is None else f"{self.comm:016x}",
            "op": self.op,
            "seq": self.seq,
            "ranks": list(self.ranks),
            "nodes": list(self.nodes),
            "hang_times": self.hang_times,
            "detail": dict(self.detail),
        }

    def json_line(self) -> str:
        return json.dumps(self.to_json(), sort_keys=False)

    def summary(self) -> str:
        """One human-readable log line."""
        where = f" comm {self.comm:016x}" if self.comm is not None else ""
        if self.op is not None:
            where += f" {self.op}"
        if self.seq is not None:
            where += f" #{self.seq}"
        who = ", ".join(f"rank {r}" for r in self.ranks) or "no rank"
        nodes = ", ".join(self.nodes)
        d = self.detail
        extra = []
        if self.hang_times:
            extra.append(f"n={self.hang_times}")
        if "waited_s" in d:
            extra.append(f"waited {d['waited_s']:.1f}s")
        if "localized_by" in d:
            extra.append(f"by {d['localized_by']}")
        if "confidence" in d:
            extra.append(f"conf {d['confidence']:.2f}")
        tail = f" ({', '.join(extra)})" if extra else ""
        return f"{self.level.name} {self.kind.value}: {who} [{nodes}]{where}{tail}"


@dataclass(frozen=True)
class CommSnapshot:
    """One communicator in the live view (field names match c4d.live.CommRow)."""

    comm: str
    kind: str
    """Guess: PP (point-to-point only), WORLD (every rank), TP (consecutive ranks), DP (strided)."""
    nranks: int
    last_done_seq: int
    ops_per_s: float
    wait_med_us: float
    wait_p99_us: float
    xfer_med_us: float
    xfer_p99_us: float
    busbw_gbs: float
    p2p_done: int = 0
    """p2p transfers completed (a send and its receive count once); 0 without p2p."""


@dataclass(frozen=True)
class EngineSnapshot:
    time_ns: int
    rank_states: Mapping[int, RankState]
    rank_nodes: Mapping[int, str]
    comms: tuple[CommSnapshot, ...]
    offsets_ms: Mapping[int, float]
    """Estimated clock offset per rank (rank clock minus master clock)."""
    active: tuple[Diagnosis, ...]
    """Latest diagnosis of every hang / loss still in progress."""
