"""Values looked up in a sorted array with one search of them all: where each is (clamped to the
array) and whether it is there. The engine, the intake and the agent keep their known ids, keys
and sizes this way, sorted, instead of a dict lookup per record."""

from __future__ import annotations

import numpy as np


def find_sorted(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pos, hit): ``keys[pos[i]] == values[i]`` where ``hit[i]``; ``pos`` is a valid index of
    ``keys`` whenever ``keys`` is not empty (then every ``hit`` is False and ``pos`` 0)."""
    if not len(keys):
        return np.zeros(len(values), np.intp), np.zeros(len(values), bool)
    pos = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return pos, keys[pos] == values
