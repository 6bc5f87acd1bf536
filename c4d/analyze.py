"""`c4d analyze`: offline replay of a captured trace through the live engine, and the pandas API
that needs the engine (``ops_split``, ``diagnoses``).

Replay feeds the records in file order and evaluates the engine at each TICK record's
master time, exactly as the live master did, so it gives the live run's diagnoses. It goes
through the same edge validation and ingest guard as the master (c4d/ingest.py): the trace
holds what arrived, and the replay drops what the live run dropped. The same replay hands
out the engine's per-rank wait / transfer split of every completed op: the one computation
the live metrics, the report and ``ops_split`` all use.

Layering: this module sits above the engine and the loaders (``c4d.trace``, ``c4d.formats``)
and below the master, the CLI and the report; it imports no networking.

    tr = c4d.analyze.load("job.c4d")     # or load(path) of FR dumps, Inspector logs, nccl-tests
    tr.ops_split                          # ops with the engine's wait/transfer split
    tr.diagnoses                          # the replay's diagnoses, one row each
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from c4d import schema
from c4d.engine import Diagnosis, Engine, EngineConfig
from c4d.engine.state import OP_SPLIT
from c4d.ingest import Ingest
from c4d.trace import MAGIC, RawTrace, Trace, from_raw, read_raw
from c4d.validate import Edge, Limits

SPLIT_COLUMNS = (
    "arrive_ns",
    "last_arrive_ns",
    "wait_ns",
    "transfer_ns",
    "lateness_ns",
    "compute_ns",
    "algbw_gbs",
    "busbw_gbs",
)
DIAGNOSIS_COLUMNS = ["time", "level", "kind", "comm", "op", "seq", "ranks", "nodes", "hang_times", "detail"]


def make_engine(overrides: dict[str, Any] | None = None, split: bool = False) -> Engine:
    """The diagnosis engine, configured from the job's registered values plus ``overrides``
    (and the master's C4D_SLOW_* environment)."""
    return Engine(EngineConfig.from_env(**(overrides or {})), split=split)


def replay(
    rt: RawTrace, engine: Any, ingest: Ingest | None = None, on_tick: Callable[[Any], None] | None = None
) -> list[Diagnosis]:
    """Drive ``engine`` through the trace's records and ticks; return every diagnosis.

    ``ingest`` (made here when not given) holds what the edge dropped and what failed;
    ``on_tick(engine)`` runs after each evaluation (to drain what the engine hands out).
    """
    ing = ingest or Ingest(engine, Edge(Limits.from_env()))
    raw = rt.raw
    out: list[Diagnosis] = []
    ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK)
    last_tick = int(rt.meta.get("created_ns", 0))
    prev = 0
    for i in ticks.tolist():
        if i > prev:
            ing.feed(raw[prev:i], last_tick)
        last_tick = int(raw["time_ns"][i])
        out.extend(ing.tick(last_tick))
        if on_tick is not None:
            on_tick(engine)
        prev = i + 1
    if prev < len(raw):
        ing.feed(raw[prev:], last_tick)
        if on_tick is not None:
            engine.flush()  # ingest the records after the last TICK (never evaluated live either)
            on_tick(engine)
    return out


def run_engine(rt: RawTrace, overrides: dict[str, Any] | None = None) -> tuple[list[Diagnosis], np.ndarray]:
    """One replay: the diagnoses and every completed op's OP_SPLIT rows."""
    eng = make_engine(overrides, split=True)
    parts: list[np.ndarray] = []
    diags = replay(rt, eng, on_tick=lambda e: parts.append(e.take_split()))
    split = np.concatenate(parts) if parts else np.empty(0, OP_SPLIT)
    return diags, split


