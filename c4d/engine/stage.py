"""Staged hang thresholds: what the training code said about its own hangs.

``with c4d.hang_timeout(seconds):`` in a rank (AIMaster's per-phase hang detection) sends a
STAGE record: from then on, a RankNonCommHang in which that rank is one the others wait for
is diagnosed after its staged timeout instead of T, or not at all for ``-1``, until the
code leaves the block (a STAGE record with 0). A slow checkpoint save or a long evaluation
is then not called a hang, and a real hang inside it still is, after the longer timeout.

Times are the master's (the tick stamp the record was fed with), so a replay of the trace
reproduces the live decisions. Only RankNonCommHang is affected: a transfer that stopped
(RankCommHang) or a rank that went silent (RankLost) is not what a slow phase looks like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DISABLED = -1


@dataclass
class _Stage:
    timeout_ns: int  # > 0: staged T; DISABLED: no hang diagnosis
    since_ns: int  # master time the stage began (first seen)
    generation: int


class Stages:
    """Per rank: its current staged timeout, and when its last stage ended."""

    def __init__(self) -> None:
        self._active: dict[int, _Stage] = {}
        self._ended: dict[int, int] = {}  # rank → master time its last stage ended
        self._gen: dict[int, int] = {}

    def feed(self, rows: np.ndarray, recv: np.ndarray) -> None:
        """STAGE rows (schema.STAGE) in arrival order, with the master time each was fed at."""
        for rec, t in zip(rows, recv.tolist(), strict=True):
            g, gen, us = int(rec["rank"]), int(rec["generation"]), int(rec["hang_timeout_us"])
            if gen <= self._gen.get(g, 0) and gen != 0:
                continue  # a repeat, or an older value arriving late
            self._gen[g] = gen
            if us == 0:
                if g in self._active:
                    del self._active[g]
                    self._ended[g] = int(t)
            else:
                cur = self._active.get(g)
                since = cur.since_ns if cur is not None else int(t)
                self._active[g] = _Stage(DISABLED if us < 0 else us * 1000, since, gen)

    def adjust(self, ranks: tuple[int, ...], T: int, start_ns: int, now: int) -> tuple[int, int] | None:
        """(T, start) to count a RankNonCommHang of culprits ``ranks`` with, or None: not a hang yet.

        Per culprit: its staged timeout while a stage lasts (None if -1); otherwise the job's T,
        counted from the end of its last stage if that came after the waiting began. The
        culprit that makes the hang longest-overdue sets the count.
        """
        if not any(g in self._active or g in self._ended for g in ranks):
            return T, start_ns
        best: tuple[float, int, int] | None = None
        for g in ranks:
            st = self._active.get(g)
            if st is not None and st.timeout_ns == DISABLED:
                continue
            t_g, s_g = (
                (st.timeout_ns, start_ns) if st is not None else (T, max(start_ns, self._ended.get(g, 0)))
            )
            over = (now - s_g) / t_g
            if best is None or over > best[0]:
                best = (over, t_g, s_g)
        return None if best is None else (best[1], best[2])

    def staged(self) -> dict[int, float]:
        """rank → staged timeout in seconds (-1: disabled), for ranks in a stage now."""
        return {
            g: (-1.0 if s.timeout_ns == DISABLED else s.timeout_ns / 1e9) for g, s in self._active.items()
        }
