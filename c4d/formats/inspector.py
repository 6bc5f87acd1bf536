"""Import NCCL Inspector logs (the profiler plugin's JSON lines) as c4d records.

Inspector (NVIDIA/nccl ``plugins/profiler/inspector``) writes ``<host>-pid<pid>.log`` per process:
one JSON object per line, ``{"header": {id, rank, n_ranks, nnodes}, "metadata": {hostname, pid,
dump_timestamp_us, ...}, "coll_perf": {coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us,
coll_timing_source, coll_algobw_gbs, coll_busbw_gbs[, event_trace_ts]}}``. Lines with ``p2p_perf``
(``p2p``, ``p2p_sn``, ``p2p_peer``, ``p2p_msg_size_bytes``, ... as third-party readers of newer
versions show them; not checked against NVIDIA's source) are read the same way.

What the logs are, and so what the import can say:

* a *sample*: the dump thread writes, every interval, the latest completed collective of each
  communicator, so ops are missing and different ranks may log different ops of one
  communicator; only completed ops appear, so there is no pending state and no hang to find
  (the replay evaluates once, at the last op);
* ``header.id`` is the communicator hash (→ ``comm_id``), ``header.rank`` the rank in it; the
  global rank is the rank in a communicator that spans every process in the input, else the
  order of (host, pid) — a warning says which;
* ``coll_sn`` counts per collective type (NCCL's ``seqNumber[func]``), so c4d's per-communicator
  ``seq`` is rebuilt by ordering the (type, sn) pairs of a communicator by their median time
  over the ranks that logged them: equal on every rank;
* times: with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` the kernel start/stop and collective start
  times (µs) give start/end/issue; otherwise ``end`` = ``dump_timestamp_us`` (later than the real
  end by up to the dump interval) and ``start`` = end − ``coll_exec_time_us``, without the
  DEVICE_TIMING flag. ``count`` and ``dtype`` are not logged: 0 and 255 (unknown).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from c4d.formats import to_records as tr
from c4d.formats.budget import RECORD_COST, Budget, BudgetError, HostileFile, LineReader
from c4d.formats.to_records import FormatError, ImportOptions
from c4d.record import schema
from c4d.record.trace import RawTrace

if TYPE_CHECKING:  # pandas is slow to import: only parsing needs it
    import pandas as pd

Op = schema.Op
_OPS = {
    "allreduce": Op.AllReduce,
    "allgather": Op.AllGather,
    "reducescatter": Op.ReduceScatter,
    "broadcast": Op.Broadcast,
    "reduce": Op.Reduce,
    "alltoall": Op.AlltoAll,
    "gather": Op.Gather,
    "scatter": Op.Scatter,
    "send": Op.Send,
    "recv": Op.Recv,
}
_SUFFIXES = {".log", ".jsonl", ".json", ".txt", ".gz", ""}
COLUMNS = [
    "host",
    "pid",
    "comm",
    "crank",
    "nranks",
    "op",
    "sn",
    "peer",
    "bytes",
    "exec_us",
    "source",
    "algbw_gbs",
    "busbw_gbs",
    "dump_us",
    "issue_us",
    "start_us",
    "end_us",
]


def find_files(path: str | os.PathLike, budget: Budget | None = None) -> list[Path]:
    """The file itself, or every log under a directory whose content starts like Inspector's."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FormatError(f"{p}: no such file or directory")
    out = []
    for f in sorted(p.rglob("*")):
        if budget is not None:
            budget.tick(str(p), every=64)
        if f.is_file() and f.suffix in _SUFFIXES and looks_like(f):
            out.append(f)
    if not out:
        raise FormatError(f"{p}: no NCCL Inspector logs (JSON lines with header/metadata/coll_perf)")
    return out


# what one parsed line holds until the DataFrame is built (a list of 17 Python values), and the
# DataFrame's share per row while it is built from them
ROW_COST = 1536


