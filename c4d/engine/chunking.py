"""Fed batches held and cut into the chunks the engine ingests (docs/engine.md, Determinism).

Chunks are ``CHUNK`` rows, cut at multiples of the running row count whatever the batch
sizes, so a replay that feeds the same rows in other slices ingests exactly the same chunks.
Every batch is held apart: its node summaries read (c4d.engine.summaries, row by row) and its
other rows in order. A batch that comes whole (``Engine.feed``) is taken apart here; one that
comes apart (``Engine.feed_apart``: the master's loop read its summaries) is held as it came.
One path for both, so both give the same chunks by position and the same steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from c4d.engine import clock
from c4d.engine.ranks import RankTable
from c4d.engine.rows import take
from c4d.engine.summaries import OPSUM, Summaries
from c4d.record import schema
from c4d.record.columns import Columns
from c4d.util.ratelog import RateLimitedLog

# rows ingested at once: the per-communicator work of a chunk is paid once per chunk, so a
# 4,096-rank job's 0.2 s tick (~85k rows through agents) is one chunk; it bounds what a backlog
# costs at once
CHUNK = 131072
NO_SUMMARIES = Summaries.of(np.zeros(0, schema.HEADER))  # (zero rows: nothing in it to change)


class Chunk(NamedTuple):
    rest: np.ndarray  # HEADER rows other than node summaries, in order
    rpos: np.ndarray  # int64: each one's position in the chunk
    recv: np.ndarray  # int64: master time stamped on each position
    sums: Summaries  # the node summaries read, at their positions in the chunk


def apart(
    raw: np.ndarray, cols: Columns | None = None, summaries: Summaries | None = None
) -> tuple[np.ndarray, Summaries]:
    """A whole batch (HEADER rows) apart: its rows other than summaries, in order (the batch
    itself when it has none), and its summaries read. ``cols``: the rows' columns when the
    caller cut them; ``summaries``: read already (not these rows' ones: read again here)."""
    kind = cols["kind"] if cols is not None and len(cols) == len(raw) else raw["kind"]
    is_sum = kind == OPSUM
    pos = np.flatnonzero(is_sum)
    if summaries is not None and not np.array_equal(summaries.pos, pos):
        summaries = None  # a caller's slip: read from the rows
    if not len(pos):
        return raw, NO_SUMMARIES if summaries is None else summaries
    if summaries is None:
        summaries = Summaries.of(raw, cols, kind)
    return take(raw, ~is_sum), summaries


class Chunker:
    """The batches fed and not yet ingested, each apart, cut into chunks on demand."""

    def __init__(self) -> None:
        # (rows other than summaries, master time (one, or per position), summaries, rows in all)
        self._buf: list[tuple[np.ndarray, int | np.ndarray, Summaries, int]] = []
        self.held = 0  # rows held, summaries included

    def add(self, rest: np.ndarray, recv: int | np.ndarray, sums: Summaries, n: int) -> bool:
        """Hold a batch of ``n`` rows apart; True when a whole chunk is held."""
        self._buf.append((rest, recv, sums, n))
        self.held += n
        return self.held >= CHUNK

    def cut(self, whole_chunks: bool) -> Iterator[Chunk]:
        """The chunks of what is held, in order: whole ``CHUNK``s only (the rest held on), or
        everything (the last one shorter)."""
        if not self._buf:
            return
        rests, rposs, recvs, parts = [], [], [], []
        at = 0
        for rest, t, sums, n in self._buf:
            if len(sums):
                here = np.ones(n, bool)
                here[sums.pos] = False
                rposs.append(np.flatnonzero(here) + at)
            else:
                rposs.append(np.arange(at, at + n))
            rests.append(rest)
            recvs.append(np.full(n, t, np.int64) if isinstance(t, int) else t)
            parts.append((sums, at))
            at += n
        rest = schema.join_records(rests, schema.HEADER)
        rpos = np.concatenate(rposs) if len(rposs) > 1 else rposs[0]
        recv = np.concatenate(recvs) if len(recvs) > 1 else recvs[0]
        sums = Summaries.join(parts)
        self._buf, self.held = [], 0
        cut = 0
        while at - cut >= CHUNK or (cut < at and not whole_chunks):
            end = min(cut + CHUNK, at)
            i, j = np.searchsorted(rpos, (cut, end)).tolist()
            yield Chunk(rest[i:j], rpos[i:j] - cut, recv[cut:end], sums.cut(cut, end))
            cut = end
        if cut < at:  # (whole chunks only) the rest waits, apart
            i = int(np.searchsorted(rpos, cut))
            self._buf, self.held = [(rest[i:], recv[cut:], sums.cut(cut, at), at - cut)], at - cut


class Feeds:
    """How an engine takes batches (``Engine``, ``ShardedEngine``): each held apart (its node
    summaries read) and cut into chunks, which the engine's ``_flush`` ingests."""

    _chunks: Chunker
    stats: dict[str, int]
    ranks: RankTable
    _now: int
    _epoch: list[int]
    _ratelog: RateLimitedLog

    def _invalid(self, what: str, n: int) -> None:
        """Rows dropped: counted, and said at most once a minute per reason."""
        self.stats["invalid"] += n
        self._ratelog(what, "c4d engine: dropped %d record(s) with %s", n, what, n=n)

    def _flush(self, whole_chunks: bool = False) -> None:
        raise NotImplementedError

    def feed(
        self, raw: np.ndarray, recv_ns: int, cols: Columns | None = None, summaries: Summaries | None = None
    ) -> None:
        """Take HEADER-typed rows in arrival order; ``recv_ns`` = master time stamped on them.

        Rows are held and ingested in fixed chunks of ``chunking.CHUNK`` rows (cut at multiples
        of the running row count, whatever the feed sizes) and at each tick: a replay that
        feeds the same rows in other slices ingests exactly the same chunks, so it reproduces
        the live diagnoses bit for bit.

        ``cols``: the rows' columns when the caller cut them (the master's edge), read for
        their node summaries now; ``summaries``: those read already (c4d.engine.summaries:
        row by row, so neither changes what a chunk gives).
        """
        raw = np.asarray(raw)
        if raw.dtype != schema.HEADER:
            if raw.ndim != 1 or raw.dtype.itemsize != schema.RECORD_SIZE:
                self._invalid("a wrong record size", len(raw) if raw.ndim else 1)
                return
            raw = raw.view(schema.HEADER)
        if not len(raw):
            return
        self.stats["batches"] += 1
        rest, sums = apart(raw, cols, summaries)
        self._hold(rest, recv_ns, sums, len(raw))

    def feed_apart(self, rest: np.ndarray, recv_ns: int, summaries: Summaries, n: int) -> None:
        """``feed`` of a batch of ``n`` rows that comes apart: its node summaries read
        (``summaries``, at their positions in the batch) and its other rows (``rest``, HEADER
        rows in order). An engine in a process of its own gets them so from the master's loop
        (c4d.master.engine_process): the summaries' rows themselves neither travel nor are joined.
        The same chunks, the same steps, the same results as ``feed`` of the whole batch
        (which takes it apart so)."""
        rest = np.asarray(rest)
        fits = rest.dtype == schema.HEADER and len(rest) + len(summaries) == n
        if fits and len(summaries):
            fits = int(summaries.pos[-1]) < n and bool((summaries.pos[1:] > summaries.pos[:-1]).all())
        if not fits or (len(rest) and (rest["kind"] == OPSUM).any()):
            self._invalid("a batch apart whose parts do not fit together", n)
            return
        if not n:
            return
        self.stats["batches"] += 1
        self._hold(rest, recv_ns, summaries, n)

    def _hold(self, rest: np.ndarray, recv_ns: int, sums: Summaries, n: int) -> None:
        if self._chunks.add(rest, int(recv_ns), sums, n):
            self._flush(whole_chunks=True)

    def flush(self) -> None:
        """Ingest everything fed so far without evaluating (tick does this first)."""
        self._flush()

    def _settle(self) -> None:
        raise NotImplementedError

    def _begin_tick(self, now: int) -> None:
        """A tick's start: every row fed ingested, every clock step applied, the clock's
        receipt bounds taken (clock.on_tick)."""
        R = self.ranks
        # records fed since the last tick are stamped with its time; when ticks come late (a
        # master that falls behind) a rank that reported in that interval is not silent
        R.prev_tick_ns = self._now or now
        self._now = now
        self.stats["ticks"] += 1
        self._flush()
        self._settle()
        clock.on_tick(R, now, self._epoch)
