"""What a path holds, and one entry point that loads any supported format as a ``RawTrace``.

``detect(path)`` looks at content, not names: the ``C4DTRACE`` magic (c4d trace); a pickle
``PROTO`` opcode in files named ``<prefix><rank>`` (PyTorch Flight Recorder, a directory of
them or one file), or a JSON dump with ``entries``/``pg_config``; JSON lines with
``header``/``coll_perf`` (NCCL Inspector, plain or gzip); nccl-tests' text banners and table
header, or its ``-J`` JSON report. ``load_any(path, fmt=None)`` then returns what reading a c4d
trace returns, so ``c4d.analyze.replay`` works on all of them.

nccl-tests output becomes a synthetic one-communicator job (``nccl_tests_trace``): per table row
and block (out-of-place, in-place), one op per rank of the size and average time printed, back to
back from an arbitrary start (``T0_NS``); every rank gets the same times (nccl-tests prints one
average), so bus bandwidth comes out as printed and nothing else (waits, lateness) means anything.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from c4d.formats import flight_recorder, inspector
from c4d.formats import to_records as tr
from c4d.formats.budget import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SECONDS,
    RECORD_COST,
    Budget,
    BudgetError,
)
from c4d.formats.to_records import FormatError, ImportOptions
from c4d.record import schema
from c4d.record.trace import MAGIC as C4D_MAGIC
from c4d.record.trace import RawTrace, TraceError, read_raw

FORMATS = ("c4d", "fr", "inspector", "nccl-tests")
_PROBE = 65536
_NCCL_TESTS_RE = re.compile(
    rb"(#\s*nThread\s+\d+|#\s*nccl-tests version|#\s*Avg bus bandwidth|#\s+size\s+count\s+type|"
    rb"#\s*Collective test (starting|concluded))"
)
T0_NS = 1_700_000_000_000_000_000  # where synthetic nccl-tests timelines start (2023-11-14, arbitrary)
_GAP_NS = 1_000  # between synthetic ops

Op = schema.Op
# nccl-tests' collective names (nccl_tests.COLLECTIVES) are ours, but for its "AllToAll"
_NT_OPS = {**{o.name: o for o in Op if o not in (Op.Send, Op.Recv)}, "AllToAll": Op.AlltoAll}
_NT_NAMES = {  # nccl-tests type names → ncclDataType_t (bytes per element: schema.DTYPE_SIZE)
    "int8": schema.DType.int8,
    "char": schema.DType.int8,
    "uint8": schema.DType.uint8,
    "int32": schema.DType.int32,
    "int": schema.DType.int32,
    "uint32": schema.DType.uint32,
    "int64": schema.DType.int64,
    "uint64": schema.DType.uint64,
    "half": schema.DType.float16,
    "float16": schema.DType.float16,
    "float": schema.DType.float32,
    "float32": schema.DType.float32,
    "double": schema.DType.float64,
    "float64": schema.DType.float64,
    "bfloat16": schema.DType.bfloat16,
    "f8e4m3": schema.DType.float8e4m3,
    "fp8_e4m3": schema.DType.float8e4m3,
    "f8e5m2": schema.DType.float8e5m2,
    "fp8_e5m2": schema.DType.float8e5m2,
}
_NT_TYPES = {n: (int(d), int(schema.DTYPE_SIZE[d])) for n, d in _NT_NAMES.items()}


def _head(p: Path) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(_PROBE)
    except OSError as e:
        raise FormatError(f"{p}: {e.strerror or e}") from None


def _json_first(head: bytes) -> Any:
    """The first JSON value in ``head`` (a whole document or its first line), or None."""
    text = head.decode("utf-8", errors="replace").lstrip()
    if not text.startswith("{"):
        return None
    for cand in (text, text.splitlines()[0]):
        try:
            return json.loads(cand)
        except ValueError:
            continue
    return None


def _file_format(p: Path) -> str | None:
    head = _head(p)
    if head.startswith(C4D_MAGIC):
        return "c4d"
    if head[:1] == b"\x80":
        return "fr"
    if head[:2] == b"\x1f\x8b":
        return "inspector" if inspector.looks_like(p) else None
    obj = _json_first(head)
    if isinstance(obj, dict):
        if "header" in obj and ("coll_perf" in obj or "p2p_perf" in obj):
            return "inspector"
        if "entries" in obj or "pg_config" in obj:
            return "fr"
        if "results" in obj and ("config" in obj or "devices" in obj):
            return "nccl-tests"
    if head.lstrip().startswith(b"{") and inspector.looks_like(p):
        return "inspector"
    if _NCCL_TESTS_RE.search(head):
        return "nccl-tests"
    return None


def detect(path: str | os.PathLike) -> str:
    """``"c4d"``, ``"fr"``, ``"inspector"`` or ``"nccl-tests"``; ``FormatError`` (one line) otherwise."""
    p = Path(path)
    if p.is_file():
        fmt = _file_format(p)
        if fmt is None:
            raise FormatError(
                f"{p}: not a format c4d reads (a c4d trace, Flight Recorder dumps, NCCL Inspector "
                "JSON lines or nccl-tests output)"
            )
        return fmt
    if not p.is_dir():
        raise FormatError(f"{p}: no such file or directory")
    try:
        flight_recorder.find_dumps(p)
        return "fr"
    except FormatError:
        pass
    found: set[str] = set()
    for f in sorted(x for x in p.iterdir() if x.is_file())[:256]:
        try:
            fmt = _file_format(f)
        except FormatError:
            continue
        if fmt:
            found.add(fmt)
    for fmt in ("inspector", "nccl-tests", "c4d"):
        if fmt in found:
            return fmt
    raise FormatError(f"{p}: holds no Flight Recorder dumps, NCCL Inspector logs or nccl-tests output")


def load_any(
    path: str | os.PathLike,
    fmt: str | None = None,
    *,
    opts: ImportOptions | None = None,
    on_warning: Callable[[str], None] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> RawTrace:
    """Load ``path`` in format ``fmt`` (detected when None) as a ``RawTrace``.

    Imports carry no c4d thresholds: ``opts`` says which to assume (default: docs/design.md's, T = 10 s,
    18 times). Non-fatal problems (a corrupt dump among good ones, lines that are not records) go to
    ``on_warning`` one line each and into ``meta["import"]["warnings"]``; a path that cannot be
    loaded at all raises ``FormatError`` with one line. An import of another tool's files holds at
    most ``max_bytes`` of data in memory and runs at most ``max_seconds`` (c4d.formats.budget,
    docs/untrusted-input.md); past either it raises ``BudgetError`` (a ``FormatError``).
    """
    budget = Budget(max_bytes, max_seconds)
    fmt = fmt or detect(path)
    if fmt not in FORMATS:
        raise FormatError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    opts = opts or ImportOptions()
    if fmt == "c4d":
        if Path(path).is_dir():
            raise FormatError(f"{path}: a directory, not a c4d trace file")
        try:
            return read_raw(path)
        except TraceError as e:
            raise FormatError(str(e)) from None
    if fmt == "fr":
        return flight_recorder.read(path, opts, on_warning=on_warning, budget=budget)
    if fmt == "inspector":
        return inspector.read(path, opts, on_warning=on_warning, budget=budget)
    return read_nccl_tests(path, opts, on_warning=on_warning, budget=budget)


# ------------------------------------------------------------------------------------- nccl-tests
def read_nccl_tests(
    path: str | os.PathLike,
    opts: ImportOptions | None = None,
    *,
    on_warning: Callable[[str], None] | None = None,
    budget: Budget | None = None,
) -> RawTrace:
    """nccl-tests output (a file, or a directory of them) → a synthetic RawTrace (module doc)."""
    from c4d.formats import nccl_tests

    p = Path(path)
    budget = budget or Budget()
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    runs: list[tuple[str, Any]] = []
    warns: list[str] = []
    for f in files:
        budget.check_time(str(p))
        if p.is_dir() and _file_format(f) != "nccl-tests":
            continue
        try:
            runs.extend((f.name, r) for r in nccl_tests.parse_file(f, budget, warns))
        except BudgetError:
            raise
        except (nccl_tests.NcclTestsError, FormatError, OSError, UnicodeDecodeError) as e:
            warns.append(f"{e}" if isinstance(e, FormatError) else f"{f}: {e}")
    if not runs:
        raise FormatError(f"{p}: no nccl-tests results" + (f" ({warns[0]})" if warns else ""))
    rt = nccl_tests_trace(runs, opts or ImportOptions(), path=str(p), warns=warns, budget=budget)
    if on_warning:
        for w in warns:
            on_warning(w)
    return rt


def _infer_op(run: Any, n: int, warns: list[str], name: str) -> Op | None:
    coll = run.collective
    if coll in _NT_OPS:
        return _NT_OPS[coll]
    rows = run.rows
    if coll is None and len(rows):
        redop = str(rows["redop"].iloc[0]).lower()
        root = rows["root"].iloc[0]
        rooted = root is not None and not (isinstance(root, float) and np.isnan(root)) and int(root) >= 0
        ratio = (rows["oop_busbw_gbs"] / rows["oop_algbw_gbs"]).replace([np.inf], np.nan).dropna()
        r = float(ratio.median()) if len(ratio) else float("nan")
        if redop != "none":
            op = (
                Op.Reduce
                if rooted
                else (
                    Op.AllReduce
                    if n < 2 or abs(r - 2 * (n - 1) / n) < 0.05 or np.isnan(r)
                    else Op.ReduceScatter
                )
            )
        else:
            op = Op.Broadcast if rooted else Op.AllGather
        warns.append(f"{name}: the program is not named; taken as {op.name} from redop/root/bandwidth")
        return op
    warns.append(f"{name}: {coll or 'this test'} has no c4d op kind; skipped")
    return None


def _nranks(run: Any) -> int:
    if run.devices:
        return len({d.rank for d in run.devices})
    n = run.params.get("gpus") if isinstance(run.params, dict) else None
    try:
        return max(1, int(n)) if n else 1
    except ValueError:
        return 1


def nccl_tests_trace(
    runs: list[tuple[str, Any]],
    opts: ImportOptions,
    *,
    path: str = "",
    warns: list[str] | None = None,
    budget: Budget | None = None,
) -> RawTrace:
    """Parsed nccl-tests runs → RawTrace: one communicator per run, one op per rank per row and block."""
    warns = warns if warns is not None else []
    budget = budget or Budget()
    op_parts: list[np.ndarray] = []
    comm_parts: list[np.ndarray] = []
    beat_parts: list[np.ndarray] = []
    nodes: dict[int, str] = {}
    comms: dict[str, Any] = {}
    t = T0_NS
    world = 0
    for i, (name, run) in enumerate(runs):
        budget.check_time(name)
        n = _nranks(run)
        op = _infer_op(run, n, warns, name)
        rows = run.rows
        if op is None or rows.empty:
            continue
        for d in run.devices:
            nodes.setdefault(int(d.rank), d.host)
        world = max(world, n)
        cid = tr.comm_id(f"nccl-tests:{path}:{name}:{i}")
        comms[f"{cid:016x}"] = {
            "name": run.program or "nccl-tests",
            "ranks": list(range(n)),
            "avg_busbw_gbs": run.avg_busbw_gbs,
            "file": name,
        }
        import pandas as pd

        blocks = []
        for b in ("oop", "ip"):
            blk = rows[["size", "count", "type", f"{b}_time_us"]].rename(columns={f"{b}_time_us": "time_us"})
            blocks.append(blk.assign(block=b))
        ops_df = pd.concat(blocks).dropna(subset=["time_us"])
        ops_df = ops_df[ops_df["time_us"] >= 0].sort_index(kind="stable")
        unknown = sorted(set(ops_df["type"].astype(str)) - set(_NT_TYPES))
        if unknown:
            warns.append(f"{name}: data types {', '.join(unknown)} unknown; bytes taken from the size column")
        tcode = np.array([_NT_TYPES.get(str(x), (255, 0))[0] for x in ops_df["type"]], dtype=np.int64)
        tsize = np.array([_NT_TYPES.get(str(x), (255, 0))[1] for x in ops_df["type"]], dtype=np.int64)
        count = ops_df["count"].to_numpy(np.int64)
        nbytes = np.where(tsize > 0, count * tsize, ops_df["size"].to_numpy(np.int64))
        dur = np.maximum((ops_df["time_us"].to_numpy(float) * 1000).round().astype(np.int64), 1)
        start = t + np.concatenate([[0], np.cumsum(dur + _GAP_NS)[:-1]])
        end = start + dur
        t = int(end[-1]) + _GAP_NS
        k = len(ops_df)
        budget.charge((n * k + n * (opts.hang_times + 2)) * RECORD_COST, f"{name}: {n} ranks x {k:,} ops")
        ranks = np.arange(n, dtype=np.int32)
        R = np.repeat(ranks, k)
        T = np.tile(np.arange(k), n)
        op_parts.append(
            tr.ops(
                n * k,
                rank=R,
                comm_id=cid,
                seq=T,
                issue_ns=start[T],
                start_ns=start[T],
                end_ns=end[T],
                count=count[T],
                bytes=nbytes[T],
                comm_rank=R,
                comm_nranks=n,
                op=int(op),
                dtype=tcode[T],
                flags=int(schema.OpFlag.DEVICE_TIMING),
                redop=255,
            )
        )
        comm_parts.append(tr.comms(ranks, np.full(n, cid, dtype=np.uint64), ranks, np.full(n, n), T0_NS))
        beat_parts.append(
            tr.heartbeats(
                n,
                rank=ranks,
                comm_id=cid,
                n_issued=k,
                n_arrived=k,
                n_done=k,
                last_done_ns=int(end[-1]),
                comm_rank=ranks,
                comm_nranks=n,
            )
        )
    if not op_parts:
        raise FormatError(f"{path}: no nccl-tests rows c4d can represent")
    all_ranks = np.arange(world, dtype=np.int32)
    regs = tr.registers(all_ranks, [nodes.get(int(r), "") for r in all_ranks], world, opts, time_ns=T0_NS)
    meta = {
        "source_format": "nccl-tests",
        "source_path": path,
        "comms": comms,
        "nccl_tests": {"runs": len(runs), "synthetic_start_ns": T0_NS},
        "import": {"warnings": warns},
    }
    return tr.assemble(
        meta,
        regs=regs,
        comm_recs=np.concatenate(comm_parts),
        op_recs=np.concatenate(op_parts),
        final_beats=np.concatenate(beat_parts),
        t_end=t,
        opts=opts,
        path=path,
        extrapolate=False,
    )
