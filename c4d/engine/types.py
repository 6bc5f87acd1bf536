"""What the engine returns: verdict enums, typed localizations, the Diagnosis record and the
live-view snapshot.

All frozen. A Diagnosis serialises to docs/cli.md's JSON object with ``to_json()``; its
``localization`` (how the culprit was found, how sure the engine is) is written there once,
as the top-level ``localization`` object and mirrored into ``detail`` under the keys older
readers know (``localized_by``, ``localized``, ``confidence``, ``suspects``, ``link``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ISOLATE_CONFIDENCE = 0.9
"""C4D_ISOLATE_CONFIDENCE's default: the calibrated confidence an ERROR needs to isolate a node."""


class Level(enum.IntEnum):
    """Severity, ordered so that ``level >= Level.WARNING`` works; the one level order
    (``sorted(ds, key=lambda d: -Level[d["level"]])`` puts ERRORs first)."""

    INFO = 20
    """A finding that needs no action: the slow kinds (once per check period they hold)."""
    WARNING = 30
    """A hang or a silent rank that has lasted at least T (hang count n >= 1)."""
    ERROR = 40
    """The same after T x C4D_HANG_TIMES; with an isolating localization it triggers the action."""


class DiagKind(enum.Enum):
    """What went wrong (docs/design.md, "Diagnoses")."""

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
    CollectiveMismatch = "CollectiveMismatch"
    """Ranks wait on each other in a cycle: each is blocked in an op that another rank of the
    cycle never entered (mismatched collective order, a program bug); or the members of one
    collective called it with different op, count, dtype, root or reduction op (named at once,
    c4d/engine/consistency.py). Counted like a hang; never isolates a node: no hardware is at
    fault."""


class How(enum.Enum):
    """Which evidence decided where a diagnosis points (``Localization.how``)."""

    arrival = "arrival"
    """Hangs: the rank that never arrived while its peers wait. Slow: the rank that arrives last
    by a clear margin because of its own compute."""
    peer_progress = "peer-progress"
    """Per-link transfer progress from NCCL's profiler plugin (PEER records; network links
    only): which links stopped, or which set a slow ring's pace."""
    p2p_pair = "p2p-pair"
    """A send and its matching receive both started and neither finished: that link."""
    two_rank = "two-rank"
    """The communicator that stopped or slowed has two ranks: it is one link."""
    cross_comm = "cross-comm"
    """The one rank (or link) that the affected communicators and links have in common."""
    exclusion = "exclusion"
    """What is left when the units that tell it from the others (clear ones, or dim ones: a unit
    slowed a little through links that do not set its pace) rule them out: one link whose ranks'
    other communicators are clear is the link, not a rank."""
    cycle = "cycle"
    """Ranks blocked in each other's ops (CollectiveMismatch)."""
    heartbeat = "heartbeat"
    """The rank went silent (RankLost)."""
    match = "match"
    """Members' records of one op disagree (type, count, dtype): the minority ranks
    (CollectiveMismatch; a program bug, never isolates)."""
    none = "none"
    """Nothing localizes: every member is a suspect."""


class Target(enum.Enum):
    """What a localization names (``Localization.target``)."""

    rank = "rank"
    """One or more culprit ranks, each on its own evidence (a node whose ranks all hang)."""
    link = "link"
    """The link between two ranks (both directions unless ``Localization.link`` says one)."""
    node = "node"
    """Every rank of one node (host, NIC, switch port): ``ranks`` are the node's ranks."""
    cycle = "cycle"
    """The ranks of a wait cycle, each with the op it is in and the op it never entered."""
    minority = "minority"
    """The members of a collective that called it differently from the rest (a program bug:
    named, never isolated)."""
    suspects = "suspects"
    """Not localized: the ranks among which the culprit is."""


