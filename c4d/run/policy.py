"""When to restart: the fault-tolerance policy, as a pure function of the attempts so far.

``decide(cfg, attempts)`` looks at how the latest attempt ended and at the history and
says whether to start another, and why. Nothing here starts, stops or sleeps, so every
rule is tested on hand-made histories (tests/test_run_policy.py).

Rules, in order:

1. the job succeeded, or ``c4d run`` was interrupted → stop;
2. ``--max-restarts`` restarts done → stop;
3. ``--fault-tolerant-policy Never`` → stop;
4. the same error ``--max-same-error`` times in a row → stop, the job is marked failed;
5. three identical failures in a row, none of which isolated a node → stop: the machine
   was changed or nothing pointed at one, so the code, not the hardware, is at fault;
6. c4d stopped the attempt (a hang seen in the logs, an exit hang, an ERROR diagnosis) →
   restart; a job that failed by itself → restart under ``OnFailure``, and under
   ``ExitCodeAndErrorMsg`` only when the failure is retryable: killed by a signal that
   means the system took it away (SIGKILL: the OOM killer or a node agent; SIGBUS: a
   memory error), or a retryable error pattern in the tail of its log.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


class Policy(enum.Enum):
    OnFailure = "OnFailure"
    """Restart after any failure."""
    ExitCodeAndErrorMsg = "ExitCodeAndErrorMsg"
    """Restart after a failure whose exit status or log says it is retryable (see ``is_retryable``)."""
    Never = "Never"
    """Never restart (c4d still stops a hung job and isolates a culprit node)."""


class End(enum.Enum):
    """How an attempt ended."""

    succeeded = "succeeded"
    """Every launched process exited 0."""
    failed = "failed"
    """A launched process exited with a non-zero status by itself."""
    log_hang = "log-hang"
    """c4d stopped it: no output for --job-hang-interval."""
    exit_hang = "exit-hang"
    """c4d stopped it: one process (or rank) exited 0 and the rest did not follow in time."""
    c4d_error = "c4d-error"
    """c4d stopped it: an ERROR diagnosis."""
    interrupted = "interrupted"
    """``c4d run`` itself got SIGINT/SIGTERM."""
    not_started = "not-started"
    """Nothing to run here: this node is isolated, or the program could not be started."""


STOPPED_BY_C4D = (End.log_hang, End.exit_hang, End.c4d_error)

# Built-in retryable errors (Python regular expressions, case-insensitive), matched against the
# tail of a failed attempt's log. Each names a failure of the machine or the network, not of the
# code: NCCL/transport errors, lost GPUs and ECC errors, broken connections, rendezvous timeouts.
RETRYABLE_PATTERNS: tuple[str, ...] = (
    r"NCCL error|ncclSystemError|ncclInternalError|ncclRemoteError|unhandled system error",
    r"NCCL communicator was aborted|Watchdog caught collective operation timeout",
    r"NET/IB|ibv_\w+ failed|IBV_WC_\w+|transport retry counter exceeded",
    r"uncorrectable ECC error|ECC_UNCORRECTABLE|GPU has fallen off the bus|Xid \d+",
    r"CUDA error: (unspecified launch failure|an illegal instruction|uncorrectable)",
    r"Connection reset by peer|Connection refused|Broken pipe|No route to host|Network is unreachable",
    r"Connection timed out|Socket Timeout|DistNetworkError|RendezvousConnectionError|RendezvousTimeoutError",
)
RETRYABLE_SIGNALS = {7: "SIGBUS", 9: "SIGKILL"}


@dataclass(frozen=True)
class PolicyConfig:
    policy: Policy = Policy.ExitCodeAndErrorMsg
    max_restarts: int = 3
    max_same_error: int = 10
    retryable: tuple[str, ...] = RETRYABLE_PATTERNS
    """Patterns: the built-in ones plus every ``--retryable-error``."""
    same_failures_without_isolation: int = 3


@dataclass(frozen=True)
class Attempt:
    """One start of the job, as the policy sees it."""

    index: int
    """1 for the first start."""
    end: End
    exit_status: int | None = None
    """The job's status as a shell reports it (128 + N for signal N); None: not started."""
    signature: str = ""
    """What went wrong, normalized, so that the same error twice compares equal."""
    retryable: str | None = None
    """Why the failure counts as retryable (a pattern, a signal), None when it does not."""
    isolated: tuple[str, ...] = ()
    """Nodes isolated because of this attempt."""
    detail: str = ""


