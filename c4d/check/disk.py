"""DiskTest: write, fsync, read back, verify, clean up; report throughput.

The read is timed after asking the kernel to drop the file's pages (``posix_fadvise``), so it
measures the device rather than the page cache where the filesystem honours the hint.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import time

import numpy as np

from c4d.check.result import CheckResult, Status

CHUNK = 4 << 20


def _pattern(seed: int) -> bytes:
    # Random (incompressible, not deduplicable across runs) bytes; each chunk is stamped with its
    # index below so a block written to the wrong offset fails verification.
    return np.random.default_rng(seed).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()


def _chunk(base: bytes, i: int, n: int) -> bytes:
    stamp = i.to_bytes(8, "little")
    return (stamp + base[8:])[:n]


def disk_test(
    path: str, size_bytes: int, min_write_mbs: float = 0.0, min_read_mbs: float = 0.0
) -> CheckResult:
    """Test the filesystem holding directory ``path``. Never raises for an I/O problem: a
    read-only, full, missing or failing disk is a ``Failed`` result naming the error."""
    threshold = {"min_write_mbs": min_write_mbs, "min_read_mbs": min_read_mbs}
    size_bytes = max(int(size_bytes), 1)
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a directory"
        return CheckResult("DiskTest", path, Status.FAILED, None, threshold, f"{path} {what}")
    base = _pattern(int(time.time_ns() & 0xFFFFFFFF))
    nchunks = (size_bytes + CHUNK - 1) // CHUNK
    fd, name = -1, None
    stage = "create"
    try:
        fd, name = tempfile.mkstemp(prefix=".c4d-disktest-", dir=path)
        stage = "write"
        t0 = time.perf_counter()
        left = size_bytes
        for i in range(nchunks):
            n = min(CHUNK, left)
            view = memoryview(_chunk(base, i, n))
            while view:
                view = view[os.write(fd, view) :]
            left -= n
        stage = "fsync"
        os.fsync(fd)
        t_write = time.perf_counter() - t0
        os.close(fd)
        fd = -1
        stage = "read"
        fd = os.open(name, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        left, bad = size_bytes, None
        for i in range(nchunks):
            n = min(CHUNK, left)
            got = b""
            while len(got) < n:
                part = os.read(fd, n - len(got))
                if not part:
                    break
                got += part
            if got != _chunk(base, i, n) and bad is None:
                bad = i * CHUNK
            left -= n
        t_read = time.perf_counter() - t0
    except OSError as e:
        code = errno.errorcode.get(e.errno or 0, "error")
        return CheckResult(
            "DiskTest",
            path,
            Status.FAILED,
            {"error": code},
            threshold,
            f"{stage}: {e.strerror or e} [{code}]",
        )
    finally:
        if fd >= 0:
            os.close(fd)
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)
    mb = size_bytes / 1e6
    value = {
        "bytes": size_bytes,
        "write_mbs": round(mb / max(t_write, 1e-9), 1),
        "read_mbs": round(mb / max(t_read, 1e-9), 1),
    }
    detail = f"write {value['write_mbs']:.1f} MB/s, read {value['read_mbs']:.1f} MB/s"
    if bad is not None:
        return CheckResult(
            "DiskTest",
            path,
            Status.FAILED,
            value,
            threshold,
            f"data read back differs at byte {bad}; {detail}",
        )
    slow = []
    if value["write_mbs"] < min_write_mbs:
        slow.append(f"write below {min_write_mbs:g} MB/s")
    if value["read_mbs"] < min_read_mbs:
        slow.append(f"read below {min_read_mbs:g} MB/s")
    status = Status.FAILED if slow else Status.SUCCEED
    return CheckResult("DiskTest", path, status, value, threshold, "; ".join([*slow, detail]))
