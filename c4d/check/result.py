"""The outcome of one health check, and how it is printed.

Human output keeps the seed platform's Bootcheck shape, one timestamped line per check::

    2026-11-22 10:00:00 DiskTest /mnt/data: Succeed (write 812.4 MB/s, read 2301.7 MB/s)

``--json`` prints :meth:`CheckResult.to_json` objects, one per line.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from enum import Enum


class Status(str, Enum):
    SUCCEED = "Succeed"
    """The check ran and met its threshold."""
    FAILED = "Failed"
    """The check ran and missed its threshold, or could not run where it must (a disk error)."""
    SKIPPED = "Skipped"
    """The check does not apply here (no GPU, torch not installed); it fails nothing."""
    UNKNOWN = "Unknown"
    """The check ran but cannot decide about this target (a failed pair with no known-good
    partner to tell its members apart); not a pass, and not grounds to blacklist."""


@dataclass(frozen=True)
class CheckResult:
    """One check. ``value`` is what was measured, ``threshold`` what it was held against
    (``None``: informational); both are JSON-ready."""

    name: str
    target: str
    status: Status
    value: object = None
    threshold: object = None
    detail: str = ""
    time: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.status in (Status.SUCCEED, Status.SKIPPED)

    def line(self) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        what = f"{self.name} {self.target}" if self.target else self.name
        tail = f" ({self.detail})" if self.detail else ""
        return f"{stamp} {what}: {self.status.value}{tail}"

    def to_json(self) -> dict:
        return {
            "time": round(self.time, 3),
            "check": self.name,
            "target": self.target,
            "status": self.status.value,
            "passed": self.ok,
            "value": _jsonable(self.value),
            "threshold": _jsonable(self.threshold),
            "detail": self.detail,
        }


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def emit(results: list[CheckResult], as_json: bool, out) -> None:
    """Print results in the chosen format (lines, or one JSON object per line)."""
    for r in results:
        print(json.dumps(r.to_json()) if as_json else r.line(), file=out, flush=True)
