"""The master's process keeps the large blocks it frees, to use them again, and collects
cyclic garbage rarely.

The engine works a chunk at a time through arrays of 1-16 MiB (a chunk's rows, their columns,
each kind's copy), and the slow judge through larger ones when a window closes; all are freed
soon after. glibc maps a block above its mmap threshold (128 KiB, raised as such blocks are
freed, to 32 MiB at most) afresh and unmaps it when freed, and gives the top of its heap back
beyond twice that threshold, so many of the next chunk's arrays are fresh pages the kernel
zeroes as they are first touched (huge pages with numpy's madvise): one more pass over their
bytes. Raising both thresholds serves them from the heap and keeps freed heap memory mapped, so
a chunk reuses the pages of the one before (the gain is in docs/performance.md). Memory held at
the peak is not given back, which is what the master needs again at the next peak anyway.

Python's cyclic collector runs a pass over the young objects every 700 containers allocated
(and not freed yet), and over every object (all of a large job's engine state) whenever a
tenth of them are new, which at a large job's record rate is a full pass every second or so.
The master's arrays are not containers and its objects form few
cycles (they are freed when their count drops), so a young pass every 50,000 and
the older generations 20 times rarer cost nothing of note and hold little garbage longer.

numpy asks the kernel for huge pages for each array of 4 MiB or more (madvise). Where the kernel
makes a huge page at first touch by compacting memory (transparent huge pages' ``defrag`` set to
``madvise``, the usual default) and memory is fragmented (a large process has just exited), that
first touch stalls. A process that reuses its arrays (the master) pays it once; an import writes
most of its arrays once, so ``without_huge_pages`` makes its arrays with small pages.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable, Iterator

import numpy as np

log = logging.getLogger("c4d.util.heap")

_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # blocks up to this come from the heap (glibc's own: 128 KiB rising to 32 MiB)
TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept mapped up to this

GC_THRESHOLDS = (50_000, 20, 20)  # Python's defaults: 700, 10, 10

_done = False


def keep_freed_blocks() -> bool:
    """Set glibc's thresholds for this process (once); False where the C library is not glibc."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator as it is
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        log.debug("mallopt refused the thresholds: the allocator as it is")
    _done = ok
    return ok


def collect_rarely() -> None:
    """Python's cyclic collector at GC_THRESHOLDS for this process (never lower than its own)."""
    now = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(now, GC_THRESHOLDS, strict=True)))


def _madvise_switch() -> Callable[[bool], bool] | None:
    """numpy's switch for asking huge pages (it answers the previous setting); None where absent."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)  # numpy 2 / numpy 1
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


@contextlib.contextmanager
def without_huge_pages() -> Iterator[None]:
    """numpy makes its arrays with small pages while the block runs (see the module docstring);
    numpy's setting is restored after it."""
    switch = _madvise_switch()
    if switch is None:
        yield
        return
    was = switch(False)
    try:
        yield
    finally:
        switch(was)
