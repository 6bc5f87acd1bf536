"""`c4d analyze`: offline replay of a captured trace through the live engine, and the pandas API
that needs the engine (``ops_split``, ``diagnoses``).

Replay feeds the records in file order and evaluates the engine at each TICK record's
master time, exactly as the live master did, so it gives the live run's diagnoses. It goes
through the same edge validation and ingest guard as the master (c4d/intake/ingest.py): the trace
holds what arrived, and the replay drops what the live run dropped. The same replay hands
out the engine's per-rank wait / transfer split of every completed op: the one computation
the live metrics, the report and ``ops_split`` all use.

Layering: this module sits above the engine and the loaders (``c4d.record.trace``, ``c4d.formats``)
and below the master, the CLI and the report; it imports no networking.

    tr = c4d.analyze.load("job.c4d")     # or load(path) of FR dumps, Inspector logs, nccl-tests
    tr.ops_split                          # ops with the engine's wait/transfer split
    tr.diagnoses                          # the replay's diagnoses, one row each
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from c4d.engine import Diagnosis, make_engine
from c4d.engine.rows import OP_SPLIT
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.record import oppart, schema
from c4d.record.trace import RawTrace, Trace, from_raw, raw_trace, read_raw
from c4d.util import heap

if TYPE_CHECKING:  # pandas is slow to import: the replay itself never needs it
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


def replay(
    rt: RawTrace, engine: Any, ingest: Ingest | None = None, on_tick: Callable[[Any], None] | None = None
) -> list[Diagnosis]:
    """Drive ``engine`` through the trace's records and ticks; return every diagnosis.

    ``ingest`` (made here when not given) holds what the edge dropped and what failed;
    ``on_tick(engine)`` runs after each evaluation (to drain what the engine hands out).
    """
    out = replay_chunks([rt.raw], engine, int(rt.meta.get("created_ns", 0)), ingest, on_tick)
    if rt.meta.get("source_format") == "fr":  # the dumps matched across ranks (c4d/formats/fr_match.py)
        from c4d.formats.fr_match import amend

        out = amend(rt, out)
    return out


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
    r = Replay(engine, created_ns, ingest, on_tick)
    for raw in chunks:
        r.feed(raw)
    return r.finish()


class Replay:
    """``replay_chunks`` one piece at a time (``feed``), for a caller that works between pieces."""

    def __init__(
        self,
        engine: Any,
        created_ns: int = 0,
        ingest: Ingest | None = None,
        on_tick: Callable[[Any], None] | None = None,
    ):
        heap.keep_freed_blocks()  # (c4d/util/heap.py)
        heap.collect_rarely()
        self.engine = engine
        self.ingest = ingest or Ingest(engine, Edge(Limits.from_env()))
        self.on_tick = on_tick
        self.diagnoses: list[Diagnosis] = []
        self.last_tick = created_ns
        self._pending: list[np.ndarray] = []  # records since the last tick, fed as one batch at the next

    def feed(self, raw: np.ndarray) -> None:
        ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK)
        prev = 0
        for i in ticks.tolist():
            if i > prev:
                self._pending.append(raw[prev:i])
            self._feed_pending()
            self.last_tick = int(raw["time_ns"][i])
            self.diagnoses.extend(self.ingest.tick(self.last_tick))
            if self.on_tick is not None:
                self.on_tick(self.engine)
            prev = i + 1
        if prev < len(raw):
            self._pending.append(raw[prev:])

    def _feed_pending(self) -> bool:
        p, self._pending = self._pending, []
        if p:
            self.ingest.feed(p[0] if len(p) == 1 else np.concatenate(p), self.last_tick)
        return bool(p)

    def finish(self) -> list[Diagnosis]:
        if self._feed_pending() and self.on_tick is not None:
            self.engine.flush()  # ingest the records after the last TICK (never evaluated live either)
            self.on_tick(self.engine)
        self.diagnoses.extend(self.ingest.settle())  # an engine in a process of its own answers late
        return self.diagnoses


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
    """One row per diagnosis (columns of docs/cli.md's JSON; detail kept as a dict)."""
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
    joined: pd.DataFrame | None = None  # ops_split already joined (a bounded load: load_selected)

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
        if self.joined is not None:
            return self.joined
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
    *,
    ranks: Iterable[int] | None = None,
    comms: Iterable[int | str] | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    columns: Iterable[str] | None = None,
    **budget: Any,
) -> AnalyzedTrace:
    """Load a c4d trace, a directory of node traces, or an import (Flight Recorder dumps, NCCL
    Inspector, nccl-tests).

    ``opts`` (c4d.formats.to_records.ImportOptions) gives the thresholds an import assumes;
    ``on_warning`` receives one line per non-fatal import problem; ``overrides`` are engine
    thresholds (as ``c4d analyze --hang-timeout``); ``max_bytes`` / ``max_seconds`` an import's
    budget (c4d.formats.detect.load_any). ``ranks``, ``comms``, ``start_s`` / ``end_s`` (seconds
    since the trace started) and ``columns`` (of the ops tables) keep only that much of a c4d
    trace in memory (``load_selected``); ``iter_table`` and ``to_parquet`` read any size."""
    sel = Selection.of(ranks, comms, start_s, end_s)
    if sel or columns is not None:
        if not is_c4d(path, fmt):
            raise ValueError(f"{path}: a selection needs a c4d trace (or a directory of them)")
        return load_selected(path, sel, columns, overrides)
    return analyzed(from_raw(load_raw(path, fmt, opts, on_warning, **budget)), overrides)


