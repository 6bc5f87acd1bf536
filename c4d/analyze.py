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

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from c4d import heap, schema
from c4d.engine import Diagnosis, Engine, EngineConfig
from c4d.engine.state import OP_SPLIT
from c4d.ingest import Ingest
from c4d.trace import MAGIC, RawTrace, Trace, from_raw, read_raw
from c4d.validate import Edge, Limits

if TYPE_CHECKING:  # pandas loads in ~0.5 s: the replay itself never needs it
    import pandas as pd

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
    return replay_chunks([rt.raw], engine, int(rt.meta.get("created_ns", 0)), ingest, on_tick)


def replay_chunks(
    chunks: Iterable[np.ndarray],
    engine: Any,
    created_ns: int = 0,
    ingest: Ingest | None = None,
    on_tick: Callable[[Any], None] | None = None,
) -> list[Diagnosis]:
    """``replay`` over records that come in pieces (``TraceStream.chunks()``): the same feeds and
    ticks as over the whole array, so the same diagnoses. Holds at most the records between
    two ticks (one master tick period) besides the piece being read."""
    heap.keep_freed_blocks()  # (c4d/heap.py)
    heap.collect_rarely()
    ing = ingest or Ingest(engine, Edge(Limits.from_env()))
    out: list[Diagnosis] = []
    last_tick = created_ns
    pending: list[np.ndarray] = []  # records since the last tick, fed as one batch at the next
    for raw in chunks:
        ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK)
        prev = 0
        for i in ticks.tolist():
            if i > prev:
                pending.append(raw[prev:i])
            if pending:
                ing.feed(pending[0] if len(pending) == 1 else np.concatenate(pending), last_tick)
                pending = []
            last_tick = int(raw["time_ns"][i])
            out.extend(ing.tick(last_tick))
            if on_tick is not None:
                on_tick(engine)
            prev = i + 1
        if prev < len(raw):
            pending.append(raw[prev:])
    if pending:
        ing.feed(pending[0] if len(pending) == 1 else np.concatenate(pending), last_tick)
        if on_tick is not None:
            engine.flush()  # ingest the records after the last TICK (never evaluated live either)
            on_tick(engine)
    out.extend(ing.settle())  # an engine in a process of its own answers ticks late (c4d.engine_process)
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
    import pandas as pd

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
    import pandas as pd

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
    return analyzed(from_raw(load_raw(path, fmt, opts, on_warning)), overrides)


def load_raw(
    path: str | os.PathLike, fmt: str | None = None, opts: Any = None, on_warning: Any = None
) -> RawTrace:
    """``load`` without the DataFrames (pandas is not even imported): what a replay needs."""
    p = Path(path)
    if fmt == "c4d" or (fmt is None and p.is_file() and p.open("rb").read(len(MAGIC)) == MAGIC):
        return read_raw(path)
    from c4d.formats.detect import load_any as load_raw_any

    return load_raw_any(path, fmt, opts=opts, on_warning=on_warning)


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


