"""Build c4d records (native/include/c4d/record.h) from other tools' data, and lay them out as a trace.

Every importer (Flight Recorder, NCCL Inspector, nccl-tests) ends here: it fills column arrays
(one value per op, per rank, per rank × communicator) and ``assemble`` turns them into the same
``RawTrace`` a c4d trace file gives, so ``c4d.analyze.replay`` runs the live engine on it.

How the stream is laid out (what a replay sees, in order):

1. one REGISTER per rank, one COMM (INIT_RANK) per rank × communicator;
2. the completed ops as OP records, ordered by ``time_ns`` (when the op ended), with a TICK every
   ``bw_check_period_s`` of op time so the engine evaluates during the history as the live master
   would; before each such TICK, a process-level HEARTBEAT (comm 0) per rank, so no rank looks lost;
3. the state at the end (``t_end``, the dump time): per rank × communicator, a HEARTBEAT with
   n_issued / n_arrived / n_done and the oldest pending op, then a TICK — repeated, with the same
   content, at ``t_end + i·T`` for i = 1 … hang_times (T = hang timeout). Other tools' dumps are a
   snapshot: c4d takes what was pending in it as still pending afterwards (a Flight Recorder dump is
   normally written because the job was stuck), so the engine sees a hang grow past T (WARNING)
   and T × hang_times (ERROR), as it would have live.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from c4d.record import schema
from c4d.record.schema import DEFAULT_BW_CHECK_PERIOD_S, DEFAULT_HANG_TIMEOUT_US, DEFAULT_HANG_TIMES
from c4d.record.trace import RawTrace

_BLOCK = 8192  # records filled at a time (1 MiB of OP records)
MAX_HISTORY_TICKS = 5000  # a very long history gets coarser ticks, not millions of records
_END_EPSILON_NS = 1_000  # ticks land just after the boundary so "waited > T" holds at i·T


class FormatError(ValueError):
    """Input that cannot be imported; the message is one line and names the file."""


@dataclass(frozen=True)
class ImportOptions:
    """The job values c4d assumes for imported data (imports carry no C4D_* environment)."""

    hang_timeout_us: int = DEFAULT_HANG_TIMEOUT_US
    hang_times: int = DEFAULT_HANG_TIMES
    bw_check_period_s: int = DEFAULT_BW_CHECK_PERIOD_S

    def __post_init__(self) -> None:
        for name in ("hang_timeout_us", "hang_times", "bw_check_period_s"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ImportOptions.{name} must be > 0, not {getattr(self, name)!r}")

    @property
    def hang_timeout_ns(self) -> int:
        return self.hang_timeout_us * 1000


def comm_id(key: str) -> int:
    """A stable, non-zero 64-bit communicator id from a key that is equal on every rank."""
    v = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return v or 1


def nccl_version_code(text: str | None) -> int:
    """ "2.21.5" → 22105 (NCCL_VERSION_CODE); 0 when unknown."""
    if not text:
        return 0
    parts = str(text).split("+")[0].split(".")
    try:
        major, minor, patch = (int(p) for p in (parts + ["0", "0"])[:3])
    except ValueError:
        return 0
    return major * 10000 + minor * 100 + patch


def _blank(dtype: np.dtype, n: int) -> np.ndarray:
    a = np.zeros(n, dtype=dtype)
    a["version"] = schema.SCHEMA_VERSION
    return a


def registers(
    ranks: np.ndarray,
    nodes: list[str],
    world_size: int,
    opts: ImportOptions,
    *,
    time_ns: int = 0,
    pids: np.ndarray | None = None,
    device_timing: np.ndarray | None = None,
    nccl_version: int = 0,
    job: str = "",
) -> np.ndarray:
    """One REGISTER per rank; ``nodes[i]`` is rank ``ranks[i]``'s host ("" when the format has none)."""
    n = len(ranks)
    a = _blank(schema.REGISTER, n)
    a["kind"] = schema.Kind.REGISTER
    a["rank"] = ranks
    a["time_ns"] = time_ns
    a["hang_timeout_us"] = opts.hang_timeout_us
    a["pid"] = 0 if pids is None else pids
    a["world_size"] = world_size
    a["local_rank"] = -1
    a["cuda_device"] = -1
    a["nccl_version"] = nccl_version
    a["hang_times"] = opts.hang_times
    a["bw_check_period_s"] = opts.bw_check_period_s
    a["heartbeat_ms"] = max(1, opts.hang_timeout_us // 1000)  # assemble() sets the real period
    a["log_level"] = 2
    a["device_timing"] = 0 if device_timing is None else device_timing
    a["node"] = [s.encode()[:39] for s in nodes]
    a["job"] = job.encode()[:23]
    return a


def comms(
    ranks: np.ndarray,
    ids: np.ndarray,
    comm_rank: np.ndarray,
    nranks: np.ndarray,
    time_ns: np.ndarray | int = 0,
) -> np.ndarray:
    """One COMM record (INIT_RANK) per rank × communicator."""
    a = _blank(schema.COMM, len(ranks))
    a["kind"] = schema.Kind.COMM
    a["rank"] = ranks
    a["time_ns"] = time_ns
    a["comm_id"] = ids
    a["comm_rank"] = comm_rank
    a["comm_nranks"] = nranks
    a["color"] = -1
    a["key"] = -1
    a["device"] = -1
    a["event"] = schema.CommEvent.INIT_RANK
    return a


def ops(n: int, out: np.ndarray | None = None, rows: np.ndarray | None = None, **cols: Any) -> np.ndarray:
    """``n`` OP records; ``cols`` are OP field names → arrays or scalars. ``out``: where to write
    them (``n`` zeroed OP records, e.g. a slice of the stream ``assemble`` lays out); a new array
    when not given. ``rows``: the array columns are read at these ``n`` indices (``v[rows]``),
    a block at a time, never as a whole column.

    Defaults: peer -1, device -1, redop 255 (not recorded), time_ns = the latest of
    issue/start/end. Filled a block of records at a time: each field's writes are strided (a
    record is 128 bytes), so a block that stays in cache takes them all faster than whole
    columns one after the other.
    """
    a = np.zeros(n, dtype=schema.OP) if out is None else out
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    for s in range(0, n, _BLOCK):
        b = a[s : s + _BLOCK]
        at = slice(s, s + _BLOCK) if rows is None else rows[s : s + _BLOCK]
        b["version"] = schema.SCHEMA_VERSION
        b["kind"] = schema.Kind.OP
        b["peer"] = -1
        b["device"] = -1
        b["redop"] = 255
        for k, v in arrays.items():
            b[k] = v[at] if v.ndim else v
        if "time_ns" not in cols:
            b["time_ns"] = np.maximum(np.maximum(b["issue_ns"], b["start_ns"]), b["end_ns"])
    return a


@dataclass(frozen=True)
class OpColumns:
    """``n`` OP records not written yet: ``cols`` as ``ops`` takes them, read at ``rows`` when
    given (record i is row ``rows[i]`` of each array). ``assemble`` writes them straight into the
    stream, so no array of the OP records alone is made (an import's largest: 128 bytes an op)."""

    n: int
    cols: dict[str, Any]
    rows: np.ndarray | None = None

    def _col(self, k: str) -> np.ndarray:
        v = np.asarray(self.cols[k])
        return v if not v.ndim or self.rows is None else v[self.rows]

    def time_ns(self) -> np.ndarray:
        """Their ``time_ns``, as ``ops`` will write it."""
        if "time_ns" in self.cols:
            return np.broadcast_to(self._col("time_ns").astype(np.uint64), (self.n,))
        t = np.zeros(self.n, np.uint64)
        for k in ("issue_ns", "start_ns", "end_ns"):
            if k in self.cols:
                np.maximum(t, self._col(k).astype(np.uint64), out=t)
        return t

    def take(self, order: np.ndarray) -> OpColumns:
        """The records in ``order``."""
        if self.rows is not None:
            return OpColumns(len(order), self.cols, self.rows[order])
        return OpColumns(len(order), {k: (v[order] if np.ndim(v) else v) for k, v in self.cols.items()})

    def write(self, out: np.ndarray, start: int, stop: int) -> None:
        """Records ``start:stop`` into ``out`` (``stop - start`` zeroed OP records)."""
        if self.rows is not None:
            ops(stop - start, out, self.rows[start:stop], **self.cols)
        else:
            ops(stop - start, out, **{k: (v[start:stop] if np.ndim(v) else v) for k, v in self.cols.items()})


def heartbeats(n: int, **cols: Any) -> np.ndarray:
    """``n`` HEARTBEAT records; defaults: nothing pending (pend_seq UINT64_MAX, pend_op,
    pend_dtype and pend_redop 255)."""
    a = _blank(schema.HEARTBEAT, n)
    a["kind"] = schema.Kind.HEARTBEAT
    a["pend_seq"] = schema.UINT64_MAX
    a["pend_op"] = 255
    a["pend_peer"] = -1
    a["pend_dtype"] = a["pend_redop"] = 255  # the pending op's dtype and reduction op: unknown
    a["device"] = -1
    for k, v in cols.items():
        a[k] = v
    return a


def _ticks(times: np.ndarray) -> np.ndarray:
    a = _blank(schema.HEADER, len(times))
    a["kind"] = schema.Kind.TICK
    a["rank"] = -1
    a["time_ns"] = times
    return a


def _process_beats(ranks: np.ndarray, world: int, times: np.ndarray) -> np.ndarray:
    """A comm-0 heartbeat per rank at each time (rank-major within a time)."""
    t = np.repeat(times, len(ranks))
    r = np.tile(ranks, len(times))
    return heartbeats(len(t), rank=r, time_ns=t, comm_id=0, comm_rank=r, comm_nranks=world)


def history_ticks(t_first: int, t_end: int, period_ns: int) -> np.ndarray:
    """Tick times every ``period_ns`` strictly inside (t_first, t_end], coarser if there would be too many."""
    if t_end <= t_first or period_ns <= 0:
        return np.empty(0, dtype=np.uint64)
    n = (t_end - t_first) // period_ns
    if n > MAX_HISTORY_TICKS:
        period_ns = -(-(t_end - t_first) // MAX_HISTORY_TICKS)
        n = (t_end - t_first) // period_ns
    return (t_first + period_ns * np.arange(1, n + 1, dtype=np.int64)).astype(np.uint64)


def assemble(
    meta: dict[str, Any],
    *,
    regs: np.ndarray,
    comm_recs: np.ndarray,
    op_recs: np.ndarray | OpColumns,
    final_beats: np.ndarray,
    t_end: int,
    opts: ImportOptions,
    path: str = "",
    extrapolate: bool = True,
) -> RawTrace:
    """Lay the records out as described in the module docstring and wrap them in a ``RawTrace``.

    ``op_recs``: the OP records, or their columns (``OpColumns``: written straight into the
    stream). ``final_beats`` is the per rank × communicator state at ``t_end``; its ``time_ns``
    is set here. ``extrapolate=False`` evaluates once at ``t_end`` only (for sources that describe
    no pending state, e.g. nccl-tests). The trace's ``kinds`` are split out of the stream when
    first asked for (a replay reads the stream only).
    """
    ranks = np.unique(regs["rank"]).astype(np.int32)
    world = int(regs["world_size"].max()) if len(regs) else 0
    given = op_recs.time_ns() if isinstance(op_recs, OpColumns) else op_recs["time_ns"]
    t_op = given.astype(np.int64)
    if len(t_op) > 1 and not (t_op[1:] >= t_op[:-1]).all():  # importers may hand them in time order
        order = np.argsort(t_op, kind="stable")
        op_recs = op_recs.take(order) if isinstance(op_recs, OpColumns) else op_recs[order]
        t_op = t_op[order]
    n_ops = len(t_op)
    t_first = int(t_op[0]) if n_ops else int(t_end)
    t_end = max(int(t_end), int(t_op[-1]) if n_ops else 0)

    hist = history_ticks(t_first, t_end, opts.bw_check_period_s * 1_000_000_000)
    hist = hist[hist < t_end]
    # ranks "beat" at every tick: say so, so that the widest gap between ticks is not read as a loss
    gaps = np.diff(np.concatenate([[t_first], hist.astype(np.int64), [t_end]]))
    regs = regs.copy()
    regs["heartbeat_ms"] = max(int(gaps.max()) // 1_000_000, opts.hang_timeout_us // 1000, 1)
    steps = opts.hang_times if extrapolate else 0
    final_t = (t_end + _END_EPSILON_NS + opts.hang_timeout_ns * np.arange(steps + 1, dtype=np.int64)).astype(
        np.uint64
    )

    # the stream in order: records, or (start, stop) of the OP records
    parts: list[np.ndarray | tuple[int, int]] = [regs, comm_recs]
    cuts = np.searchsorted(t_op, hist.astype(np.int64), side="right")
    prev = 0
    for cut, t in zip(cuts.tolist(), hist.tolist(), strict=True):
        parts.append((prev, cut))  # history: ops up to the tick, the process beats, the tick
        parts.append(_process_beats(ranks, world, np.array([t], dtype=np.uint64)))
        parts.append(_ticks(np.array([t], dtype=np.uint64)))
        prev = cut
    parts.append((prev, n_ops))
    for t in final_t.tolist():
        fb = final_beats.copy()
        fb["time_ns"] = t
        parts.append(fb)
        parts.append(_process_beats(ranks, world, np.array([t], dtype=np.uint64)))
        parts.append(_ticks(np.array([t], dtype=np.uint64)))
    raw = _lay_out(parts, op_recs)

    full = {
        "schema_version": schema.SCHEMA_VERSION,
        "record_size": schema.RECORD_SIZE,
        "created_ns": t_first,
        **meta,
    }
    imp = full.setdefault("import", {})
    imp.update(
        {
            "t_end_ns": t_end,
            "extrapolated": bool(extrapolate),
            "final_ticks_ns": [int(t) for t in final_t],
            "history_ticks": len(hist),
            "hang_timeout_us": opts.hang_timeout_us,
            "hang_times": opts.hang_times,
        }
    )
    imp.setdefault("warnings", [])
    return RawTrace(meta=full, raw=raw, path=path, kinds=schema.KindsOf(raw))


def _lay_out(parts: list[np.ndarray | tuple[int, int]], op_recs: np.ndarray | OpColumns) -> np.ndarray:
    """The stream: ``parts`` one after the other in one array, (start, stop) standing for those
    OP records. Copied as whole records (numpy would copy a structured dtype field by field)."""
    size = sum(p[1] - p[0] if isinstance(p, tuple) else len(p) for p in parts)
    raw = np.zeros(size, schema.HEADER)
    whole = np.dtype((np.void, schema.RECORD_SIZE))
    out = raw.view(whole)
    at = 0
    for p in parts:
        if isinstance(p, tuple):
            start, stop = p
            if isinstance(op_recs, OpColumns):
                op_recs.write(raw[at : at + stop - start].view(schema.OP), start, stop)
            else:
                out[at : at + stop - start] = np.ascontiguousarray(op_recs[start:stop]).view(whole)
            at += stop - start
        else:
            out[at : at + len(p)] = np.ascontiguousarray(p).view(whole)
            at += len(p)
    return raw


def save(rt: RawTrace, path: str) -> None:
    """Write an imported trace as a c4d trace file (``c4d report`` / ``c4d.record.trace.load`` read it)."""
    from c4d.record.trace import TraceWriter

    w = TraceWriter(path, {k: v for k, v in rt.meta.items() if k not in ("schema_version", "record_size")})
    try:
        w.write(rt.raw)
    finally:
        w.close()
