"""Incidents: one verdict per fault, folded from the engine's stream of diagnoses.

The engine re-reports a hang every T (n = 1, 2, ... 18) and a slow rank once per check
period. An operator wants one line per *incident*, the same thing both offline (`c4d analyze`'s
summary table) and live (what the master logs, what the live view lists). This module is the
one definition both use:

* **Identity.** The same kind and culprit set while it lasts. Hangs and losses
  (RankNonCommHang, RankCommHang, RankLost, CollectiveMismatch) are reported on a
  communicator, op and sequence number; a culprit missing from several ops is charged to the
  one waited on longest, and that charge can move between evaluations (two ops whose waits
  began within clock-alignment error of each other), so the op is an attribute of the
  incident (the latest report's, the others listed), not part of its identity. Two different
  hangs of the same rank are two incidents because the first ends before the second starts.
  Slow kinds (RankNonCommSlow, RankCommSlow): likewise on any communicator — a slow rank is one
  incident however many of its communicators show it.
* **Start.** Its first diagnosis (WARNING for hangs, INFO for the slow kinds).
* **End.** *resolved*: no report came when the next one was due (a hang is re-counted every T,
  so none for T and a half means it cleared; a slow finding repeats every period, so none for
  three periods means it stopped) while the job was still sending; *stopped with the job*: the
  reports stopped because the job did (nothing came from any rank after the next report was
  due: it was killed or ended, e.g. by ``c4d sim`` or ``c4d run`` on an ERROR, under a master
  that runs on); *superseded*: a newer incident of the hang family names a
  culprit set overlapping this one's (the engine's view of one event got sharper: more ranks of
  a node confirmed, a silent rank now lost); *open at end*: the run or the trace ended while it
  lasted.

``--json`` and ``c4d analyze --all`` keep the full stream (docs/cli.md: ``--json`` prints every
diagnosis); incidents only decide what is *shown once*.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from c4d.engine.types import Diagnosis, Level

SLOW_KINDS = frozenset({"RankNonCommSlow", "RankCommSlow"})
RESOLVE_AFTER_T = 1.5
"""A hang incident ends when no report came for this many hang timeouts (T)."""
RESOLVE_AFTER_PERIODS = 3.0
"""A slow incident ends when no report came for this many check periods."""
DEFAULT_GAP_S = 15.0
"""Used when a diagnosis does not say its T or its period (imports without thresholds)."""


class End(enum.Enum):
    """Why an incident is over (``None`` on an incident while it lasts)."""

    resolved = "resolved"
    """No report came when the next was due: the hang cleared or the rank is no longer slow."""
    superseded = "superseded"
    """A newer incident names an overlapping culprit set for the same event."""
    open_at_end = "open at end"
    """Still going when the run or the trace ended."""
    stopped = "stopped with the job"
    """Its reports stopped because the job stopped sending (killed or ended), not because it cleared."""


class Change(enum.Enum):
    """What happened to an incident at one step (what the master logs)."""

    opened = "opened"
    escalated = "escalated"
    """WARNING -> ERROR."""
    revised = "revised"
    """Its culprit moved as more evidence was judged (link -> rank -> node, suspects -> rank)."""
    ended = "ended"
    resumed = "resumed"
    """A hang ended by time reported again, the same stall (it began when the incident's did):
    the reports were late (a master too busy to tick on time), not the hang over."""


@dataclass
class Incident:
    id: int
    kind: str
    first: Diagnosis
    last: Diagnosis
    level: Level
    """The highest level reached."""
    reports: int = 1
    """Diagnoses folded into it."""
    comms: list[str] = field(default_factory=list)
    """Every communicator (hex) it was reported on, first first."""
    sites: list[str] = field(default_factory=list)
    """Every op it was charged to ("comm op #seq"), first first."""
    top_n: int = 0
    """The highest hang count n any of its reports reached."""
    top_waited_s: float = 0.0
    end: End | None = None
    end_s: float | None = None
    superseded_by: int | None = None
    revisions: list[str] = field(default_factory=list)
    """How its localization moved as evidence came ("+3.0s: link 1-7 -> rank 7"), first first."""
    current: Diagnosis | None = None
    """The diagnosis that set its culprits (the first, or the latest revision)."""

    # -- identity ------------------------------------------------------------------------
    @property
    def key(self) -> tuple:
        return incident_key(self.current or self.first)

    @property
    def ranks(self) -> tuple[int, ...]:
        return (self.current or self.first).ranks

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.current or self.first).nodes

    @property
    def is_slow(self) -> bool:
        return self.kind in SLOW_KINDS

    # -- what the summary shows ----------------------------------------------------------
    @property
    def first_s(self) -> float:
        return self.first.time

    @property
    def count(self) -> int:
        """Hangs: the highest n reached (⌊duration / T⌋); slow kinds: the periods reported."""
        return self.reports if self.is_slow else self.top_n

    @property
    def duration_s(self) -> float:
        """Hangs: the longest wait any report measured; slow: first to last window."""
        if self.is_slow or not self.top_waited_s:
            return max(0.0, self.last.time - self.first.time) + (
                _window_s(self.last) if self.is_slow else 0.0
            )
        return self.top_waited_s

    def _note(self, d: Diagnosis) -> None:
        comm = None if d.comm is None else f"{d.comm:016x}"
        if comm and comm not in self.comms:
            self.comms.append(comm)
        site = _site(d)
        if site and site not in self.sites and not self.is_slow:
            self.sites.append(site)
        self.top_n = max(self.top_n, d.hang_times)
        waited = d.detail.get("waited_s")
        if isinstance(waited, int | float):
            self.top_waited_s = max(self.top_waited_s, float(waited))

    @property
    def evidence(self) -> str:
        return evidence_of(self.last)

    @property
    def confidence(self) -> float | None:
        return confidence_of(self.last)

    @property
    def localized(self) -> bool:
        return bool(self.last.localized)

    def culprit(self) -> str:
        if not self.ranks:
            return "-"
        return _who(self.current or self.first)

    def where(self) -> str:
        """The latest report's communicator and op (+N: on N more communicators or ops)."""
        d = self.last
        if d.comm is None:
            return "-"
        s = f"{d.comm:016x}"
        if d.op:
            s += f" {d.op}"
        if d.seq is not None and not self.is_slow:
            s += f" #{d.seq}"
        more = len(self.comms if self.is_slow else self.sites) - 1
        return s + (f" +{more}" if more > 0 else "")

    def line(self) -> str:
        """One human-readable line (the master's log, the live view)."""
        conf = self.confidence
        bits = [f"n={self.count}" if not self.is_slow else f"{self.count} periods"]
        bits.append(f"{self.duration_s:.1f}s")
        if self.evidence:
            bits.append(f"by {self.evidence}")
        if conf is not None:
            bits.append(f"conf {conf:.2f}")
        if self.end is not None:
            bits.append(self.end.value + (f" by #{self.superseded_by}" if self.superseded_by else ""))
        nodes = ", ".join(self.nodes)
        where = self.where()
        head = f"{self.level.name} #{self.id} {self.kind}: {self.culprit()} [{nodes}]" + (
            f" {where}" if where != "-" else ""
        )
        return f"{head} ({', '.join(bits)})"

    def row(self, t0_s: float | None = None) -> dict[str, Any]:
        """The summary table's columns."""
        first = (
            f"+{self.first_s - t0_s:.1f}s"
            if t0_s is not None
            else time.strftime("%H:%M:%S", time.localtime(self.first_s))
        )
        conf = self.confidence
        return {
            "#": str(self.id),
            "kind": self.kind,
            "level": self.level.name,
            "culprit": self.culprit(),
            "node": ",".join(self.nodes) or "-",
            "comm/op/seq": self.where(),
            "first seen": first,
            "duration": f"{self.duration_s:.1f}s",
            "count": str(self.count),
            "evidence": self.evidence or "-",
            "confidence": "-" if conf is None else f"{conf:.2f}",
            "end": self.end.value if self.end else "open",
        }


@dataclass(frozen=True)
class Event:
    change: Change
    incident: Incident
    diagnosis: Diagnosis | None = None
    """The diagnosis that caused it (None for an end found by time)."""


def incident_key(d: Diagnosis) -> tuple:
    return (d.kind.value, tuple(sorted(d.ranks)))


def _who(d: Diagnosis) -> str:
    """A diagnosis's culprit in a few words ("link 3<->4", "rank 7", "node node-1", "suspects 1,7")."""
    loc = getattr(d, "localization", None)
    target = getattr(getattr(loc, "target", None), "value", "rank")
    if target == "link" and getattr(loc, "link", None):
        arrow = "->" if getattr(loc, "directed", False) else "<->"  # as Diagnosis.summary writes it
        return f"link {loc.link[0]}{arrow}{loc.link[1]}"  # type: ignore[union-attr]
    if target == "node":
        return f"node {','.join(d.nodes)}"
    if target == "suspects":
        return f"suspects {_ranges(d.ranks)}"
    return f"rank {_ranges(d.ranks)}" if len(d.ranks) == 1 else f"ranks {_ranges(d.ranks)}"


def _site(d: Diagnosis) -> str:
    if d.comm is None:
        return ""
    return f"{d.comm:016x} {d.op or ''} #{d.seq}"


def evidence_of(d: Diagnosis) -> str:
    """How the culprit was localized (the engine's typed Localization where it has one)."""
    loc = getattr(d, "localization", None)
    how = getattr(loc, "how", None) if loc is not None else None
    if how is not None:
        return str(getattr(how, "value", how))
    v = d.detail.get("localized_by")
    return str(v) if v else ""


def confidence_of(d: Diagnosis) -> float | None:
    loc = getattr(d, "localization", None)
    c = getattr(loc, "confidence", None) if loc is not None else None
    if c is None:
        c = d.detail.get("confidence")
    return float(c) if isinstance(c, int | float) else None


def _window_s(d: Diagnosis) -> float:
    w = d.detail.get("window_s")
    return float(w) if isinstance(w, int | float) and w > 0 else 0.0


def _gap_s(d: Diagnosis) -> float:
    """How long an incident may go unreported before it is over."""
    if d.kind.value in SLOW_KINDS:
        w = _window_s(d)
        return RESOLVE_AFTER_PERIODS * w if w else DEFAULT_GAP_S
    t = d.detail.get("timeout_s")
    return RESOLVE_AFTER_T * float(t) if isinstance(t, int | float) and t > 0 else DEFAULT_GAP_S


def _stall_start(d: Diagnosis) -> float | None:
    """When a hang report's stall began (None: the report does not say how long it waited)."""
    w = d.detail.get("waited_s")
    return d.time - float(w) if isinstance(w, int | float) else None


def _due_s(d: Diagnosis) -> float:
    """When the incident's next report is due after ``d`` (T for hangs, a period for slow kinds)."""
    per = RESOLVE_AFTER_PERIODS if d.kind.value in SLOW_KINDS else RESOLVE_AFTER_T
    return _gap_s(d) / per


def heard_stamps(raw: Any, last_tick_ns: int) -> tuple[np.ndarray, int]:
    """When the job was heard in a piece of a trace: the master time each record was fed at (the
    TICK before it, ``last_tick_ns`` before the piece's first TICK), once each; and the piece's
    last TICK. What ``Incidents.heard`` saw live, for ``fold``."""
    from c4d.record import schema

    is_tick = raw["kind"] == schema.Kind.TICK
    if not len(raw):
        return np.empty(0, np.int64), last_tick_ns
    pos = np.maximum.accumulate(np.where(is_tick, np.arange(len(raw)), -1))
    # a record's stamp is the latest TICK before it (the TICK itself is not a record)
    prev = np.concatenate(([-1], pos[:-1]))
    times = raw["time_ns"].astype(np.int64)
    stamp = np.where(prev >= 0, times[np.maximum(prev, 0)], last_tick_ns)
    last = int(times[pos[-1]]) if pos[-1] >= 0 else last_tick_ns
    return np.unique(stamp[~is_tick]), last


def _ranges(ranks: Iterable[int]) -> str:
    """0,1,2,3,7 -> '0-3,7'."""
    rs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if j == i else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


class Incidents:
    """Fold diagnoses (in time order) into incidents; report what changed.

    Live: ``observe`` every new diagnosis, ``expire(now)`` at every tick, ``close(now)`` at the
    end. Offline: ``fold(diagnoses, end_s)`` does all three.
    """

    def __init__(self, heard_ns: np.ndarray | None = None) -> None:
        self.all: list[Incident] = []
        self.open: dict[tuple, Incident] = {}
        # when the job was heard (master times records were fed at): live the latest (``heard``),
        # offline every one, sorted (``heard_stamps``); neither: every end found by time is resolved
        self._heard = heard_ns
        self._last_heard: int | None = None
        self._ended: dict[tuple, Incident] = {}  # per key, the latest hang ended by time (_resumed_by)

    def heard(self, stamp_ns: int) -> None:
        """Records of the job were fed at master time ``stamp_ns``: it is still sending."""
        if self._last_heard is None or stamp_ns > self._last_heard:
            self._last_heard = stamp_ns

    def _last_heard_by(self, now_ns: int) -> int | None:
        if self._heard is not None:
            i = int(np.searchsorted(self._heard, now_ns, side="right"))
            return int(self._heard[i - 1]) if i else None
        return self._last_heard

    def _ended_by_time(self, inc: Incident, now_ns: int) -> End:
        """Resolved, unless the job went quiet before the next report was due."""
        if self._heard is None and self._last_heard is None:
            return End.resolved
        last = self._last_heard_by(now_ns)
        due_ns = inc.last.time_ns + int(_due_s(inc.last) * 1e9)
        return End.stopped if last is None or last < due_ns else End.resolved

    def observe(self, d: Diagnosis) -> list[Event]:
        out = self.expire(d.time_ns)
        key = incident_key(d)
        inc = self.open.get(key) or self._revised_by(d)
        if inc is None and (inc := self._resumed_by(d)) is not None:
            inc.end = inc.end_s = None
            self.open[inc.key] = inc
            out.append(Event(Change.resumed, inc, d))
        if inc is not None and _who(inc.current or inc.first) != _who(d):
            del self.open[inc.key]
            was = _who(inc.current or inc.first)
            inc.revisions.append(f"+{d.time - inc.first.time:.1f}s: {was} -> {_who(d)}")
            inc.current = d
            self.open[key] = inc
            out.append(Event(Change.revised, inc, d))
        if inc is not None:
            inc.last = d
            inc.reports += 1
            inc._note(d)
            if d.level > inc.level:
                inc.level = d.level
                out.append(Event(Change.escalated, inc, d))
            return out
        inc = Incident(len(self.all) + 1, d.kind.value, d, d, d.level, current=d)
        inc._note(d)
        for old in self._superseded_by(d):
            del self.open[old.key]
            old.end, old.end_s, old.superseded_by = End.superseded, d.time, inc.id
            out.append(Event(Change.ended, old, d))
        self.all.append(inc)
        self.open[key] = inc
        self._ended.pop(key, None)
        out.append(Event(Change.opened, inc, d))
        return out

    def _resumed_by(self, d: Diagnosis) -> Incident | None:
        """The hang of ``d``'s kind and culprits ended by time whose stall ``d`` still reports: the
        two began within a hang timeout of each other (a stall's start is its report's time less
        what it waited)."""
        old = self._ended.get(incident_key(d))
        if old is None or old.superseded_by is not None:
            return None
        a, b = _stall_start(old.last), _stall_start(d)
        t = old.last.detail.get("timeout_s")
        if a is None or b is None or not isinstance(t, int | float) or abs(a - b) > t:
            return None
        del self._ended[incident_key(d)]
        return old

    def _revised_by(self, d: Diagnosis) -> Incident | None:
        """The open incident of the same kind whose culprits overlap ``d``'s: the same fault, its
        localization revised (one incident per fault, it keeps its number)."""
        new = set(d.ranks)
        same = [inc for inc in self.open.values() if inc.kind == d.kind.value and new & set(inc.ranks)]
        return min(same, key=lambda i: i.id) if same else None

    def _superseded_by(self, d: Diagnosis) -> list[Incident]:
        """Open hang-family incidents of another kind whose culprits overlap a new hang-family
        diagnosis's (a silent rank now lost)."""
        if d.kind.value in SLOW_KINDS:
            return []
        new = set(d.ranks)
        return [inc for inc in self.open.values() if not inc.is_slow and new & set(inc.ranks)]

    def expire(self, now_ns: int) -> list[Event]:
        """End the incidents whose next report is overdue at master time ``now_ns``."""
        now = now_ns / 1e9
        out = []
        for key, inc in list(self.open.items()):
            if now - inc.last.time > _gap_s(inc.last):
                del self.open[key]
                inc.end, inc.end_s = self._ended_by_time(inc, now_ns), inc.last.time
                if not inc.is_slow:
                    self._ended[key] = inc
                out.append(Event(Change.ended, inc))
        return out

    def close(self, now_ns: int | None = None) -> list[Event]:
        """The run (or the trace) ended: expire what is overdue, mark the rest open at end."""
        out = self.expire(now_ns) if now_ns is not None else []
        for inc in self.open.values():
            inc.end, inc.end_s = End.open_at_end, None
            out.append(Event(Change.ended, inc))
        self.open.clear()
        return out

    @classmethod
    def fold(
        cls, diagnoses: Iterable[Diagnosis], end_ns: int | None = None, heard_ns: np.ndarray | None = None
    ) -> list[Incident]:
        """Every incident of a finished stream (``end_ns``: when the run or trace ended; ``heard_ns``:
        when the job was heard, ``heard_stamps``, so that an incident whose job stopped says so)."""
        inc = cls(None if heard_ns is None else np.sort(np.asarray(heard_ns, np.int64)))
        for d in sorted(diagnoses, key=lambda d: d.time_ns):
            inc.observe(d)
        inc.close(end_ns)
        return inc.all

    def current(self) -> list[Incident]:
        """Open incidents first (worst level first, then oldest), then the ended ones, newest first."""
        live = sorted(self.open.values(), key=lambda i: (-i.level, i.first.time_ns))
        done = sorted((i for i in self.all if i.end is not None), key=lambda i: -i.last.time_ns)
        return live + done


COLUMNS = (
    "#",
    "kind",
    "level",
    "culprit",
    "node",
    "comm/op/seq",
    "first seen",
    "duration",
    "count",
    "evidence",
    "confidence",
    "end",
)


def table_lines(incidents: list[Incident], t0_s: float | None = None) -> list[str]:
    """A plain-text table: a header line, then exactly one line per incident (never wrapped)."""
    from c4d.util import texttable

    rows = [i.row(t0_s) for i in incidents]
    right = ("#", "duration", "count", "confidence")
    return texttable.lines(COLUMNS, ([r[c] for c in COLUMNS] for r in rows), right)
