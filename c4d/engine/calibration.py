"""Confidence that means what it says: each localization's probability of being exactly right.

The engine decides *where* with rules (hang.py, slow.py); how often each rule is right depends
on the jobs it meets, so the confidence a rule reports is measured, not guessed. A
localization has a ``basis`` — its kind, how it was localized, what it names and the
refinement that matters for being right (``RankCommSlow:peer-progress/link/partial``: the
pace-setting link is one of its ends' only visible links, so a rank fault would look the
same). ``python analysis/evaluate.py --random N --seed S --learn`` runs the randomized fault
benchmark and writes, per basis, how many diagnoses had it and how many named exactly the
injected culprit into ``c4d/engine/calibration_table.py``. The confidence of a basis is the
Wilson lower bound (z = 1.28, one-sided 90 %) of that share, so a basis that was right 17 of
20 times says 0.73, not 0.85: confidences hold on a fresh seed (docs/performance.md's table checks
them on another seed than the one they were learned on). A basis the benchmark never produced
says ``PRIOR_CAP``, or less where the rule gives a lower ``prior`` (its own share of the
evidence, or one in N suspects).
"""

from __future__ import annotations

import math

from c4d.engine.calibration_table import TABLE
from c4d.engine.types import CycleMember, DiagKind, How, Localization, Target

PRIOR_CAP = 0.5  # an uncalibrated basis never claims more than this
Z = 1.28  # one-sided 90 % Wilson lower bound


def wilson_lower(right: int, n: int, z: float = Z) -> float:
    """Lower bound of the share of successes: small samples claim little."""
    if n <= 0:
        return 0.0
    p = right / n
    den = 1 + z * z / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / den)


def basis_key(kind: DiagKind, how: How, target: Target, refine: str = "") -> str:
    return f"{kind.value}:{how.value}/{target.value}" + (f"/{refine}" if refine else "")


def confidence(basis: str, prior: float) -> float:
    """Calibrated confidence of a basis (see module doc); ``prior`` where it was never measured."""
    got = TABLE.get(basis)
    if got is None:
        return round(min(prior, PRIOR_CAP), 2)
    n, right = got
    return round(wilson_lower(right, n), 2)


def localize(
    kind: DiagKind,
    how: How,
    target: Target,
    ranks: tuple[int, ...] | list[int],
    evidence: str,
    prior: float = PRIOR_CAP,
    refine: str = "",
    link: tuple[int, int] | None = None,
    directed: bool = False,
    cycle: tuple[CycleMember, ...] = (),
    posterior: float | None = None,
    runner_up: str | None = None,
    alternatives: tuple[str, ...] = (),
) -> Localization:
    """A Localization whose confidence comes from the calibration table, never above the
    evidence model's ``posterior`` where it gave one."""
    basis = basis_key(kind, how, target, refine)
    conf = confidence(basis, prior)
    if posterior is not None:
        posterior = round(posterior, 3)
        conf = min(conf, round(posterior, 2))
    return Localization(
        how=how,
        target=target,
        ranks=tuple(int(r) for r in ranks),
        confidence=conf,
        basis=basis,
        evidence=evidence,
        link=None if link is None else (int(link[0]), int(link[1])),
        directed=directed,
        cycle=cycle,
        posterior=posterior,
        runner_up=runner_up,
        alternatives=alternatives,
    )