def split_frame(ops: pd.DataFrame, split: np.ndarray) -> pd.DataFrame:
    """``ops`` (one row per rank and op record) with the engine's split columns (NaN where the
    engine measured nothing: ops that never completed on every member, unpaired p2p)."""
    df = ops.copy()
    if df.empty or not len(split):
        for c in SPLIT_COLUMNS:
            df[c] = pd.Series(np.nan, index=df.index, dtype="float64")
        return df
    sp = pd.DataFrame({k: split[k] for k in ("comm_id", "seq", "comm_rank", "peer", *SPLIT_COLUMNS)})
    sp = sp.drop_duplicates(["comm_id", "seq", "comm_rank", "peer"], keep="last")
    p2p = (df["flags"].astype(int) & int(schema.OpFlag.P2P)) != 0
    key = pd.DataFrame(
        {
            "comm_id": df["comm_id"].astype("uint64"),
            "seq": df["seq"].astype("int64"),
            "comm_rank": df["comm_rank"].astype("int32"),
            "peer": np.where(p2p, df["peer"], -1).astype("int32"),
        }
    )
    merged = key.merge(sp, how="left", on=["comm_id", "seq", "comm_rank", "peer"], validate="many_to_one")
    for c in SPLIT_COLUMNS:
        df[c] = merged[c].to_numpy(dtype="float64")
    return df


def diagnoses_frame(diags: list[Diagnosis]) -> pd.DataFrame:
    """One row per diagnosis (columns of DESIGN.md's JSON; detail kept as a dict)."""
    rows = [d.to_json() for d in diags]
    df = pd.DataFrame(rows, columns=DIAGNOSIS_COLUMNS)
    return df.astype(
        {
            "time": "float64",
            "level": "str",
            "kind": "str",
            "comm": "object",
            "op": "object",
            "seq": "Int64",
            "hang_times": "int64",
        }
    )


@dataclass
class AnalyzedTrace(Trace):
    """A trace (or an import) with what the engine says about it, computed once on first use."""

    overrides: dict[str, Any] = field(default_factory=dict)
    _result: tuple[list[Diagnosis], np.ndarray] | None = None

    def _run(self) -> tuple[list[Diagnosis], np.ndarray]:
        if self._result is None:
            self._result = run_engine(self.raw, self.overrides)
        return self._result

    def diagnoses_list(self) -> list[Diagnosis]:
        """The engine's diagnoses for this trace (an offline replay)."""
        return self._run()[0]

    @property
    def diagnoses(self) -> pd.DataFrame:
        return diagnoses_frame(self.diagnoses_list())

    @property
    def ops_split(self) -> pd.DataFrame:
        """Ops with the engine's wait/transfer split and bus bandwidth (docs/trace-api.md)."""
        return split_frame(self.ops, self._run()[1])

    def table(self, name: str) -> pd.DataFrame:
        if name == "ops":
            return self.ops_split
        if name == "diagnoses":
            return self.diagnoses
        return getattr(self, name)


def analyzed(tr: Trace, overrides: dict[str, Any] | None = None) -> AnalyzedTrace:
    return AnalyzedTrace(**{f.name: getattr(tr, f.name) for f in fields(Trace)}, overrides=overrides or {})


def load(
    path: str | os.PathLike,
    fmt: str | None = None,
    opts: Any = None,
    on_warning: Any = None,
    overrides: dict[str, Any] | None = None,
) -> AnalyzedTrace:
    """Load a c4d trace or an import (Flight Recorder dumps, NCCL Inspector, nccl-tests).

    ``opts`` (c4d.formats.to_records.ImportOptions) gives the thresholds an import assumes;
    ``on_warning`` receives one line per non-fatal import problem; ``overrides`` are engine
    thresholds (as ``c4d analyze --hang-timeout``)."""
    p = Path(path)
    if fmt == "c4d" or (fmt is None and p.is_file() and p.open("rb").read(len(MAGIC)) == MAGIC):
        rt = read_raw(path)
    else:
        from c4d.formats.detect import load_any as load_raw_any

        rt = load_raw_any(path, fmt, opts=opts, on_warning=on_warning)
    return analyzed(from_raw(rt), overrides)


load_any = load  # the name the pandas API had for "any format"


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