class StreamSummary:
    """``summary`` of a trace read in pieces (``add`` each piece's records), in bounded memory.

    Ranks, ops and bytes per (communicator, op kind) are exact. Median and p99 are exact while
    at most ``keep`` op durations have been seen; past that every group switches to a log
    histogram (64 bins per decade: within 2% of the exact value) and ``approximate`` is set. Also
    keeps what the text report needs besides: each rank's node, the op count, the last TICK."""

    BINS_PER_DECADE = 64
    LO_US, DECADES = 1e-3, 12  # 1 ns .. 1000 s

    def __init__(self, keep: int = 1_000_000):
        self.keep = keep
        self.kept = 0
        self.approximate = False
        self.n_ops = 0
        self.nodes: dict[int, str] = {}
        self.end_ns: int | None = None
        self._g: dict[tuple[int, int], dict[str, Any]] = {}

    def add(self, raw: np.ndarray) -> None:
        kind = raw["kind"]
        ticks = raw["time_ns"][kind == schema.Kind.TICK]
        if len(ticks):
            self.end_ns = max(self.end_ns or 0, int(ticks.max()))
        regs = raw[kind == schema.Kind.REGISTER].view(schema.DTYPES[schema.Kind.REGISTER])
        if len(regs):
            from c4d import names

            for r, node in zip(regs["rank"].tolist(), regs["node"].tolist(), strict=True):
                self.nodes[int(r)] = names.clean(bytes(node))
        ops = raw[kind == schema.Kind.OP].view(schema.DTYPES[schema.Kind.OP])
        if not len(ops):
            return
        self.n_ops += len(ops)
        start, end = ops["start_ns"].astype(np.int64), ops["end_ns"].astype(np.int64)
        dur_us = np.where((end > 0) & (start > 0), (end - start) / 1e3, np.nan)
        order = np.lexsort((ops["op"], ops["comm_id"]))
        cid, op = ops["comm_id"][order], ops["op"][order]
        cut = np.flatnonzero((cid[1:] != cid[:-1]) | (op[1:] != op[:-1])) + 1
        for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), len(order)], strict=True):
            idx = order[lo:hi]
            g = self._g.setdefault(
                (int(cid[lo]), int(op[lo])), {"ranks": set(), "ops": 0, "bytes": 0, "d": []}
            )
            g["ranks"].update(np.unique(ops["rank"][idx]).tolist())
            g["ops"] += len(idx)
            g["bytes"] += int(ops["bytes"][idx].sum())
            d = dur_us[idx]
            if self.approximate:
                h = self._hist(d)
                g["d"] = h if isinstance(g["d"], list) else g["d"] + h
            else:
                g["d"].append(d)
                self.kept += len(d)
        if not self.approximate and self.kept > self.keep:
            self.approximate = True
            for g in self._g.values():
                g["d"] = self._hist(np.concatenate(g["d"]))

    def _hist(self, d_us: np.ndarray) -> np.ndarray:
        """Counts per log bin; the last cell counts the ops without a duration."""
        nb = self.DECADES * self.BINS_PER_DECADE
        ok = ~np.isnan(d_us)
        b = np.floor(np.log10(np.maximum(d_us[ok], self.LO_US) / self.LO_US) * self.BINS_PER_DECADE)
        h = np.bincount(np.clip(b, 0, nb - 1).astype(np.int64), minlength=nb)
        return np.append(h, np.count_nonzero(~ok))

    def _quantiles(self, d: Any) -> tuple[float, float]:
        if not self.approximate:
            v = np.concatenate(d)
            v = v[~np.isnan(v)]
            return (float(np.median(v)), float(np.quantile(v, 0.99))) if len(v) else (math.nan, math.nan)
        h = d[:-1]
        n = int(h.sum())
        if not n:
            return math.nan, math.nan
        mid = self.LO_US * 10 ** ((np.arange(len(h)) + 0.5) / self.BINS_PER_DECADE)
        cum = np.cumsum(h)

        def order_stat(k: int) -> float:  # the k-th smallest (0-based), as its bin's middle
            return float(mid[np.searchsorted(cum, k + 1)])

        def quantile(q: float) -> float:  # numpy's linear interpolation between order statistics
            pos = q * (n - 1)
            lo = math.floor(pos)
            a = order_stat(lo)
            return a + (pos - lo) * (order_stat(min(lo + 1, n - 1)) - a)

        return quantile(0.5), quantile(0.99)

    def frame(self) -> pd.DataFrame:
        """The same columns and order as ``summary``."""
        import pandas as pd

        cols = ["comm", "op", "ranks", "ops", "bytes", "median_us", "p99_us"]
        rows = []
        for (cid, op), g in self._g.items():
            med, p99 = self._quantiles(g["d"])
            rows.append(
                [f"{cid:016x}", str(schema.OP_NAMES[op]), len(g["ranks"]), g["ops"], g["bytes"], med, p99]
            )
        df = pd.DataFrame(rows, columns=cols)
        return df.sort_values(["comm", "op"], kind="stable").reset_index(drop=True)


def summary(tr: Trace) -> pd.DataFrame:
    """Per communicator and op kind: ranks, ops, bytes, median and p99 device time (µs)."""
    import pandas as pd

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
