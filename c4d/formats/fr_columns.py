"""One Flight Recorder dump's entries as numpy columns, and the FR vocabulary they are read with
(op names, c10 dtypes, states): the builder step between the loader (fr_load) and the conversion
to c4d records (fr_convert).

``columns`` takes from the entries only the fields c4d reads, in C-level passes; numbers are
converted by numpy, strings factorized into codes and their distinct values. Whatever would be
walked to be read (strings that are not strings, sizes, pg_config) is counted against the dump's
walk limit first (fr_limits.check_walk), so a hostile dump is refused before it is read."""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain
from operator import index, itemgetter, methodcaller
from typing import Any

import numpy as np

from c4d.formats.fr_limits import MAX_RANK, check_walk
from c4d.record import schema

Op = schema.Op

OP_NAMES: dict[str, Op] = {}
for _op, _names in {
    Op.AllReduce: "all_reduce allreduce allreduce_coalesced all_reduce_coalesced all_reduce_barrier barrier",
    Op.Broadcast: "broadcast _broadcast_oop broadcast_coalesced",
    Op.Reduce: "reduce _reduce_oop",
    Op.AllGather: "all_gather all_gather_single all_gather_v _all_gather_base "
    "all_gather_into_tensor_coalesced ALLGATHER_coalesced allgather allgather_coalesced "
    "allgather_into_tensor_coalesced",
    Op.ReduceScatter: "reduce_scatter reduce_scatter_single reduce_scatter_v _reduce_scatter_base "
    "reduce_scatter_tensor_coalesced REDUCE_SCATTER_coalesced reduce_scatter_base",
    Op.AlltoAll: "all_to_all all_to_all_single all_to_all_v_single alltoall alltoall_base",
    Op.Gather: "gather",
    Op.Scatter: "scatter",
    Op.Send: "send",
    Op.Recv: "recv",
}.items():
    for _n in _names.split():
        OP_NAMES[_n] = _op
# the op names whose size is their output's (what the native reader is told too)
USE_OUTPUT = tuple(n for n, op in OP_NAMES.items() if op == Op.ReduceScatter)

# c10 scalar type names → ncclDataType_t (schema.DType); bytes per element from schema.DTYPE_SIZE,
# except for c10 types NCCL has no type for (recorded as DType.unknown with their own size)
_C10_DTYPES: dict[str, schema.DType] = {
    "Char": schema.DType.int8,
    "Byte": schema.DType.uint8,
    "Bool": schema.DType.uint8,
    "Int": schema.DType.int32,
    "UInt32": schema.DType.uint32,
    "Long": schema.DType.int64,
    "UInt64": schema.DType.uint64,
    "Half": schema.DType.float16,
    "Float": schema.DType.float32,
    "Double": schema.DType.float64,
    "BFloat16": schema.DType.bfloat16,
    "Float8_e4m3fn": schema.DType.float8e4m3,
    "Float8_e5m2": schema.DType.float8e5m2,
}
_C10_OTHER_SIZES = {"Short": 2, "ComplexFloat": 8, "ComplexDouble": 16}
DTYPES: dict[str, tuple[int, int]] = {
    **{n: (int(d), int(schema.DTYPE_SIZE[d])) for n, d in _C10_DTYPES.items()},
    **{n: (int(schema.DType.unknown), size) for n, size in _C10_OTHER_SIZES.items()},
}
STATES = {"scheduled": 0, "started": 1, "completed": 2}  # an entry's state; any other is 3


@lru_cache(maxsize=65536)
def parse_name(profiling_name: str) -> tuple[int, int, bool]:
    """``"nccl:send 0->1"`` → (op kind or -1 if c4d has none, peer group rank or -1, uses output size)."""
    _, _, rest = profiling_name.partition(":")
    parts = (rest or profiling_name).split(" ")
    op = OP_NAMES.get(parts[0])
    kind = -1 if op is None else int(op)
    peer = -1
    if len(parts) == 2 and op in (Op.Send, Op.Recv):
        _, sep, b = parts[1].partition("->" if op == Op.Send else "<-")
        if sep and b.lstrip("-").isdigit():
            peer = int(b)
    return kind, peer, op == Op.ReduceScatter


def _numel(sizes: Any) -> int:
    try:  # dimensions must be ints: a list among them would make math.prod repeat it
        return sum(math.prod(map(index, dims)) for dims in sizes)
    except (TypeError, IndexError):
        return 0


def _first(xs: Any) -> str:
    return xs[0] if xs else ""


def _text(x: Any) -> str:
    return str(x) if type(x) in _ATOMS else ""


_G_0 = itemgetter(0)


