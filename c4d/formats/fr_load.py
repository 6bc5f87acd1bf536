"""Finding and reading Flight Recorder dump files: the loader step, which knows no analysis.

``find_dumps`` maps ranks to files; ``load_all`` turns each into its columns (fr_columns), by the
native reader (c4d/formats/fr_native.py: pickle bytes → the same columns) where it is built and
takes the file, else by ``load_dump``: the one guarded loader of these untrusted pickles, a
restricted unpickler that refuses every global but ``collections.OrderedDict``, with one-line
errors. Both read within the same limits (fr_limits) and the import's budget; many large dumps
without the native reader are read by a process pool."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c4d.formats import fr_columns, fr_native
from c4d.formats.budget import RECORD_COST, Budget, BudgetError, human, rss_bytes
from c4d.formats.fr_limits import (
    BUILT_PER_BYTE,
    CHECK_EVERY,
    COLUMN_COST,
    ENTRY_COST,
    FREE,
    JSON_COST,
    MAX_RANK,
    built_too_much,
    expands,
    walk_limit,
)
from c4d.formats.to_records import FormatError

_PICKLE_PROTO = 0x80
_RANK_RE = re.compile(r"^(.*?)(\d+)$")
_JSON_RANK_RE = re.compile(r"^(.*?)(\d+)\.json$")

# Globals a Flight Recorder dump may reference. torch's C++ pickler writes only dicts, lists,
# tuples, strings, numbers, bools and None (no GLOBAL opcode at all); an OrderedDict is allowed
# for dumps re-saved from Python. Anything else is refused before it is imported or called.
SAFE_GLOBALS = frozenset({("collections", "OrderedDict")})


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


class _Guarded:
    """The dump's bytes as the C unpickler reads them. Every 256 KiB it reads, the import's clock and
    the memory built since the load began (resident size) are checked against BUILT_PER_BYTE times
    what it read: a pickle of opcodes that build far more than they weigh (empty containers, a byte
    each) is stopped while it builds."""

    def __init__(self, data: bytes, budget: Budget, name: str):
        self._data, self._pos, self._next = data, 0, CHECK_EVERY
        self._budget, self._name = budget, name
        self._rss0, self._left = rss_bytes(), budget.left()

    def _check(self) -> None:
        self._next = self._pos + CHECK_EVERY
        self._budget.check_time(self._name)
        grown = rss_bytes() - self._rss0
        limit = min(self._left, BUILT_PER_BYTE * self._pos + FREE)
        if grown > limit:
            raise built_too_much(self._name, grown, self._pos, limit)

    def peek(self, n: int = 0) -> bytes:
        if self._pos >= self._next:
            self._check()
        return self._data[self._pos : self._pos + CHECK_EVERY]

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


def load_dump(path: str | os.PathLike, budget: Budget | None = None) -> dict[str, Any]:
    """Load one rank's dump (pickle, or the JSON form) safely; ``FormatError`` with one line otherwise.

    Within ``budget``: what unpickling builds must fit what is left of it (``HostileFile`` otherwise);
    the clock is checked as it reads. What reading the entries costs is checked by ``fr_columns.columns``, on
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


def rank_of(name: str) -> int:
    """The rank a dump file's name gives (``<prefix><rank>`` or ``<prefix><rank>.json``); 0 if none."""
    m = _RANK_RE.match(name) or _JSON_RANK_RE.match(name)
    return int(m.group(2)) if m else 0


def _is_pickle(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(1) == bytes([_PICKLE_PROTO])
    except OSError:
        return False


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


def native_columns(p: Path, budget: Budget) -> dict[str, Any] | None:
    """``fr_columns.columns`` of one pickle, read by the native reader (c4d/formats/fr_native.py) within the
    same limits as ``load_dump`` and ``fr_columns.columns``; ``None`` where it leaves the file to them."""
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
            check_every=CHECK_EVERY,
            deadline=budget.deadline,
            use_output=fr_columns.USE_OUTPUT,
        ),
        str(p),
    )
    if r is None:
        return None
    if r.status == fr_native.BUILT:
        raise built_too_much(str(p), r.a, r.b, r.c)
    if r.status == fr_native.EXPAND:
        raise expands(str(p), r.c)
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
        if (got := fr_columns.ranks_text(text)) is not None:
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


def load_one(item: tuple[Any, ...]) -> tuple[int, dict[str, Any] | str | BudgetError]:
    """Worker: load + column one file within the budget it is given (rank, path[, budget]); an
    error becomes its one-line message, an import over its time budget the BudgetError."""
    rank, path = item[0], item[1]
    budget = (item[2] if len(item) > 2 else None) or Budget()
    gc_was = gc.isenabled()
    gc.disable()  # until the dump is freed: a collection would walk its million fresh containers
    try:
        cols = native_columns(Path(path), budget)
        if cols is None:
            dump = load_dump(path, budget)
            cols = fr_columns.columns(dump, walk_limit(Path(path).stat().st_size, budget), str(path))
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
    """``load_one`` after the import's time check (over time: the BudgetError, raised by ``_kept``
    in order, so a reading thread never raises past the others)."""
    try:
        item[2].check_time(item[1])
    except BudgetError as e:
        return item[0], e
    return load_one(item)


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


def load_all(
    files: dict[int, Path], workers: int | None, budget: Budget | None = None
) -> list[tuple[int, dict[str, Any] | str]]:
    """Every file's columns (or its one-line error) as (rank, columns | message), in ``files``' order:
    read in this process (on reading threads with the native reader), or by a process pool for
    inputs worth one (``workers``: None to decide from their size and the cores)."""
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
                done = ex.map(load_one, jobs, chunksize=chunk)
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
