"""``c4d.hang_timeout``: staged hang thresholds from the training code (AIMaster's per-phase hangs).

    import c4d

    with c4d.hang_timeout(900):        # a checkpoint save may take 15 minutes
        save_checkpoint()

    @c4d.hang_timeout(-1)              # no hang diagnosis while evaluating
    def evaluate(): ...

While a block runs, a hang in which this rank is the one the others wait for is diagnosed
after ``seconds`` instead of the job's ``C4D_HANG_TIMEOUT``, or never for ``-1``; when it
ends, the enclosing block's value (or the job's) applies again. Blocks nest, from any
thread: the most recently entered block still open sets the value.

The value reaches the master through the preloaded shim: ``c4d_set_hang_timeout`` in
libc4d.so, found with ``ctypes.CDLL(None)`` (the process's global symbols, where
LD_PRELOAD put it). Without the shim this is a no-op (one debug line).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("c4d")

_lock = threading.Lock()
_open: list[tuple[int, int]] = []  # (token, µs) of the blocks open now, in the order they were entered
_tokens = itertools.count(1)
_setter: Callable[[int], None] | None = None
_looked_up = False


def _shim_setter() -> Callable[[int], None] | None:
    """c4d_set_hang_timeout of the preloaded shim, looked up once; None without the shim."""
    global _setter, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            fn = ctypes.CDLL(None).c4d_set_hang_timeout
        except (AttributeError, OSError):
            log.debug("c4d.hang_timeout: libc4d.so is not preloaded; staged timeouts are a no-op")
        else:
            fn.argtypes, fn.restype = [ctypes.c_int64], None
            _setter = fn
    return _setter


def _publish() -> None:
    """Tell the shim the value in force now (0: the job's own). Caller holds _lock."""
    fn = _shim_setter()
    if fn is not None:
        fn(_open[-1][1] if _open else 0)


def current() -> float | None:
    """The staged timeout in force in this process, in seconds (-1: disabled); None: the job's."""
    with _lock:
        if not _open:
            return None
        us = _open[-1][1]
    return -1.0 if us < 0 else us / 1e6


class hang_timeout(contextlib.ContextDecorator):  # lower case: used like a function
    """Use ``seconds`` (> 0, or -1 to disable) as this rank's hang timeout inside the block."""

    def __init__(self, seconds: float):
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"c4d.hang_timeout: seconds must be a number, not {type(seconds).__name__}")
        if seconds != -1 and not seconds > 0:
            raise ValueError(f"c4d.hang_timeout: seconds must be > 0 or -1 (disabled), not {seconds!r}")
        self.seconds = seconds
        self._us = -1 if seconds == -1 else max(1, round(seconds * 1e6))
        self._token: int | None = None

    def _recreate_cm(self) -> hang_timeout:
        return hang_timeout(self.seconds)  # each call of a decorated function gets its own block

    def __enter__(self) -> hang_timeout:
        if self._token is not None:
            raise RuntimeError("c4d.hang_timeout: this block is already open (use a new one)")
        with _lock:
            self._token = next(_tokens)
            _open.append((self._token, self._us))
            _publish()
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _open[:] = [e for e in _open if e[0] != self._token]
            _publish()
        self._token = None