# the entry fields read, in one C-level pass over the entries (itemgetter → tuples → one per field)
_SCALARS = (
    "collective_seq_id",
    "p2p_seq_id",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "state",
    "profiling_name",
    "process_group",
    "input_sizes",
    "input_dtypes",
)
_REQUIRED = frozenset(
    ("collective_seq_id", "p2p_seq_id", "time_created_ns", "state", "profiling_name", "process_group")
)
_DEFAULTS: dict[str, Any] = {"input_dtypes": ()}
_G_SCALARS = itemgetter(*_SCALARS)
_ATOMS = frozenset((int, float, bool, str, type(None)))


def _scalars(ents: list[dict[str, Any]]) -> list[Sequence[Any]]:
    """The _SCALARS of every entry, one sequence per field; optional keys absent (old versions)
    read as None. A required key absent raises KeyError."""
    try:
        return list(zip(*map(_G_SCALARS, ents), strict=True)) if ents else [()] * len(_SCALARS)
    except KeyError:
        get = {
            k: itemgetter(k) if k in _REQUIRED else methodcaller("get", k, _DEFAULTS.get(k)) for k in _SCALARS
        }
        return [list(map(get[k], ents)) for k in _SCALARS]


def _field(ents: list[dict[str, Any]], key: str, default: Any = None) -> list[Any]:
    """``key`` of every entry (``default`` where absent), C-level maps only."""
    try:
        return list(map(itemgetter(key), ents))
    except KeyError:
        return list(map(methodcaller("get", key, default), ents))


def _int_col(col: Sequence[Any]) -> np.ndarray:
    """Ints where None (pickle) or 0 (JSON) mean "not known" → int64 with 0. Converting never walks a
    value: a container among them raises TypeError."""
    n = len(col)
    try:
        return np.fromiter(col, dtype=np.int64, count=n)
    except TypeError:  # a None among them (or something that is not a number)
        if col.count(None) == n:
            return np.zeros(n, np.int64)
        return np.fromiter([0 if x is None else x for x in col], dtype=np.int64, count=n)


def _numels(sizes: Sequence[Any], limit: int | None = None, name: str = "dump") -> np.ndarray:
    """Elements of each entry's tensors (``input_sizes`` or ``output_sizes``); 0 where the sizes are
    missing or not sizes. Their structure is counted against ``limit`` before it is read."""
    n = len(sizes)
    try:  # the common case, every entry as many tensors of one rank: one numpy pass over the ints
        counts = set(map(len, sizes)) if n else set()
        if len(counts) == 1 and (t := counts.pop()):
            if limit is not None and n * t > limit:  # one long list shared by every entry
                check_walk([sizes], limit, name)
            dims = list(map(_G_0, sizes)) if t == 1 else list(chain.from_iterable(sizes))
            ranks = set(map(len, dims))
            if len(ranks) == 1 and (k := ranks.pop()):
                if limit is not None and n * t * k > limit:
                    check_walk([dims], limit, name)
                flat = np.fromiter(chain.from_iterable(dims), dtype=np.int64, count=n * t * k)
                return flat.reshape(n, t, k).prod(axis=2).sum(axis=1)
    except (TypeError, IndexError, ValueError, OverflowError):
        pass
    check_walk([sizes], limit, name)
    return np.fromiter(map(_numel, sizes), dtype=np.int64, count=n)


def _dtypes(in_dtypes: Sequence[Any]) -> list[str]:
    try:  # every entry with an input dtype: C-level maps only
        return list(map(_G_0, in_dtypes))
    except (TypeError, IndexError, KeyError):
        return list(map(_first, (x if isinstance(x, list | tuple) else () for x in in_dtypes)))


def _durations(durs: Sequence[Any]) -> np.ndarray:
    try:  # absent (old versions) or None: not known (NaN)
        dur = np.fromiter(durs, dtype=np.float64, count=len(durs))
    except (TypeError, ValueError):
        dur = np.array([x if type(x) in (int, float) else math.nan for x in durs], dtype=np.float64)
    return np.where(np.isfinite(dur), dur, np.nan)


def _strings(col: Sequence[Any]) -> bool:
    """Every value a string (hashing them walks nothing): one C-level pass."""
    try:
        "".join(col)
        return True
    except TypeError:
        return False


