"""Simulated faults for the check workers, so tests and demos can break a node on purpose.

``C4D_CHECK_SIM_FAULT`` holds entries separated by ``,`` or ``;``, each ``KIND:TARGET[:FACTOR]``.
TARGET is a worker's name: ``node-K`` for ``c4d check nodes``, ``rank-K`` for the boot
all-reduce processes. KIND:

=========  ===========================================================================
``slow``   the worker is FACTOR times slower (default 5): each step it sleeps (FACTOR-1) x its
           natural step time (measured in the warm-up) before joining the collective
``fail``   the worker never joins its group's collective; its partners time out
``crash``  the worker process exits (status 17) when it is given work
``corrupt`` the worker contributes wrong data to the collective
=========  ===========================================================================

Example: ``C4D_CHECK_SIM_FAULT="slow:node-2:5"`` or ``"fail:node-3"``. The worker reads the
variable itself; the coordinator only validates it once to print a clear message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "C4D_CHECK_SIM_FAULT"
KINDS = ("slow", "fail", "crash", "corrupt")
CRASH_STATUS = 17


@dataclass(frozen=True)
class SimFault:
    kind: str
    target: str
    factor: float = 1.0


def parse(text: str | None) -> tuple[dict[str, SimFault], list[str]]:
    """Faults by target name, and one message per malformed entry (which is ignored)."""
    faults: dict[str, SimFault] = {}
    errors: list[str] = []
    for raw in (text or "").replace(";", ",").split(","):
        entry = raw.strip()
        if not entry:
            continue
        parts = entry.split(":")
        kind = parts[0].strip().lower()
        if kind not in KINDS or len(parts) < 2 or not parts[1].strip() or len(parts) > 3:
            errors.append(
                f"{ENV}: ignoring '{entry}' (expected KIND:TARGET[:FACTOR], KIND one of {', '.join(KINDS)})"
            )
            continue
        factor = 5.0 if kind == "slow" else 1.0
        if len(parts) == 3:
            try:
                factor = float(parts[2])
            except ValueError:
                errors.append(f"{ENV}: ignoring '{entry}' (FACTOR '{parts[2]}' is not a number)")
                continue
            if not factor >= 1.0:
                errors.append(f"{ENV}: ignoring '{entry}' (FACTOR must be >= 1)")
                continue
        target = parts[1].strip()
        faults[target] = SimFault(kind, target, factor)
    return faults, errors


def for_worker(name: str) -> SimFault | None:
    """The fault this worker must simulate, read from its own environment."""
    return parse(os.environ.get(ENV))[0].get(name)
