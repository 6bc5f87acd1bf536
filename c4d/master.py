"""The master: collector → engine → sinks (trace, JSON lines, log, blacklist, live view).

One thread owns everything (the ZeroMQ socket, the engine, the trace writer), so no
locks: each loop iteration ingests what has arrived, then — every ``tick_s`` — writes
a TICK record to the trace and evaluates the engine at that master time. ``c4d
analyze`` replays the same records and ticks through the same engine.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from c4d import schema
from c4d.analyze import make_engine
from c4d.collector import DEFAULT_ENDPOINT, Collector
from c4d.received import Received
from c4d.trace import TraceWriter

log = logging.getLogger("c4d")


@dataclass
class MasterConfig:
    bind: str = DEFAULT_ENDPOINT
    trace: str | None = None
    json_out: bool = False
    blacklist: str | None = None
    tick_s: float = 0.2
    metrics_port: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    engine_overrides: dict[str, Any] = field(default_factory=dict)


class Master:
    def __init__(
        self,
        cfg: MasterConfig,
        out: TextIO | None = None,
        on_diagnosis: list[Callable[[Any], None]] | None = None,
    ):
        self.cfg = cfg
        self.out = out or sys.stdout
        self.collector = Collector(cfg.bind)
        self.endpoint = self.collector.endpoint
        self.received = Received()
        # the metrics read the engine's per-rank wait / transfer split (one computation)
        self.engine = make_engine(cfg.engine_overrides, split=cfg.metrics_port is not None)
        self.trace = TraceWriter(cfg.trace, {"endpoint": self.endpoint, **cfg.meta}) if cfg.trace else None
        self.metrics = None
        if cfg.metrics_port is not None:
            from c4d.metrics import Metrics

            self.metrics = Metrics()
            self.metrics_port = self.metrics.serve(cfg.metrics_port)
        self.diagnoses: list[Any] = []
        self.on_diagnosis = list(on_diagnosis or [])
        self._next_tick = time.monotonic() + cfg.tick_s
        self.started_ns = time.time_ns()
        self.blacklisted: list[str] = []
        # Records are fed stamped with the latest tick's master time (not their own receipt
        # time), so that a replay of the trace, which stores ticks, feeds identical input.
        self._last_tick_ns = self.started_ns
        self._rate: deque[tuple[float, int]] = deque()
        self.tick(self.started_ns)

    # -- the loop -----------------------------------------------------------------------
    def step(self, timeout_s: float | None = None) -> list[Any]:
        """Ingest for at most ``timeout_s`` (default: until the next tick), then tick if due."""
        wait = self._next_tick - time.monotonic() if timeout_s is None else timeout_s
        for raw in self.collector.poll(max(0.0, wait)):
            now = time.time_ns()
            kinds = schema.by_kind(raw)  # split once for the bookkeeping and the metrics
            self.received.add(raw, now, kinds)
            if self.trace:
                self.trace.write(raw)
            self.engine.feed(raw, self._last_tick_ns)
            if self.metrics is not None:
                self.metrics.count(kinds)
        new: list[Any] = []
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.cfg.tick_s
            new = self.tick(time.time_ns())
        return new

    def tick(self, now_ns: int) -> list[Any]:
        self._last_tick_ns = now_ns
        if self.trace:
            self.trace.tick(now_ns)
            self.trace.flush()
        new = self.engine.tick(now_ns)
        for d in new:
            self._emit(d)
        if self.metrics is not None:
            snap = self.engine.state()
            self.metrics.tick(
                self.received.dropped, self.collector.bad_messages, snap, self.engine.take_split()
            )
        return new

    def records_per_s(self, window_s: float = 2.0) -> float:
        """Ingest rate over roughly the last ``window_s`` seconds."""
        now = time.monotonic()
        self._rate.append((now, self.collector.records))
        while len(self._rate) > 2 and now - self._rate[0][0] > window_s:
            self._rate.popleft()
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        while not should_stop():
            self.step()

    # -- sinks --------------------------------------------------------------------------
    def _emit(self, d: Any) -> None:
        self.diagnoses.append(d)
        if self.cfg.json_out:
            self.out.write(json.dumps(d.to_json()) + "\n")
            self.out.flush()
        level = getattr(logging, d.level.name, logging.WARNING)
        log.log(level, "%s", d.summary().split(" ", 1)[-1])  # the logger prints the level itself
        if self.cfg.blacklist and d.blacklist_nodes:
            from c4d.actions.blacklist import append_nodes

            added = append_nodes(self.cfg.blacklist, d.blacklist_nodes)
            if added:
                self.blacklisted.extend(added)
                log.error("blacklisted %s (written to %s)", ", ".join(added), self.cfg.blacklist)
        if self.metrics is not None:
            self.metrics.diagnosis(d)
        for cb in self.on_diagnosis:
            cb(d)

    def close(self) -> None:
        self.collector.close()
        if self.trace:
            self.trace.close()
