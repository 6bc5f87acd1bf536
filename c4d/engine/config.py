"""Engine thresholds: the job's registered values, master overrides, and slow-detection knobs.

Hang thresholds (``hang_timeout_us``, ``hang_times``, ``bw_check_period_s``, ``heartbeat_ms``)
default to ``None`` = "use what the job registered" (its C4D_* values, REGISTER records),
falling back to docs/design.md's defaults. The slow-detection knobs have no job-side variable;
they come from the master's environment (``C4D_SLOW_*``, see ``from_env``) or the fields.
Every threshold is documented in docs/engine.md.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from c4d.engine.blame import Likelihoods
from c4d.engine.expected import ExpectedBusbw, ExpectedError
from c4d.engine.types import DEFAULT_ISOLATE_CONFIDENCE
from c4d.record.schema import (
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
    slow_baseline_windows: int = 8
    """C4D_SLOW_BASELINE_WINDOWS: baseline = median of up to this many earlier clean windows."""
    slow_window_ops: int = 1024
    """C4D_SLOW_WINDOW_OPS: the most completed ops of one communicator kept for one slow window;
    past it a sample, one op in 2^k by a hash of its seq (c4d/engine/sampling.py), 512 to 1,024
    of them: a share of ops within about 4 points of the whole window's (95%), well apart from the
    judge's lines (slow at 60%, clear at 20%). Node agents send the same sample. 0: every op."""
    slow_grace_ms: float = 150.0
    """C4D_SLOW_GRACE_MS: a window is judged this long (master clock) after it closed, so late
    records of its ops are in."""

    slow_ops_share: float = 0.6
    """C4D_SLOW_OPS_SHARE: a slow unit has at least this share of its ops below slow_bw_ratio x its
    reference (not a median a few stretched transfers pulled down)."""
    slow_clear_ops_share: float = 0.2
    """C4D_SLOW_CLEAR_OPS_SHARE: a unit with more of its ops that slow is not clear evidence."""
    slow_p2p_min_ops_factor: int = 2
    """C4D_SLOW_P2P_MIN_OPS_FACTOR: a p2p link needs this many times slow_min_ops transfers (its
    rates are noisier than a collective's)."""
    slow_p2p_strong_ratio: float = 0.8
    """C4D_SLOW_P2P_STRONG_RATIO: a p2p link below this x (slow_bw_ratio x reference) in
    slow_strong_share of its transfers is slow in its first window; otherwise it must be below
    the degraded line in the window before too."""
    slow_strong_share: float = 0.8
    """C4D_SLOW_STRONG_SHARE: see slow_p2p_strong_ratio."""
    slow_named_windows: int = 3
    """C4D_SLOW_NAMED_WINDOWS: a culprit named RankCommSlow this many windows ago is still part of
    every hypothesis (it explains the units it affects)."""
    slow_stood_out_share: float = 0.3
    """C4D_SLOW_STOOD_OUT_SHARE: a rank whose compute stood out in this share of a window's ops is
    watched in the next window too (a slowdown that straddles two windows)."""
    slow_pace_strong: float = 2.0
    """C4D_SLOW_PACE_STRONG: a rank computing 1 + this x slow_arrival_rel times its own pace for
    half a window is RankNonCommSlow in its first window (own_pace.py)."""
    slow_shared_min_ranks: int = 3
    """C4D_SLOW_SHARED_MIN_RANKS: ranks judged in a window before their median pace tells a
    host-wide slowdown (own_pace.py)."""

    expected_busbw: ExpectedBusbw | None = None
    """C4D_EXPECTED_BUSBW=FILE: the bus bandwidth healthy communicators reach per link class,
    collective and size (``c4d check nccl --write-expected``; c4d/engine/expected.py): the
    reference of a unit with no siblings whose own past is missing or already slow."""

    peer_slow_share: float = 0.25
    """C4D_PEER_SLOW_SHARE: a network link that sets a slow ring's pace (PEER records) in at least
    this share of the window's ops is slow evidence; a rank's two slowed links take turns."""
    peer_clear_share: float = 0.05
    """C4D_PEER_CLEAR_SHARE: one that sets it in at most this share is clear evidence."""

    # -- localization model (blame.py) -----------------------------------------------------
    model_affected: tuple[float, float, float] = (0.70, 0.20, 0.10)
    """P(slow, degraded, clear) of a unit the hypothesis must slow (a link it breaks sets the
    unit's pace)."""
    model_hidden: tuple[float, float, float] = (0.15, 0.25, 0.60)
    """The same for a unit it touches only through links that do not set its pace."""
    model_clear: tuple[float, float, float] = (0.03, 0.10, 0.87)
    """The same for a unit it does not touch (another fault, or noise, slows it)."""
    model_dim: tuple[float, float, float] = (0.08, 0.15, 0.08)
    """P(dim) of a unit per prediction (affected, hidden, clear): below the clear line but above
    the degraded one (between slow_degraded_ratio and slow_clear_ratio); the rows above are the
    chances of the other states given that it is not dim. A fault worth finding puts the units
    whose pace it sets below the degraded line, so a dim unit is noise as often under it as
    under none (affected = clear: their odds on the other states stay as they were); a fault
    on links that do not set a unit's pace slows it a little (hidden)."""
    model_tie: float = 0.7
    """Hypotheses within this log-likelihood of the best are not told apart."""
    model_memory: float = 0.5
    """Weight of a window's evidence in the next window's verdict, per window (blame.Evidence)."""
    model_fault_prior: float = -3.0
    """log prior odds of a second fault beside the culprits named in the last windows: a new
    culprit must explain evidence that they do not (about e^3 = 20 times more likely)."""
    isolate_confidence: float = DEFAULT_ISOLATE_CONFIDENCE
    """C4D_ISOLATE_CONFIDENCE: an ERROR isolates a node only when its localization names hardware
    with at least this calibrated confidence; below it the diagnosis names suspects' nodes and
    isolates nothing."""

    # -- clock alignment ----------------------------------------------------------------
    clock_gain: float = 0.25
    """C4D_CLOCK_GAIN: share of the per-rank median end-time residual applied per batch."""

    def likelihoods(self, dim: bool = False) -> Likelihoods:
        """The model's error rates; ``dim`` for the slow judge, whose units can be dim (the hang
        judge's are stalled or clear: no chance of dim to condition on)."""
        return Likelihoods(
            self.model_affected,
            self.model_hidden,
            self.model_clear,
            self.model_tie,
            self.model_fault_prior,
            self.model_dim if dim else (0.0, 0.0, 0.0),
        )

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
        if env.get("C4D_EXPECTED_BUSBW"):
            try:
                changes["expected_busbw"] = ExpectedBusbw.load(env["C4D_EXPECTED_BUSBW"])
            except ExpectedError as e:
                log.warning("c4d: C4D_EXPECTED_BUSBW: %s; judging without it", e)
        for f in fields(cls):
            if not f.name.startswith(("slow_", "clock_", "peer_", "isolate_")):
                continue
            var = "C4D_" + f.name.upper()
            if var not in env:
                continue
            kind: type[int] | type[float] = int if isinstance(getattr(cfg, f.name), int) else float
            try:
                v = kind(env[var])
                if v < 0 or (f.name == "isolate_confidence" and v > 1):
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
