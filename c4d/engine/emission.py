"""What a tick says: the wait-for graph's findings counted into hang diagnoses, members that
disagree named at once, the slow judge's findings passed on, each made a ``Diagnosis``.

A finding is said again only when its count rises (``emitted``), so a tick returns what is
new; ``active`` keeps each live finding's latest diagnosis for the live view (snapshot.py).

It reads no communicator: the graph's findings carry their communicators' views
(wait_view.py) and the verdicts their communicator's id (consistency.pending_mismatches), so
it can run where the communicators are not (docs/engine-shards.md, "The design").
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from c4d.engine import hang
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.consistency import MAX_REPORTED, Mismatch
from c4d.engine.ranks import RankTable
from c4d.engine.slow import SlowFinding
from c4d.engine.stage import Stages
from c4d.engine.types import DiagKind, Diagnosis, Level, Localization
from c4d.record.schema import op_name


class FoundMismatches:
    """The verdicts said so far, the latest MAX_REPORTED per communicator, for the stall that
    may follow one: kept where verdicts are said, from the verdicts handed over
    (``Consistency``, which finds them, lives with the communicators)."""

    def __init__(self) -> None:
        self.found: dict[int, list[Mismatch]] = {}  # by communicator index, latest last

    def add(self, mm: Mismatch) -> None:
        lst = self.found.setdefault(mm.comm, [])
        lst.append(mm)
        del lst[:-MAX_REPORTED]

    def explains(self, comm: int, seq: int | None, start_ns: int, T: int) -> Mismatch | None:
        """The verdict a stall of communicator ``comm`` at ``seq`` that began at ``start_ns``
        continues: found on it at or before that seq, at most T before the stall began."""
        for mm in reversed(self.found.get(comm, ())):
            # a p2p seq counts per direction and peer: not comparable with a stall's seq
            if (seq is None or mm.p2p or mm.seq <= seq) and start_ns <= mm.found_ns + T:
                return mm
        return None

    def forget(self, comms: Iterable[int]) -> None:
        """Freed communicators (Engine.free_comms)."""
        for c in comms:
            self.found.pop(int(c), None)


class Emission:
    def __init__(self, cfg: EngineConfig, ranks: RankTable, stages: Stages) -> None:
        self.cfg, self.ranks, self.stages = cfg, ranks, stages
        self.emitted: dict[Hashable, int] = {}  # hang key -> highest count emitted
        self.active: dict[Hashable, Diagnosis] = {}  # hang key -> latest diagnosis (live view)
        self.mismatches = FoundMismatches()

    def hangs(
        self, findings: list[hang.Finding], new_mismatches: list[Mismatch], th: ResolvedThresholds, now: int
    ) -> list[Diagnosis]:
        """The wait-for graph's ``findings`` at ``now`` and the verdicts found since the last
        tick (consistency.pending_mismatches): the new mismatches first, then each finding's
        count where it rose; findings no longer live leave ``active``."""
        out = self._mismatches(findings, new_mismatches, th, now)
        live: set[Hashable] = set()
        for f in findings:
            live.add(f.key)
            out += self._count(f, th, now)
        for key in [k for k in self.active if k not in live]:
            del self.active[key]
        return out

    def forget(self, comms: Iterable[int]) -> None:
        """Freed communicators (Engine.free_comms): their verdicts explain no stall any more."""
        self.mismatches.forget(comms)

    def slow(self, s: SlowFinding, now: int) -> Diagnosis:
        cid = None if s.comm is None else s.comm.id
        return self._diag(now, Level.INFO, s.kind, cid, s.op, s.seq, s.ranks, 0, s.loc, s.detail)

    def _mismatches(
        self, findings: list[hang.Finding], new: list[Mismatch], th: ResolvedThresholds, now: int
    ) -> list[Diagnosis]:
        """Collectives whose members disagree (consistency.py): a WARNING now for each new one
        (``new``: its pending op's heartbeats checked where a member waits); a stall it explains
        (its communicator, at or after its seq, beginning within T of it) is counted on as it,
        in place in ``findings``: one incident, never isolating."""
        R = self.mismatches
        out = []
        # in the order they were found, by communicator (index) and seq where at once: the same
        # whichever shard of an engine sharded by communicator found each (one communicator's
        # verdicts keep their own order: the sort is stable)
        for mm in sorted(new, key=lambda m: (m.found_ns, m.comm, m.seq)):
            if mm.comm_id is not None:  # (one freed before it was handed over: forgotten already)
                R.add(mm)
            d = mm.detail()
            d["timeout_s"] = round(th.hang_timeout_ns / 1e9, 3)
            d["hang_times_limit"] = th.hang_times
            loc, kind = mm.localization(), DiagKind.CollectiveMismatch
            cid = mm.comm_id
            out.append(self._diag(now, Level.WARNING, kind, cid, mm.op, mm.seq, mm.culprits, 0, loc, d))
        for j, f in enumerate(findings):
            if f.comm is None or f.kind is DiagKind.RankLost:
                continue
            was: Mismatch | None = R.explains(f.comm.idx, f.seq, f.start_ns, th.hang_timeout_ns)
            if was is not None:
                detail = {**was.detail(), "stalled": f.kind.value, "stalled_seq": f.seq}
                kind = DiagKind.CollectiveMismatch
                findings[j] = hang.Finding(
                    f.key, kind, f.comm, was.op, was.seq, was.culprits, f.start_ns, was.localization(), detail
                )
        return out

    def _count(self, f: hang.Finding, th: ResolvedThresholds, now: int) -> list[Diagnosis]:
        """Hang counting: n = floor(duration / T); WARNING at 1, ERROR at hang_times, each increase."""
        T, start = th.hang_timeout_ns, f.start_ns
        if f.kind is DiagKind.RankNonCommHang:
            staged = self.stages.adjust(f.ranks, T, start, now)
            if staged is None:
                return []  # the code disabled hang detection where it is (c4d.hang_timeout(-1))
            T, start = staged
        dur = now - start
        n = int(dur // T) if dur > 0 else 0
        prev = self.emitted.get(f.key, 0)
        if n < 1 or n <= prev:
            return []
        if prev == 0 and f.detail.get("missing") and dur < T + T // 2:
            # Some ranks' evidence is not in yet (their latest report predates the wait's
            # first T/2: delivery lags on a loaded host). A whole node that hangs would be
            # named a few ranks short; the first diagnosis waits up to T/2 for them.
            return []
        self.emitted[f.key] = n
        d = dict(f.detail)
        d["waited_s"] = round((now - f.start_ns) / 1e9, 3)
        d["timeout_s"] = round(T / 1e9, 3)
        if (T, start) != (th.hang_timeout_ns, f.start_ns):
            d["staged_timeout"] = True  # set by the training code (c4d.hang_timeout), see stage.py
        d["hang_times_limit"] = th.hang_times
        cid = None if f.comm is None else f.comm.id
        mk = lambda lvl: self._diag(now, lvl, f.kind, cid, f.op, f.seq, f.ranks, n, f.loc, d)  # noqa: E731
        out = []
        if n >= th.hang_times:
            if prev == 0:
                out.append(mk(Level.WARNING))  # the WARNING transition happened too
            out.append(mk(Level.ERROR))
        else:
            out.append(mk(Level.WARNING))
        self.active[f.key] = out[-1]
        return out

    def _diag(
        self,
        now: int,
        level: Level,
        kind: DiagKind,
        comm_id: int | None,
        op: int | None,
        seq: int | None,
        ranks: tuple[int, ...],
        n: int,
        loc: Localization,
        detail: dict[str, Any],
    ) -> Diagnosis:
        nodes = []
        for g in ranks:
            name = self.ranks.node_name(g)
            if name not in nodes:
                nodes.append(name)
        return Diagnosis(
            time_ns=now,
            level=level,
            kind=kind,
            comm=comm_id,
            op=op_name(op),
            seq=seq,
            ranks=tuple(int(r) for r in ranks),
            nodes=tuple(nodes),
            hang_times=n,
            localization=loc,
            detail=detail,
            isolate_confidence=self.cfg.isolate_confidence,
        )
