"""Flight Recorder pickles read by ``libc4d_frread.so`` (native/frread): the pickle's bytes straight to
the columns the import uses, without building the entries as Python objects (what dominates the
Python reader: building and freeing every entry's dicts, lists and stack frames).

``read`` answers ``None`` where the library is missing, switched off (``C4D_FR_NATIVE=0``) or meets
something it leaves to the Python reader (an opcode or a field type it does not handle); the caller
then reads the file with the restricted unpickler, as before. Its refusals (a pickle that builds
or walks too much, a global, a truncated file) come back as a status for the caller to word.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

OK, FALLBACK, BUILT, EXPAND, TOO_MANY, TIME, ERROR, NOT_A_DUMP = range(8)
LIB_NAME = "libc4d_frread.so"


class _Limits(ctypes.Structure):
    _fields_ = [
        ("built_per_byte", ctypes.c_int64),
        ("free_bytes", ctypes.c_int64),
        ("budget_left", ctypes.c_int64),
        ("walk_limit", ctypes.c_int64),
        ("max_entries", ctypes.c_int64),
        ("check_every", ctypes.c_int64),
        ("deadline", ctypes.c_double),
        ("use_output", ctypes.c_char_p),
    ]


class _Info(ctypes.Structure):
    _fields_ = [
        ("status", ctypes.c_int32),
        ("nstr", ctypes.c_int32),
        ("n", ctypes.c_int64),
        ("a", ctypes.c_int64),
        ("b", ctypes.c_int64),
        ("c", ctypes.c_int64),
        ("blob_len", ctypes.c_int64),
        ("counts", ctypes.c_int32 * 8),
        ("first_record", ctypes.c_int64),
        ("msg", ctypes.c_char * 512),
    ]


# the columns frr_fill writes, in its order: (name, numpy dtype)
COLUMNS = (
    ("pg", np.int32),
    ("name", np.int32),
    ("state", np.int32),
    ("dtype", np.int32),
    ("cseq", np.int64),
    ("pseq", np.int64),
    ("retired", np.bool_),
    ("t_created", np.int64),
    ("t_started", np.int64),
    ("t_completed", np.int64),
    ("duration_ms", np.float64),
    ("numel", np.int64),
)


class _Cols(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name, _ in COLUMNS]


_lib: ctypes.CDLL | None = None
_tried = False


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    from c4d.util import native

    try:
        lib = ctypes.CDLL(str(native._find(LIB_NAME)))
        lib.frr_read.restype = ctypes.c_void_p
        lib.frr_read.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(_Limits),
            ctypes.POINTER(_Info),
        ]
        lib.frr_fill.restype = None
        lib.frr_fill.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Cols), ctypes.c_void_p, ctypes.c_void_p]
        lib.frr_free.restype = None
        lib.frr_free.argtypes = [ctypes.c_void_p]
        if lib.frr_version() != 1:
            raise OSError("another version of the library")
        _lib = lib
    except (native.NativeMissing, OSError, AttributeError) as e:
        log.debug("Flight Recorder dumps are read by Python's unpickler: %s", e)
    return _lib


def enabled() -> bool:
    """The native reader is built and not switched off (``C4D_FR_NATIVE=0``)."""
    return os.environ.get("C4D_FR_NATIVE", "1") != "0" and _load() is not None


@dataclass
class Limits:
    """The Python reader's limits for one dump (c4d/formats/fr_limits.py)."""

    built_per_byte: int
    free_bytes: int
    budget_left: int
    walk_limit: int
    max_entries: int
    check_every: int
    deadline: float
    use_output: tuple[str, ...]


@dataclass
class Read:
    """What the library answered: ``status`` and its details, or (OK) the columns and strings."""

    status: int
    n: int = 0
    a: int = 0
    b: int = 0
    c: int = 0
    msg: str = ""
    cols: dict[str, np.ndarray] | None = None
    tables: list[list[str]] | None = None  # pg names, pg descs, names, states, dtypes, top, pg_config
    first_record: int = 0


def read(data: bytes | bytearray | memoryview, limits: Limits, name: str = "dump") -> Read | None:
    """One dump's pickle → ``Read``; ``None``: read it the Python way (said in the debug log)."""
    lib = _load() if os.environ.get("C4D_FR_NATIVE", "1") != "0" else None
    if lib is None:
        return None
    lim = _Limits(
        limits.built_per_byte,
        limits.free_bytes,
        limits.budget_left,
        limits.walk_limit,
        limits.max_entries,
        limits.check_every,
        limits.deadline,
        "\n".join(limits.use_output).encode(),
    )
    info = _Info()
    arr = np.frombuffer(data, dtype=np.uint8)  # a view, read-only or not: its address for the call
    h = lib.frr_read(arr.ctypes.data, len(arr), ctypes.byref(lim), ctypes.byref(info))
    del arr
    msg = info.msg.decode("utf-8", "replace")
    if not h:
        if info.status == FALLBACK:
            log.debug("%s: read by Python's unpickler (the native reader does not handle %s)", name, msg)
            return None
        return Read(info.status, info.n, info.a, info.b, info.c, msg)
    try:
        n = int(info.n)
        cols = {k: np.empty(n, dtype=dt) for k, dt in COLUMNS}
        blob = np.empty(max(int(info.blob_len), 1), dtype=np.uint8)
        offs = np.empty(int(info.nstr) + 1, dtype=np.int64)
        ptrs = _Cols(*(cols[k].ctypes.data for k, _ in COLUMNS))
        lib.frr_fill(h, ctypes.byref(ptrs), blob.ctypes.data, offs.ctypes.data)
    finally:
        lib.frr_free(h)
    raw = blob.tobytes()
    o = offs.tolist()
    try:  # as Python's unpickler decodes a pickle's str
        strs = [raw[o[i] : o[i + 1]].decode("utf-8", "surrogatepass") for i in range(len(o) - 1)]
    except UnicodeDecodeError as e:
        log.debug("%s: read by Python's unpickler (a string that is not UTF-8: %s)", name, e)
        return None
    tables, at = [], 0
    for k in info.counts:
        tables.append(strs[at : at + k])
        at += k
    return Read(OK, n, cols=cols, tables=tables, first_record=int(info.first_record))