def _factorize(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Codes (int32) and the distinct values in order of first appearance, C-level maps only."""
    uni = dict.fromkeys(values)
    code = {v: i for i, v in enumerate(uni)}
    return np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values)), list(uni)


def columns(dump: dict[str, Any], limit: int | None = None, name: str = "dump") -> dict[str, Any]:
    """One dump's entries as numpy columns (string columns as codes + their unique values).

    The fields read are taken from the entries first (references only). Numbers are converted by
    numpy, which never walks a value; the rest (strings to hash unless they are strings, sizes,
    pg_config) has its structure counted against ``limit`` (``check_walk``) before it is read."""
    ents = dump.get("entries") or []
    n = len(ents)
    scal = _scalars(ents)
    cseq, pseq, t_created, t_started, t_completed, retired, state, pname, pgs, in_sizes, in_dt = scal
    pg_names = list(map(_G_0, pgs))
    dts = _dtypes(in_dt)
    first = ents[0].get("record_id", 0) if n else 0
    top = [dump.get("version", ""), dump.get("comm_lib_version", ""), dump.get("pg_config")]
    hashed = [c for c in (state, pname, pg_names, dts) if not _strings(c)]
    check_walk([top[:2], _pg_read(top[2]), *hashed], limit, name)
    pg_codes, pg_uni = _factorize(pg_names)
    first_of: Any = np.unique(pg_codes, return_index=True)[1] if n else []
    descs = {str(pg_names[i]): _text(pgs[i][1]) if len(pgs[i]) > 1 else "" for i in first_of}
    nm_codes, nm_uni = _factorize(pname)
    st_codes, st_uni = _factorize(state)
    use_out = np.array([parse_name(str(x))[2] for x in nm_uni], dtype=bool)
    numel = _numels(in_sizes, limit, name)
    if n and use_out.any():
        idx = np.flatnonzero(use_out[nm_codes]).tolist()
        numel[idx] = _numels([ents[i].get("output_sizes") for i in idx], limit, name)
    dt_codes, dt_uni = _factorize(dts)
    return {
        "n": n,
        "pg": pg_codes.astype(np.int32),
        "pg_names": [str(x) for x in pg_uni],
        "pg_desc": descs,
        "name": nm_codes.astype(np.int32),
        "names": [str(x) for x in nm_uni],
        "state": st_codes.astype(np.int32),
        "states": [str(x) for x in st_uni],
        "dtype": dt_codes.astype(np.int32),
        "dtypes": [str(x) for x in dt_uni],
        "cseq": _int_col(cseq),
        "pseq": _int_col(pseq),
        "first_record": int(first or 0),
        "retired": np.fromiter(retired, dtype=bool, count=n),
        "t_created": _int_col(t_created),
        "t_started": _int_col(t_started),
        "t_completed": _int_col(t_completed),
        "duration_ms": _durations(_field(ents, "duration_ms")),
        "numel": numel,
        "version": _text(top[0]),
        "comm_lib_version": _text(top[1] or ""),
        "pg_config": _pg_config(top[2]),
    }


def _pg_read(cfg: Any) -> list[Any]:
    """What ``_pg_config`` reads of each group: its key, name and ranks, not the rest (a damaged
    dump's group may hold the dump itself; torch's reader, and the native one, pass it by)."""
    if not isinstance(cfg, dict):
        return []
    return [(k, v.get("name"), v.get("ranks")) for k, v in cfg.items() if isinstance(v, dict)]


def _pg_config(cfg: Any) -> dict[str, list[int]]:
    """pg name → member ranks, from ``pg_config`` (ranks is a string like "[0, 1]"); empty lists dropped."""
    out: dict[str, list[int]] = {}
    if not isinstance(cfg, dict):
        return out
    for key, v in cfg.items():
        if not isinstance(v, dict):
            continue
        ranks = v.get("ranks")
        if isinstance(ranks, str):
            got = ranks_text(ranks)
        elif isinstance(ranks, list | tuple):
            got = _ranks_valid(ranks)
        else:
            got = None
        if got is not None:
            out[str(v.get("name", key))] = list(got)
    return out


@lru_cache(maxsize=4096)
def ranks_text(text: str) -> tuple[int, ...] | None:
    """A pg_config ranks string, parsed and checked once per process however many dumps repeat it."""
    if len(text) > 8 * MAX_RANK:  # "[0, 1, ...]" of MAX_RANK ranks is shorter
        return None
    ranks = _rank_list(text)
    return _ranks_valid(ranks) if isinstance(ranks, list | tuple) else None


def _ranks_valid(ranks: list[Any] | tuple[Any, ...]) -> tuple[int, ...] | None:
    """Sorted distinct ranks, or None unless 1..MAX_RANK ints in [0, MAX_RANK)."""
    if 0 < len(ranks) <= MAX_RANK and all(type(r) is int and 0 <= r < MAX_RANK for r in ranks):
        return tuple(sorted(set(ranks)))
    return None


def _rank_list(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
            return None
