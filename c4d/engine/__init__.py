"""The diagnosis engine: record batches in, diagnoses out — the same live and offline.

    from c4d.engine import Engine, EngineConfig
    eng = Engine(EngineConfig(hang_timeout_us=1_000_000))
    eng.feed(raw, recv_ns)        # HEADER rows in arrival order, stamped with master time
    new = eng.tick(now_ns)        # diagnoses that are new at master time now_ns
    snap = eng.state()            # for the live view

Modules: the engine's memory, numpy arrays filled chunk by chunk (lowest first: ``rows``
record rows and row helpers, ``ranks`` per rank, ``compute`` compute gaps, ``pool`` every
communicator's arrays and the byte budgets, ``reduce`` complete ops to rows, ``comm`` per
communicator, ``p2p_pairs`` sends paired with receives); the way in and out (``engine`` the
``Engine`` facade composing them: ``chunking`` batches cut into chunks, ``comm_index``
communicators by id, ``ingest`` a chunk kind by kind, ``ingest_ops`` OP rows,
``ingest_summaries`` node summaries, ``emission`` findings made diagnoses, ``snapshot`` the
live view's state); ``clock`` (offsets), ``hang``
(wait-for graph: hangs, mismatches and lost ranks), ``slow`` (check windows), ``blame``
(rank or link behind a slow unit), ``peer`` (link localization from PEER progress),
``calibration`` (confidence measured on the randomized benchmark), ``types`` (Diagnosis,
Localization, enums), ``config`` (thresholds).
docs/engine.md explains the algorithms and every threshold.
Imports only ``c4d.record`` and ``c4d.util``: no file, no network, no report. ``incidents`` folds
its diagnoses into the incidents a person reads.
"""

from typing import Any

from c4d.engine.config import EngineConfig
from c4d.engine.engine import Engine
from c4d.engine.types import (
    CommSnapshot,
    CycleMember,
    DiagKind,
    Diagnosis,
    EngineSnapshot,
    How,
    Level,
    Localization,
    OpRef,
    RankState,
    Target,
)


def make_engine(overrides: dict[str, Any] | None = None, split: bool = False, shards: int = 1) -> Any:
    """The diagnosis engine, configured from the job's registered values plus ``overrides``
    (and the master's C4D_SLOW_* environment): what the live master and a replay both run.
    ``shards`` > 1: its communicators over that many shards, each a process of its own
    (c4d/engine/shards.py: the same diagnoses)."""
    cfg = EngineConfig.from_env(**(overrides or {}))
    if shards > 1:
        from c4d.engine.shards import ShardedEngine

        return ShardedEngine(cfg, split=split, shards=shards, processes=True)
    return Engine(cfg, split=split)


__all__ = [
    "CommSnapshot",
    "CycleMember",
    "DiagKind",
    "Diagnosis",
    "Engine",
    "EngineConfig",
    "EngineSnapshot",
    "How",
    "Level",
    "Localization",
    "OpRef",
    "RankState",
    "Target",
    "make_engine",
]
