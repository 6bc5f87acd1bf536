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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("c4d.heap")

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
