"""The engine: ``feed`` record batches, ``tick`` at a master time, read ``state``.

Driven identically by ``c4d master`` (live: records stamped with the latest tick's master
time, ``tick`` every ~0.2 s) and ``c4d analyze`` (replay: the trace's records between its
TICK records, ``tick`` at each TICK's time), so a replay reproduces the live diagnoses.
Everything is deterministic in the feed/tick sequence: no wall clock, no randomness, no
iteration over unordered containers in an order that could vary.

Call from one thread (the master's); nothing here blocks or sleeps.
"""

from __future__ import annotations

import logging

import numpy as np

from c4d.engine import hang, wait_view
from c4d.engine.chunking import Chunker, Feeds
from c4d.engine.comm import Comm
from c4d.engine.comm_index import CommIndex
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.consistency import Consistency, pending_mismatches
from c4d.engine.emission import Emission
from c4d.engine.ingest import Ingest
from c4d.engine.p2p_pairs import P2PPairs
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.rows import OP_SPLIT
from c4d.engine.slow import SlowJudge
from c4d.engine.snapshot import engine_snapshot, state_part
from c4d.engine.stage import Stages
from c4d.engine.types import Diagnosis, EngineSnapshot
from c4d.util.ratelog import RateLimitedLog

log = logging.getLogger("c4d.engine")


class Engine(Feeds):
    """The facade over the engine's parts: fed batches held and cut into chunks (chunking.py),
    each chunk ingested into the engine's memory (ingest.py, ingest_ops.py,
    ingest_summaries.py; communicators by id: comm_index.py), a tick's verdicts (hang.py,
    slow.py) said as diagnoses (emission.py), the live view read (snapshot.py)."""

    def __init__(self, cfg: EngineConfig | None = None, split: bool = False) -> None:
        """``split``: keep every completed op's per-rank wait / transfer split (``OP_SPLIT`` rows)
        for ``take_split`` — the one wait/transfer computation the metrics, the report and
        ``ops_split`` use."""
        self.cfg = cfg or EngineConfig()
        self.ranks = RankTable()
        self.comms: dict[int, Comm] = {}  # by index (stable, never reused), in creation order
        self._epoch = [-1]
        self._slow = SlowJudge(self.cfg)
        self._pairs = P2PPairs()
        self._pool = Pool(self.cfg.slow_window_ops)  # every communicator's membership and ring tags
        self._pool.sampler.period_ns = self.thresholds().period_ns
        self.stages = Stages()  # the training code's staged hang timeouts (stage.py)
        # members of one collective that call it differently (consistency.py)
        self.consistency = Consistency(lambda i: self.comms[i].grank if i in self.comms else None)
        self._now = 0
        self._ratelog = RateLimitedLog(log)
        self.stats = {"records": 0, "invalid": 0, "batches": 0, "ticks": 0}
        self._index = CommIndex(self.comms, self._pool, self.ranks, split, self._invalid)
        self._comm_index = self._index.index  # comm id -> index
        self._chunks = Chunker()  # fed, not yet ingested
        self._ingest = Ingest(self.cfg, self.ranks, self._index, self._pool, self._pairs, self.consistency,
                              self._slow.own, self.stages, self._invalid, self.stats)  # fmt: skip
        # a send and its receive that differ in count or dtype (paired by P2PPairs)
        self._pairs.on_disagree = lambda S, R: self.consistency.p2p_disagree(S, R, self._ingest.chunk_recv)
        self._emission = Emission(self.cfg, self.ranks, self.stages)

    # -- input -------------------------------------------------------------------------
    def thresholds(self) -> ResolvedThresholds:
        return self.cfg.resolve(self.ranks.job)

    def drops(self) -> dict[str, int]:
        """What the byte budgets refused or let go, by reason (Pool.drops)."""
        return self._pool.drops()

    def free_comms(self, cids) -> int:
        """Forget communicators (destroyed, or silent for long: c4d/intake/validate.py, Edge.expire): their
        arrays, memberships, unpaired p2p halves and slow-window state. Returns how many were known."""
        freed = self._index.free(cids)
        if freed:
            self.consistency.forget(freed)
            self._emission.forget(freed)
            self._pairs.forget(freed)
            self._slow.forget(freed)
        return len(freed)

    def _settle(self) -> None:
        self._ingest.settle()

    def _flush(self, whole_chunks: bool = False) -> None:
        """Ingest held rows: whole chunks only (from feed), or everything (at a tick)."""
        for chunk in self._chunks.cut(whole_chunks):
            self._ingest.chunk(chunk)

    def take_split(self) -> np.ndarray:
        """OP_SPLIT rows of the ops completed since the last call (needs ``split=True``).

        Rows of ops still in the feed buffer come at a later call (after the next tick)."""
        parts = []
        for c in self.comms.values():
            if c.split:
                parts.extend(c.split)
                c.split = []
        return np.concatenate(parts) if parts else np.empty(0, OP_SPLIT)

    # -- evaluation --------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[Diagnosis]:
        """Evaluate at master time ``now_ns``; return the diagnoses that are new at this tick."""
        now = int(now_ns)
        self._begin_tick(now)
        th = self.thresholds()
        self._pool.sampler.period_ns = th.period_ns
        # the communicators' side: views of those someone waits in, new verdicts
        views = wait_view.busy_views(self.comms, self._pool)
        new_mm = pending_mismatches(self.consistency, self.comms, self._pool, now)
        ev = hang.evaluate(self.ranks, views, th, now, self.cfg.likelihoods())
        wait_view.join_peers(self.comms, ev.peers_read)
        out = self._emission.hangs(ev.findings, new_mm, th, now)
        for s in self._slow.judge(self.ranks, self.comms, th, now, ev.oldest_wait, self._pool):
            out.append(self._emission.slow(s, now))
        return out

    # -- live view ---------------------------------------------------------------------
    def state(self) -> EngineSnapshot:
        part = state_part(self.comms, self._pool, self.ranks, self._now, self._index.next_idx)
        return engine_snapshot(
            self.ranks, [part], self._slow.slow_ranks, self._emission.active, self.thresholds(), self._now
        )
