"""Prometheus metrics from the master (`--metrics-port`), through prometheus-client.

Updated from the master thread only. Waits and transfers are the engine's own (its
per-rank OP_SPLIT rows of the ops completed since the last tick: the same wait/transfer
computation as the diagnoses, the report and ``ops_split``, clock offsets included);
per-communicator gauges come from the engine's snapshot. The HTTP server thread only reads
the registry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from c4d import schema

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

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server.server_port

    def count(self, kinds: dict[schema.Kind, np.ndarray]) -> None:
        """Count one received batch's records by kind."""
        for k, arr in kinds.items():
            if len(arr):
                self.records.labels(kind=k.name.lower()).inc(len(arr))

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
        comm = split["comm_id"]
        op = split["op"]
        key = comm.astype(np.uint64) * np.uint64(256) + op.astype(np.uint64)
        for k in np.unique(key).tolist():
            g = split[key == k]
            labels = {"comm": f"{int(g['comm_id'][0]):016x}", "op": str(schema.OP_NAMES[int(g["op"][0])])}
            w, t = self.wait.labels(**labels), self.transfer.labels(**labels)
            for v in g["wait_ns"][np.isfinite(g["wait_ns"])] / 1e9:
                w.observe(max(float(v), 0.0))
            _, first = np.unique(np.stack([g["seq"], g["peer"]], axis=1), axis=0, return_index=True)
            xfer = g["transfer_ns"][np.sort(first)]  # once per op
            for v in xfer[np.isfinite(xfer)] / 1e9:
                t.observe(max(float(v), 0.0))
            bw = g["busbw_gbs"][np.isfinite(g["busbw_gbs"])]
            if len(bw):
                self.busbw.labels(**labels).set(float(bw[-1]))

    def diagnosis(self, d: Any) -> None:
        self.diagnoses.labels(kind=d.kind.value, level=d.level.name).inc()
