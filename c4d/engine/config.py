"""Engine thresholds: the job's registered values, master overrides, and slow-detection knobs.

Hang thresholds (``hang_timeout_us``, ``hang_times``, ``bw_check_period_s``, ``heartbeat_ms``)
default to ``None`` = "use what the job registered" (its C4D_* values, REGISTER records),
falling back to DESIGN.md's defaults. The slow-detection knobs have no job-side variable;
they come from the master's environment (``C4D_SLOW_*``, see ``from_env``) or the fields.
Every threshold is documented in docs/engine.md.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from c4d.schema import (
    DEFAULT_BW_CHECK_PERIOD_S,
    DEFAULT_HANG_TIMEOUT_US,
    DEFAULT_HANG_TIMES,
    DEFAULT_HEARTBEAT_MS,
)

log = logging.getLogger("c4d.engine")


@dataclass(frozen=True)
class EngineConfig:
    # -- hangs (None: the job's registered value, else the default above) ---------------
    hang_timeout_us: int | None = None
    """T: an op may wait this long before a hang WARNING; re-counted every T."""
    hang_times: int | None = None
    """ERROR once a hang has lasted T x hang_times (C4D_HANG_TIMES)."""
    bw_check_period_s: float | None = None
    """Slow-detection window (C4D_CONN_BW_CHECK_PERIOD)."""
    heartbeat_ms: int | None = None
    """The ranks' heartbeat period; sets how stale a report may be before it is not evidence."""

    # -- slow detection (C4D_SLOW_* in the master's environment) -----------------------
    slow_min_ops: int = 4
    """C4D_SLOW_MIN_OPS: a communicator needs this many complete ops in a window to be judged."""
    slow_last_frac: float = 0.6
    """C4D_SLOW_LAST_FRAC: RankNonCommSlow needs the rank's compute to stand out in this share of the ops."""
    slow_arrival_rel: float = 0.5
    """C4D_SLOW_ARRIVAL_REL: a slow rank computes longer than the other members by this fraction
    of their compute between two ops of the communicator (and by slow_arrival_min_ms)."""
    slow_arrival_min_ms: float = 1.0
    """C4D_SLOW_ARRIVAL_MIN_MS: absolute floor of that excess (timer noise, clock error)."""
    slow_bw_ratio: float = 0.5
    """C4D_SLOW_BW_RATIO: RankCommSlow when busbw < this x baseline (own earlier windows or siblings)."""
    slow_degraded_ratio: float = 0.8
    """C4D_SLOW_DEGRADED_RATIO: a unit below this x its reference (but not slow) is *degraded*:
    evidence for the rank or link that would explain it (blame.py)."""
    slow_clear_ratio: float = 0.9
    """C4D_SLOW_CLEAR_RATIO: a unit at or above this x its reference, with hardly an op slow, is
    *clear*: evidence against any rank or link that would have to slow it."""
    slow_pace_share: float = 0.6
    """C4D_SLOW_PACE_SHARE: in a slow ring, the link that sets the pace (finishes its steps last,
    PEER records) in this share of the window's ops is the slow link; two links of one rank
    that together do, the rank."""
    slow_baseline_windows: int = 8
    """C4D_SLOW_BASELINE_WINDOWS: baseline = median of up to this many earlier clean windows."""
    slow_grace_ms: float = 150.0
    """C4D_SLOW_GRACE_MS: a window is judged this long (master clock) after it closed, so late
    records of its ops are in."""

    # -- clock alignment ----------------------------------------------------------------
    clock_gain: float = 0.25
    """C4D_CLOCK_GAIN: share of the per-rank median end-time residual applied per batch."""

    def resolve(self, job: dict[str, int]) -> ResolvedThresholds:
        """Thresholds in force: explicit field, else the job's registered value, else the default."""

        def pick(name: str, default: float) -> float:
            v = getattr(self, name)
            if v is not None:
                return v
            jv = job.get(name)
            return jv if jv is not None and jv > 0 else default

        return ResolvedThresholds(
            hang_timeout_ns=int(pick("hang_timeout_us", DEFAULT_HANG_TIMEOUT_US)) * 1000,
            hang_times=max(1, int(pick("hang_times", DEFAULT_HANG_TIMES))),
            period_ns=int(float(pick("bw_check_period_s", DEFAULT_BW_CHECK_PERIOD_S)) * 1e9),
            heartbeat_ns=int(pick("heartbeat_ms", DEFAULT_HEARTBEAT_MS)) * 1_000_000,
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> EngineConfig:
        """Read C4D_SLOW_* / C4D_CLOCK_GAIN (master side).

        A malformed value logs one line and keeps the default.
        """
        env = dict(os.environ if env is None else env)
        cfg = cls(**overrides)
        changes: dict[str, Any] = {}
        for f in fields(cls):
            if not f.name.startswith(("slow_", "clock_")):
                continue
            var = "C4D_" + f.name.upper()
            if var not in env:
                continue
            kind: type[int] | type[float] = int if isinstance(getattr(cfg, f.name), int) else float
            try:
                v = kind(env[var])
                if v < 0:
                    raise ValueError
            except ValueError:
                log.warning(
                    "c4d: %s=%r is not a non-negative number; using %s", var, env[var], getattr(cfg, f.name)
                )
                continue
            changes[f.name] = v
        return replace(cfg, **changes)


@dataclass(frozen=True)
class ResolvedThresholds:
    hang_timeout_ns: int
    hang_times: int
    period_ns: int
    heartbeat_ns: int

    @property
    def lost_after_ns(self) -> int:
        """Silence before RankLost: max(3 heartbeats, T)."""
        return max(3 * self.heartbeat_ns, self.hang_timeout_ns)

    @property
    def stale_after_ns(self) -> int:
        """A rank whose last record is older than this is not evidence of anything (2 heartbeats + slack)."""
        return 2 * self.heartbeat_ns + 250_000_000