def is_c4d(path: str | os.PathLike, fmt: str | None = None) -> bool:
    """A c4d trace file, or a directory that holds c4d traces (read as one job)."""
    from c4d.record.trace import is_trace, trace_files

    if fmt not in (None, "c4d"):
        return False
    p = Path(path)
    if p.is_dir():
        try:
            return bool(trace_files(p))
        except ValueError:
            return False
    return p.is_file() and (fmt == "c4d" or is_trace(p))


def load_raw(
    path: str | os.PathLike, fmt: str | None = None, opts: Any = None, on_warning: Any = None, **budget: Any
) -> RawTrace:
    """``load`` without the DataFrames (pandas is not even imported): what a replay needs."""
    if is_c4d(path, fmt):
        return read_raw(path)
    from c4d.formats.detect import load_any as load_raw_any

    return load_raw_any(path, fmt, opts=opts, on_warning=on_warning, **budget)


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
    """One verdict per incident (c4d/engine/incidents.py) of a replay's diagnoses."""
    from c4d.engine.incidents import Incidents, heard_stamps

    heard, _ = heard_stamps(rt.raw, int(rt.meta.get("created_ns", 0)))
    return Incidents.fold(diagnoses, end_ns(rt), heard)


class RawWatch:
    """What a trace read in pieces says besides its diagnoses (``add`` each piece's records):
    each rank's node, the op count, the last TICK, and when the job was heard (incidents that
    end with the trace: c4d/engine/incidents.py heard_stamps)."""

    def __init__(self, tick_ns: int = 0) -> None:
        self.nodes: dict[int, str] = {}
        self.n_ops = 0
        self.end_ns: int | None = None
        self.tick_ns = tick_ns  # the last TICK before the next piece (the trace's start at first)
        self._heard: list[np.ndarray] = []

    @property
    def heard_ns(self) -> np.ndarray:
        return np.unique(np.concatenate(self._heard)) if self._heard else np.empty(0, np.int64)

    def add(self, raw: np.ndarray) -> None:
        from c4d.engine.incidents import heard_stamps

        raw = oppart.unpack(raw)
        stamps, self.tick_ns = heard_stamps(raw, self.tick_ns)
        self._heard.append(stamps)
        kind = raw["kind"]
        ticks = raw["time_ns"][kind == schema.Kind.TICK]
        if len(ticks):
            self.end_ns = max(self.end_ns or 0, int(ticks.max()))
        self.n_ops += int(np.count_nonzero(kind == schema.Kind.OP))
        regs = raw[kind == schema.Kind.REGISTER].view(schema.DTYPES[schema.Kind.REGISTER])
        if len(regs):
            from c4d.record import names

            for r, node in zip(regs["rank"].tolist(), regs["node"].tolist(), strict=True):
                self.nodes[int(r)] = names.clean(bytes(node))


