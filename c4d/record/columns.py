"""Fields of 128-byte records read as contiguous columns.

A field read straight from record rows (``rows["seq"]``) is a strided pass over every record:
one cache line per row per field, a dozen passes for the fields an OPSUM check reads. Here
the rows' 16 little-endian words are transposed once (one pass), and a field is
cut from its word(s): an aligned 8-byte field is a view of its word's row, any other a pass over
one or a few contiguous words. Reads only, bit for bit what the structured view gives.
"""

from __future__ import annotations

import numpy as np

from c4d.record import schema

_WORDS = schema.RECORD_SIZE // 8
_BLOCK = 4096  # rows transposed at a time (512 KiB)


class Columns:
    """Read-only stand-in for a record array (``a[field]``, ``len(a)``) of one record dtype."""

    __slots__ = ("_cache", "dtype", "words")

    def __init__(self, words: np.ndarray, dtype: np.dtype, cache: dict | None = None):
        self.words = words  # (16, n) uint64, each row C-contiguous
        self.dtype = dtype
        self._cache: dict[tuple[int, str], np.ndarray] = {} if cache is None else cache

    @classmethod
    def of(cls, rows: np.ndarray, dtype: np.dtype | None = None) -> Columns:
        """``rows`` (any 128-byte record dtype, contiguous) as columns of ``dtype`` (theirs)."""
        n = len(rows)
        m = np.ascontiguousarray(rows).view(np.uint64).reshape(n, _WORDS)
        w = np.empty((_WORDS, n), np.uint64)
        for a in range(0, n, _BLOCK):  # blocks that stay in cache, faster than the whole transpose
            w[:, a : a + _BLOCK] = m[a : a + _BLOCK].T
        return cls(w, rows.dtype if dtype is None else dtype)

    def __len__(self) -> int:
        return self.words.shape[1]

    def as_kind(self, dtype: np.dtype) -> Columns:
        """The same rows read as another record dtype (what ``rows.view(dtype)`` is): fields
        already cut are shared (they are keyed by offset and type)."""
        return Columns(self.words, dtype, self._cache)

    def take(self, idx: np.ndarray) -> Columns:
        """The rows ``idx`` (indices or a mask): np.take / np.compress along the rows, faster
        than ``words[:, idx]`` (a chunk's summaries are sorted by communicator this way)."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            return Columns(np.compress(idx, self.words, axis=1), self.dtype)
        return Columns(np.take(self.words, idx, axis=1), self.dtype)

    def rows(self) -> np.ndarray:
        """The records themselves, typed as ``dtype`` (a copy: one transpose back)."""
        return np.ascontiguousarray(self.words.T).view(self.dtype).ravel()

    def __getitem__(self, name: str) -> np.ndarray:
        ft, off = self.dtype.fields[name][:2]  # type: ignore[index]  # (a record dtype has fields)
        key = (off, ft.str if not ft.shape else str(ft))
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._cut(ft, off)
        return got

    def _cut(self, ft: np.dtype, off: int) -> np.ndarray:
        n = len(self)
        size = ft.itemsize
        if not ft.shape and size == 8 and off % 8 == 0:
            return self.words[off // 8].view(ft)  # no copy
        w0, w1 = off // 8, -(-(off + size) // 8)
        if w1 - w0 == 1 and size in (1, 2, 4) and ft.kind in "iufb":  # a narrower number in one word
            return (self.words[w0] >> np.uint64(8 * (off % 8))).astype(f"<u{size}").view(ft)
        raw = np.ascontiguousarray(self.words[w0:w1].T).view(np.uint8)[:, off % 8 : off % 8 + size]
        return np.ascontiguousarray(raw).view(ft.base).reshape((n, *ft.shape))