@dataclass(frozen=True)
class OpRef:
    """One op of a communicator: (C, k) for collectives, (C, peer pair, k) for p2p."""

    comm: int
    seq: int
    op: str | None
    peer: int | None = None
    """p2p: the global rank at the other end."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"comm": f"{self.comm:016x}", "seq": self.seq, "op": self.op}
        if self.peer is not None:
            out["peer"] = self.peer
        return out

    def __str__(self) -> str:
        peer = f" peer {self.peer}" if self.peer is not None else ""
        return f"{self.op or '?'} #{self.seq} of {self.comm:016x}{peer}"


@dataclass(frozen=True)
class CycleMember:
    """A rank of a wait cycle: blocked in ``blocked_in``, never entered ``never_entered``, which
    the previous rank of the cycle is blocked in."""

    rank: int
    blocked_in: OpRef
    never_entered: OpRef

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "blocked_in": self.blocked_in.to_json(),
            "never_entered": self.never_entered.to_json(),
        }


@dataclass(frozen=True)
class Localization:
    """Where a diagnosis points, on which evidence, and how sure the engine is.

    ``confidence`` is the probability that the culprit named (``ranks`` for a rank or a cycle,
    the link for a link) is exactly right, calibrated against outcomes on the randomized fault
    benchmark (c4d/engine/calibration.py, analysis/evaluate.py): a 0.85 is right about 85% of
    the time or more. ``basis`` is the calibration key: how and what, plus the refinement the
    engine used (e.g. ``peer-progress/rank``).
    """

    how: How
    target: Target
    ranks: tuple[int, ...]
    """Culprit global ranks (both ends of a link; the cycle's ranks; all suspects)."""
    confidence: float
    basis: str
    evidence: str
    """One line: the evidence that decided, in words."""
    link: tuple[int, int] | None = None
    """A named link's ends (a, b); with ``directed`` the fault is on a -> b only."""
    directed: bool = False
    cycle: tuple[CycleMember, ...] = ()
    posterior: float | None = None
    """The evidence model's probability of the named hypothesis among its candidates
    (c4d/engine/blame.py); ``confidence`` never exceeds it."""
    runner_up: str | None = None
    """The next most probable hypothesis ("rank 3", "link 3-4", "node 1")."""
    alternatives: tuple[str, ...] = ()
    """Hypotheses nothing observable tells from the named one (its ends, for a link whose ends
    have no other visible link), or the tied ones when only suspects are named."""

    @property
    def localized(self) -> bool:
        """A culprit is named (a rank, a link, a node or the ranks of a cycle), not only suspects."""
        return self.target is not Target.suspects

    @property
    def hardware(self) -> bool:
        """It names hardware (a rank, a link, a node), not a program bug or mere suspects."""
        return self.target in (Target.rank, Target.link, Target.node) and self.how is not How.match

    def isolates_at(self, threshold: float) -> bool:
        """An ERROR with this localization takes nodes out: hardware named with a calibrated
        confidence of at least ``threshold`` (C4D_ISOLATE_CONFIDENCE)."""
        return self.hardware and self.confidence >= threshold

    @property
    def isolates(self) -> bool:
        """``isolates_at`` the default C4D_ISOLATE_CONFIDENCE."""
        return self.isolates_at(DEFAULT_ISOLATE_CONFIDENCE)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "how": self.how.value,
            "target": self.target.value,
            "ranks": list(self.ranks),
            "confidence": self.confidence,
            "basis": self.basis,
            "evidence": self.evidence,
            "link": list(self.link) if self.link is not None else None,
        }
        if self.link is not None:
            out["directed"] = self.directed
        if self.cycle:
            out["cycle"] = [m.to_json() for m in self.cycle]
        if self.posterior is not None:
            out["posterior"] = self.posterior
            out["runner_up"] = self.runner_up
        if self.alternatives:
            out["alternatives"] = list(self.alternatives)
        return out

    def legacy_detail(self) -> dict[str, Any]:
        """The keys ``detail`` has always carried, derived from this localization."""
        d: dict[str, Any] = {
            "localized_by": self.how.value,
            "localized": self.localized,
            "confidence": self.confidence,
            "suspects": list(self.ranks),
        }
        if self.link is not None:
            d["link"] = list(self.link)
        return d


class RankState(enum.Enum):
    """Per-rank state in the live view (keys of c4d.master.live.STATE_STYLE)."""

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
    """The culprit global ranks (both ends for a link; the cycle's ranks for a mismatch); all
    members when only suspects exist."""
    nodes: tuple[str, ...]
    hang_times: int
    """n = floor(duration / T) for hangs, mismatches and RankLost; 0 for the slow kinds."""
    localization: Localization
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific facts (waits, victims, bandwidths, windows); see docs/engine.md."""
    isolate_confidence: float = field(default=DEFAULT_ISOLATE_CONFIDENCE, compare=False)
    """C4D_ISOLATE_CONFIDENCE in force: an ERROR isolates only hardware named at least this sure."""

    @property
    def time(self) -> float:
        return self.time_ns / 1e9

    @property
    def localized(self) -> bool:
        return self.localization.localized

    @property
    def blacklist_nodes(self) -> tuple[str, ...]:
        """Nodes to isolate: only an ERROR whose localization names hardware with a calibrated
        confidence of at least ``isolate_confidence`` triggers the action."""
        if self.isolates:
            return tuple(n for n in self.nodes if n and n != "?")
        return ()

    @property
    def isolates(self) -> bool:
        return self.level is Level.ERROR and self.localization.isolates_at(self.isolate_confidence)

    def to_json(self) -> dict[str, Any]:
        detail = {**self.localization.legacy_detail(), **self.detail}
        if self.level is Level.ERROR:
            detail["isolates"] = self.isolates
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
            "detail": detail,
            "localization": self.localization.to_json(),
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
        loc = self.localization
        if loc.target is Target.link and loc.link is not None:
            arrow = "->" if loc.directed else "<->"
            who = f"link {loc.link[0]}{arrow}{loc.link[1]}"
        elif loc.target is Target.cycle:
            who = "; ".join(
                f"rank {m.rank} in {m.blocked_in}, never entered {m.never_entered}" for m in loc.cycle
            )
        else:
            who = ", ".join(f"rank {r}" for r in self.ranks) or "no rank"
            if loc.target is Target.suspects:
                who = f"suspects {who}"
        nodes = ", ".join(self.nodes)
        d = self.detail
        extra = []
        if self.hang_times:
            extra.append(f"n={self.hang_times}")
        if "waited_s" in d:
            extra.append(f"waited {d['waited_s']:.1f}s")
        extra.append(f"by {loc.how.value}")
        extra.append(f"conf {loc.confidence:.2f}")
        tail = f" ({', '.join(extra)})"
        return f"{self.level.name} {self.kind.value}: {who} [{nodes}]{where}{tail}"


@dataclass(frozen=True)
class CommSnapshot:
    """One communicator in the live view (field names match c4d.master.live.CommRow)."""

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
