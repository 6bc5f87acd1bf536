"""`c4d analyze`: offline replay of a captured trace through the live engine, and its summary.

Replay feeds the records in file order and evaluates the engine at each TICK record's
master time, exactly as the live master did, so it gives the live run's diagnoses. It goes
through the same edge validation and ingest guard as the master (c4d/ingest.py): the trace
holds what arrived, and the replay drops what the live run dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from c4d import schema
from c4d.ingest import Ingest
from c4d.trace import RawTrace, Trace
from c4d.validate import Edge, Limits


def replay(rt: RawTrace, engine: Any, ingest: Ingest | None = None) -> list[Any]:
    """Drive ``engine`` through the trace's records and ticks; return every diagnosis.

    ``ingest`` (made here when not given) holds what the edge dropped and what failed.
    """
    ing = ingest or Ingest(engine, Edge(Limits.from_env()))
    raw = rt.raw
    out: list[Any] = []
    ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK)
    last_tick = int(rt.meta.get("created_ns", 0))
    prev = 0
    for i in ticks.tolist():
        if i > prev:
            ing.feed(raw[prev:i], last_tick)
        last_tick = int(raw["time_ns"][i])
        out.extend(ing.tick(last_tick))
        prev = i + 1
    if prev < len(raw):
        ing.feed(raw[prev:], last_tick)
    return out


def end_ns(rt: RawTrace) -> int | None:
    """Master time of the trace's last TICK (when the run, as recorded, ended)."""
    raw = rt.raw
    ticks = raw["time_ns"][raw["kind"] == schema.Kind.TICK]
    return int(ticks.max()) if len(ticks) else None


def start_s(rt: RawTrace) -> float | None:
    """When the trace was started (its header), in seconds; None if it does not say."""
    created = rt.meta.get("created_ns")
    return int(created) / 1e9 if created else None


def incidents(rt: RawTrace, diagnoses: list[Any]) -> list[Any]:
    """One verdict per incident (c4d/incidents.py) of a replay's diagnoses."""
    from c4d.incidents import Incidents

    return Incidents.fold(diagnoses, end_ns(rt))


def summary(tr: Trace) -> pd.DataFrame:
    """Per communicator and op kind: ranks, ops, bytes, median and p99 device time (µs)."""
    ops = tr.ops
    if ops.empty:
        return pd.DataFrame(columns=["comm", "op", "ranks", "ops", "bytes", "median_us", "p99_us"])
    df = ops.assign(comm=ops["comm_id"].map(lambda c: f"{int(c):016x}"), dur_us=ops["duration_ns"] / 1e3)
    g = df.groupby(["comm", "op_name"], sort=True)
    out = g.agg(
        ranks=("rank", "nunique"),
        ops=("seq", "size"),
        bytes=("bytes", "sum"),
        median_us=("dur_us", "median"),
        p99_us=("dur_us", lambda s: s.quantile(0.99)),
    ).reset_index()
    return out.rename(columns={"op_name": "op"})
