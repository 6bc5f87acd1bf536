"""What c4d's own processes may unpickle from each other besides their own types: numpy arrays
and scalars as numpy pickles them, and a few builtins (c4d/master/engine_process.py's answers,
c4d/engine/shards.py's messages). Every other global is refused by their unpicklers."""

from __future__ import annotations

NUMPY_GLOBALS = frozenset(
    (m, n)
    for m in (
        "numpy",
        "numpy.core.numeric",
        "numpy._core.numeric",
        "numpy.core.multiarray",
        "numpy._core.multiarray",
    )
    for n in ("dtype", "ndarray", "_frombuffer", "_reconstruct", "scalar")
)
BUILTINS = frozenset({"set", "frozenset", "slice"})


def plain(module: str, name: str) -> bool:
    """A numpy array's or scalar's global, or an allowed builtin."""
    return (module, name) in NUMPY_GLOBALS or (module == "builtins" and name in BUILTINS)
