"""What a tick says: the wait-for graph's findings counted into hang diagnoses, members that
disagree named at once, the slow judge's findings passed on, each made a ``Diagnosis``.

A finding is said again only when its count rises (``emitted``), so a tick returns what is
new; ``active`` keeps each live finding's latest diagnosis for the live view (snapshot.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from c4d.engine import hang
from c4d.engine.comm import Comm
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.consistency import Consistency, Mismatch
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.slow import CommMeta, SlowFinding
from c4d.engine.stage import Stages
from c4d.engine.types import DiagKind, Diagnosis, Level, Localization
from c4d.record.schema import op_name


class Emission:
    def __init__(
        self,
        cfg: EngineConfig,
        ranks: RankTable,
        comms: dict[int, Comm],
        pool: Pool,
        consistency: Consistency,
        stages: Stages,
    ) -> None:
        """``comms``: the engine's communicators by index (the same dict, kept up to date)."""
        self.cfg, self.ranks, self.comms = cfg, ranks, comms
        self.pool, self.consistency, self.stages = pool, consistency, stages
        self.emitted: dict[Hashable, int] = {}  # hang key -> highest count emitted
        self.active: dict[Hashable, Diagnosis] = {}  # hang key -> latest diagnosis (live view)

    def hangs(self, findings: list[hang.Finding], th: ResolvedThresholds, now: int) -> list[Diagnosis]:
        """The wait-for graph's ``findings`` at ``now``: new mismatches first, then each
        finding's count where it rose; findings no longer live leave ``active``."""
        out = self._mismatches(findings, th, now)
        live: set[Hashable] = set()
        for f in findings:
            live.add(f.key)
            out += self._count(f, th, now)
        for key in [k for k in self.active if k not in live]:
            del self.active[key]
        return out

    def slow(self, s: SlowFinding, now: int) -> Diagnosis:
        return self._diag(now, Level.INFO, s.kind, s.comm, s.op, s.seq, s.ranks, 0, s.loc, s.detail)

    def _mismatches(self, findings: list[hang.Finding], th: ResolvedThresholds, now: int) -> list[Diagnosis]:
        """Collectives whose members disagree (consistency.py): a WARNING now for each new one
        (its pending op's heartbeats checked where a member waits); a stall it explains (its
        communicator, at or after its seq, beginning within T of it) is counted on as it, in
        place in ``findings``: one incident, never isolating."""
        C = self.consistency
        waiting, p2p_waiting = self.pool.busy()
        for i in np.union1d(waiting, p2p_waiting).tolist():
            if i in self.comms:
                C.check_pending(self.comms[i], now)
        C.expire(now)
        out = []
        for mm in C.take_new():
            d = mm.detail()
            d["timeout_s"] = round(th.hang_timeout_ns / 1e9, 3)
            d["hang_times_limit"] = th.hang_times
            c = self.comms.get(mm.comm)
            loc, kind = mm.localization(), DiagKind.CollectiveMismatch
            out.append(self._diag(now, Level.WARNING, kind, c, mm.op, mm.seq, mm.culprits, 0, loc, d))
        for j, f in enumerate(findings):
            if f.comm is None or f.kind is DiagKind.RankLost:
                continue
            was: Mismatch | None = C.explains(f.comm.idx, f.seq, f.start_ns, th.hang_timeout_ns)
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
        mk = lambda lvl: self._diag(now, lvl, f.kind, f.comm, f.op, f.seq, f.ranks, n, f.loc, d)  # noqa: E731
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
        comm: CommMeta | None,
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
            comm=None if comm is None else comm.id,
            op=op_name(op),
            seq=seq,
            ranks=tuple(int(r) for r in ranks),
            nodes=tuple(nodes),
            hang_times=n,
            localization=loc,
            detail=detail,
            isolate_confidence=self.cfg.isolate_confidence,
        )
