"""Prometheus metrics from the master (`--metrics-port`), through prometheus-client.

Updated from the master thread only. Waits and transfers are the engine's own (its
per-rank OP_SPLIT rows of the ops completed since the last tick: the same wait/transfer
computation as the diagnoses, the report and ``ops_split``, clock offsets included);
per-communicator gauges come from the engine's snapshot. The HTTP server thread only reads
the registry.

Bad input is counted here in detail (``c4d_records_rejected{reason}``,
``c4d_bad_messages_by_reason{reason}``, ``c4d_ingest_failures{where}``) while the log says it
at most once per reason class per minute. Label values are fixed reason strings, and
per-communicator series are removed when the edge frees the communicator, so a hostile
sender cannot grow the registry without bound.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from c4d.record import schema

_BUCKETS_S = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("c4d_records", "Records ingested by the master", ["kind"], registry=r)
        self.dropped = Gauge(
            "c4d_records_dropped", "Records dropped by the ranks (queue full, no master)", registry=r
        )
        self.bad = Gauge("c4d_bad_messages", "Messages the master rejected", registry=r)
        self.diagnoses = Counter("c4d_diagnoses", "Diagnoses emitted", ["kind", "level"], registry=r)
        self.busbw = Gauge(
            "c4d_busbw_gbs", "Latest bus bandwidth (GB/s) per communicator and op", ["comm", "op"], registry=r
        )
        self.wait = Histogram(
            "c4d_wait_seconds",
            "Per-rank wait for the last arrival",
            ["comm", "op"],
            buckets=_BUCKETS_S,
            registry=r,
        )
        self.transfer = Histogram(
            "c4d_transfer_seconds", "Last arrival to done", ["comm", "op"], buckets=_BUCKETS_S, registry=r
        )
        self.ranks = Gauge("c4d_ranks", "Ranks by state", ["state"], registry=r)
        self.rejected = Counter(
            "c4d_records_rejected", "Records the edge validator dropped", ["reason"], registry=r
        )
        self.bad_by_reason = Counter(
            "c4d_bad_messages_by_reason", "Messages the collector rejected", ["reason"], registry=r
        )
        self.failures = Counter(
            "c4d_ingest_failures", "Batches or ticks dropped by an exception", ["where"], registry=r
        )
        self._reported: dict[tuple[str, str], int] = {}
        self._series: set[tuple[str, str]] = set()  # (comm, op) label pairs in use

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server.server_port

    def ingest(self, ok: np.ndarray) -> None:
        """Count one admitted batch's records by kind."""
        per = np.bincount(ok["kind"], minlength=256) if len(ok) else np.zeros(256, np.int64)
        for k in schema.DTYPES:
            if per[k]:
                self.records.labels(kind=k.name.lower()).inc(int(per[k]))

    def tick(
        self, dropped: int, bad_messages: int, snapshot: Any = None, split: np.ndarray | None = None
    ) -> None:
        """Gauges from the master and the engine's snapshot; waits and transfers from the
        engine's OP_SPLIT rows of the ops completed since the last tick."""
        self.dropped.set(dropped)
        self.bad.set(bad_messages)
        if snapshot is not None:
            states: dict[str, int] = {}
            for st in snapshot.rank_states.values():
                name = getattr(st, "value", str(st))
                states[name] = states.get(name, 0) + 1
            for name, n in states.items():
                self.ranks.labels(state=name).set(n)
        if split is None or not len(split):
            return
        key = split["comm_id"].astype(np.uint64) * np.uint64(256) + split["op"].astype(np.uint64)
        for k in np.unique(key).tolist():
            g = split[key == k]
            comm, op = f"{int(g['comm_id'][0]):016x}", str(schema.OP_NAMES[int(g["op"][0])])
            self._series.add((comm, op))
            w, t = self.wait.labels(comm=comm, op=op), self.transfer.labels(comm=comm, op=op)
            for v in g["wait_ns"][np.isfinite(g["wait_ns"])] / 1e9:
                w.observe(max(float(v), 0.0))
            _, first = np.unique(np.stack([g["seq"], g["peer"]], axis=1), axis=0, return_index=True)
            xfer = g["transfer_ns"][np.sort(first)]  # once per op
            for v in xfer[np.isfinite(xfer)] / 1e9:
                t.observe(max(float(v), 0.0))
            bw = g["busbw_gbs"][np.isfinite(g["busbw_gbs"])]
            if len(bw):
                self.busbw.labels(comm=comm, op=op).set(float(bw[-1]))

    def edge(self, edge: Any, collector: Any, ingest: Any) -> None:
        """Bring the reason counters up to the edge's, the collector's and the ingest's totals."""
        for name, metric, totals in (
            ("rejected", self.rejected, edge.rejected),
            ("bad", self.bad_by_reason, collector.bad_reasons),
            ("fail", self.failures, ingest.failures),
        ):
            for reason, total in totals.items():
                key = (name, reason)
                delta = total - self._reported.get(key, 0)
                if delta > 0:
                    metric.labels(reason).inc(delta)
                    self._reported[key] = total

    def forget(self, cids: list[int]) -> None:
        """Drop freed communicators' series."""
        if not self._series:
            return
        names = {f"{int(c):016x}" for c in cids}
        for comm, op in [k for k in self._series if k[0] in names]:
            for m in (self.wait, self.transfer, self.busbw):
                with contextlib.suppress(KeyError):
                    m.remove(comm, op)
            self._series.discard((comm, op))

    def diagnosis(self, d: Any) -> None:
        self.diagnoses.labels(kind=d.kind.value, level=d.level.name).inc()