class StreamSummary(RawWatch):
    """``summary`` of a trace read in pieces (``add`` each piece's records), in bounded memory.

    Ranks, ops and bytes per (communicator, op kind) are exact. Median and p99 are exact while
    at most ``keep`` op durations have been seen; past that every group switches to a log
    histogram (64 bins per decade: within 2% of the exact value) and ``approximate`` is set. Also
    keeps what the text report needs besides: each rank's node, the op count, the last TICK."""

    BINS_PER_DECADE = 64
    LO_US, DECADES = 1e-3, 12  # 1 ns .. 1000 s

    def __init__(self, keep: int = 1_000_000):
        super().__init__()
        self.keep = keep
        self.kept = 0
        self.approximate = False
        self._g: dict[tuple[int, int], dict[str, Any]] = {}

    def add(self, raw: np.ndarray) -> None:
        raw = oppart.unpack(raw)
        super().add(raw)
        ops = raw[raw["kind"] == schema.Kind.OP].view(schema.DTYPES[schema.Kind.OP])
        if not len(ops):
            return
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


# -- bounded memory: traces of any size, and directories of node traces --------------------

PASS_CHUNK_BYTES = 4 << 20  # a pass's pieces: each is copied a few times on its way through the replay
JOIN_WINDOW_NS = 300 * 10**9  # an op row waits this long (master time) for the engine's split
JOIN_MAX_PENDING = 1 << 18  # ... and at most this many rows wait at once (the oldest go first)
TABLES = ("ops", "registrations", "heartbeats", "comms", "peers", "diagnoses")
_TIMED = (schema.Kind.OP, schema.Kind.HEARTBEAT, schema.Kind.PEER, schema.Kind.OPSUM, schema.Kind.OPPART)
_KEY = ["comm_id", "seq", "comm_rank", "peer"]


@dataclass(frozen=True)
class Selection:
    """Which records a bounded load keeps: global ranks, communicators (ids) and a time range in
    seconds since the trace started (records' own ``time_ns``; registrations and communicator
    events are kept at any time). None keeps all."""

    ranks: frozenset[int] | None = None
    comms: frozenset[int] | None = None
    start_s: float | None = None
    end_s: float | None = None

    @classmethod
    def of(
        cls,
        ranks: Iterable[int] | None = None,
        comms: Iterable[int | str] | None = None,
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> Selection:
        """``comms`` as ids or 16-digit hex strings (as the logs and the exports write them)."""
        ids = None
        if comms is not None:
            ids = frozenset(int(c, 16) if isinstance(c, str) else int(c) for c in comms)
        return cls(None if ranks is None else frozenset(int(r) for r in ranks), ids, start_s, end_s)

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.ranks, self.comms, self.start_s, self.end_s))

    def mask(self, raw: np.ndarray, created_ns: int) -> np.ndarray:
        """Which ``schema.HEADER`` rows to keep (TICKs by the time range only)."""
        kind = raw["kind"]
        keep = np.ones(len(raw), bool)
        tick = kind == schema.Kind.TICK
        if self.ranks is not None:
            keep &= np.isin(raw["rank"], np.fromiter(self.ranks, np.int64)) | tick
        if self.comms is not None:
            ids = np.fromiter(self.comms, np.uint64)
            for k, dt in schema.DTYPES.items():
                sel = np.flatnonzero(kind == k)
                if len(sel) and "comm_id" in (dt.names or ()):
                    keep[sel] &= np.isin(raw[sel].view(dt)["comm_id"], ids)
        if self.start_s is not None or self.end_s is not None:
            t = raw["time_ns"].astype(np.int64) - created_ns
            lo = -(2**62) if self.start_s is None else int(self.start_s * 1e9)
            hi = 2**62 if self.end_s is None else int(self.end_s * 1e9)
            timed = np.isin(kind, [int(k) for k in (*_TIMED, schema.Kind.TICK)])
            keep &= ~timed | ((t >= lo) & (t < hi))
        return keep

    def split_mask(self, split: np.ndarray) -> np.ndarray | None:
        """Which OP_SPLIT rows can belong to a kept op (None: all); the time range is the join's."""
        m = None
        if self.ranks is not None:
            m = np.isin(split["rank"], np.fromiter(self.ranks, np.int64))
        if self.comms is not None:
            c = np.isin(split["comm_id"], np.fromiter(self.comms, np.uint64))
            m = c if m is None else m & c
        return m