def looks_like(p: Path, probe: int = 1 << 16) -> bool:
    """True when the first JSON line of ``p`` has Inspector's ``header`` and ``coll_perf``/``p2p_perf``."""
    try:
        with open(p, "rb") as f:
            head = f.read(probe)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(p, "rb") as g:
                head = g.read(probe)
    except (OSError, EOFError):
        return False
    for line in head.decode("utf-8", errors="replace").splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("{"):
            return False
        try:
            obj = json.loads(s)
        except ValueError:
            return False  # a first line cut by the probe size is too long to be Inspector's anyway
        return isinstance(obj, dict) and "header" in obj and ("coll_perf" in obj or "p2p_perf" in obj)
    return False


def _num(v: Any, default: float = 0.0) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _row(obj: dict[str, Any]) -> list[Any] | None:
    h, m = obj.get("header"), obj.get("metadata")
    perf, pre = (obj.get("coll_perf"), "coll") if "coll_perf" in obj else (obj.get("p2p_perf"), "p2p")
    if not (isinstance(h, dict) and isinstance(m, dict) and isinstance(perf, dict)):
        return None
    op = _OPS.get(str(perf.get(pre, "")).lower().replace("_", ""))
    if op is None:
        return None
    cid = str(h.get("id", ""))
    try:
        comm = int(cid, 16) & 0xFFFFFFFFFFFFFFFF
    except ValueError:
        comm = tr.comm_id(f"inspector:{cid}")
    dump_us = _num(m.get("dump_timestamp_us"))
    exec_us = _num(perf.get(f"{pre}_exec_time_us"))
    issue_us = start_us = end_us = 0.0
    ts = perf.get("event_trace_ts")
    if isinstance(ts, dict):
        issue_us = _num(ts.get(f"{pre}_start_ts"))
        ks = [k for k in ts.get("kernel_events") or [] if isinstance(k, dict)]
        starts = [_num(k.get("kernel_start_ts")) for k in ks if _num(k.get("kernel_start_ts")) > 0]
        stops = [_num(k.get("kernel_stop_ts")) for k in ks if _num(k.get("kernel_stop_ts")) > 0]
        if starts and stops:
            start_us, end_us = min(starts), max(stops)
    return [
        str(m.get("hostname", "")),
        int(_num(m.get("pid"), -1)),
        comm,
        int(_num(h.get("rank"), -1)),
        int(_num(h.get("n_ranks"), 0)),
        int(op),
        int(_num(perf.get(f"{pre}_sn"), -1)),
        int(_num(perf.get(f"{pre}_peer"), -1)),
        int(_num(perf.get(f"{pre}_msg_size_bytes"))),
        exec_us,
        str(perf.get(f"{pre}_timing_source", "")),
        _num(perf.get(f"{pre}_algobw_gbs")),
        _num(perf.get(f"{pre}_busbw_gbs")),
        dump_us,
        issue_us,
        start_us,
        end_us,
    ]


def parse(files: list[Path], warns: list[str], budget: Budget | None = None) -> pd.DataFrame:
    """Every usable line of ``files`` as one row (COLUMNS), read line by line under ``budget``;
    bad lines are counted per file, a file refused as hostile is skipped with one warning."""
    budget = budget or Budget()
    rows: list[list[Any]] = []
    for f in files:
        reader = LineReader(f, budget)
        bad, first_bad = 0, 0
        mine: list[list[Any]] = []  # this file's rows: none are kept from a file refused as hostile
        try:
            for line in reader:
                s = line.strip()
                if not s:
                    continue
                try:
                    obj = json.loads(s)
                    r = _row(obj) if isinstance(obj, dict) else None
                except (ValueError, RecursionError):
                    r = None
                if r is None:
                    bad += 1
                    first_bad = first_bad or reader.lines
                else:
                    budget.charge(ROW_COST, f"{f}: line {reader.lines}")
                    mine.append(r)
        except BudgetError:  # over the import's budget: the whole import is refused
            raise
        except HostileFile as e:
            warns.append(str(e))
            budget.used -= ROW_COST * len(mine)
            mine = []
        except FormatError as e:  # a damaged gzip: what came before the damage is kept
            warns.append(f"{e} (read to line {reader.lines})")
        except OSError as e:
            warns.append(f"{f}: unreadable ({e.strerror or e})")
        if bad:
            warns.append(f"{f}: {bad} lines are not Inspector records (first at line {first_bad})")
        if w := reader.warning():
            warns.append(w)
        rows.extend(mine)
    import pandas as pd

    return pd.DataFrame(rows, columns=COLUMNS)


