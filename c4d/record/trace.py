"""The trace file: what the master received, append-only, loadable after any cut.

Layout::

    b"C4DTRACE"  u32 format_version  u32 meta_len  meta (UTF-8 JSON)  frame*

Format 2 (written now): each batch as received (in frames of at most 512 records), and each
master TICK record, is one frame with a sync marker, its length and a CRC32C
(c4d/record/framing.py): a reader verifies each frame, skips a damaged one, resynchronizes at
the next marker and reports what it skipped.
Format 1 (still read): records (128 bytes each) back to back, no framing.

Format rule: FORMAT_VERSION changes when the file layout around the records changes (this
header, the framing); the records inside have their own version (schema.SCHEMA_VERSION).
A reader reads every format up to its own and refuses newer ones.

The JSON header holds the schema version and the job metadata known when the trace was
opened. Records are written exactly as received (the edge validator runs again on replay),
so a file cut at any byte after the header loads every complete record before the cut; a
record whose kind or version this reader does not know is skipped and counted.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from c4d import __version__
from c4d.record import framing, names, oppart, schema

if TYPE_CHECKING:  # pandas is slow to import: only the DataFrame views import it
    import pandas as pd

MAGIC = b"C4DTRACE"
FORMAT_VERSION = 2
FRAME_RECORDS = 512  # records a frame holds at most: what one damaged frame can cost
FILE_MODE = 0o640
_PREFIX = struct.Struct("<8sII")


class TraceError(ValueError):
    """A file that is not a readable c4d trace."""


class TraceWriter:
    """Appends records to a trace file. Called from the master thread only."""

    def __init__(self, path: str | os.PathLike, meta: dict[str, Any] | None = None):
        self.path = Path(path)
        full = {
            "schema_version": schema.SCHEMA_VERSION,
            "record_size": schema.RECORD_SIZE,
            "c4d_version": __version__,
            "created_ns": time.time_ns(),
            "master_host": socket.gethostname(),
            **(meta or {}),
        }
        blob = json.dumps(full, sort_keys=True).encode()
        # mode 0640 (or stricter by umask), an existing file narrowed to it: the trace names the
        # job's nodes and timings, for the operator's group, not every user (docs/reliability.md)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with contextlib.suppress(OSError):  # not ours to chmod (made writable for us): keep its mode
            os.fchmod(fd, os.fstat(fd).st_mode & FILE_MODE)
        self._f: BinaryIO = os.fdopen(fd, "wb")
        self._f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob)) + blob)
        self._f.flush()
        self.records = 0

    def write(self, raw: np.ndarray) -> None:
        """A batch's records, in frames of at most FRAME_RECORDS: a damaged frame costs its own
        records only, however many messages the batch joined (c4d.master.collector)."""
        for a in range(0, len(raw), FRAME_RECORDS):  # each frame's bytes copied once, as before
            self._f.write(framing.encode(np.ascontiguousarray(raw[a : a + FRAME_RECORDS]).tobytes()))
        self.records += len(raw)

    def tick(self, now_ns: int) -> None:
        """Mark that the engine was evaluated at ``now_ns`` (so a replay evaluates at the same moments)."""
        rec = np.zeros(1, dtype=schema.HEADER)
        rec["kind"] = schema.Kind.TICK
        rec["version"] = schema.SCHEMA_VERSION
        rec["rank"] = -1
        rec["time_ns"] = now_ns
        self.write(rec)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()  # flushes first, and closes the file even when that flush fails


class _DamageReport:
    """What damage cost, from ``damaged`` ((file offset, bytes skipped) pairs)."""

    damaged: list[tuple[int, int]]

    @property
    def damaged_bytes(self) -> int:
        return sum(n for _, n in self.damaged)

    @property
    def lost_records(self) -> int:
        """Records lost to damage (at most: damaged bytes / record size)."""
        return self.damaged_bytes // schema.RECORD_SIZE


@dataclass
class RawTrace(_DamageReport):
    """The undecoded content of a trace: its header and its records as ``schema.HEADER`` rows."""

    meta: dict[str, Any]
    raw: np.ndarray
    truncated_bytes: int = 0  # bytes of an incomplete record at the end (a cut file)
    skipped: int = 0  # records of unknown kind or newer version
    path: str = ""
    kinds: Mapping[schema.Kind, np.ndarray] = field(default_factory=dict)  # (schema.KindsOf: split when read)
    format_version: int = FORMAT_VERSION
    damaged: list[tuple[int, int]] = field(default_factory=list)  # (file offset, bytes skipped)


CHUNK_BYTES = 16 << 20  # what a streaming reader holds of the file at a time


class TraceStream(_DamageReport):
    """A trace read piece by piece: ``chunks()`` yields its records (``schema.HEADER`` rows,
    unknown kinds and newer versions dropped, older ones upgraded) a few MiB at a time, so a
    trace of any size is read in bounded memory. What ``read_raw`` reports (cut, skipped,
    damaged) is complete once ``chunks()`` is exhausted.
    """

    def __init__(self, path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES):
        self.path = Path(path)
        self.chunk_bytes = max(int(chunk_bytes), schema.RECORD_SIZE)
        self.truncated_bytes = 0
        self.skipped = 0
        self.records = 0
        self.damaged: list[tuple[int, int]] = []
        p = self.path
        try:
            self.size = p.stat().st_size
            with open(p, "rb") as f:
                head = f.read(_PREFIX.size)
                if len(head) < _PREFIX.size:
                    raise TraceError(f"{p}: not a c4d trace (only {len(head)} bytes)")
                magic, fmt, meta_len = _PREFIX.unpack(head)
                if magic != MAGIC:
                    raise TraceError(f"{p}: not a c4d trace (magic {magic!r})")
                if fmt < 1 or fmt > FORMAT_VERSION:
                    raise TraceError(
                        f"{p}: trace format {fmt} is newer than this c4d reads ({FORMAT_VERSION})"
                    )
                blob = f.read(meta_len)
                if len(blob) < meta_len:
                    raise TraceError(f"{p}: trace header cut short ({len(blob)} of {meta_len} bytes)")
        except OSError as e:
            raise TraceError(f"{p}: {e.strerror or e}") from None
        try:
            self.meta: dict[str, Any] = json.loads(blob)
        except ValueError as e:
            raise TraceError(f"{p}: trace header is not valid JSON: {e}") from None
        self.format_version = fmt
        self.body_offset = _PREFIX.size + meta_len

    def chunks(self) -> Iterator[np.ndarray]:
        """The records, in file order, one array per piece read (writable, typed ``schema.HEADER``)."""
        p = self.path
        try:
            with open(p, "rb") as f:
                f.seek(self.body_offset)
                if self.format_version >= 2:
                    sc = framing.Scanner()
                    while True:
                        piece = f.read(self.chunk_bytes)
                        parts = sc.feed(piece, final=not piece)
                        if parts:
                            yield self._admit(np.concatenate(parts))
                        if not piece:
                            break
                    self.truncated_bytes = sc.truncated_bytes
                    self.damaged = [(self.body_offset + off, k) for off, k in sc.damaged]
                else:
                    step = self.chunk_bytes // schema.RECORD_SIZE * schema.RECORD_SIZE
                    tail = b""
                    while piece := f.read(step):
                        data = tail + piece
                        whole = len(data) // schema.RECORD_SIZE * schema.RECORD_SIZE
                        tail = data[whole:]
                        if whole:
                            yield self._admit(
                                np.frombuffer(data, dtype=schema.HEADER, count=whole // schema.RECORD_SIZE)
                            )
                    self.truncated_bytes = len(tail)
        except OSError as e:
            raise TraceError(f"{p}: {e.strerror or e}") from None

    def _admit(self, raw: np.ndarray) -> np.ndarray:
        ok = np.isin(raw["kind"], _KINDS) & (raw["version"] >= 1)
        ok &= raw["version"] <= schema.SCHEMA_VERSION
        bad = int(len(ok) - np.count_nonzero(ok))
        self.skipped += bad
        raw = raw[ok] if bad else raw.copy()  # a copy either way: the piece's buffer can go
        self.records += len(raw)
        return schema.upgrade(raw)


_KINDS = np.array([int(k) for k in schema.Kind])

_END = 1 << 64  # after every TICK time
MERGE_TICK_NS = 100_000_000  # a merged set's TICKs at most this often (an agent's flush period)


def is_trace(path: str | os.PathLike) -> bool:
    """A regular file that starts with the trace magic."""
    try:
        with open(path, "rb") as f:
            return os.path.isfile(path) and f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def trace_files(path: str | os.PathLike) -> list[Path]:
    """The c4d traces directly inside directory ``path`` (sorted by name; other files ignored)."""
    try:
        entries = sorted(Path(path).iterdir())
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    return [p for p in entries if is_trace(p)]


class TraceSet(_DamageReport):
    """Several traces of one job read as one (``c4d agent --trace``: one file per node), merged by
    time in a stream: each file's records are cut at its TICKs, and the pieces go out in the order
    of the TICK that closes them, with a TICK at most every ``MERGE_TICK_NS`` (the agents'
    flush period; a master's trace split by node keeps its own TICKs). An agent ticks on its
    node's clock: the merge is as good as the nodes' clock sync, and the replay feeds each
    record at most one period later than its node's agent forwarded it.

    The same interface as ``TraceStream``: ``chunks()``, then ``damaged`` (file offsets per
    file in ``damaged_files``), ``truncated_bytes``, ``skipped``, ``records``. Each file is read
    ``chunk_bytes / files`` at a time (64 KiB at least), so memory does not grow with the files'
    sizes, only a little with their number.
    """

    def __init__(self, paths: list[Path], chunk_bytes: int = CHUNK_BYTES, path: str | os.PathLike = ""):
        if not paths:
            raise TraceError(f"{path}: no c4d trace in this directory")
        self.paths = list(paths)
        self.path = Path(path or self.paths[0].parent)
        self.chunk_bytes = max(int(chunk_bytes), schema.RECORD_SIZE)
        each = max(self.chunk_bytes // len(self.paths), 64 << 10)
        self.streams = [TraceStream(p, each) for p in self.paths]
        self.size = sum(s.size for s in self.streams)
        self.format_version = min(s.format_version for s in self.streams)
        created = [int(s.meta["created_ns"]) for s in self.streams if s.meta.get("created_ns")]
        self.meta: dict[str, Any] = {
            **self.streams[0].meta,
            "merged_from": [p.name for p in self.paths],
            **({"created_ns": min(created)} if created else {}),
        }
        self.truncated_bytes = self.skipped = self.records = 0
        self.damaged: list[tuple[int, int]] = []
        self.damaged_files: dict[str, list[tuple[int, int]]] = {}
        self.ticks_merged = 0  # TICKs of the files folded into a later one

    @staticmethod
    def _segments(st: TraceStream) -> Iterator[tuple[int, np.ndarray]]:
        """(TICK time, the records since the previous TICK) of one file; the records after its
        last TICK come last, at ``_END``."""
        buf: list[np.ndarray] = []
        for raw in st.chunks():
            ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK)
            prev = 0
            for i in ticks.tolist():
                buf.append(raw[prev:i])
                yield int(raw["time_ns"][i]), np.concatenate(buf) if len(buf) > 1 else buf[0]
                buf, prev = [], i + 1
            if prev < len(raw):
                buf.append(raw[prev:])
        if buf:
            yield _END, np.concatenate(buf)

    def chunks(self) -> Iterator[np.ndarray]:
        gens = [self._segments(s) for s in self.streams]
        heap: list[tuple[int, int, np.ndarray]] = []
        for i, g in enumerate(gens):
            for t, seg in g:
                heapq.heappush(heap, (t, i, seg))
                break
        out: list[np.ndarray] = []
        n_out = 0
        want = max(self.chunk_bytes // schema.RECORD_SIZE, 1)
        first = last = -1  # the TICK times of the segments since the last TICK written (-1: none)

        def tick(t: int) -> np.ndarray:
            rec = np.zeros(1, dtype=schema.HEADER)
            rec["kind"], rec["version"], rec["rank"], rec["time_ns"] = (
                schema.Kind.TICK,
                schema.SCHEMA_VERSION,
                -1,
                int(t),
            )
            return rec

        while heap:
            t, i, seg = heapq.heappop(heap)
            # one TICK for the segments that closed within a period: written at the latest of them,
            # after all their records
            if first >= 0 and t >= first + MERGE_TICK_NS:
                out.append(tick(last))
                n_out += 1
                first = -1
            if len(seg):
                out.append(seg)
                n_out += len(seg)
            if t != _END:
                if first < 0:
                    first = t
                else:
                    self.ticks_merged += 1
                last = t
            for t2, seg2 in gens[i]:
                heapq.heappush(heap, (t2, i, seg2))
                break
            if n_out >= want:
                yield np.concatenate(out)
                out, n_out = [], 0
        if first >= 0:
            out.append(tick(last))
        if out:
            yield np.concatenate(out)
        for s in self.streams:
            self.truncated_bytes += s.truncated_bytes
            self.skipped += s.skipped
            self.records += s.records
            self.damaged += s.damaged
            if s.damaged:
                self.damaged_files[str(s.path)] = s.damaged


def open_stream(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES) -> TraceStream | TraceSet:
    """A trace file, or a directory of traces of one job (merged), read piece by piece."""
    if os.path.isdir(path):
        return TraceSet(trace_files(path), chunk_bytes, path)
    return TraceStream(path, chunk_bytes)


def read_raw(path: str | os.PathLike) -> RawTrace:
    """Load every complete record of a trace file, or of a directory of traces merged (read in
    pieces, then joined once)."""
    st = open_stream(path)
    parts = list(st.chunks())
    return raw_trace(st, np.concatenate(parts) if parts else np.empty(0, schema.HEADER))


def raw_trace(st: TraceStream | TraceSet, raw: np.ndarray, meta: dict[str, Any] | None = None) -> RawTrace:
    """``raw`` (records a read stream gave) with what the stream reported of its file(s)."""
    return RawTrace(
        meta=st.meta if meta is None else meta,
        raw=raw,
        truncated_bytes=st.truncated_bytes,
        skipped=st.skipped,
        path=str(st.path),
        kinds=schema.by_kind(oppart.unpack(raw)),  # node agents' parts as their OP records
        format_version=st.format_version,
        damaged=st.damaged,
    )


def _names(col: np.ndarray) -> np.ndarray:
    """Wire names as c4d.record.names.clean gives them (the raw bytes stay in ``Trace.raw``)."""
    uniq, inv = np.unique(col, return_inverse=True)
    return np.array([names.clean(bytes(u)) for u in uniq], dtype=object)[inv.ravel()]


@dataclass
class Trace:
    """A trace as pandas DataFrames, one per record kind: what the ranks sent, decoded.

    This is the loader's output and knows no analysis. The engine's view of the same trace
    (``ops_split`` with the wait/transfer split, ``diagnoses``) comes from ``c4d.analyze.load``,
    which returns a Trace that has them (docs/trace-api.md)."""

    meta: dict[str, Any]
    registrations: pd.DataFrame
    ops: pd.DataFrame
    heartbeats: pd.DataFrame
    comms: pd.DataFrame
    peers: pd.DataFrame
    raw: RawTrace

    def __getattr__(self, name: str) -> Any:
        if name in ("ops_split", "diagnoses", "diagnoses_list"):
            raise AttributeError(
                f"{name} needs the engine: load the trace with c4d.analyze.load(path) (c4d.record.trace.load "
                "only decodes the records)"
            )
        raise AttributeError(name)

    def table(self, name: str) -> pd.DataFrame:
        return getattr(self, name)

    @property
    def nodes(self) -> dict[int, str]:
        """Global rank → node name, from the latest registration of each rank."""
        r = self.registrations.drop_duplicates("rank", keep="last")
        return dict(zip(r["rank"].astype(int), r["node"], strict=True))


def _frame(arr: np.ndarray, drop: tuple[str, ...] = ()) -> pd.DataFrame:
    import pandas as pd

    cols = {n: arr[n] for n in arr.dtype.names or () if n not in drop and not n.startswith("reserved")}
    return pd.DataFrame(cols)


def load(path: str | os.PathLike) -> Trace:
    """Load a c4d trace into DataFrames: registrations, ops (with names), heartbeats, comms, peers."""
    return from_raw(read_raw(path))


TABLE_KINDS = {
    "registrations": schema.Kind.REGISTER,
    "ops": schema.Kind.OP,
    "heartbeats": schema.Kind.HEARTBEAT,
    "comms": schema.Kind.COMM,
    "peers": schema.Kind.PEER,
}


def decode(table: str, recs: np.ndarray) -> pd.DataFrame:
    """One table's DataFrame from its records (typed as ``schema.DTYPES`` of its kind)."""
    import pandas as pd

    df = _frame(recs, drop=("version", "kind"))
    if table == "registrations" and len(df):
        df["node"] = _names(recs["node"])
        df["job"] = _names(recs["job"])
    elif table == "ops":
        df["op_name"] = pd.Series(schema.OP_NAMES[df["op"].to_numpy()], index=df.index, dtype=object)
        dur = df["end_ns"].astype("int64") - df["start_ns"].astype("int64")
        df["duration_ns"] = dur.where((df["end_ns"] > 0) & (df["start_ns"] > 0)).astype("float64")
    return df


def from_raw(rt: RawTrace) -> Trace:
    """DataFrames over the records of a RawTrace (a c4d trace or an import)."""
    if not rt.kinds:
        rt.kinds = schema.by_kind(oppart.unpack(rt.raw))
    return Trace(meta=rt.meta, raw=rt, **{t: decode(t, rt.kinds[k]) for t, k in TABLE_KINDS.items()})
