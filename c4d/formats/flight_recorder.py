"""Import PyTorch Flight Recorder dumps (one pickle per rank) as c4d records.

Pipeline: ``find_dumps`` (which files, which rank) → ``_native_columns`` (the native reader,
c4d/formats/fr_native.py: pickle bytes → the same columns, within the same limits) or, for a dump
it leaves alone or without the library, ``load_dump`` (the guarded loader: a restricted unpickler,
one-line errors) → ``_columns`` (entries → numpy columns, per file, in worker processes when
there are many) → ``convert`` (vectorised: communicators, sequences, OP records,
per-communicator heartbeats) → ``to_records.assemble``.

Mapping (facts: docs/design.md, "PyTorch Flight Recorder dumps"; semantics: record.h):

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
  REGISTER.device_timing = 0 and "arrived" = "issued", as docs/design.md says for ranks without device
  timing; otherwise a "scheduled" op has not arrived.
* every op not done is pending in that rank × communicator's HEARTBEAT at the dump time (the latest
  time any dump mentions), the oldest one as pend_*; see to_records for how the replay goes on.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import json
import math
import os
import pickle
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import index, itemgetter, methodcaller
from pathlib import Path
from typing import Any

import numpy as np

from c4d import heap, schema
from c4d.formats import fr_match, fr_native
from c4d.formats import to_records as tr
from c4d.formats.budget import RECORD_COST, Budget, BudgetError, HostileFile, human, rss_bytes
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


# A dump's cost is counted as references: each reference to a shared object counts that object's
# whole structure again (what every reader that walks the entries pays); NODE_COST bytes each.
NODE_COST = 8
EXPAND_PER_BYTE = 64  # references per byte of pickle past which a dump is hostile (real ones: < 2)
BUILT_PER_BYTE = 64  # bytes of Python objects unpickling may build per byte (real dumps: < 16)
FREE = 64 << 20  # what any dump may expand to or build before those ratios count
ENTRY_COST = 512  # memory an entry (each reference in ``entries``) costs while its columns are made
COLUMN_COST = 128  # an entry's share of the columns kept per dump (13 numpy columns)
JSON_COST = 16  # json.load of a JSON dump: Python objects per byte of text, at worst
MAX_RANK = 1 << 17  # c4d.validate's C4D_MAX_RANKS: a rank number or group past it is not a job's
_CHECK_EVERY = 1 << 18  # bytes of pickle between two checks of the clock and the memory built


class _Guarded:
    """The dump's bytes as the C unpickler reads them. Every 256 KiB it reads, the import's clock and
    the memory built since the load began (resident size) are checked against BUILT_PER_BYTE times
    what it read: a pickle of opcodes that build far more than they weigh (empty containers, a byte
    each) is stopped while it builds."""

    def __init__(self, data: bytes, budget: Budget, name: str):
        self._data, self._pos, self._next = data, 0, _CHECK_EVERY
        self._budget, self._name = budget, name
        self._rss0, self._left = rss_bytes(), budget.left()

    def _check(self) -> None:
        self._next = self._pos + _CHECK_EVERY
        self._budget.check_time(self._name)
        grown = rss_bytes() - self._rss0
        limit = min(self._left, BUILT_PER_BYTE * self._pos + FREE)
        if grown > limit:
            raise _built_too_much(self._name, grown, self._pos, limit)

    def peek(self, n: int = 0) -> bytes:
        if self._pos >= self._next:
            self._check()
        return self._data[self._pos : self._pos + _CHECK_EVERY]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = len(self._data) - self._pos
        b = self._data[self._pos : self._pos + n]
        self._pos += len(b)
        if self._pos >= self._next:
            self._check()
        return b

    def readinto(self, buf: Any) -> int:
        b = self.read(len(buf))
        buf[: len(b)] = b
        return len(b)

    def readline(self) -> bytes:
        i = self._data.find(b"\n", self._pos)
        return self.read((i + 1 if i >= 0 else len(self._data)) - self._pos)


_EXPAND_STEP = 1 << 16  # references listed at once while counting


def expanded_size(root: Any, limit: int) -> int:
    """References in ``root``'s structure as if nothing in it were shared (a list two entries
    share counts twice), counted at C speed and stopping past ``limit``: the work any walk of
    the entries would do, known before one is done. Plain data only (what _DumpUnpickler builds)."""
    total = 1
    stack: list[list[Any]] = [[root]] if gc.is_tracked(root) else []
    while stack:
        chunk = stack.pop()
        try:
            least = sum(map(len, chunk))  # a lower bound of the chunk's references
        except TypeError:
            least = 0
        if total + least > limit:
            return total + least
        if least > _EXPAND_STEP and len(chunk) > 1:
            h = len(chunk) // 2
            stack.append(chunk[h:])
            stack.append(chunk[:h])
            continue
        refs = gc.get_referents(*chunk)
        total += len(refs)
        if total > limit:
            return total
        inner = list(filter(gc.is_tracked, refs))
        del refs
        for i in range(0, len(inner), 4096):
            stack.append(inner[i : i + 4096])
    return total


def load_dump(path: str | os.PathLike, budget: Budget | None = None) -> dict[str, Any]:
    """Load one rank's dump (pickle, or the JSON form) safely; ``FormatError`` with one line otherwise.

    Within ``budget``: what unpickling builds must fit what is left of it (``HostileFile`` otherwise);
    the clock is checked as it reads. What reading the entries costs is checked by ``_columns``, on
    the fields it reads, before it reads them."""
    p = Path(path)
    budget = budget or Budget()
    gc_was = gc.isenabled()
    gc.disable()  # unpickling builds millions of containers: the collector only slows it down
    try:
        size = p.stat().st_size
        if p.suffix == ".json":
            budget.fits(size * JSON_COST, f"{p}: a {human(size)} JSON dump")
            with open(p, "rb") as f:
                obj = json.load(f)
        else:
            budget.fits(size, f"{p}: a {human(size)} dump")
            obj = _DumpUnpickler(_Guarded(p.read_bytes(), budget, str(p))).load()  # type: ignore[arg-type]
    except FormatError:
        raise
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
    entries = obj.get("entries") or []
    budget.fits(len(entries) * ENTRY_COST, f"{p}: {len(entries):,} entries")
    return obj


def walk_limit(size: int, budget: Budget) -> int:
    """References reading a dump of ``size`` bytes may walk (``expanded_size``'s limit)."""
    return min(budget.left() // NODE_COST, EXPAND_PER_BYTE * size + FREE // NODE_COST)


def _check_walk(parts: list[Any], limit: int | None, name: str) -> None:
    """``HostileFile`` if reading ``parts`` (the values taken from the entries) would walk more than
    ``limit`` references: a value shared by many entries counts once per entry, as each read of it
    costs. Values c4d never reads (stack frames, pg_status) are never walked, so never counted."""
    if limit is None:
        return
    refs = expanded_size(parts, limit)
    if refs > limit:
        raise _expands(name, limit)


def _expands(name: str, limit: int) -> HostileFile:
    return HostileFile(
        f"{name}: its structure expands to more than {limit:,} references (shared parts counted each "
        f"time they are used; {EXPAND_PER_BYTE} a byte of pickle allowed, within what is left of "
        "--max-import-bytes): not read"
    )


def _built_too_much(name: str, grown: int, pos: int, limit: int) -> HostileFile:
    return HostileFile(
        f"{name}: unpickling it built {human(grown)} from {human(pos)} of pickle, over "
        f"the {human(limit)} allowed ({BUILT_PER_BYTE} bytes a byte, and within what is left "
        "of --max-import-bytes): not read"
    )


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
        if (m or jm) and int((m or jm).group(2)) >= MAX_RANK:  # type: ignore[union-attr]
            skipped.append(f"{n}: rank {(m or jm).group(2)} is past {MAX_RANK - 1}")  # type: ignore[union-attr]
            continue
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
                _check_walk([sizes], limit, name)
            dims = list(map(_G_0, sizes)) if t == 1 else list(chain.from_iterable(sizes))
            ranks = set(map(len, dims))
            if len(ranks) == 1 and (k := ranks.pop()):
                if limit is not None and n * t * k > limit:
                    _check_walk([dims], limit, name)
                flat = np.fromiter(chain.from_iterable(dims), dtype=np.int64, count=n * t * k)
                return flat.reshape(n, t, k).prod(axis=2).sum(axis=1)
    except (TypeError, IndexError, ValueError, OverflowError):
        pass
    _check_walk([sizes], limit, name)
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


def _columns(dump: dict[str, Any], limit: int | None = None, name: str = "dump") -> dict[str, Any]:
    """One dump's entries as numpy columns (string columns as codes + their unique values).

    The fields read are taken from the entries first (references only). Numbers are converted by
    numpy, which never walks a value; the rest (strings to hash unless they are strings, sizes,
    pg_config) has its structure counted against ``limit`` (``_check_walk``) before it is read."""
    ents = dump.get("entries") or []
    n = len(ents)
    scal = _scalars(ents)
    cseq, pseq, t_created, t_started, t_completed, retired, state, pname, pgs, in_sizes, in_dt = scal
    pg_names = list(map(_G_0, pgs))
    dts = _dtypes(in_dt)
    first = ents[0].get("record_id", 0) if n else 0
    top = [dump.get("version", ""), dump.get("comm_lib_version", ""), dump.get("pg_config")]
    hashed = [c for c in (state, pname, pg_names, dts) if not _strings(c)]
    _check_walk([top, *hashed], limit, name)
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
            got = _ranks_text(ranks)
        elif isinstance(ranks, list | tuple):
            got = _ranks_valid(ranks)
        else:
            got = None
        if got is not None:
            out[str(v.get("name", key))] = list(got)
    return out


@lru_cache(maxsize=4096)
def _ranks_text(text: str) -> tuple[int, ...] | None:
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


_USE_OUTPUT = tuple(n for n, op in _OP_NAMES.items() if op == Op.ReduceScatter)


_bufs = threading.local()


def _read_into(f: Any, size: int) -> memoryview:
    """The file's bytes in a buffer kept from one dump to the next (one per reading thread): a
    fresh one per dump would be pages the kernel maps and zeroes anew each time."""
    buf = getattr(_bufs, "buf", None)
    if buf is None or len(buf) < size:
        buf = _bufs.buf = bytearray(max(size, 2 * len(buf or b"")))
    view = memoryview(buf)[:size]
    got = f.readinto(view)
    return view[:got]


def _native_columns(p: Path, budget: Budget) -> dict[str, Any] | None:
    """``_columns`` of one pickle, read by the native reader (c4d/formats/fr_native.py) within the
    same limits as ``load_dump`` and ``_columns``; ``None`` where it leaves the file to them."""
    if p.suffix == ".json" or not fr_native.enabled():
        return None
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            budget.fits(size, f"{p}: a {human(size)} dump")
            data = _read_into(f, size)
    except OSError as e:
        raise FormatError(f"{p}: {e.strerror or e}") from None
    left = budget.left()
    r = fr_native.read(
        data,
        fr_native.Limits(
            built_per_byte=BUILT_PER_BYTE,
            free_bytes=FREE,
            budget_left=left,
            walk_limit=walk_limit(len(data), budget),
            max_entries=left // ENTRY_COST,
            check_every=_CHECK_EVERY,
            deadline=budget.deadline,
            use_output=_USE_OUTPUT,
        ),
        str(p),
    )
    if r is None:
        return None
    if r.status == fr_native.BUILT:
        raise _built_too_much(str(p), r.a, r.b, r.c)
    if r.status == fr_native.EXPAND:
        raise _expands(str(p), r.c)
    if r.status == fr_native.TOO_MANY:
        budget.fits(r.n * ENTRY_COST, f"{p}: {r.n:,} entries")
    elif r.status == fr_native.TIME:
        budget.check_time(str(p))
    elif r.status == fr_native.ERROR:
        raise FormatError(f"{p}: {r.msg}")
    elif r.status == fr_native.NOT_A_DUMP:
        raise FormatError(f"{p}: not a Flight Recorder dump ({r.msg})")
    if r.status != fr_native.OK or r.cols is None or r.tables is None:
        return None  # a limit the Python reader then meets itself
    pg_names, descs, names, states, dtypes, top, cfg = r.tables[:7]
    pg_config: dict[str, list[int]] = {}
    for name, text in zip(cfg[::2], cfg[1::2], strict=True):
        if (got := _ranks_text(text)) is not None:
            pg_config[name] = list(got)
    c = r.cols
    return {
        "n": r.n,
        "pg": c["pg"],
        "pg_names": pg_names,
        "pg_desc": dict(zip(pg_names, descs, strict=True)),
        "name": c["name"],
        "names": names,
        "state": c["state"],
        "states": states,
        "dtype": c["dtype"],
        "dtypes": dtypes,
        "cseq": c["cseq"],
        "pseq": c["pseq"],
        "first_record": r.first_record,
        "retired": c["retired"],
        "t_created": c["t_created"],
        "t_started": c["t_started"],
        "t_completed": c["t_completed"],
        "duration_ms": c["duration_ms"],
        "numel": c["numel"],
        "version": top[0],
        "comm_lib_version": top[1],
        "pg_config": pg_config,
    }


def _load_one(item: tuple[Any, ...]) -> tuple[int, dict[str, Any] | str | BudgetError]:
    """Worker: load + column one file within the budget it is given (rank, path[, budget]); an
    error becomes its one-line message, an import over its time budget the BudgetError."""
    rank, path = item[0], item[1]
    budget = (item[2] if len(item) > 2 else None) or Budget()
    gc_was = gc.isenabled()
    gc.disable()  # until the dump is freed: a collection would walk its million fresh containers
    try:
        cols = _native_columns(Path(path), budget)
        if cols is None:
            dump = load_dump(path, budget)
            cols = _columns(dump, walk_limit(Path(path).stat().st_size, budget), str(path))
            del dump  # freed by reference counting, never traversed by the collector
        return rank, cols
    except BudgetError as e:
        return rank, e
    except FormatError as e:
        return rank, str(e)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        what = f"entry lacks key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        return rank, f"{path}: not a Flight Recorder dump ({what})"
    finally:
        if gc_was:
            gc.enable()


def _reader_threads(dumps: int) -> int:
    """Threads for the native reader (its C++ runs without the GIL): the cores this process may
    run on, at most 4, when there are dumps enough to share; 1 for Python's unpickler."""
    if not fr_native.enabled() or dumps < 8:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores))