class OpsJoin:
    """``split_frame`` in a stream: op rows wait here until the engine hands out their split.

    The engine splits an op once every member reported it, so an op row waits about as long as
    its op's slowest member; a row that waits longer than ``window_ns`` of master time, or past
    ``max_pending`` waiting rows (the oldest first), goes out with NaN split columns, as one
    whose op never completed does in ``split_frame``, and is counted in ``expired``. Rows go out
    in the order their split arrived, each batch in file order (``_row`` numbers them)."""

    def __init__(
        self, window_ns: int = JOIN_WINDOW_NS, max_pending: int = JOIN_MAX_PENDING, keep_row: bool = False
    ):
        self.keep_row = keep_row  # the output keeps ``_row`` (file order) and ``_compute_rec`` (the record's)
        self.window_ns = window_ns
        self.max_pending = max_pending
        self.expired = 0
        self.max_held = 0  # most rows held at once (ops waiting, after a resolve)
        self._pending: list[pd.DataFrame] = []
        self._splits: list[np.ndarray] = []
        self._rows = 0
        self.columns: list[str] | None = None

    def add_ops(self, ops: pd.DataFrame, fed_ns: int) -> None:
        if self.columns is None:
            self.columns = [*ops.columns, *(c for c in SPLIT_COLUMNS if c not in ops.columns)]
        if not len(ops):
            return
        p2p = (ops["flags"].to_numpy().astype(int) & int(schema.OpFlag.P2P)) != 0
        df = ops.drop(columns=[c for c in SPLIT_COLUMNS if c in ops.columns])
        if self.keep_row and "compute_ns" in ops:
            df["_compute_rec"] = ops["compute_ns"].to_numpy()
        df["_row"] = np.arange(self._rows, self._rows + len(df))
        df["_fed"] = fed_ns
        df["_cid"] = df["comm_id"].to_numpy().astype(np.uint64)
        df["_seq"] = df["seq"].to_numpy().astype(np.int64)
        df["_cr"] = df["comm_rank"].to_numpy().astype(np.int32)
        df["_peer"] = np.where(p2p, df["peer"].to_numpy(), -1).astype(np.int32)
        self._rows += len(df)
        self._pending.append(df)

    def add_split(self, rows: np.ndarray) -> None:
        if len(rows):
            self._splits.append(rows)

    def resolve(self, now_ns: int, final: bool = False) -> pd.DataFrame:
        """The rows whose split came (and those that waited too long; every row when ``final``)."""
        import pandas as pd

        if not self._pending:
            self._splits = []
            return self._empty()
        pend = pd.concat(self._pending, ignore_index=True) if len(self._pending) > 1 else self._pending[0]
        self._pending = []
        keys = ["_cid", "_seq", "_cr", "_peer"]
        if self._splits:
            split = np.concatenate(self._splits)
            self._splits = []
            sp = pd.DataFrame({k: split[c] for k, c in zip(keys, _KEY, strict=True)})
            for c in SPLIT_COLUMNS:
                sp[c] = split[c]
            sp = sp.drop_duplicates(keys, keep="last")
            m = pend.merge(sp, how="left", on=keys, validate="many_to_one", indicator=True)
            hit = (m["_merge"] == "both").to_numpy()
            done, rest = m[hit].drop(columns="_merge"), pend[~hit]
        else:
            done, rest = pend.iloc[:0], pend
        late = np.ones(len(rest), bool) if final else (rest["_fed"].to_numpy() < now_ns - self.window_ns)
        over = len(rest) - int(late.sum()) - self.max_pending
        if over > 0:  # the oldest rows past the bound go without their split
            late[np.flatnonzero(~late)[:over]] = True
        if late.any():
            gone = rest[late].copy()
            for c in SPLIT_COLUMNS:
                gone[c] = np.nan
            if not final:
                self.expired += len(gone)
            done = pd.concat([done, gone], ignore_index=True) if len(done) else gone
            rest = rest[~late]
        if len(rest):
            self._pending = [rest]
        self.max_held = max(self.max_held, len(rest))
        if not len(done):
            return self._empty()
        done = done.sort_values("_row", kind="stable")
        return self._shape(done)

    @property
    def held(self) -> int:
        return sum(len(p) for p in self._pending)

    def _shape(self, df: pd.DataFrame) -> pd.DataFrame:
        for c in SPLIT_COLUMNS:
            if c not in df:
                df[c] = np.nan
        cols = self.columns or list(df.columns)
        if self.keep_row:
            cols = [*cols, "_row", *(["_compute_rec"] if "_compute_rec" in df else [])]
        out = df[cols].reset_index(drop=True)
        return out.astype({c: "float64" for c in SPLIT_COLUMNS})

    def _empty(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(columns=self.columns or [])


class StreamPass:
    """One pass over a trace, or a directory of node traces merged (``c4d.record.trace.open_stream``),
    piece by piece: the engine replays it as ``c4d analyze`` does, and ``frames()`` yields each
    piece's rows of the wanted tables as DataFrames (``ops`` with the engine's split, through an
    ``OpsJoin``; ``diagnoses`` once, at the end). Memory does not grow with the trace.

    ``on_split`` receives every OP_SPLIT batch the engine hands out (``c4d report`` draws from
    them); ``on_raw`` every piece of records, before the selection."""

    def __init__(
        self,
        path: str | os.PathLike,
        tables: Iterable[str] = ("ops",),
        select: Selection | None = None,
        overrides: dict[str, Any] | None = None,
        chunk_bytes: int | None = None,
        on_split: Callable[[np.ndarray], None] | None = None,
        on_raw: Callable[[np.ndarray], None] | None = None,
        join: OpsJoin | None = None,
        columns: Iterable[str] | None = None,
    ):
        from c4d.record.trace import open_stream

        self.tables = tuple(tables)
        for t in self.tables:
            if t not in TABLES:
                raise ValueError(f"no table {t!r} (one of {', '.join(TABLES)})")
        self.stream = open_stream(path, chunk_bytes or PASS_CHUNK_BYTES)
        self.select = select or Selection()
        self.created_ns = int(self.stream.meta.get("created_ns", 0))
        self.overrides = overrides
        self.on_split = on_split
        self.on_raw = on_raw
        self.join = join or OpsJoin()
        self.columns = None if columns is None else list(columns)
        self.diagnoses: list[Diagnosis] = []
        self.ingest: Ingest | None = None
        self.largest_piece = 0  # records in the largest piece read (the bound the tests check)
        self.rows_written = 0

    @property
    def meta(self) -> dict[str, Any]:
        return self.stream.meta

    def _take(self, engine: Any) -> None:
        split = engine.take_split()
        if self.on_split is not None and len(split):
            self.on_split(split)
        if "ops" in self.tables:
            m = self.select.split_mask(split)
            self.join.add_split(split if m is None else split[m])

    def frames(self) -> Iterator[tuple[str, pd.DataFrame]]:
        from c4d.record.trace import TABLE_KINDS, decode

        need_split = "ops" in self.tables or self.on_split is not None
        engine = make_engine(self.overrides, split=need_split)
        self.ingest = Ingest(engine, Edge(Limits.from_env()))
        rep = Replay(engine, self.created_ns, self.ingest, self._take if need_split else None)
        for raw in self.stream.chunks():
            self.largest_piece = max(self.largest_piece, len(raw))
            if self.on_raw is not None:
                self.on_raw(raw)
            rep.feed(raw)
            rows = oppart.unpack(raw)  # node agents' parts as the OP records they hold
            kept = rows[self.select.mask(rows, self.created_ns)] if self.select else rows
            kinds = kept["kind"]
            for t in self.tables:
                k = TABLE_KINDS.get(t)
                if k is None:
                    continue
                recs = kept[kinds == k].view(schema.DTYPES[k])
                if t == "ops":
                    self.join.add_ops(decode(t, recs), rep.last_tick)
                    df = self.join.resolve(rep.last_tick)
                else:
                    df = decode(t, recs)
                if len(df):
                    yield t, self._cols(df)
            del raw, kept
        self.diagnoses = rep.finish()
        if "ops" in self.tables:
            df = self.join.resolve(rep.last_tick, final=True)
            if len(df):
                yield "ops", self._cols(df)
        if "diagnoses" in self.tables:
            yield "diagnoses", diagnoses_frame(self.diagnoses)

    def _cols(self, df: pd.DataFrame) -> pd.DataFrame:
        if self.columns is None:
            return df
        return df[[c for c in df.columns if c in self.columns or c in ("_row", "_compute_rec")]]


def iter_table(
    path: str | os.PathLike,
    table: str = "ops",
    *,
    ranks: Iterable[int] | None = None,
    comms: Iterable[int | str] | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    columns: Iterable[str] | None = None,
    overrides: dict[str, Any] | None = None,
    chunk_bytes: int | None = None,
) -> Iterator[pd.DataFrame]:
    """One table of a c4d trace (or a directory of node traces) as DataFrame chunks, in bounded
    memory: ``ops`` is ``ops_split`` (the engine's split joined as its ops complete: rows come in
    the order their op completed). The selection keeps ranks, communicators and a time range
    (seconds since the trace started), ``columns`` the columns named."""
    sp = StreamPass(
        path, (table,), Selection.of(ranks, comms, start_s, end_s), overrides, chunk_bytes, columns=columns
    )
    for _, df in sp.frames():
        yield df


def hex_ids(df: pd.DataFrame) -> pd.DataFrame:
    """Communicator ids as 16-digit hex strings, as everywhere else (logs, JSON, live view)."""
    for col in ("comm_id", "parent_id", "comm"):
        if col in df.columns and df[col].dtype.kind in "iu":
            df = df.assign(**{col: df[col].map(lambda v: f"{int(v) & (2**64 - 1):016x}")})
    return df


def parquet_frame(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """A table as ``c4d export`` writes it: hex communicator ids, a diagnosis's detail as JSON."""
    import json

    df = hex_ids(df)
    if table == "diagnoses":
        df = df.assign(detail=df["detail"].map(json.dumps))
    return df


class ParquetChunks:
    """Writes DataFrame chunks of one table to one Parquet file, one row group each (pyarrow):
    the first chunk's schema for all (a later chunk is cast to it)."""

    def __init__(self, out: str | os.PathLike):
        self.out = out
        self.rows = 0
        self._w: Any = None
        self._schema: Any = None

    def write(self, df: pd.DataFrame) -> None:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        t = pa.Table.from_pandas(df, preserve_index=False)
        if self._w is None:
            self._schema = pa.schema(
                [f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in t.schema]
            )
            self._w = pq.ParquetWriter(self.out, self._schema)
        self._w.write_table(t.cast(self._schema))
        self.rows += len(df)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()


def to_parquet(
    path: str | os.PathLike,
    out: str | os.PathLike,
    table: str = "ops",
    *,
    ranks: Iterable[int] | None = None,
    comms: Iterable[int | str] | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    columns: Iterable[str] | None = None,
    overrides: dict[str, Any] | None = None,
    chunk_bytes: int | None = None,
) -> StreamPass:
    """``c4d export``: one table of a c4d trace (or a directory of node traces) written to Parquet
    chunk by chunk, in bounded memory. Returns the pass (its ``join.expired``, ``diagnoses``)."""
    from c4d.record.trace import TABLE_KINDS, decode

    sp = StreamPass(
        path, (table,), Selection.of(ranks, comms, start_s, end_s), overrides, chunk_bytes, columns=columns
    )
    w = ParquetChunks(out)
    try:
        for _, df in sp.frames():
            w.write(parquet_frame(df, table))
        if w.rows == 0:  # no rows: the table's columns all the same
            if table == "diagnoses":
                empty = diagnoses_frame([])
            else:
                k = TABLE_KINDS[table]
                empty = decode(table, np.empty(0, schema.DTYPES[k]))
                if table == "ops":
                    empty = split_frame(empty, np.empty(0, OP_SPLIT))
            w.write(parquet_frame(sp._cols(empty), table))
    finally:
        w.close()
    sp.rows_written = w.rows
    return sp


def load_selected(
    path: str | os.PathLike,
    select: Selection | None = None,
    columns: Iterable[str] | None = None,
    overrides: dict[str, Any] | None = None,
    chunk_bytes: int | None = None,
) -> AnalyzedTrace:
    """``load`` of a c4d trace (or a directory of node traces) holding only the selected records
    in memory: the engine still replays the whole trace (in pieces), so ``diagnoses`` are the
    whole job's and ``ops_split`` has the same values as an unselected load's rows."""
    import pandas as pd

    from c4d.record.trace import TABLE_KINDS, decode

    sel = select or Selection()
    kept: list[np.ndarray] = []
    tables = [t for t in TABLE_KINDS if t != "ops"]

    def keep(raw: np.ndarray) -> None:
        rows = oppart.unpack(raw)
        kept.append(rows[sel.mask(rows, sp.created_ns)])

    sp = StreamPass(
        path, ("ops", *tables), sel, overrides, chunk_bytes, on_raw=keep, join=OpsJoin(keep_row=True),
        columns=columns,
    )  # fmt: skip
    parts: dict[str, list[pd.DataFrame]] = {t: [] for t in ("ops", *tables)}
    for t, df in sp.frames():
        parts[t].append(df)
    raw = np.concatenate(kept) if kept else np.empty(0, schema.HEADER)
    st = sp.stream
    selection = {k: _jsonable(v) for k, v in vars(sel).items() if v is not None}
    rt = raw_trace(st, raw, meta={**st.meta, "selection": selection})

    def frame(t: str) -> pd.DataFrame:
        if parts[t]:
            return pd.concat(parts[t], ignore_index=True)
        k = TABLE_KINDS[t]
        return decode(t, np.empty(0, schema.DTYPES[k]))

    joined = frame("ops")
    if "_row" in joined:
        joined = joined.sort_values("_row", kind="stable").reset_index(drop=True)
        ops = joined.drop(columns=[c for c in SPLIT_COLUMNS if c != "compute_ns" and c in joined])
        if "_compute_rec" in ops:
            ops = ops.assign(compute_ns=ops["_compute_rec"])
        ops = ops.drop(columns=["_row", "_compute_rec"], errors="ignore")
        joined = joined.drop(columns=["_row", "_compute_rec"])
    else:  # no op selected: the empty frames
        ops = joined
        joined = split_frame(ops, np.empty(0, OP_SPLIT))
    tr = AnalyzedTrace(
        meta=rt.meta,
        registrations=frame("registrations"),
        ops=ops,
        heartbeats=frame("heartbeats"),
        comms=frame("comms"),
        peers=frame("peers"),
        raw=rt,
        overrides=overrides or {},
        _result=(sp.diagnoses, np.empty(0, OP_SPLIT)),
        joined=joined,
    )
    return tr


def _jsonable(v: Any) -> Any:
    return sorted(v) if isinstance(v, frozenset) else v
