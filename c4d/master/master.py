"""The master: collector → engine → sinks (trace, JSON lines, log, blacklist, live view).

One thread owns everything (the ZeroMQ socket, the engine, the trace writer), so no
locks: each loop iteration ingests what has arrived, then — every ``tick_s`` — writes
a TICK record to the trace and evaluates the engine at that master time. ``c4d
analyze`` replays the same records and ticks through the same engine.

The trace keeps every decoded batch as it arrived; everything else sees only what the edge
validator admitted (c4d/intake/validate.py, driven by c4d/intake/ingest.py exactly as in a replay). No
record, batch or exception stops the loop.

What the master took from its socket is written and flushed to the trace before the engine
sees it, so a master killed at any moment loses at most the poll it was in (docs/reliability.md).
A trace that can't be written (disk full, file-size limit, I/O error) is closed with one ERROR
line; diagnosis goes on without it.

Sinks differ in how much they say: ``--json`` writes every diagnosis (docs/cli.md), the
human-readable log follows c4d/engine/incidents.py — an incident is logged when it opens, when
it escalates to ERROR, when it isolates a node and when it ends, never at every re-count.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from c4d.engine import make_engine
from c4d.engine.consistency import PendingWatch
from c4d.engine.incidents import Change, Incidents, incident_key
from c4d.intake.ingest import Ingest
from c4d.intake.received import Received
from c4d.intake.validate import Edge, Limits
from c4d.master.collector import DEFAULT_ENDPOINT, Collector
from c4d.master.receiver import ReceiverProcess
from c4d.record.trace import TraceWriter
from c4d.util import heap

log = logging.getLogger("c4d")


def _switch(var: str) -> Callable[[], bool]:
    """A MasterConfig default read from the environment: ``var`` set and not 0."""
    return lambda: os.environ.get(var, "").strip() not in ("", "0")


MAX_AUTO_SHARDS = 4  # beyond, the join (front, clock, judges) bounds a sharded engine (docs/engine-shards.md)


def engine_shards_from_env(env: Mapping[str, str] | None = None) -> int:
    """``C4D_ENGINE_SHARDS``: how many shards the engine's process splits communicators over
    (c4d/engine/shards.py); unset, empty or ``auto``: 0 (``engine_shards``: by core count)."""
    raw = (os.environ if env is None else env).get("C4D_ENGINE_SHARDS", "").strip()
    if raw in ("", "auto"):
        return 0
    try:
        n = int(raw)
        if n < 1:
            raise ValueError
    except ValueError:
        log.warning("C4D_ENGINE_SHARDS=%r is not a count >= 1 or 'auto': by core count", raw)
        return 0
    return n


def engine_shards(asked: int, cores: int | None = None) -> int:
    """Shards for an engine in its own process: ``asked``, or (0) the cores this process may use
    less two (the master's loop and the engine's join), at least 1, at most MAX_AUTO_SHARDS."""
    if asked >= 1:
        return asked
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_AUTO_SHARDS, cores - 2))


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
    limits: Limits | None = None  # None: Limits.from_env()
    curve: str | None = None  # KEYDIR of the master's CURVE key pair (c4d.master.curve); None: no CURVE
    job: str | None = None  # the job served; None: the first one heard (c4d.master.collector)
    # answer status requests here (c4d/master/status.py); "auto": next to the record endpoint; None: nowhere
    status: str | None = None
    # the engine in a process of its own (c4d.master.engine_process); c4d run's master too
    engine_process: bool = field(default_factory=_switch("C4D_MASTER_ENGINE_PROCESS"))
    # its communicators over this many shards (c4d/engine/shards.py); 0: by core count
    engine_shards: int = field(default_factory=engine_shards_from_env)
    # receiving (the socket, decoding, the job's check) in a process of its own (c4d.master.receiver)
    receiver_process: bool = field(default_factory=_switch("C4D_MASTER_RECEIVER_PROCESS"))


class Master:
    def __init__(
        self,
        cfg: MasterConfig,
        out: TextIO | None = None,
        on_diagnosis: list[Callable[[Any], None]] | None = None,
        enrich: Callable[[Any], Any] | None = None,
        collector: Collector | None = None,
    ):
        self.cfg = cfg
        self.out = out or sys.stdout
        heap.keep_freed_blocks()  # a chunk's arrays reuse the pages of the one before (c4d/util/heap.py)
        heap.collect_rarely()
        # a collector passed in (c4d run keeps one endpoint across restarts) is the caller's to close
        self._own_collector = collector is None
        keys = None
        self.collector: Collector | ReceiverProcess
        if collector is None:
            from c4d.master import curve

            keys = curve.load(cfg.curve) if cfg.curve else None
            if cfg.receiver_process:
                self.collector = ReceiverProcess(cfg.bind, curve=cfg.curve, job=cfg.job)
            else:
                self.collector = Collector(cfg.bind, curve=keys, job=cfg.job)
        else:
            collector.serve(cfg.job)  # a new attempt may be a new job
            self.collector = collector
        self.endpoint = self.collector.endpoint
        self.status = None
        if cfg.status:
            from c4d.master.status import StatusServer, status_endpoint

            try:
                where = status_endpoint(self.endpoint) if cfg.status == "auto" else cfg.status
                if where is None:
                    raise OSError(f"none can be derived from {self.endpoint}; give --status-bind")
                self.status = StatusServer(where, keys)
            except OSError as e:  # the job is served all the same; only status requests go unanswered
                log.warning("no status endpoint (c4d sim --master will not hear the verdicts): %s", e)
        self.received = Received()
        # the metrics read the engine's per-rank wait / transfer split (one computation)
        split = cfg.metrics_port is not None
        if cfg.engine_process or cfg.engine_shards > 1:
            from c4d.master.engine_process import EngineProcess

            shards = engine_shards(cfg.engine_shards)
            self.engine: Any = EngineProcess(cfg.engine_overrides, split=split, shards=shards)
        else:
            self.engine = make_engine(cfg.engine_overrides, split=split)
        self.trace = None
        self.metrics = None
        try:
            if cfg.trace:
                self.trace = self._open(f"cannot write the trace {cfg.trace}", TraceWriter, cfg.trace,
                                        {"endpoint": self.endpoint, **cfg.meta})  # fmt: skip
            if cfg.metrics_port is not None:
                from c4d.master.metrics import Metrics

                self.metrics = Metrics()
                where = f"cannot serve metrics on 127.0.0.1:{cfg.metrics_port}"
                self.metrics_port = self._open(where, self.metrics.serve, cfg.metrics_port)
        except OSError:
            self._abandon()
            raise
        self.edge = Edge(cfg.limits or Limits.from_env())
        sinks: list[Any] = [lambda ok: self.received.add(ok, time.time_ns(), self.edge.columns_of(ok))]
        on_free: list[Any] = [self.received.forget]
        # members whose heartbeats complete a disagreement: evaluated when that heartbeat comes
        self.pending_watch = PendingWatch()
        sinks.append(lambda ok: self.pending_watch.feed(ok, self.edge.columns_of(ok)))
        on_free.append(self.pending_watch.forget)
        if (m := self.metrics) is not None:
            sinks.append(m.ingest)
            on_free.append(m.forget)
        self.ingest = Ingest(self.engine, self.edge, sinks=sinks, on_free=on_free)
        self.diagnoses: list[Any] = []
        self.on_diagnosis = list(on_diagnosis or [])
        # adds evidence gathered outside the engine (c4d run: stacks) before any sink sees a diagnosis
        self.enrich = enrich
        self._next_tick = time.monotonic() + cfg.tick_s
        self._last_tick_mono = time.monotonic()
        self.started_ns = time.time_ns()
        self.blacklisted: list[str] = []
        self.trace_error: str | None = None
        self.incidents = Incidents()
        # Records are fed stamped with the latest tick's master time (not their own receipt
        # time), so that a replay of the trace, which stores ticks, feeds identical input.
        self._last_tick_ns = self.started_ns
        self._rate: deque[tuple[float, int]] = deque()
        self.tick(self.started_ns)

    # -- the loop -----------------------------------------------------------------------
    def step(self, timeout_s: float | None = None) -> list[Any]:
        """Ingest for at most ``timeout_s`` (default: until the next tick), then tick if due."""
        wait = self._next_tick - time.monotonic() if timeout_s is None else timeout_s
        if self.pending_watch.due:
            wait = min(wait, self._early_at() - time.monotonic())
        raws = self.collector.poll(max(0.0, wait))
        if self.trace and raws:
            try:
                for raw in raws:
                    self.trace.write(raw)  # what arrived, valid or not: a replay re-validates it
                self.trace.flush()  # on disk before the engine sees it: a kill loses this poll at most
            except Exception as e:
                self._trace_failed(e)
        if raws:
            self.ingest.feed_many(raws, self._last_tick_ns)
            self.incidents.heard(self._last_tick_ns)  # the job still sends: its hangs did not just stop
        new: list[Any] = []
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.cfg.tick_s
            new = self.tick(time.time_ns())
        elif self.pending_watch.due and time.monotonic() >= self._early_at():
            new = self.tick(time.time_ns())  # a TICK like any other: a replay evaluates there too
        if self.status is not None:
            self.status.serve(self.diagnoses, self.collector.job)
        return new

    def _early_at(self) -> float:
        """When a tick the pending watch asks for may come: a quarter period after the last one
        at the earliest (a stream of disagreements cannot make the master tick on every batch)."""
        return self._last_tick_mono + self.cfg.tick_s / 4

    def tick(self, now_ns: int) -> list[Any]:
        self._last_tick_ns = now_ns
        self._last_tick_mono = time.monotonic()
        self.pending_watch.take()
        if self.trace:
            try:
                self.trace.tick(now_ns)
                self.trace.flush()
            except Exception as e:
                self._trace_failed(e)
        new = self.ingest.tick(now_ns)
        self._emit_all(new)
        try:
            self._log_events(self.incidents.expire(now_ns))
        except Exception as e:
            self.ingest.failed("diagnosis sink", e, 0)
        self.collector.ratelog.flush()
        if self.metrics is not None:
            try:
                take = getattr(self.engine, "take_metrics", None)
                if take is not None:  # an engine in a process of its own: what it answered so far
                    snap, split = take()
                else:
                    snap = self.engine.state()
                    split = self.engine.take_split()  # the engine's own waits and transfers
                self.metrics.tick(self.received.dropped, self.collector.bad_messages, snap, split)
                self.metrics.edge(self.edge, self.collector, self.ingest)
            except Exception as e:
                self.ingest.failed("metrics", e, 0)
        return new

    def settle(self) -> list[Any]:
        """Wait for the evaluations an engine in a process of its own still owes
        (``Ingest.settle``) and hand out their diagnoses; nothing to wait for in-process."""
        new = self.ingest.settle()
        self._emit_all(new)
        return new

    def _emit_all(self, new: list[Any]) -> None:
        for d in new:
            try:
                self._emit(d)
            except Exception as e:  # a sink (blacklist file, a callback) must not stop the master
                self.ingest.failed("diagnosis sink", e, 0)

    def _trace_failed(self, e: Exception) -> None:
        """Stop writing the trace (one ERROR line); the engine and every other sink go on."""
        tr, self.trace = self.trace, None
        if tr is None:
            return
        why = (
            f"{e.strerror} (errno {e.errno})"
            if isinstance(e, OSError) and e.strerror
            else f"{type(e).__name__}: {e}"
        )
        self.trace_error = why
        self.ingest.failures["trace write"] += 1
        with contextlib.suppress(Exception):  # the buffered tail can't be written either: a cut frame
            tr.close()
        log.error(
            "trace writing stopped: %s: %s after %d records; diagnosis goes on without a trace",
            tr.path,
            why,
            tr.records,
        )

    def records_per_s(self, window_s: float = 2.0) -> float:
        """Ingest rate over roughly the last ``window_s`` seconds."""
        now = time.monotonic()
        self._rate.append((now, self.collector.records))
        while len(self._rate) > 2 and now - self._rate[0][0] > window_s:
            self._rate.popleft()
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def run(
        self, should_stop: Callable[[], bool] = lambda: False, on_step: Callable[[], None] | None = None
    ) -> None:
        while not should_stop():
            self.step()
            if on_step is not None:
                on_step()

    # -- sinks --------------------------------------------------------------------------
    def _emit(self, d: Any) -> None:
        if self.enrich is not None:
            d = self.enrich(d)
        self.diagnoses.append(d)
        if self.cfg.json_out:
            self.out.write(json.dumps(d.to_json()) + "\n")
            self.out.flush()
        self._log_events(self.incidents.observe(d))
        if self.cfg.blacklist and d.blacklist_nodes:
            from c4d.actions.blacklist import append_nodes

            added = append_nodes(self.cfg.blacklist, d.blacklist_nodes)
            if added:
                self.blacklisted.extend(added)
                inc = self.incidents.open.get(incident_key(d))
                tag = f"#{inc.id} " if inc is not None else ""
                log.error("%sblacklisted %s (written to %s)", tag, ", ".join(added), self.cfg.blacklist)
        if self.metrics is not None:
            self.metrics.diagnosis(d)
        for cb in self.on_diagnosis:
            cb(d)

    def _log_events(self, events) -> None:
        """The log policy: an incident's opening, its escalation to ERROR, its end."""
        for ev in events:
            inc = ev.incident
            if ev.change is Change.ended:  # at the level it reached, so it reads like its start
                log.log(getattr(logging, inc.level.name), "%s", inc.line().split(" ", 1)[1])
                continue
            d = ev.diagnosis
            level = getattr(logging, d.level.name, logging.WARNING)
            what = ""  # opened or escalated: the report itself (the logger adds the level)
            if ev.change is Change.resumed:
                what = " resumed (its reports were late):"
            elif ev.change is Change.revised:
                what = f" revised ({inc.revisions[-1]}):"
            log.log(level, "#%d%s %s", inc.id, what, d.summary().split(" ", 1)[-1])

    def drain(self, budget_s: float = 1.0) -> None:
        """Before stopping: take what already arrived (polls that wait for nothing, until one
        finds nothing or ``budget_s`` passed), so that records the job sent before its master
        was told to stop reach the trace and the engine."""
        end = time.monotonic() + budget_s
        self.collector.sync()  # a receiver's process: what it received so far, then a mark
        while time.monotonic() < end:
            n = self.collector.messages
            self.step(timeout_s=0)
            if self.collector.messages == n and self.collector.synced:
                return

    def finish(self) -> None:
        """The run is over: say which incidents were still open (once)."""
        self._log_events(self.incidents.close(time.time_ns()))

    @staticmethod
    def _open(what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; its failure one OSError that says what could not be done (the command
        line prints it as it is: a trace's path or a metrics port is not the master's endpoint)."""
        try:
            return fn(*args)
        except (OSError, OverflowError) as e:  # (OverflowError: a port beyond 65535)
            raise OSError(f"{what}: {getattr(e, 'strerror', None) or e}") from None

    def _abandon(self) -> None:
        """What ``__init__`` started, stopped when a later part of it fails."""
        for part in (self.collector if self._own_collector else None, self.status, self.trace, self.engine):
            if part is not None and hasattr(part, "close"):
                with contextlib.suppress(Exception):
                    part.close()

    def close(self) -> None:
        self.settle()
        if self.incidents.open:
            self.finish()
        if self._own_collector:
            self.collector.close()
        if self.status is not None:
            self.status.close()
        if self.trace:
            self.trace.close()
        if hasattr(self.engine, "close"):
            self.engine.close()
