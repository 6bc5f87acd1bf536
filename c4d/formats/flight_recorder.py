"""Import PyTorch Flight Recorder dumps (one pickle per rank) as c4d records.

Pipeline: ``find_dumps`` (which files, which rank) → ``load_dump`` (the one guarded loader: a
restricted unpickler, one-line errors) → ``_columns`` (entries → numpy columns, per file, in
worker processes when there are many) → ``convert`` (vectorised: communicators, sequences, OP
records, per-communicator heartbeats) → ``to_records.assemble``.

Mapping (facts: shared/reference/flight-recorder-format.md; semantics: record.h):

* rank: the number at the end of the file name (``<prefix><rank>``, as torch's ``DebugInfoWriter``
  names them); the dumps hold no host name, so REGISTER.node is "".
* communicator: a process group, identified by its name (``process_group[0]``) plus its member
  ranks (``pg_config[name]["ranks"]``; inferred from which dumps use the name when ``pg_config``
  does not list it, as on gloo). ``comm_id`` = blake2b of both, equal on every rank; comm_rank =
  position in the sorted members (torch's own convention for p2p peers).
* collectives: ``seq = collective_seq_id - 1`` (FR counts from 1, c4d from 0, so a heartbeat's
  ``n_issued`` is the next seq). Entries sharing a ``collective_seq_id`` on one rank (a coalesced
  group and its ``coalesced`` end entry) are one op: bytes summed, IN_GROUP set.
* p2p (``send a->b`` / ``recv a<-b``, peers are group ranks): seq counted per (rank, comm,
  direction, peer) in dump order, P2P set. With a wrapped ring buffer the count starts at the
  oldest kept entry, so sender and receiver may not line up (FR keeps no per-peer counter).
* times: ``issue_ns`` = ``time_created_ns``; ``start_ns`` = ``time_discovered_started_ns`` (when the
  watchdog saw the start event: CUDA-event based, but only as fine as the watchdog's polling);
  ``end_ns`` = ``time_discovered_completed_ns``. Done = state "completed" or ``retired``.
* a rank whose dump shows no start times (``TORCH_NCCL_ENABLE_TIMING`` off, or gloo) has
  REGISTER.device_timing = 0 and "arrived" = "issued", as DESIGN.md says for ranks without device
  timing; otherwise a "scheduled" op has not arrived.
* every op not done is pending in that rank × communicator's HEARTBEAT at the dump time (the latest
  time any dump mentions), the oldest one as pend_*; see to_records for how the replay goes on.
"""

from __future__ import annotations

import ast
import gc
import json
import math
import os
import pickle
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any

import numpy as np

from c4d import schema
from c4d.formats import to_records as tr
from c4d.formats.to_records import FormatError, ImportOptions
from c4d.trace import RawTrace

Op = schema.Op
_PICKLE_PROTO = 0x80
_RANK_RE = re.compile(r"^(.*?)(\d+)$")
_JSON_RANK_RE = re.compile(r"^(.*?)(\d+)\.json$")
KNOWN_MAJOR = 2  # FR schema major version this reader knows ("2.x"); newer majors get a warning

# Globals a Flight Recorder dump may reference. torch's C++ pickler writes only dicts, lists,
# tuples, strings, numbers, bools and None (no GLOBAL opcode at all); an OrderedDict is allowed
# for dumps re-saved from Python. Anything else is refused before it is imported or called.
SAFE_GLOBALS = frozenset({("collections", "OrderedDict")})

_OP_NAMES: dict[str, Op] = {}
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
        _OP_NAMES[_n] = _op

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
_DTYPES: dict[str, tuple[int, int]] = {
    **{n: (int(d), int(schema.DTYPE_SIZE[d])) for n, d in _C10_DTYPES.items()},
    **{n: (int(schema.DType.unknown), size) for n, size in _C10_OTHER_SIZES.items()},
}
_STATES = {"scheduled": 0, "started": 1, "completed": 2}


