"""Where the native artifacts live: libc4d.so, simnccl's libnccl.so.2, the sim driver.

Looked up, in order: ``$C4D_NATIVE_DIR``; ``c4d/_native`` beside this file (a plain
CMake build writes there); ``c4d/_native`` under site-packages (a wheel or an editable
install puts it there).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path


class NativeMissing(RuntimeError):
    """The native part of c4d is not built or not installed."""


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get("C4D_NATIVE_DIR")
    if env:
        out.append(Path(env))
    out.append(Path(__file__).resolve().parents[1] / "_native")
    for key in ("platlib", "purelib"):
        out.append(Path(sysconfig.get_paths()[key]) / "c4d" / "_native")
    return out


def native_dir() -> Path:
    for d in _candidates():
        if (d / "libc4d.so").is_file() or (d / "simnccl" / "libnccl.so.2").is_file():
            return d
    raise NativeMissing(
        "c4d's native part is not built: run `pip install .` or "
        "`cmake -S . -B build && cmake --build build -j2`"
    )


def _find(rel: str) -> Path:
    for d in _candidates():
        p = d / rel
        if p.is_file():
            return p
    raise NativeMissing(
        f"{rel} not found under {', '.join(str(c) for c in _candidates())}: run `pip install .` "
        "or `cmake -S . -B build && cmake --build build -j2`"
    )


def lib_path() -> Path:
    """Absolute path of libc4d.so (what `c4d lib` prints)."""
    return _find("libc4d.so")


def simnccl_dir() -> Path:
    """Folder holding simnccl's libnccl.so.2."""
    return _find("simnccl/libnccl.so.2").parent


def simtrain_path() -> Path:
    """The native training-loop driver linked against libnccl.so.2."""
    return _find("bin/c4d-simtrain")


def libzmq_path() -> Path | None:
    """The libzmq that pyzmq's wheel bundles (what the shim loads), or None if pyzmq links a system one."""
    import glob

    import zmq

    site = Path(zmq.__file__).resolve().parent.parent
    hits = sorted(glob.glob(str(site / "pyzmq.libs" / "libzmq*.so*")))
    return Path(hits[0]) if hits else None
