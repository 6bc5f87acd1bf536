"""Prometheus metrics from the master (`--metrics-port`), through prometheus-client.

Updated from the master thread only: op records are buffered per batch and, at each
tick, every collective whose records from all ranks have arrived is split into wait and
transfer (c4d.opstats) and observed into histograms; per-communicator gauges come from
the engine's snapshot. The HTTP server thread only reads the registry.

Bad input is counted here in detail (``c4d_records_rejected{reason}``,
``c4d_bad_messages_by_reason{reason}``, ``c4d_ingest_failures{where}``) while the log says it
at most once per reason class per minute. Label values are fixed reason strings, and
per-communicator series are removed when the edge frees the communicator, so a hostile
sender cannot grow the registry without bound.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from c4d import schema
from c4d.opstats import split_wait_transfer

_BUCKETS_S = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
_OP_NAMES = np.array([o.name for o in schema.Op] + ["?"] * (256 - len(schema.Op)), dtype=object)
CARRY_MAX = 200_000  # op rows kept while waiting for the other ranks of their collective


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
        self._pending: list[np.ndarray] = []
        self._carry = pd.DataFrame()
        self._series: set[tuple[str, str]] = set()  # (comm, op) label pairs in use

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server.server_port

    def ingest(self, kinds: dict[schema.Kind, np.ndarray]) -> None:
        for k, arr in kinds.items():
            if len(arr):
                self.records.labels(kind=k.name.lower()).inc(len(arr))
        ops = kinds.get(schema.Kind.OP)
        if ops is not None and len(ops):
            coll = ops[(ops["flags"] & schema.OpFlag.P2P) == 0]
            if len(coll):
                self._pending.append(
                    coll[
                        [
                            "rank",
                            "comm_id",
                            "seq",
                            "start_ns",
                            "end_ns",
                            "comm_nranks",
                            "op",
                            "bytes",
                            "flags",
                        ]
                    ].copy()
                )

    def tick(
        self, dropped: int, bad_messages: int, snapshot=None, offsets_ns: dict[int, int] | None = None
    ) -> None:
        self.dropped.set(dropped)
        self.bad.set(bad_messages)
        if snapshot is not None:
            states: dict[str, int] = {}
            for st in snapshot.rank_states.values():
                name = getattr(st, "value", str(st))
                states[name] = states.get(name, 0) + 1
            for name, n in states.items():
                self.ranks.labels(state=name).set(n)
        if not self._pending:
            return
        df = pd.concat([self._carry, *(pd.DataFrame(a) for a in self._pending)], ignore_index=True)
        self._pending.clear()
        size = df.groupby(["comm_id", "seq"])["rank"].transform("size")
        complete = size >= df["comm_nranks"]
        self._carry = df[~complete].reset_index(drop=True).tail(CARRY_MAX)
        done = split_wait_transfer(df[complete].reset_index(drop=True), offsets_ns)
        if done.empty:
            return
        done["comm"] = done["comm_id"].map(lambda c: f"{int(c):016x}")
        done["op_name"] = _OP_NAMES[done["op"].to_numpy()]
        for (comm, op), g in done.groupby(["comm", "op_name"]):
            self._series.add((comm, op))
            w, t = self.wait.labels(comm=comm, op=op), self.transfer.labels(comm=comm, op=op)
            for v in g["wait_ns"].dropna().to_numpy() / 1e9:
                w.observe(v)
            for v in g.drop_duplicates("seq")["transfer_ns"].dropna().to_numpy() / 1e9:
                t.observe(max(v, 0.0))
            bw = g["busbw_gbs"].replace([np.inf, -np.inf], np.nan).dropna()
            if len(bw):
                self.busbw.labels(comm=comm, op=op).set(float(bw.iloc[-1]))

    def edge(self, edge, collector, ingest) -> None:
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
        """Drop freed communicators: their waiting op rows and their series."""
        if not len(self._carry) and not self._series:
            return
        ids = {int(c) for c in cids}
        if len(self._carry):
            self._carry = self._carry[~self._carry["comm_id"].isin(list(ids))].reset_index(drop=True)
        names = {f"{c:016x}" for c in ids}
        for comm, op in [k for k in self._series if k[0] in names]:
            for m in (self.wait, self.transfer, self.busbw):
                with contextlib.suppress(KeyError):
                    m.remove(comm, op)
            self._series.discard((comm, op))

    def diagnosis(self, d) -> None:
        self.diagnoses.labels(kind=d.kind.value, level=d.level.name).inc()
