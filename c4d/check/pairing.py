"""Which nodes to test together, and which node to blame: the pure logic of ``c4d check nodes``.

Round 1 splits the nodes into pairs (a triple at the end when the count is odd). A group is
*suspect* when it failed or when its time exceeds ``factor`` x the lower median of the groups
that passed (the lower median, so that with two groups the fast one is the reference). Every
suspect is then re-tested with a *known-good* node (one from a passing, not-slow group); spare
good nodes pair among themselves so the load on shared hardware stays the same across rounds.

Verdicts (:class:`NodeStatus`) come from evidence only:

* a node that passed in some group is not faulty; it is a straggler if every group it passed
  in took over ``factor`` x the lower median of the passing groups of the same round (its
  *ratio*, the smallest over its groups, is above ``factor``) and at least two of its partners
  ran at normal speed elsewhere (so the slowness is its own, not a partner's, and one noisy
  measurement cannot convict). Comparing within a round cancels the load of the machine at the
  time; the lower median makes the fast group the reference when a round has only two;
* a node that never passed is faulty if it failed together with a node that passed elsewhere
  (the partner is proven good), or if its worker process died by itself;
* otherwise it is unresolved: with two nodes, or when all its partners failed too, there is
  nothing to tell the nodes of a failed group apart, and guessing would blacklist a good node.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class GroupResult:
    """One group's run in one round. ``time_s``: the slowest member's median iteration time
    (GEMM + all-gather); ``None`` when the group failed."""

    round: int
    nodes: tuple[str, ...]
    ok: bool
    time_s: float | None = None
    gemm_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "round": self.round,
            "nodes": list(self.nodes),
            "ok": self.ok,
            "time_s": self.time_s,
            "gemm_s": dict(self.gemm_s),
            "errors": dict(self.errors),
        }


class NodeStatus(str, Enum):
    OK = "ok"
    """Passed with some partner, and not slow."""
    STRAGGLER = "straggler"
    """Passed, but each of its groups took over straggler_factor x its round's median, with at
    least two partners that were fast elsewhere."""
    FAULTY = "faulty"
    """Failed with a partner proven good elsewhere, or its worker died."""
    UNRESOLVED = "unresolved"
    """Failed, but never with a proven-good partner: the check cannot tell it from its partners."""


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    status: NodeStatus
    time_s: float | None
    ratio: float | None
    reason: str

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "status": self.status.value,
            "time_s": self.time_s,
            "ratio": self.ratio,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Localization:
    verdicts: tuple[NodeVerdict, ...]
    references_s: dict[int, float]
    factor: float
    suspect_links: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...]

    def _with(self, status: NodeStatus) -> list[str]:
        return [v.node for v in self.verdicts if v.status is status]

    @property
    def faulty(self) -> list[str]:
        return self._with(NodeStatus.FAULTY)

    @property
    def stragglers(self) -> list[str]:
        return self._with(NodeStatus.STRAGGLER)

    @property
    def unresolved(self) -> list[str]:
        return self._with(NodeStatus.UNRESOLVED)

    @property
    def passed(self) -> bool:
        return all(v.status is NodeStatus.OK for v in self.verdicts)


def first_round(nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Consecutive pairs; an odd node out joins the last pair."""
    if len(nodes) < 2:
        raise ValueError("a node check needs at least 2 nodes")
    groups = [tuple(nodes[i : i + 2]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        groups[-1] = (*groups[-1], nodes[-1])
    return groups


def suspects(results: Sequence[GroupResult], factor: float) -> list[str]:
    """Members of groups that failed or were slow, in group order."""
    times = [g.time_s for g in results if g.ok and g.time_s is not None]
    ref = statistics.median_low(times) if len(times) >= 2 else None
    out: list[str] = []
    for g in results:
        slow = ref is not None and g.time_s is not None and g.time_s > factor * ref
        if not g.ok or slow:
            out.extend(n for n in g.nodes if n not in out)
    return out


def retest_round(pending: Sequence[str], good: Sequence[str]) -> list[tuple[str, ...]]:
    """One re-test round: each pending suspect with a distinct good node (as many as there are
    good nodes); the spare good nodes in pairs among themselves."""
    groups: list[tuple[str, ...]] = [(s, g) for s, g in zip(pending, good, strict=False)]
    spare = list(good[len(groups) :])
    groups += [tuple(spare[i : i + 2]) for i in range(0, len(spare) - 1, 2)]
    return groups


def round_references(results: Sequence[GroupResult]) -> dict[int, float]:
    """Per round, the lower median of the passing groups' times, or round 1's where a round has
    fewer than two passing groups. Groups of one round run together (or back to back), so
    comparing a group with its own round cancels out the load of the machine at that time."""
    by_round: dict[int, list[float]] = {}
    for g in results:
        if g.ok and g.time_s is not None:
            by_round.setdefault(g.round, []).append(g.time_s)
    refs = {r: statistics.median_low(ts) for r, ts in by_round.items() if len(ts) >= 2}
    fallback = refs.get(1)
    if fallback is not None:
        for r in {g.round for g in results}:
            refs.setdefault(r, fallback)
    return refs


def localize(
    nodes: Sequence[str],
    results: Sequence[GroupResult],
    factor: float,
    died: dict[str, str] | None = None,
) -> Localization:
    """Verdicts for every node from every group result (see the module docstring)."""
    died = died or {}
    by_node: dict[str, list[GroupResult]] = {n: [] for n in nodes}
    for g in results:
        for n in g.nodes:
            by_node.setdefault(n, []).append(g)
    passed = {n for g in results if g.ok for n in g.nodes}
    refs = round_references(results)
    best: dict[str, tuple[float, float | None]] = {}  # node -> (time, ratio to its round's reference)
    for n in nodes:
        scored = [
            (g.time_s / refs[g.round] if refs.get(g.round) else math.inf, g.time_s)
            for g in by_node[n]
            if g.ok and g.time_s is not None
        ]
        if scored:
            ratio, t = min(scored)
            best[n] = (t, None if math.isinf(ratio) else round(ratio, 2))
    notes: list[str] = []

    def fast(p: str) -> bool:  # ran at normal speed in some group
        r = best[p][1] if p in best else None
        return r is not None and r <= factor

    verdicts = []
    for n in nodes:
        best_t, best_ratio = best.get(n, (None, None))
        if n in died:
            verdicts.append(NodeVerdict(n, NodeStatus.FAULTY, best_t, best_ratio, f"worker died: {died[n]}"))
        elif n in passed:
            slow = best_t is not None and best_ratio is not None and best_ratio > factor
            witnesses = sorted({p for g in by_node[n] if g.ok for p in g.nodes if p != n and fast(p)})
            if slow and len(witnesses) >= 2:
                assert best_t is not None and best_ratio is not None  # implied by `slow`
                reason = (
                    f"every group it ran in was slow, best {best_t * 1e3:.1f} ms = {best_ratio:.1f}x its "
                    f"round's median, while its partners {', '.join(witnesses)} ran at normal speed elsewhere"
                )
                verdicts.append(NodeVerdict(n, NodeStatus.STRAGGLER, best_t, best_ratio, reason))
            else:
                if slow:
                    notes.append(
                        f"{n} was slow ({best_ratio:.1f}x) in every group it ran in, but fewer than two "
                        "of its partners were proven fast elsewhere: a possible straggler, not confirmed"
                    )
                verdicts.append(NodeVerdict(n, NodeStatus.OK, best_t, best_ratio, ""))
        else:
            proof = next(  # the latest round first: there the partner was known good beforehand
                (
                    (g, p)
                    for g in reversed(by_node[n])
                    if not g.ok
                    for p in g.nodes
                    if p != n and p in passed and p not in died
                ),
                None,
            )
            if proof:
                g, p = proof
                err = g.errors.get(n) or next(iter(g.errors.values()), "failed")
                reason = f"failed with known-good {p} in round {g.round} ({err})"
                verdicts.append(NodeVerdict(n, NodeStatus.FAULTY, None, None, reason))
            else:
                partners = sorted({p for g in by_node[n] for p in g.nodes if p != n})
                reason = (
                    f"cannot localize: failed only together with {', '.join(partners) or 'no partner'}, "
                    "none of which passed elsewhere"
                )
                verdicts.append(NodeVerdict(n, NodeStatus.UNRESOLVED, None, None, reason))
    links = tuple(
        g.nodes for g in results if not g.ok and len(g.nodes) > 1 and all(m in passed for m in g.nodes)
    )
    if links:
        notes.append(
            "groups failed although each member passed with another partner: suspect the link(s) "
            + "; ".join("<->".join(lk) for lk in links)
            + " or a transient fault"
        )
    if len(nodes) == 2:
        notes.append(
            "cannot localize with 2 nodes: they form one pair and there is no known-good node to re-pair "
            "with, so a failure or a slowdown cannot be attributed to either node"
        )
    elif passed and not refs:
        notes.append("stragglers not assessed: no round had two passing groups to compare")
    if any(v.status is NodeStatus.UNRESOLVED for v in verdicts) and len(nodes) != 2:
        notes.append("cannot localize every failure: unresolved nodes never ran with a known-good partner")
    return Localization(tuple(verdicts), refs, factor, links, tuple(notes))