class _DumpUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every global outside SAFE_GLOBALS is refused, never imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            import collections

            return collections.OrderedDict
        raise pickle.UnpicklingError(
            f"refers to the Python global {module}.{name}; a Flight Recorder dump holds only plain data, "
            "so it was not loaded (and nothing in it was run)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("uses a persistent id; a Flight Recorder dump never does")


def load_dump(path: str | os.PathLike) -> dict[str, Any]:
    """Load one rank's dump (pickle, or the JSON form) safely; ``FormatError`` with one line otherwise."""
    p = Path(path)
    gc_was = gc.isenabled()
    gc.disable()  # unpickling builds millions of containers: the collector only slows it down
    try:
        with open(p, "rb") as f:
            obj = json.load(f) if p.suffix == ".json" else _DumpUnpickler(f).load()
    except OSError as e:
        raise FormatError(f"{p}: {e.strerror or e}") from None
    except pickle.UnpicklingError as e:
        raise FormatError(f"{p}: {e}") from None
    except EOFError:
        raise FormatError(f"{p}: the pickle is cut short (truncated file)") from None
    except RecursionError:
        raise FormatError(f"{p}: the pickle nests too deeply to be a Flight Recorder dump") from None
    except Exception as e:  # corrupt opcodes raise anything from ValueError to KeyError: one line each
        raise FormatError(f"{p}: not a readable Flight Recorder dump ({type(e).__name__}: {e})") from None
    finally:
        if gc_was:
            gc.enable()
    if not isinstance(obj, dict) or "version" not in obj:
        raise FormatError(f"{p}: not a Flight Recorder dump (no top-level dict with a 'version' key)")
    if not isinstance(obj.get("entries", []), list):
        raise FormatError(f"{p}: 'entries' is a {type(obj['entries']).__name__}, not a list")
    return obj


@dataclass
class DumpFiles:
    """Which file holds which rank's dump, and what was skipped."""

    files: dict[int, Path]
    prefix: str
    skipped: list[str] = field(default_factory=list)


def find_dumps(directory: str | os.PathLike, prefix: str | None = None) -> DumpFiles:
    """Map rank → dump file: ``<prefix><rank>`` holding a pickle, else ``<prefix><rank>.json``."""
    d = Path(directory)
    try:
        names = sorted(e.name for e in os.scandir(d) if e.is_file())
    except OSError as e:
        raise FormatError(f"{d}: {e.strerror or e}") from None
    picks: dict[str, dict[int, Path]] = {}
    jsons: dict[str, dict[int, Path]] = {}
    skipped: list[str] = []
    for n in names:
        m = _RANK_RE.match(n)
        jm = _JSON_RANK_RE.match(n)
        if m and (prefix is None or m.group(1) == prefix):
            if _is_pickle(d / n):
                picks.setdefault(m.group(1), {})[int(m.group(2))] = d / n
            else:
                skipped.append(f"{n}: not a pickle")
        elif jm and (prefix is None or jm.group(1) == prefix):
            jsons.setdefault(jm.group(1), {})[int(jm.group(2))] = d / n
    pool = picks or jsons
    if not pool:
        raise FormatError(f"{d}: no Flight Recorder dumps (files named <prefix><rank> holding a pickle)")
    best = max(pool, key=lambda k: (len(pool[k]), k))
    files = dict(jsons.get(best, {}))
    files.update(picks.get(best, {}))
    for other, fs in pool.items():
        if other != best:
            skipped.append(f"{len(fs)} files with prefix {other!r} (the dumps use {best!r}; pass prefix=)")
    return DumpFiles(files=dict(sorted(files.items())), prefix=best, skipped=skipped)


def _is_pickle(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(1) == bytes([_PICKLE_PROTO])
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ columns
@lru_cache(maxsize=65536)
def parse_name(profiling_name: str) -> tuple[int, int, bool]:
    """``"nccl:send 0->1"`` → (op kind or -1 if c4d has none, peer group rank or -1, uses output size)."""
    _, _, rest = profiling_name.partition(":")
    parts = (rest or profiling_name).split(" ")
    op = _OP_NAMES.get(parts[0])
    kind = -1 if op is None else int(op)
    peer = -1
    if len(parts) == 2 and op in (Op.Send, Op.Recv):
        _, sep, b = parts[1].partition("->" if op == Op.Send else "<-")
        if sep and b.lstrip("-").isdigit():
            peer = int(b)
    return kind, peer, op == Op.ReduceScatter


def _numel(sizes: Any) -> int:
    try:  # one tensor is the common case: skip the map/sum
        return math.prod(sizes[0]) if len(sizes) == 1 else sum(map(math.prod, sizes))
    except (TypeError, IndexError):
        return 0


def _first(xs: Any) -> str:
    return xs[0] if xs else ""


_G_PG = itemgetter("process_group")
_G_0 = itemgetter(0)
_G_INPUT_SIZES = itemgetter("input_sizes")
_G_INPUT_DTYPES = itemgetter("input_dtypes")
_G_DURATION = itemgetter("duration_ms")


# scalar entry fields read in one C-level pass (itemgetter → tuples → one tuple per field)
_SCALARS = (
    "collective_seq_id",
    "p2p_seq_id",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "state",
    "profiling_name",
)
_REQUIRED = frozenset(("collective_seq_id", "p2p_seq_id", "time_created_ns", "state", "profiling_name"))
_G_SCALARS = itemgetter(*_SCALARS)


def _scalars(ents: list[dict[str, Any]]) -> list[Sequence[Any]]:
    """The _SCALARS of every entry, one sequence per field; optional keys absent (old versions)
    read as None. A required key absent raises KeyError."""
    try:
        return list(zip(*map(_G_SCALARS, ents), strict=True)) if ents else [()] * len(_SCALARS)
    except KeyError:
        get = {k: itemgetter(k) if k in _REQUIRED else methodcaller("get", k) for k in _SCALARS}
        return [list(map(get[k], ents)) for k in _SCALARS]


def _int_col(col: Sequence[Any]) -> np.ndarray:
    """Ints where None (pickle) or 0 (JSON) mean "not known" → int64 with 0."""
    try:
        return np.array(col, dtype=np.int64)
    except TypeError:  # a None among them
        a = np.array(col, dtype=object)
        a[a == None] = 0  # noqa: E711 - elementwise comparison with None
        return a.astype(np.int64)


def _numels(ents: list[dict[str, Any]], key: str = "input_sizes") -> np.ndarray:
    """Elements of each entry's tensors; 0 where the sizes are missing or not sizes."""
    n = len(ents)
    try:  # the common case, every entry one tensor: C-level maps only
        sizes = list(map(_G_INPUT_SIZES if key == "input_sizes" else itemgetter(key), ents))
        if n and all(map((1).__eq__, map(len, sizes))):
            return np.fromiter(map(math.prod, map(_G_0, sizes)), dtype=np.int64, count=n)
    except (KeyError, TypeError, IndexError, ValueError):
        sizes = [e.get(key) for e in ents]
    return np.fromiter(map(_numel, sizes), dtype=np.int64, count=n)


def _dtypes(ents: list[dict[str, Any]]) -> list[str]:
    try:  # every entry with an input dtype: C-level maps only
        return list(map(_G_0, map(_G_INPUT_DTYPES, ents)))
    except (KeyError, TypeError, IndexError):
        return list(map(_first, map(methodcaller("get", "input_dtypes", ()), ents)))


def _durations(ents: list[dict[str, Any]]) -> np.ndarray:
    try:
        dur = np.fromiter(map(_G_DURATION, ents), dtype=np.float64, count=len(ents))
    except (KeyError, TypeError, ValueError):  # absent (old versions) or None: not known
        get = methodcaller("get", "duration_ms", math.nan)
        dur = np.array([math.nan if x is None else x for x in map(get, ents)], dtype=np.float64)
    return np.where(np.isfinite(dur), dur, np.nan)


def _factorize(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Codes (int32) and the distinct values in order of first appearance, C-level maps only."""
    uni = dict.fromkeys(values)
    code = {v: i for i, v in enumerate(uni)}
    return np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values)), list(uni)


def _columns(dump: dict[str, Any]) -> dict[str, Any]:
    """One dump's entries as numpy columns (string columns as codes + their unique values)."""
    ents = dump.get("entries") or []
    n = len(ents)
    cseq, pseq, t_created, t_started, t_completed, retired, state, name = _scalars(ents)
    pgs = list(map(_G_PG, ents))
    pg_codes, pg_uni = _factorize(list(map(_G_0, pgs)))
    first_of: Any = np.unique(pg_codes, return_index=True)[1] if n else []
    descs = {str(pgs[i][0]): str(pgs[i][1]) if len(pgs[i]) > 1 else "" for i in first_of}
    nm_codes, nm_uni = _factorize(name)
    st_codes, st_uni = _factorize(state)
    use_out = np.array([parse_name(str(x))[2] for x in nm_uni], dtype=bool)
    numel = _numels(ents)
    if n and use_out.any():
        idx = np.flatnonzero(use_out[nm_codes])
        numel[idx] = [_numel(ents[i].get("output_sizes")) for i in idx.tolist()]
    dt_codes, dt_uni = _factorize(_dtypes(ents))
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
        "cseq": np.array(cseq, dtype=np.int64),
        "pseq": np.array(pseq, dtype=np.int64),
        "first_record": int(ents[0].get("record_id", 0) or 0) if n else 0,
        "retired": np.array(retired, dtype=bool),
        "t_created": _int_col(t_created),
        "t_started": _int_col(t_started),
        "t_completed": _int_col(t_completed),
        "duration_ms": _durations(ents),
        "numel": numel,
        "version": str(dump.get("version", "")),
        "comm_lib_version": str(dump.get("comm_lib_version", "") or ""),
        "pg_config": _pg_config(dump.get("pg_config")),
    }


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
            try:
                ranks = json.loads(ranks)
            except ValueError:
                try:
                    ranks = ast.literal_eval(ranks)
                except (ValueError, SyntaxError):
                    continue
        if isinstance(ranks, list | tuple) and ranks and all(isinstance(r, int) for r in ranks):
            out[str(v.get("name", key))] = sorted(set(ranks))
    return out


def _load_one(item: tuple[int, str]) -> tuple[int, dict[str, Any] | str]:
    """Worker: load + column one file; an error becomes its one-line message."""
    rank, path = item
    gc_was = gc.isenabled()
    gc.disable()  # until the dump is freed: a collection would walk its million fresh containers
    try:
        dump = load_dump(path)
        cols = _columns(dump)
        del dump  # freed by reference counting, never traversed by the collector
        return rank, cols
    except FormatError as e:
        return rank, str(e)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        what = f"entry lacks key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        return rank, f"{path}: not a Flight Recorder dump ({what})"
    finally:
        if gc_was:
            gc.enable()


def _load_all(files: dict[int, Path], workers: int | None) -> list[tuple[int, dict[str, Any] | str]]:
    items = [(r, str(p)) for r, p in files.items()]
    total = sum(p.stat().st_size for p in files.values())
    if workers is None:  # the cores this process may run on, for inputs worth a process pool (the
        # 1-minute load average lags by a minute: it counted the previous command as busy cores)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = min(8, cores) if len(items) >= 8 and total >= 16 << 20 else 1
    if workers > 1:
        import multiprocessing as mp

        try:
            ctx = mp.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
                return list(ex.map(_load_one, items, chunksize=max(1, len(items) // (workers * 4))))
        except (OSError, ValueError, RuntimeError):
            pass  # no fork here (or no processes allowed): load in this process
    return [_load_one(it) for it in items]


# ------------------------------------------------------------------------------------------ convert
def _remap(codes: np.ndarray, local: Sequence[Any], table: dict[Any, int]) -> np.ndarray:
    lut = np.array([table.setdefault(x, len(table)) for x in local], dtype=np.int32)
    return lut[codes] if len(codes) else codes


@dataclass
class _Merged:
    cols: dict[str, np.ndarray]
    pg_names: list[str]
    names: list[str]
    states: list[str]
    dtypes: list[str]
    pg_desc: dict[str, str]
    pg_config: dict[int, dict[str, list[int]]]
    versions: dict[int, str]
    lib: str
    first_record: dict[int, int]


_NUMERIC = ("cseq", "pseq", "retired", "t_created", "t_started", "t_completed", "duration_ms", "numel")


def _merge(loaded: list[tuple[int, dict[str, Any]]]) -> _Merged:
    tabs: dict[str, dict[Any, int]] = {"pg": {}, "name": {}, "state": {}, "dtype": {}}
    uni_key = {"pg": "pg_names", "name": "names", "state": "states", "dtype": "dtypes"}
    parts: dict[str, list[np.ndarray]] = {}
    pg_desc: dict[str, str] = {}
    pg_config: dict[int, dict[str, list[int]]] = {}
    versions: dict[int, str] = {}
    first_record: dict[int, int] = {}
    lib = ""
    for rank, c in loaded:
        n = c["n"]
        parts.setdefault("rank", []).append(np.full(n, rank, dtype=np.int32))
        for k, uk in uni_key.items():
            parts.setdefault(k, []).append(_remap(c[k], c[uk], tabs[k]))
        for k in _NUMERIC:
            parts.setdefault(k, []).append(c[k])
        pg_desc.update(c["pg_desc"])
        pg_config[rank] = c["pg_config"]
        versions[rank] = c["version"]
        first_record[rank] = c["first_record"]
        lib = lib or c["comm_lib_version"]
    cols = {k: np.concatenate(v) for k, v in parts.items()}

    def inv(t: dict[Any, int]) -> list[Any]:
        out: list[Any] = [None] * len(t)
        for k, i in t.items():
            out[i] = k
        return out

    return _Merged(
        cols,
        inv(tabs["pg"]),
        inv(tabs["name"]),
        inv(tabs["state"]),
        inv(tabs["dtype"]),
        pg_desc,
        pg_config,
        versions,
        lib,
        first_record,
    )


def convert(
    loaded: list[tuple[int, dict[str, Any]]],
    opts: ImportOptions,
    *,
    job: str = "",
    path: str = "",
    warnings: list[str] | None = None,
) -> RawTrace:
    """Per-rank column dicts (from ``_columns``) → a RawTrace of c4d records."""
    warns = warnings if warnings is not None else []
    m = _merge(loaded)
    c = m.cols
    dump_ranks = sorted(r for r, _ in loaded)
    nrow = len(c["rank"])

    # -- communicators: (rank, pg name) → (comm id, comm rank, nranks)
    npg = max(len(m.pg_names), 1)
    row_key = c["rank"].astype(np.int64) * npg + c["pg"]
    uniq, inv = np.unique(row_key, return_inverse=True)
    pairs = [(int(u) // npg, m.pg_names[int(u) % npg]) for u in uniq.tolist()]
    inferred: dict[str, list[int]] = {}
    for r, n in pairs:
        inferred.setdefault(n, []).append(r)
    member_sets: dict[tuple[int, str], list[int]] = {}
    for r, n in pairs:
        member_sets[(r, n)] = m.pg_config.get(r, {}).get(n) or sorted(inferred[n])
    for r in dump_ranks:  # groups a rank belongs to by its own pg_config, used or not
        for n, members in m.pg_config.get(r, {}).items():
            if r in members:
                member_sets.setdefault((r, n), members)
    comm_of: dict[tuple[int, str], tuple[int, int, int]] = {}
    comm_info: dict[str, dict[str, Any]] = {}
    for (r, n), members in member_sets.items():
        cid = tr.comm_id(f"fr:{n}:{members}")
        crank = members.index(r) if r in members else -1
        if crank < 0:
            warns.append(f"rank {r} uses process group {n!r} but is not among its ranks {_short(members)}")
        comm_of[(r, n)] = (cid, crank, len(members))
        comm_info[f"{cid:016x}"] = {"name": n, "desc": m.pg_desc.get(n, ""), "ranks": members}
    listed = sorted({x for mem in member_sets.values() for x in mem})
    no_dump = sorted(set(listed) - set(dump_ranks))
    if no_dump:
        warns.append(
            f"no dump for ranks {_short(no_dump)} (members of the process groups): "
            "c4d cannot tell whether they joined"
        )
    world = max([*listed, *dump_ranks]) + 1 if (listed or dump_ranks) else 0
    # every (rank, communicator): first the ones with entries (index = ``inv``), then pg_config-only ones
    keys = pairs + [k for k in comm_of if k not in set(pairs)]
    k_rank = np.array([r for r, _ in keys], dtype=np.int64)
    k_id = np.array([comm_of[k][0] for k in keys], dtype=np.uint64)
    k_crank = np.array([comm_of[k][1] for k in keys], dtype=np.int32)
    k_nranks = np.array([comm_of[k][2] for k in keys], dtype=np.int32)

    # -- per-row derived columns (one row per entry, all numpy)
    kind_of = np.array([parse_name(n)[0] for n in m.names] or [0], dtype=np.int16)
    peer_of = np.array([parse_name(n)[1] for n in m.names] or [0], dtype=np.int32)
    st = np.array([_STATES.get(s, 3) for s in m.states] or [0], dtype=np.int8)[c["state"]]
    kind = kind_of[c["name"]]
    rank = c["rank"]
    dsz = np.array([_DTYPES.get(d, (255, 1)) for d in m.dtypes] or [(255, 1)], dtype=np.int64)
    unknown_dt = sorted({d for d in m.dtypes if d and d not in _DTYPES})
    if unknown_dt:
        warns.append(f"dtypes c4d does not know, counted as 1 byte/element: {', '.join(unknown_dt)}")
    dur_ns = np.where(np.isnan(c["duration_ms"]), -1, c["duration_ms"] * 1e6).astype(np.int64)
    done = (st == 2) | c["retired"]
    t_start = c["t_started"]
    fill = (t_start == 0) & (c["t_completed"] > 0) & (dur_ns >= 0)
    t_start[fill] = c["t_completed"][fill] - dur_ns[fill]
    ranks_timed = np.unique(rank[(t_start > 0) | (st == 1) | (dur_ns >= 0)])
    timed = np.isin(rank, ranks_timed)
    arrived = done | (st == 1) | (t_start > 0) | ~timed

    unknown = kind < 0
    if unknown.any():
        counts = np.bincount(c["name"][unknown], minlength=len(m.names))
        skipped = [
            f"{m.names[i]}×{counts[i]}"
            for i in np.flatnonzero(counts)
            if not m.names[i].endswith("coalesced")
        ]
        if skipped:
            warns.append(f"entries of kinds c4d does not map, skipped: {', '.join(skipped[:8])}")
    p2p_row = (kind == Op.Send) | (kind == Op.Recv)
    coll_row = ~unknown & ~p2p_row
    bad = coll_row & (c["cseq"] < 1)
    if bad.any():
        warns.append(f"{int(bad.sum())} collective entries with collective_seq_id < 1 skipped")
        coll_row &= ~bad
    pi = inv.ravel().astype(np.int64) if nrow else np.zeros(0, np.int64)

    # -- collectives: seq = collective_seq_id - 1; entries sharing one (coalesced) are one op
    ci = np.flatnonzero(coll_row)
    cseq = c["cseq"][ci] - 1
    order = np.lexsort((cseq, pi[ci]))
    ci, cseq = ci[order], cseq[order]
    new_op = np.ones(len(ci), dtype=bool)
    new_op[1:] = (pi[ci][1:] != pi[ci][:-1]) | (cseq[1:] != cseq[:-1])
    heads = np.flatnonzero(new_op)
    c_ops = _Ops.take(ci[heads], cseq[heads], c, kind, peer_of, dsz, t_start, done, arrived, timed, pi)
    if len(heads) < len(ci):  # merge the coalesced groups
        nbytes = c["numel"][ci] * dsz[c["dtype"][ci], 1]
        c_ops.bytes = np.add.reduceat(nbytes, heads)
        c_ops.count = np.add.reduceat(c["numel"][ci], heads)
        c_ops.issue = np.minimum.reduceat(c["t_created"][ci], heads)
        c_ops.start = np.maximum.reduceat(t_start[ci], heads)
        c_ops.end = np.maximum.reduceat(c["t_completed"][ci], heads)
        c_ops.done = np.minimum.reduceat(done[ci].astype(np.int8), heads).astype(bool)
        c_ops.arrived = np.minimum.reduceat(arrived[ci].astype(np.int8), heads).astype(bool)
        size = np.diff(np.append(heads, len(ci)))
        c_ops.flags |= np.where(size > 1, int(schema.OpFlag.IN_GROUP), 0).astype(np.uint8)
        c_ops.group = np.where(size > 1, c_ops.seq + 1, 0)

    # -- p2p: seq per (rank, comm, direction, peer) in dump order; a batch shares a p2p_seq_id
    p2 = np.flatnonzero(p2p_row)
    direction = (kind[p2] == Op.Recv).astype(np.int64)
    ppeer = peer_of[c["name"][p2]].astype(np.int64)
    order = np.lexsort((p2, ppeer, direction, pi[p2]))
    p2, direction, ppeer = p2[order], direction[order], ppeer[order]
    start_grp = np.ones(len(p2), dtype=bool)
    start_grp[1:] = (
        (pi[p2][1:] != pi[p2][:-1]) | (direction[1:] != direction[:-1]) | (ppeer[1:] != ppeer[:-1])
    )
    idx = np.arange(len(p2))
    pseq_ = idx - np.maximum.accumulate(np.where(start_grp, idx, 0)) if len(p2) else idx
    p_ops = _Ops.take(p2, pseq_, c, kind, peer_of, dsz, t_start, done, arrived, timed, pi)
    p_ops.flags |= np.uint8(schema.OpFlag.P2P)
    o2 = np.lexsort((c["pseq"][p2], pi[p2]))
    kk = np.stack([pi[p2][o2], c["pseq"][p2][o2]]) if len(p2) else np.zeros((2, 0), np.int64)
    same = np.zeros(len(p2), dtype=bool)
    if len(p2) > 1:
        eq = (kk[:, 1:] == kk[:, :-1]).all(axis=0)
        same[o2[1:][eq]] = True
        same[o2[:-1][eq]] = True
    p_ops.flags |= np.where(same, int(schema.OpFlag.IN_GROUP), 0).astype(np.uint8)
    p_ops.group = np.where(same, c["pseq"][p2], 0)
    ops_ = _Ops.cat(c_ops, p_ops)
    ops_.flags |= np.where(ops_.start > 0, int(schema.OpFlag.DEVICE_TIMING), 0).astype(np.uint8)

    # -- OP records: the completed ops
    dn = ops_.done
    op_recs = tr.ops(
        int(dn.sum()),
        rank=ops_.rank[dn],
        comm_id=k_id[ops_.pi[dn]],
        seq=ops_.seq[dn],
        issue_ns=ops_.issue[dn],
        start_ns=ops_.start[dn],
        end_ns=ops_.end[dn],
        count=ops_.count[dn],
        bytes=ops_.bytes[dn],
        group_id=ops_.group[dn],
        comm_rank=k_crank[ops_.pi[dn]],
        comm_nranks=k_nranks[ops_.pi[dn]],
        peer=ops_.peer[dn],
        op=ops_.kind[dn],
        dtype=ops_.dtype[dn],
        flags=ops_.flags[dn],
    )

    # -- the state at the dump
    t_end = int(max(ops_.issue.max(initial=0), ops_.start.max(initial=0), ops_.end.max(initial=0)))
    wrapped = np.array([m.first_record.get(int(r), 0) > 0 for r in k_rank], dtype=bool)
    beats = _final_beats(
        ops_, len(c_ops.seq), len(keys), len(pairs), wrapped, k_rank, k_id, k_crank, k_nranks
    )

    regs = tr.registers(
        np.array(dump_ranks, dtype=np.int32),
        [""] * len(dump_ranks),
        world,
        opts,
        time_ns=int(ops_.issue.min()) if len(ops_.issue) else t_end,
        device_timing=np.isin(dump_ranks, ranks_timed).astype(np.uint8),
        nccl_version=tr.nccl_version_code(m.lib),
        job=job,
    )
    comm_recs = tr.comms(
        k_rank.astype(np.int32), k_id, k_crank, k_nranks, time_ns=int(regs["time_ns"][0]) if len(regs) else 0
    )
    vers = sorted(set(m.versions.values()))
    if len(vers) > 1:
        warns.append(f"dumps of different FR versions: {', '.join(vers)}")
    for v in vers:
        try:
            if int(v.split(".")[0]) > KNOWN_MAJOR:
                warns.append(f"FR version {v} is newer than this reader knows (2.x); fields may differ")
        except ValueError:
            warns.append(f"FR version {v!r} is not major.minor")
    meta = {
        "source_format": "fr",
        "source_path": path,
        "fr": {
            "versions": vers,
            "comm_lib_version": m.lib,
            "ranks": len(dump_ranks),
            "ranks_without_dump": no_dump,
            "entries": int(nrow),
        },
        "comms": comm_info,
        "import": {"warnings": warns},
    }
    return tr.assemble(
        meta,
        regs=regs,
        comm_recs=comm_recs,
        op_recs=op_recs,
        final_beats=beats,
        t_end=t_end,
        opts=opts,
        path=path,
    )


@dataclass
class _Ops:
    """One row per op (collective or p2p) of every rank: the columns the records need."""

    pi: np.ndarray  # index of its (rank, communicator) key
    rank: np.ndarray
    seq: np.ndarray
    kind: np.ndarray
    peer: np.ndarray
    issue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    done: np.ndarray
    arrived: np.ndarray
    timed: np.ndarray
    bytes: np.ndarray
    count: np.ndarray
    dtype: np.ndarray
    flags: np.ndarray
    group: np.ndarray

    @classmethod
    def take(cls, rows, seq, c, kind, peer_of, dsz, t_start, done, arrived, timed, pi) -> _Ops:
        dt = c["dtype"][rows]
        return cls(
            pi=pi[rows],
            rank=c["rank"][rows],
            seq=np.asarray(seq, dtype=np.int64),
            kind=kind[rows],
            peer=peer_of[c["name"][rows]],
            issue=c["t_created"][rows],
            start=t_start[rows],
            end=c["t_completed"][rows],
            done=done[rows],
            arrived=arrived[rows],
            timed=timed[rows],
            bytes=c["numel"][rows] * dsz[dt, 1],
            count=c["numel"][rows],
            dtype=dsz[dt, 0],
            flags=np.zeros(len(rows), dtype=np.uint8),
            group=np.zeros(len(rows), dtype=np.int64),
        )

    @classmethod
    def cat(cls, a: _Ops, b: _Ops) -> _Ops:
        return cls(**{f: np.concatenate([getattr(a, f), getattr(b, f)]) for f in a.__dataclass_fields__})


def _final_beats(
    o: _Ops,
    n_coll: int,
    n_keys: int,
    n_used: int,
    wrapped: np.ndarray,
    k_rank: np.ndarray,
    k_id: np.ndarray,
    k_crank: np.ndarray,
    k_nranks: np.ndarray,
) -> np.ndarray:
    """One HEARTBEAT per rank × communicator describing the dump: counts and the oldest pending op.

    ``o``'s first ``n_coll`` rows are collectives. Ops complete in stream order, so ``n_done`` is the
    first collective not done (or all issued), likewise ``n_arrived``.
    """
    big = np.iinfo(np.int64).max
    cpi, cseq = o.pi[:n_coll], o.seq[:n_coll]
    n_issued = np.zeros(n_keys, np.int64)
    np.maximum.at(n_issued, cpi, cseq + 1)
    first_open = np.full(n_keys, big, np.int64)
    nd = ~o.done[:n_coll]
    np.minimum.at(first_open, cpi[nd], cseq[nd])
    n_done = np.minimum(first_open, n_issued)
    first_out = np.full(n_keys, big, np.int64)
    na = ~o.arrived[:n_coll]
    np.minimum.at(first_out, cpi[na], cseq[na])
    n_arrived = np.minimum(first_out, n_issued)
    arr_t = np.where(o.start > 0, o.start, np.where(o.timed, 0, o.issue))[:n_coll]
    last_arrive = np.zeros(n_keys, np.int64)
    np.maximum.at(last_arrive, cpi, np.where(o.arrived[:n_coll], arr_t, 0))
    last_done = np.zeros(n_keys, np.int64)
    np.maximum.at(last_done, cpi, np.where(o.done[:n_coll], o.end[:n_coll], 0))
    seen = np.zeros(n_keys, bool)
    seen[cpi] = True

    pend = np.flatnonzero(~o.done)
    pend = pend[np.lexsort((o.issue[pend], o.pi[pend]))]
    _, first = np.unique(o.pi[pend], return_index=True)
    oldest = pend[first]
    has_p = np.zeros(n_keys, bool)
    has_p[o.pi[oldest]] = True
    pick = np.full(n_keys, -1, np.int64)
    pick[o.pi[oldest]] = oldest
    sel_p = np.maximum(pick, 0)

    def at(col: np.ndarray, default: int) -> np.ndarray:
        return np.where(has_p, col[sel_p] if len(col) else default, default)

    p_start = at(o.start, 0)
    p_start = np.where(p_start > 0, p_start, np.where(at(o.arrived, 0).astype(bool), at(o.issue, 0), 0))
    pend_seq = np.where(has_p, at(o.seq, 0), 0).astype(np.uint64)
    pend_seq[~has_p] = schema.UINT64_MAX
    inflight = np.bincount(o.pi[pend][o.flags[pend] & schema.OpFlag.P2P != 0], minlength=n_keys)
    # a group only in pg_config (no entries): nothing issued, unless the ring buffer has wrapped
    keep = np.flatnonzero((np.arange(n_keys) < n_used) | seen | has_p | ~wrapped)
    return tr.heartbeats(
        len(keep),
        rank=k_rank[keep].astype(np.int32),
        comm_id=k_id[keep],
        n_issued=n_issued[keep],
        n_arrived=n_arrived[keep],
        n_done=n_done[keep],
        last_arrive_ns=last_arrive[keep],
        last_done_ns=last_done[keep],
        pend_seq=pend_seq[keep],
        pend_issue_ns=at(o.issue, 0)[keep],
        pend_start_ns=p_start[keep],
        comm_rank=k_crank[keep],
        comm_nranks=k_nranks[keep],
        pend_peer=at(o.peer, -1)[keep],
        pend_op=at(o.kind, 255)[keep].astype(np.uint8),
        pend_flags=at(o.flags, 0)[keep].astype(np.uint8),
        p2p_in_flight=inflight[keep],
    )


def _short(xs: list[int], n: int = 16) -> str:
    return str(xs) if len(xs) <= n else f"{xs[:n]}… ({len(xs)} ranks)"


def read(
    path: str | os.PathLike,
    opts: ImportOptions | None = None,
    *,
    prefix: str | None = None,
    workers: int | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> RawTrace:
    """A directory of dumps (or one dump file) → RawTrace. Unreadable files are skipped with a warning."""
    opts = opts or ImportOptions()
    p = Path(path)
    if p.is_dir():
        found = find_dumps(p, prefix)
        files, warns = found.files, list(found.skipped)
    else:
        m = _RANK_RE.match(p.name) or _JSON_RANK_RE.match(p.name)
        files, warns = {int(m.group(2)) if m else 0: p}, []
    loaded: list[tuple[int, dict[str, Any]]] = []
    for rank, res in _load_all(files, workers):
        if isinstance(res, str):
            warns.append(res)
        else:
            loaded.append((rank, res))
    if not loaded:
        raise FormatError(f"{p}: no readable Flight Recorder dump" + (f" ({warns[0]})" if warns else ""))
    rt = convert(
        loaded,
        opts,
        job=p.resolve().name if p.is_dir() else p.resolve().parent.name,
        path=str(p),
        warnings=warns,
    )
    if on_warning:
        for w in warns:
            on_warning(w)
    return rt