def _global_ranks(df: pd.DataFrame, warns: list[str]) -> dict[tuple[str, int], int]:
    procs = sorted(set(zip(df["host"], df["pid"], strict=True)))
    world = df[df["nranks"] == len(procs)]
    for _comm, g in world.groupby("comm"):
        m = g.drop_duplicates(["host", "pid"])
        if len(m) == len(procs) and m["crank"].nunique() == len(procs):
            return {(h, p): int(r) for h, p, r in zip(m["host"], m["pid"], m["crank"], strict=True)}
    if len(procs) > 1:
        warns.append("no communicator spans every process: global ranks numbered in (host, pid) order")
    return {hp: i for i, hp in enumerate(procs)}


def convert(
    df: pd.DataFrame,
    opts: ImportOptions,
    *,
    path: str = "",
    warns: list[str] | None = None,
    budget: Budget | None = None,
) -> RawTrace:
    """Inspector rows (``parse``) → RawTrace."""
    warns = warns if warns is not None else []
    if df.empty:
        raise FormatError(f"{path}: no NCCL Inspector records")
    if budget is not None:  # one OP per row, beats per rank x communicator at the end
        budget.charge(len(df) * RECORD_COST, f"{path}: {len(df):,} records")
    df = df.drop_duplicates().reset_index(drop=True)
    g_of = _global_ranks(df, warns)
    df["rank"] = [g_of[hp] for hp in zip(df["host"], df["pid"], strict=True)]
    verbose = df["end_us"] > 0
    end = np.where(verbose, df["end_us"], df["dump_us"])
    start = np.where(verbose, df["start_us"], end - df["exec_us"])
    issue = np.where(df["issue_us"] > 0, df["issue_us"], start)
    df["end_ns"] = (end * 1000).astype(np.int64)
    df["start_ns"] = (start * 1000).astype(np.int64)
    df["issue_ns"] = (np.minimum(issue, start) * 1000).astype(np.int64)
    p2p = df["op"].isin([int(Op.Send), int(Op.Recv)])

    # collectives: order each communicator's (op, sn) by median time over the ranks that logged it
    coll = df[~p2p]
    keys = coll.groupby(["comm", "op", "sn"])["start_ns"].median().rename("t").reset_index()
    keys = keys.sort_values(["comm", "t", "op", "sn"], kind="stable")
    keys["seq"] = keys.groupby("comm").cumcount()
    seq = coll.merge(keys[["comm", "op", "sn", "seq"]], on=["comm", "op", "sn"], how="left")["seq"]
    df["seq"] = 0
    df.loc[~p2p, "seq"] = seq.to_numpy()
    if p2p.any():
        pp = df[p2p].sort_values("sn", kind="stable")
        df.loc[pp.index, "seq"] = pp.groupby(["rank", "comm", "op", "peer"]).cumcount()
    timed = verbose & df["source"].str.startswith("kernel_gpu")
    flags = np.where(timed, int(schema.OpFlag.DEVICE_TIMING), 0) | np.where(p2p, int(schema.OpFlag.P2P), 0)

    op_recs = tr.ops(
        len(df),
        rank=df["rank"].to_numpy(np.int32),
        comm_id=df["comm"].to_numpy(np.uint64),
        seq=df["seq"].to_numpy(np.int64),
        issue_ns=df["issue_ns"].to_numpy(),
        start_ns=df["start_ns"].to_numpy(),
        end_ns=df["end_ns"].to_numpy(),
        count=0,
        bytes=df["bytes"].to_numpy(np.int64),
        comm_rank=df["crank"].to_numpy(np.int32),
        comm_nranks=df["nranks"].to_numpy(np.int32),
        peer=df["peer"].to_numpy(np.int32),
        op=df["op"].to_numpy(np.uint8),
        dtype=255,
        flags=flags.astype(np.uint8),
    )

    procs = df.drop_duplicates("rank").sort_values("rank")
    world = max(len(procs), int(procs["rank"].max()) + 1)
    regs = tr.registers(
        procs["rank"].to_numpy(np.int32),
        procs["host"].tolist(),
        world,
        opts,
        time_ns=int(df["issue_ns"].min()),
        pids=procs["pid"].to_numpy(np.int32),
        device_timing=procs["rank"].isin(df.loc[timed, "rank"]).to_numpy(np.uint8),
    )
    cm = df.drop_duplicates(["rank", "comm"])
    comm_recs = tr.comms(
        cm["rank"].to_numpy(np.int32),
        cm["comm"].to_numpy(np.uint64),
        cm["crank"].to_numpy(np.int32),
        cm["nranks"].to_numpy(np.int32),
        time_ns=int(df["issue_ns"].min()),
    )
    # nothing is pending in a log of completed ops: every rank is done with what it logged
    last = df[~p2p].groupby(["rank", "comm"]).agg(n=("seq", "max"), end=("end_ns", "max"))
    last = cm.set_index(["rank", "comm"])[["crank", "nranks"]].join(last).reset_index()
    n = last["n"].fillna(-1).to_numpy(np.int64) + 1
    beats = tr.heartbeats(
        len(last),
        rank=last["rank"].to_numpy(np.int32),
        comm_id=last["comm"].to_numpy(np.uint64),
        n_issued=n,
        n_arrived=n,
        n_done=n,
        last_done_ns=last["end"].fillna(0).to_numpy(np.int64),
        comm_rank=last["crank"].to_numpy(np.int32),
        comm_nranks=last["nranks"].to_numpy(np.int32),
    )
    names = {
        f"{c:016x}": {"name": f"0x{c:x}", "ranks": sorted(g["rank"].unique().tolist())}
        for c, g in df.groupby("comm")
    }
    meta = {
        "source_format": "inspector",
        "source_path": path,
        "comms": names,
        "inspector": {
            "records": len(df),
            "processes": len(procs),
            "verbose": bool(verbose.all()),
            "median_busbw_gbs": {
                schema.Op(int(o)).name: round(float(v), 3)
                for o, v in df.groupby("op")["busbw_gbs"].median().items()
            },
        },
        "import": {"warnings": warns},
    }
    t_end = int(df["end_ns"].max())
    return tr.assemble(
        meta,
        regs=regs,
        comm_recs=comm_recs,
        op_recs=op_recs,
        final_beats=beats,
        t_end=t_end,
        opts=opts,
        path=path,
        extrapolate=False,
    )


def read(
    path: str | os.PathLike,
    opts: ImportOptions | None = None,
    *,
    on_warning: Callable[[str], None] | None = None,
    budget: Budget | None = None,
) -> RawTrace:
    """A log file or a directory of them → RawTrace, within ``budget`` (c4d.formats.budget)."""
    warns: list[str] = []
    budget = budget or Budget()
    df = parse(find_files(path, budget), warns, budget)
    if df.empty:
        raise FormatError(f"{path}: no NCCL Inspector records" + (f" ({warns[0]})" if warns else ""))
    budget.check_time(str(path))
    rt = convert(df, opts or ImportOptions(), path=str(path), warns=warns, budget=budget)
    if on_warning:
        for w in warns:
            on_warning(w)
    return rt
