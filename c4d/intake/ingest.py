"""The one ingest path, live and offline: batch → Edge.admit → engine (and the master's sinks);
tick → free expired communicators → engine.tick.

``c4d master`` and ``c4d analyze`` both drive the engine through ``Ingest``, so they admit,
free and evaluate identically. Node agents' parts (OPPART: two members' OP records in one) are
unpacked here, after the edge admitted them and before the engine and the sinks read them.

An exception anywhere in one batch's ingest (the validator, the engine, a sink) drops that
batch: it is counted by class (where + exception type), logged at most once per class per
minute, and the next batch goes on. A failing tick yields no
diagnoses and is counted the same way.

``feed_many`` takes everything one poll of the collector returned (≤ 50 ms of input) in one
pass: the edge's and the engine's decisions do not depend on how rows are cut into batches,
and per-call overhead, not rows, dominates small batches (a shim sends one every 50 ms per
rank). If validating the poll raises, each batch is validated on its own (admission is
idempotent), so only the batch that raises is lost; an exception in the engine or a sink
drops what that poll carried.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from c4d.intake.validate import Edge
from c4d.record import oppart, schema
from c4d.util.ratelog import RateLimitedLog

log = logging.getLogger("c4d.intake.ingest")

Sink = Callable[[np.ndarray], None]  # the admitted rows of a batch (HEADER)


class Ingest:
    def __init__(
        self,
        engine: Any,
        edge: Edge | None = None,
        sinks: Sequence[Sink] = (),
        on_free: Sequence[Callable[[list[int]], None]] = (),
    ) -> None:
        self.engine = engine
        self.edge = edge or Edge()
        self.sinks = list(sinks)
        self.on_free = list(on_free)
        self.failures: Counter[str] = Counter()
        self.failed_records = 0
        self.ratelog = RateLimitedLog(log)

    def feed(self, raw: np.ndarray, t_ns: int) -> int:
        """Admit one batch fed at master time ``t_ns``; return the records that reached the engine."""
        try:
            ok = self.admit(raw, t_ns)
            if not len(ok):
                return 0
            self.engine.feed(ok, t_ns, cols=self.edge.columns_of(ok))
            for sink in self.sinks:
                sink(ok)
            return len(ok)
        except Exception as e:  # one batch must never stop the master
            self.failed("ingest", e, len(raw))
            return 0

    def feed_many(self, raws: Sequence[np.ndarray], t_ns: int) -> int:
        """``feed`` for several batches fed at the same master time, in one pass."""
        if len(raws) <= 1:
            return self.feed(raws[0], t_ns) if raws else 0
        raw = schema.join_records(raws, schema.HEADER)
        try:
            ok = self.admit(raw, t_ns)
        except Exception:
            return sum(self.feed(r, t_ns) for r in raws)  # only the batch that raises is lost
        try:
            if len(ok):
                self.engine.feed(ok, t_ns, cols=self.edge.columns_of(ok))
                for sink in self.sinks:
                    sink(ok)
            return len(ok)
        except Exception as e:
            self.failed("ingest", e, len(raw))
            return 0

    def admit(self, raw: np.ndarray, t_ns: int) -> np.ndarray:
        """The edge's admitted rows, node agents' parts unpacked (their columns then read anew)."""
        ok = self.edge.admit(raw, t_ns)
        return oppart.unpack(ok) if len(ok) else ok

    def tick(self, now_ns: int) -> list[Any]:
        """Free what expired, then evaluate the engine at ``now_ns``; the diagnoses new at this tick."""
        try:
            freed = self.edge.expire(now_ns)
            if freed:
                self.engine.free_comms(freed)
                for cb in self.on_free:
                    cb(freed)
            return self._lost(list(self.engine.tick(now_ns)))
        except Exception as e:
            self.failed("tick", e, 0)
            return []
        finally:
            self._heard()
            self._engine_drops()
            self.flush_logs()

    def settle(self) -> list[Any]:
        """The diagnoses of the ticks an engine in a process of its own still owes, waited for
        (its answers come a tick late: c4d.master.engine_process); none with an in-process engine."""
        drain = getattr(self.engine, "drain", None)
        try:
            return self._lost(list(drain())) if drain is not None else []
        except Exception as e:
            self.failed("tick", e, 0)
            return []
        finally:
            self._heard()

    def _lost(self, diagnoses: list[Any]) -> list[Any]:
        """Tell the edge which ranks the engine declared lost: a new incarnation of each may
        register (c4d/intake/validate.py, ``Edge.lost``)."""
        for d in diagnoses:
            if getattr(getattr(d, "kind", None), "name", None) == "RankLost":
                self.edge.lost(d.ranks)
        return diagnoses

    def _engine_drops(self) -> None:
        """Records the engine's byte budgets refused after the edge admitted them (op rings, PEER
        rows, p2p counters, rows kept for the slow judge: c4d/engine/pool.py, Pool) counted with
        the edge's refusals, by reason (c4d_records_rejected). An engine in a process of its own
        hands them over with each tick's answer (EngineProcess.drops)."""
        drops = getattr(self.engine, "drops", None)
        if drops is None:
            return
        for reason, total in drops().items():
            if not reason.endswith("evicted") and total > self.edge.rejected[reason]:
                self.edge.rejected[reason] = total

    def _heard(self) -> None:
        """Count what an engine in a process of its own failed at there (handed over with its
        answers) as this process's own failures are counted."""
        failed = getattr(self.engine, "failures", None)
        if failed:
            self.failures.update(failed)
            self.failed_records += self.engine.failed_records
            failed.clear()
            self.engine.failed_records = 0

    def failed(self, where: str, e: BaseException, n: int) -> None:
        cls = f"{where}: {type(e).__name__}"
        self.failures[cls] += 1
        self.failed_records += n
        self.ratelog(cls, "c4d: %s failed, %d record(s) dropped: %s: %s", where, n, type(e).__name__, e, n=n)

    def flush_logs(self) -> None:
        self.edge.ratelog.flush()
        self.ratelog.flush()