def _timed_load(item: tuple[Any, ...]) -> tuple[int, dict[str, Any] | str | BudgetError]:
    """``_load_one`` after the import's time check (over time: the BudgetError, raised by ``_kept``
    in order, so a reading thread never raises past the others)."""
    try:
        item[2].check_time(item[1])
    except BudgetError as e:
        return item[0], e
    return _load_one(item)


def _kept(res: tuple[int, Any], budget: Budget, path: Any) -> tuple[int, Any]:
    """Charge what a loaded dump keeps (its columns, the records they become); a worker's
    BudgetError refuses the import."""
    rank, cols = res
    if isinstance(cols, BudgetError):
        raise cols
    if isinstance(cols, dict):
        n = int(cols["n"])
        budget.charge(n * (COLUMN_COST + RECORD_COST), f"{path}: {n:,} entries")
    return rank, cols


def _load_all(
    files: dict[int, Path], workers: int | None, budget: Budget | None = None
) -> list[tuple[int, dict[str, Any] | str]]:
    budget = budget or Budget()
    items = [(r, str(p)) for r, p in files.items()]
    total = sum(p.stat().st_size for p in files.values())
    if workers is None:  # the cores this process may run on, for inputs worth a process pool (the
        # 1-minute load average lags by a minute: it counted the previous command as busy cores)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        # the native reader takes a few ms a dump: a pool's start and the columns sent back cost more
        worth = (1 << 30) if fr_native.enabled() else (16 << 20)
        workers = min(8, cores) if len(items) >= 8 and total >= worth else 1
    if workers > 1:  # (a process pool only here: without the native reader, or past 1 GiB of dumps)
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        try:
            ctx = mp.get_context("fork")
            # a worker only loads dumps (trees: no cycles to collect) and exits with the pool: the
            # collector, re-armed between dumps, would walk every object the worker holds
            ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=gc.disable)
        except (OSError, ValueError, RuntimeError):
            ex = None  # no fork here (or no processes allowed): load in this process
        if ex is not None:
            # each worker's dump within what was left when the import began; kept columns charged here
            jobs = [(r, p, budget) for r, p in items]
            path_of = dict(items)
            try:
                chunk = max(1, len(items) // (workers * 4))
                done = ex.map(_load_one, jobs, chunksize=chunk)
                return [_kept(res, budget, path_of[res[0]]) for res in done]
            finally:
                ex.shutdown(wait=True, cancel_futures=True)
    out = []
    gc_was = gc.isenabled()
    gc.disable()  # between two dumps too: each one's millions of allocations would trigger a collection
    try:
        threads = _reader_threads(len(items))
        # the native reader lets go of the GIL: with threads the cores read dumps side by side
        with ThreadPoolExecutor(max_workers=threads) if threads > 1 else contextlib.nullcontext() as tx:
            jobs = [(r, p, budget) for r, p in items]
            done = tx.map(_timed_load, jobs) if tx is not None else map(_timed_load, jobs)
            for (_r, p), res in zip(items, done, strict=True):
                out.append(_kept(res, budget, p))
    finally:
        if gc_was:
            gc.enable()
    return out


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
    # a dump's entries come in runs of one group (a whole dump of one, with a single group)
    uniq, _, pi = schema.unique_runs(c["rank"].astype(np.int64) * npg + c["pg"])
    pairs = [(int(u) // npg, m.pg_names[int(u) % npg]) for u in uniq.tolist()]
    inferred: dict[str, list[int]] = {}
    for r, n in pairs:
        inferred.setdefault(n, []).append(r)
    member_sets: dict[tuple[int, str], list[int]] = {}
    # the default group spans every rank of the job: where pg_config does not list it (gloo), ranks
    # up to the highest any dump or pg_config names, so a rank that left no dump is still a member
    top = max([*dump_ranks, *(max(mem) for cfg in m.pg_config.values() for mem in cfg.values() if mem)])
    spans: dict[str, list[int]] = {}  # per default group without a pg_config entry: its members
    for r, n in pairs:
        cfg = m.pg_config.get(r, {}).get(n)
        if cfg is None and m.pg_desc.get(n) == "default_pg":
            if n not in spans:
                spans[n] = sorted(set(inferred[n]) | set(range(top + 1)))
            cfg = spans[n]
        member_sets[(r, n)] = cfg or sorted(inferred[n])
    for r in dump_ranks:  # groups a rank belongs to by its own pg_config, used or not
        for n, members in m.pg_config.get(r, {}).items():
            if r in members:
                member_sets.setdefault((r, n), members)
    comm_of: dict[tuple[int, str], tuple[int, int, int]] = {}
    comm_info: dict[str, dict[str, Any]] = {}
    # each group once, however many of its members' dumps name it: (name, members) -> (comm id,
    # each member's position)
    groups: dict[tuple[str, tuple[int, ...]], tuple[int, dict[int, int]]] = {}
    for (r, n), members in member_sets.items():
        g = groups.get(gk := (n, tuple(members)))
        if g is None:
            at: dict[int, int] = {}
            for i, x in enumerate(members):
                at.setdefault(x, i)
            g = groups[gk] = (tr.comm_id(f"fr:{n}:{members}"), at)
        cid, at = g
        crank = at.get(r, -1)
        if crank < 0:
            warns.append(f"rank {r} uses process group {n!r} but is not among its ranks {_short(members)}")
        comm_of[(r, n)] = (cid, crank, len(members))
        comm_info[f"{cid:016x}"] = {"name": n, "desc": m.pg_desc.get(n, ""), "ranks": members}
    listed = sorted({x for _, mem in groups for x in mem})
    no_dump = sorted(set(listed) - set(dump_ranks))
    if no_dump:
        warns.append(
            f"no dump for ranks {_short(no_dump)} (members of the process groups): "
            "c4d cannot tell whether they joined"
        )
    world = max([*listed, *dump_ranks]) + 1 if (listed or dump_ranks) else 0
    # every (rank, communicator): first the ones with entries (index = ``pi``), then pg_config-only ones
    have = set(pairs)
    keys = pairs + [k for k in comm_of if k not in have]
    k_rank = np.array([r for r, _ in keys], dtype=np.int64)
    k_id = np.array([comm_of[k][0] for k in keys], dtype=np.uint64)
    k_crank = np.array([comm_of[k][1] for k in keys], dtype=np.int32)
    k_nranks = np.array([comm_of[k][2] for k in keys], dtype=np.int32)

    ops_, nc, ranks_timed = _op_rows(m, pi, warns)
    m.cols.clear()  # the entries' columns are done with: what follows reuses their memory
    del c, pi

    # -- the collectives matched across ranks (c4d/formats/fr_match.py): ops some member never
    # issued are not done, whatever their entries say; disagreements, lost and late ranks found
    u_ids, k_ci = np.unique(k_id, return_inverse=True)
    k_ci = k_ci.ravel()
    info = [comm_info[f"{int(i):016x}"] for i in u_ids]
    # a (rank, communicator) is one key: those of a wrapped ring buffer without a collective left
    wrapped = np.array([m.first_record.get(r, 0) > 0 for r in k_rank.tolist()], dtype=bool)
    has_rows = np.zeros(len(k_rank), dtype=bool)
    has_rows[ops_.pi[:nc]] = True
    no_rows = np.flatnonzero(wrapped & ~has_rows)
    unknown = set(zip(k_rank[no_rows].tolist(), k_ci[no_rows].tolist(), strict=True))
    matched = fr_match.check(
        comms=fr_match.Comms(u_ids, [i["name"] for i in info], [i["ranks"] for i in info]),
        cidx=k_ci[ops_.pi[:nc]],
        rank=ops_.rank[:nc],
        seq=ops_.seq[:nc],
        kind=ops_.kind[:nc],
        count=ops_.count[:nc],
        dtype=ops_.dname[:nc],
        dtype_names=m.dtypes,
        issue=ops_.issue[:nc],
        done=ops_.done[:nc],
        dump_ranks=dump_ranks,
        unknown_ranks=unknown,
        timed_ranks=set(ranks_timed.tolist()),
    )
    ops_.done[:nc] = matched.done
    # a send or recv whose peer never issued its side cannot have completed either (ranks whose ring
    # buffer wrapped are left out: their p2p counts start at the oldest entry kept)
    p_never = fr_match.p2p_unissued(
        comms=fr_match.Comms(u_ids, [i["name"] for i in info], [i["ranks"] for i in info]),
        cidx=k_ci[ops_.pi[nc:]],
        rank=ops_.rank[nc:],
        recv=ops_.kind[nc:] == Op.Recv,
        peer=ops_.peer[nc:],
        seq=ops_.seq[nc:],
        counted={r for r in dump_ranks if m.first_record.get(r, 0) == 0},
    )
    claimed = int((p_never & ops_.done[nc:]).sum())
    ops_.done[nc:] &= ~p_never
    if matched.unissued_ops or claimed:
        warns.append(
            f"{matched.unissued_ops + claimed} op(s) marked done in their dumps were never issued by some "
            "member of their group (or, for a send or recv, by its peer): taken as not completed"
        )

    # -- OP records: the completed ops
    # in the order the replay takes them (when each ended), so assemble need not reorder the records
    dn = np.flatnonzero(ops_.done)
    t_rec = np.maximum(np.maximum(ops_.issue[dn], ops_.start[dn]), ops_.end[dn])
    dn = dn[np.argsort(t_rec, kind="stable")]
    op_recs = tr.OpColumns(
        len(dn),
        dict(
            rank=ops_.rank,
            comm_id=k_id[ops_.pi],
            seq=ops_.seq,
            issue_ns=ops_.issue,
            start_ns=ops_.start,
            end_ns=ops_.end,
            count=ops_.count,
            bytes=ops_.bytes,
            group_id=ops_.group,
            comm_rank=k_crank[ops_.pi],
            comm_nranks=k_nranks[ops_.pi],
            peer=ops_.peer,
            op=ops_.kind,
            dtype=ops_.dtype,
            flags=ops_.flags,
        ),
        rows=dn,
    )

    # -- the state at the dump
    t_end = int(max(ops_.issue.max(initial=0), ops_.start.max(initial=0), ops_.end.max(initial=0)))
    beats = _final_beats(ops_, nc, len(keys), len(pairs), wrapped, k_rank, k_id, k_crank, k_nranks)

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
            "findings": matched.findings,
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


def _op_rows(m: _Merged, pi: np.ndarray, warns: list[str]) -> tuple[_Ops, int, np.ndarray]:
    """The entries (``m.cols``, one row each; ``pi``: each one's (rank, communicator) key) as ops:
    the collectives first (how many: the second value), then the p2p ops; the third value is the
    ranks whose dumps have device timing."""
    c = m.cols
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
    # ranks (file-name numbers, >= 0) with a start time, a started entry or a duration
    ranks_timed = np.flatnonzero(np.bincount(rank[(t_start > 0) | (st == 1) | (dur_ns >= 0)]))
    timed = np.zeros(int(rank.max(initial=-1)) + 1, bool)
    timed[ranks_timed] = True
    timed = timed[rank]
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

    # -- collectives: seq = collective_seq_id - 1; entries sharing one (coalesced) are one op
    ci = np.flatnonzero(coll_row)
    cseq = c["cseq"][ci] - 1
    cpi = pi[ci]
    if (order := _lexsort(cseq, cpi)) is not None:
        ci, cseq, cpi = ci[order], cseq[order], cpi[order]
    new_op = np.ones(len(ci), dtype=bool)
    new_op[1:] = (cpi[1:] != cpi[:-1]) | (cseq[1:] != cseq[:-1])
    heads = np.flatnonzero(new_op)
    nc = len(heads)

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

    # both kinds' rows taken at once (not each apart and then joined: one copy less of every column)
    o = _Ops.take(
        np.concatenate([ci[heads], p2]),
        np.concatenate([cseq[heads], pseq_]),
        c, kind, peer_of, dsz, t_start, done, arrived, timed, pi,
    )  # fmt: skip
    if nc < len(ci):  # merge the coalesced groups
        nbytes = c["numel"][ci] * dsz[c["dtype"][ci], 1]
        o.bytes[:nc] = np.add.reduceat(nbytes, heads)
        o.count[:nc] = np.add.reduceat(c["numel"][ci], heads)
        o.issue[:nc] = np.minimum.reduceat(c["t_created"][ci], heads)
        o.start[:nc] = np.maximum.reduceat(t_start[ci], heads)
        o.end[:nc] = np.maximum.reduceat(c["t_completed"][ci], heads)
        o.done[:nc] = np.minimum.reduceat(done[ci].astype(np.int8), heads).astype(bool)
        o.arrived[:nc] = np.minimum.reduceat(arrived[ci].astype(np.int8), heads).astype(bool)
        size = np.diff(np.append(heads, len(ci)))
        o.flags[:nc] |= np.where(size > 1, int(schema.OpFlag.IN_GROUP), 0).astype(np.uint8)
        o.group[:nc] = np.where(size > 1, o.seq[:nc] + 1, 0)

    o.flags[nc:] |= np.uint8(schema.OpFlag.P2P)
    o2 = np.lexsort((c["pseq"][p2], pi[p2]))
    kk = np.stack([pi[p2][o2], c["pseq"][p2][o2]]) if len(p2) else np.zeros((2, 0), np.int64)
    same = np.zeros(len(p2), dtype=bool)
    if len(p2) > 1:
        eq = (kk[:, 1:] == kk[:, :-1]).all(axis=0)
        same[o2[1:][eq]] = True
        same[o2[:-1][eq]] = True
    o.flags[nc:] |= np.where(same, int(schema.OpFlag.IN_GROUP), 0).astype(np.uint8)
    o.group[nc:] = np.where(same, c["pseq"][p2], 0)
    o.flags |= np.where(o.start > 0, int(schema.OpFlag.DEVICE_TIMING), 0).astype(np.uint8)
    return o, nc, ranks_timed


def _lexsort(minor: np.ndarray, major: np.ndarray) -> np.ndarray | None:
    """``np.lexsort((minor, major))``, or None where the rows are in that order already (the
    dumps of one process group list its collectives in order)."""
    if len(major) < 2:
        return None
    same = major[1:] == major[:-1]
    if ((major[1:] > major[:-1]) | (same & (minor[1:] >= minor[:-1]))).all():
        return None
    return np.lexsort((minor, major))


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
    dname: np.ndarray  # index of the c10 dtype name (Float, Double, ...) in _Merged.dtypes
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
            dname=dt,
            flags=np.zeros(len(rows), dtype=np.uint8),
            group=np.zeros(len(rows), dtype=np.int64),
        )


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
    budget: Budget | None = None,
) -> RawTrace:
    """A directory of dumps (or one dump file) → RawTrace, within ``budget`` (c4d.formats.budget).
    Unreadable files, and dumps built to cost far more than they weigh, are skipped with a warning."""
    opts = opts or ImportOptions()
    budget = budget or Budget()
    heap.keep_freed_blocks()  # the columns' many large temporaries reuse freed pages (c4d/heap.py)
    p = Path(path)
    if p.is_dir():
        found = find_dumps(p, prefix)
        files, warns = found.files, list(found.skipped)
    else:
        m = _RANK_RE.match(p.name) or _JSON_RANK_RE.match(p.name)
        files, warns = {int(m.group(2)) if m else 0: p}, []
    with heap.without_huge_pages():  # the import writes its arrays once (c4d/heap.py)
        loaded: list[tuple[int, dict[str, Any]]] = []
        for rank, res in _load_all(files, workers, budget):
            if isinstance(res, str):
                warns.append(res)
            else:
                loaded.append((rank, res))
        if not loaded:
            raise FormatError(f"{p}: no readable Flight Recorder dump" + (f" ({warns[0]})" if warns else ""))
        budget.check_time(str(p))
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
