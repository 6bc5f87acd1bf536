"""Node agents' summaries (OPSUM rows) read row by row into what the engine keeps of them.

Row by row, so how the stream is cut does not matter (a replay's 16 MiB pieces, a live
master's polls, the engine's chunks): what a summary becomes depends on its row alone. The
master's loop can therefore read them where it has the rows' columns already (the edge cut
them, c4d.record.columns): for an engine in a process of its own, whose process is the master's
bound while the loop waits half the time (c4d.master.engine_process), they travel read. The engine
then checks them, sorts them by communicator, puts their times on its clock and keeps them
(``ingest_summaries.SummaryIngest.feed``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from c4d.engine.ranks import RankTable
from c4d.engine.rows import COMPLETED, copy_rows, take
from c4d.record import schema
from c4d.record.columns import Columns
from c4d.record.opstats import busbw_factor, total_bytes

OPSUM = int(schema.Kind.OPSUM)
GAPS = np.dtype("<f4")
# the fields the engine checks, groups by and counts: (attribute, OPSUM field), in OPSUM's types
_IDS = (("cid", "comm_id"), ("seq", "seq"), ("rank", "rank"), ("comm_rank", "comm_rank"),
        ("comm_nranks", "comm_nranks"), ("version", "version"), ("time", "time_ns"),
        ("shift", "sample_shift"))  # fmt: skip
# (attribute, dtype) of what travels between processes, in order (the compute after them)
FIELDS: tuple[tuple[str, np.dtype], ...] = (
    ("pos", np.dtype("<i8")),
    *((name, schema.OPSUM[field]) for name, field in _IDS),
    ("done", COMPLETED),
)


class Summaries:
    """A batch's OPSUM rows: the fields the engine checks and groups by, and each as a
    COMPLETED row (times on its node's clock) with its members' compute."""

    __slots__ = ("cid", "comm_nranks", "comm_rank", "done", "gaps", "pos", "rank", "seq", "shift", "time",
                 "version")  # fmt: skip
    pos: np.ndarray  # int64: each summary's row in the rows it was read from
    cid: np.ndarray  # (_IDS: as the rows hold them)
    seq: np.ndarray
    rank: np.ndarray
    comm_rank: np.ndarray
    comm_nranks: np.ndarray
    version: np.ndarray
    time: np.ndarray
    shift: np.ndarray  # uint8: the agent's window sample the row was sent from (c4d/agent/sample.py)
    done: np.ndarray  # COMPLETED; last_arrive, first_arrive on the sender's clock
    gaps: np.ndarray  # float32 (k, OPSUM_MAX_MEMBERS): the members' compute, NaN beyond

    def __init__(
        self, pos: np.ndarray, ids: Sequence[np.ndarray], done: np.ndarray, gaps: np.ndarray
    ) -> None:
        self.pos, self.done, self.gaps = pos, done, gaps
        for (name, _), a in zip(_IDS, ids, strict=True):
            setattr(self, name, a)

    def ids(self) -> list[np.ndarray]:
        return [getattr(self, name) for name, _ in _IDS]

    def __len__(self) -> int:
        return len(self.pos)

    @classmethod
    def of(cls, raw: np.ndarray, cols: Columns | None = None, kind: np.ndarray | None = None) -> Summaries:
        """The OPSUM rows of ``raw`` (HEADER rows); ``cols``: their columns, when cut already
        (columns of other rows are not read); ``kind``: their kinds, when read already."""
        if cols is not None and len(cols) != len(raw):
            cols = None
        if kind is None:
            kind = cols["kind"] if cols is not None else raw["kind"]
        pos = np.flatnonzero(kind == OPSUM)
        if cols is not None:
            c = cols.take(pos) if len(pos) < len(raw) else cols
        else:
            c = Columns.of(take(raw, pos) if len(pos) < len(raw) else raw)
        return cls.read(c.as_kind(schema.OPSUM), pos)

    @classmethod
    def apart(
        cls, raw: np.ndarray, cols: Columns | None = None, summaries: Summaries | None = None
    ) -> tuple[np.ndarray, Summaries]:
        """A batch apart (``Engine.feed_apart``): its rows other than summaries, in order (the
        batch itself when it has none), and its summaries read (``summaries``: read already)."""
        kind = cols["kind"] if cols is not None and len(cols) == len(raw) else raw["kind"]
        sums = summaries if summaries is not None else cls.of(raw, cols, kind)
        return (take(raw, kind != OPSUM) if len(sums) else raw), sums

    @classmethod
    def read(cls, s: Columns, pos: np.ndarray) -> Summaries:
        """OPSUM columns ``s`` (rows ``pos`` of their batch) read."""
        m = len(s)
        n = s["comm_nranks"].astype(np.int64)
        op = s["op"]
        nbytes = s["bytes"].astype(np.int64)
        out = np.zeros(m, COMPLETED)
        out["seq"] = s["seq"].astype(np.int64)
        out["op"] = op
        out["bytes"] = nbytes
        L = s["last_arrive_ns"].astype(np.int64)
        out["last_arrive"] = L
        out["first_arrive"] = L - s["wait_max_ns"]  # the first arriver waits longest
        out["last"] = s["comm_rank"].astype(np.int64)
        out["margin"] = s["margin_ns"]
        transfer = s["transfer_ns"].astype(np.float64)
        out["transfer"] = s["transfer_ns"]
        size = total_bytes(op, nbytes, n)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["busbw"] = np.where(transfer > 0, size / transfer * busbw_factor(op, n), np.nan)
        out["wait_med"] = s["wait_med_ns"]
        out["wait_max"] = s["wait_max_ns"]
        out["ends_known"] = (s["flags"] & schema.OPSF_ENDS_KNOWN) != 0
        gaps = np.ascontiguousarray(s["compute_ns"], dtype=GAPS)
        return cls(np.asarray(pos, np.int64), [s[field] for _, field in _IDS], out, gaps)

    def take(self, idx: np.ndarray | slice) -> Summaries:
        """The summaries ``idx`` (indices, a mask or a slice)."""
        return Summaries(self.pos[idx], [a[idx] for a in self.ids()], take(self.done, idx), self.gaps[idx])

    def cut(self, a: int, b: int) -> Summaries:
        """The summaries of rows [a, b), their positions from a."""
        i, j = np.searchsorted(self.pos, (a, b)).tolist()
        return Summaries(self.pos[i:j] - a, [x[i:j] for x in self.ids()], self.done[i:j], self.gaps[i:j])

    @staticmethod
    def join(parts: Sequence[tuple[Summaries, int]]) -> Summaries:
        """Batches' summaries, each with the row its batch starts at, as one batch's."""
        if len(parts) == 1 and parts[0][1] == 0:
            return parts[0][0]
        ss = [s for s, _ in parts]
        ids = [np.concatenate(col) for col in zip(*(s.ids() for s in ss), strict=True)]
        return Summaries(np.concatenate([s.pos + at for s, at in parts]), ids,
                         schema.join_records([s.done for s in ss], COMPLETED),
                         np.concatenate([s.gaps for s in ss]))  # fmt: skip

    def aligned(self, ranks: RankTable) -> np.ndarray:
        """The COMPLETED rows with their times on the master's clock (by the offset of the
        node of the member that sent the summary, the last arriver)."""
        out = self.done if self.done.flags.writeable else copy_rows(self.done)
        off = ranks.offsets(self.rank.astype(np.int64))
        out["last_arrive"] -= off
        out["first_arrive"] -= off
        return out

    # -- between processes (c4d.master.engine_process) ------------------------------------------
    def frames(self) -> list[np.ndarray]:
        """The arrays as they travel: the FIELDS in order, then the compute."""
        return [np.ascontiguousarray(getattr(self, name)) for name, _ in FIELDS] + [
            np.ascontiguousarray(self.gaps)
        ]

    @classmethod
    def from_frames(cls, bufs: Sequence, rows: int) -> Summaries | None:
        """``frames()`` read back (buffers), for a batch of ``rows`` rows; None when they do not
        fit together (then the engine reads the rows itself)."""
        if len(bufs) != len(FIELDS) + 1:
            return None
        arrs = []
        for b, (_, dt) in zip(bufs, FIELDS, strict=False):
            if len(b) % dt.itemsize:
                return None
            arrs.append(np.frombuffer(b, dt))
        k = len(arrs[0])
        width = schema.OPSUM_MAX_MEMBERS * GAPS.itemsize
        if any(len(a) != k for a in arrs) or len(bufs[-1]) != k * width:
            return None
        pos = arrs[0]
        if k and (pos[0] < 0 or pos[-1] >= rows or (k > 1 and not (pos[1:] > pos[:-1]).all())):
            return None
        gaps = np.frombuffer(bufs[-1], GAPS).reshape(k, schema.OPSUM_MAX_MEMBERS)
        return cls(pos, arrs[1:-1], arrs[-1], gaps)
