"""Which of its node summaries an agent sends: the slow judge's window sample, taken at the node.

The master keeps a bounded sample of each communicator's ops per slow window
(c4d/engine/sampling.py) and drops the rest once read for progress. A node agent knows every
op of its node-local communicators, so it takes the same sample itself (the same hash of seq,
the shift from the same pace rule on its node's clock) and sends only those ops: at 16,384
ranks the tensor-parallel all-reduces were three quarters of the master's records. Each
flush also sends every communicator's last op, so the master's progress (what the wait-for
graph and the live view read) is as current as without the sample. Each row carries the
shift it was chosen at (OPSUM ``sample_shift``): a row outside its own sample is that
progress row, and the master does not keep it for the slow judge.

The shift may differ from the master's own by one near a boundary of the pace rule (windows
on the node's clock, not the master's): the master then judges from half or twice as many
ops, each a sample of the whole window, and its own sample still bounds what it keeps.
"""

from __future__ import annotations

import numpy as np

from c4d.engine.sampling import WindowSampler, sampled
from c4d.record.schema import DEFAULT_BW_CHECK_PERIOD_S


class SummarySample:
    """Per node-local communicator (by comm id): its window sample (one WindowSampler for all)."""

    def __init__(self, cap: int, period_s: float | None = None) -> None:
        """``cap``: ops a communicator keeps per window (C4D_SLOW_WINDOW_OPS; 0: send every op);
        ``period_s``: the slow window, when known apart from the job's registration."""
        self.sampler = WindowSampler(cap)
        self.period_s = period_s
        self.idx: dict[int, int] = {}
        self.free: list[int] = []

    def period(self, job_period_s: float | None) -> None:
        """The job's slow window (its ranks' C4D_CONN_BW_CHECK_PERIOD, from REGISTER)."""
        p = self.period_s or job_period_s or DEFAULT_BW_CHECK_PERIOD_S
        self.sampler.period_ns = int(float(p) * 1e9)

    def pick(self, rows: np.ndarray) -> np.ndarray:
        """OPSUM rows of one flush (each communicator's rows one run, in seq order) -> the rows
        to send, ``sample_shift`` set."""
        if self.sampler.cap <= 0 or not len(rows):
            return rows
        cid = rows["comm_id"]
        heads = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
        tails = np.r_[heads[1:], len(rows)]
        idx = np.array([self._index(int(c)) for c in cid[heads].tolist()], np.int64)
        seq = rows["seq"].astype(np.int64)
        self.sampler.select(rows["last_arrive_ns"].astype(np.int64), seq, idx, heads, tails)
        shift = np.repeat(self.sampler.shift[idx], tails - heads)
        send = sampled(seq, shift)
        send[tails - 1] = True  # each communicator's progress
        out = rows[send]
        out["sample_shift"] = shift[send]
        return out

    def forget(self, cids) -> None:
        for c in cids:
            i = self.idx.pop(int(c), None)
            if i is not None:
                self.sampler.forget(i)
                self.free.append(i)

    def _index(self, cid: int) -> int:
        i = self.idx.get(cid)
        if i is None:
            i = self.idx[cid] = self.free.pop() if self.free else len(self.idx)
        return i