@dataclass(frozen=True)
class Decision:
    restart: bool
    why: str
    failed: bool = field(default=False)
    """The job is marked failed (a final failure, not a success or an interruption)."""


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """ValueError with the pattern named when one is not a valid regular expression."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p, re.IGNORECASE))
        except re.error as e:
            raise ValueError(f"--retryable-error {p!r}: not a regular expression ({e})") from None
    return out


def is_retryable(
    exit_status: int | None, tail: Sequence[str], patterns: Sequence[re.Pattern[str]]
) -> str | None:
    """Why a failure may be retried (the first matching pattern, or the signal), else None."""
    for line in reversed(tail):
        for p in patterns:
            if p.search(line):
                return f"log matches {p.pattern!r}"
    if exit_status is not None and exit_status > 128 and exit_status - 128 in RETRYABLE_SIGNALS:
        return f"killed by {RETRYABLE_SIGNALS[exit_status - 128]}"
    return None


_ERRORISH = re.compile(r"error|exception|fatal|abort|fail|killed|traceback", re.IGNORECASE)
_VOLATILE = re.compile(r"0x[0-9a-fA-F]+|\d+")


def signature(end: End, exit_status: int | None, tail: Sequence[str], extra: str = "") -> str:
    """A failure's identity: how it ended, the status, and the last error-like line of the log
    with numbers (pids, ranks, times, addresses) blanked, so that reruns of one bug match."""
    if end is not End.failed:
        return f"{end.value} {extra}".strip()
    lines = [s.strip() for s in tail if s.strip()]
    errs = [s for s in lines if _ERRORISH.search(s)]
    last = (errs or lines or [""])[-1]
    return f"exit {exit_status}: {_VOLATILE.sub('N', last)[:200]}"


def decide(cfg: PolicyConfig, attempts: Sequence[Attempt]) -> Decision:
    """Restart or stop after ``attempts[-1]`` (see the module doc for the rules)."""
    last = attempts[-1]
    if last.end is End.succeeded:
        return Decision(False, "the job finished")
    if last.end is End.interrupted:
        return Decision(False, "c4d run was interrupted")
    if last.end is End.not_started:
        return Decision(False, last.detail or "nothing was started", failed=True)
    restarts = len(attempts) - 1
    if restarts >= cfg.max_restarts:
        return Decision(False, f"--max-restarts {cfg.max_restarts} reached", failed=True)
    if cfg.policy is Policy.Never:
        return Decision(False, "--fault-tolerant-policy Never", failed=True)
    run = _same_run(attempts)
    if len(run) >= cfg.max_same_error:
        return Decision(False, f"the same error {len(run)} times in a row (--max-same-error)", failed=True)
    n = cfg.same_failures_without_isolation
    if len(run) >= n and not any(a.isolated for a in run[-n:]):
        return Decision(
            False,
            f"{n} identical failures in a row and no node isolated: the code, not a machine, is at fault",
            failed=True,
        )
    if last.end in STOPPED_BY_C4D:
        return Decision(True, f"c4d stopped the attempt ({last.end.value})")
    if cfg.policy is Policy.OnFailure:
        return Decision(True, f"it failed with status {last.exit_status} (OnFailure)")
    if last.retryable:
        return Decision(True, f"retryable: {last.retryable}")
    return Decision(
        False,
        f"status {last.exit_status} and no retryable error in the log (ExitCodeAndErrorMsg)",
        failed=True,
    )


def _same_run(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The latest attempts that share the last one's signature (consecutive)."""
    sig = attempts[-1].signature
    out: list[Attempt] = []
    for a in reversed(attempts):
        if a.signature != sig:
            break
        out.append(a)
    return out[::-1]
