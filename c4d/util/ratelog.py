"""Rate-limited warnings: a flood of bad input costs a few log lines a minute, never one per record.

Lines are keyed by a *reason class*, a short fixed string chosen by the caller ("bad magic",
"rank outside the world"), never by the value that tripped it (that value can differ in every
message). The first event of a class in a period is logged at once; later events of that class
in the same period are only counted, and the next line of the class (or ``flush``, which the
master calls at every tick) says how many there were. The Prometheus counters in
``c4d.master.metrics`` carry the full detail. Used by the collector, the validator and the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

PERIOD_S = 60.0


@dataclass
class _Class:
    since: float  # when the current period of this class began (the clock below)
    events: int = 0  # events suppressed in it
    records: int = 0  # records they carried


class RateLimitedLog:
    """``log(reason, msg, *args, n=records)``: at most one line per reason class per period."""

    def __init__(
        self,
        logger: logging.Logger,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self.logger, self.period_s, self.clock, self.level = logger, period_s, clock, level
        self._classes: dict[str, _Class] = {}
        self.lines = 0  # lines written (tests bound it)

    def __call__(self, reason: str, msg: str, *args: object, n: int = 1) -> bool:
        """Log ``msg % args`` unless ``reason`` was logged within the period; True when logged."""
        now = self.clock()
        c = self._classes.get(reason)
        if c is not None and now - c.since < self.period_s:
            c.events += 1
            c.records += n
            return False
        more = self._more(c) if c is not None else ""
        self._classes[reason] = _Class(since=now)
        self._emit(msg + more, *args)
        return True

    def flush(self) -> None:
        """Write the counts of classes whose period is over (so a storm that stopped is still told)."""
        now = self.clock()
        for reason, c in self._classes.items():
            if c.events and now - c.since >= self.period_s:
                self._emit("%s: %s", reason, self._more(c).strip(" ()"))
                c.since, c.events, c.records = now, 0, 0

    def _more(self, c: _Class) -> str:
        if not c.events:
            return ""
        return f" (and {c.events} more like it, {c.records} records, in the last {self.period_s:g} s)"

    def _emit(self, msg: str, *args: object) -> None:
        self.lines += 1
        self.logger.log(self.level, msg, *args)
