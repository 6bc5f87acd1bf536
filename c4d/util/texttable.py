"""Plain-text tables for terminals and pipes: a header line, then one line per row, never wrapped
(rich wraps cells to the terminal's width, which breaks "one line per incident" and cuts ids)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def lines(columns: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[str] = ()) -> list[str]:
    """Columns padded to their widest cell, two spaces apart; ``right`` columns right-aligned."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    ralign = set(right)

    def fmt(cells: Sequence[str]) -> str:
        out = [
            cell.rjust(w) if col in ralign else cell.ljust(w)
            for cell, w, col in zip(cells, widths, columns, strict=True)
        ]
        return "  ".join(out).rstrip()

    return [fmt(list(columns))] + [fmt(r) for r in rows]
