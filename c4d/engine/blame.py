"""Which rank or link explains a slow unit: hypotheses checked against every unit of the window.

A fault is hardware (DESIGN.md): a slow *rank* slows both directions of every link of that rank,
in every communicator; a slow *link* slows that link. So each hypothesis predicts which units
(a communicator's main collective, or a p2p link; see slow.py) it slows:

* ``affects(h)``: the units that use a link of rank r (every unit r is in), or that use link l;
* ``must_show(h)``: those of them it cannot hide in: a unit whose only links are the faulty
  ones (two ranks, a p2p link), or a ring whose pace-setting class of links (its links across
  nodes, or all of them inside one node) includes one of the rank's links or the link. A slow
  NVLink does not slow a ring that a network link already paces, so a rank's unit that does
  not pass a must-show test says nothing either way.

The window's units are *slow* (below ``slow_bw_ratio`` of their reference), *degraded* (below
``slow_degraded_ratio``), *clear* (at least ``slow_clear_ratio`` and hardly an op slow) or
unknown. For one slow unit, the candidates are its ranks and its links, narrowed by PEER pace
setters where the ring has them. A candidate is *contradicted* when a clear unit must show it;
among the others, the one that explains the most degraded units wins. A rank that explains two
or more units (two of its links show the fault) is named; a link is named when it alone is
left, or when it ties with its own ends (only one link shows the fault: the rank and the link
look the same, DESIGN.md says name the link). Anything else leaves suspects.

A slow unit that a culprit named in the last few windows explains (``named``: it affects the
unit) is that culprit's, not evidence against another rank of the unit: it supports only
candidates that share a rank with the culprit (explaining away). Without it, every rank of a
slow rank's data-parallel ring had one slow unit already, so a host's one-window hiccup of any
of their tensor-parallel pairs made a second "slow unit" and named that rank cross-comm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Hyp:
    """A rank (``rank``) or an undirected link (``link``, sorted ends) at fault."""

    rank: int = -1
    link: tuple[int, int] = (-1, -1)

    @property
    def is_link(self) -> bool:
        return self.rank < 0

    def ranks(self) -> tuple[int, ...]:
        return self.link if self.is_link else (self.rank,)


def link_of(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a <= b else (b, a)


@dataclass
class UnitShape:
    """What blame needs to know about a unit: its ranks, its links, which links set its pace."""

    key: tuple
    members: frozenset[int]
    links: frozenset[tuple[int, int]]  # undirected, global ranks
    pacing: frozenset[tuple[int, int]]  # the links whose class sets the unit's pace
    state: str = "unknown"  # slow | degraded | clear | unknown
    ratio: float = 1.0  # bandwidth / reference

    @property
    def weight(self) -> float:
        """How much a slow or degraded unit says: log(reference / bandwidth)."""
        if self.state not in ("slow", "degraded"):
            return 0.0
        return math.log(1.0 / min(max(self.ratio, 1e-3), 0.999))


def shape(
    key: tuple, members: tuple[int, ...], links: set[tuple[int, int]], node_of: dict[int, int]
) -> UnitShape:
    """A unit's shape; ``links`` undirected. Its pacing class: the links across nodes when it
    has any (network links are the slow ones), else all of them."""
    cross = {lk for lk in links if node_of.get(lk[0], -1) != node_of.get(lk[1], -2)}
    return UnitShape(key, frozenset(members), frozenset(links), frozenset(cross or links))


def ring_links(granks: list[int]) -> set[tuple[int, int]]:
    """The links of a ring over comm ranks in order (simnccl's ring; NCCL's own rings follow
    the topology, and PEER records add the links really seen)."""
    n = len(granks)
    if n < 2:
        return set()
    if n == 2:
        return {link_of(granks[0], granks[1])}
    return {link_of(granks[i], granks[(i + 1) % n]) for i in range(n)}


def affects(h: Hyp, u: UnitShape) -> bool:
    if h.is_link:
        return h.link in u.links
    return h.rank in u.members


def must_show(h: Hyp, u: UnitShape) -> bool:
    if h.is_link:
        return h.link in u.pacing
    return any(h.rank in lk for lk in u.pacing)


@dataclass
class Verdict:
    hyp: Hyp | None  # None: suspects only
    suspects: tuple[int, ...]
    support: int  # slow or degraded units it explains
    refine: str  # calibration refinement: "", "ambiguous"
    contradicted: tuple[Hyp, ...]  # candidates a clear unit ruled out


TIE = 0.75  # a candidate whose score is within this share of the best one ties with it


def explained(h: Hyp, u: UnitShape, named: tuple[Hyp, ...]) -> bool:
    """Is the slow or degraded unit ``u`` another culprit's, so that it says nothing of ``h``?
    It is when a named culprit affects it and ``h`` shares no rank with that culprit (a named
    link's ends stay as likely as before: one link's verdict cannot tell them from it)."""
    return u.weight > 0 and any(affects(c, u) and not set(h.ranks()) & set(c.ranks()) for c in named)


def decide(candidates: list[Hyp], units: list[UnitShape], named: tuple[Hyp, ...] = ()) -> Verdict:
    """Pick the candidate that explains the window (see module doc). A candidate's score is
    the summed weight (log of the slowdown) of the slow and degraded units it explains, so a
    barely degraded unit (noise on a loaded host) cannot outvote a clearly slow one; a
    candidate within ``TIE`` of the best ties with it. Units ``named`` culprits explain do not
    count for others (``explained``)."""
    bad: list[Hyp] = []
    ok: list[tuple[float, int, Hyp]] = []
    for h in sorted(set(candidates)):
        if any(u.state == "clear" and must_show(h, u) for u in units):
            bad.append(h)
            continue
        hit = [u for u in units if u.weight > 0 and affects(h, u) and not explained(h, u, named)]
        ok.append((sum(u.weight for u in hit), len(hit), h))
    if not ok:
        return Verdict(None, _ranks_of(candidates), 0, "", tuple(bad))
    best = max(sc for sc, _, _ in ok)
    top = [(n, h) for sc, n, h in ok if sc >= TIE * best]
    if len(top) == 1:
        n, h = top[0]
        return Verdict(h, h.ranks(), n, "", tuple(bad))
    links = [(n, h) for n, h in top if h.is_link]
    if len(links) == 1:
        n, lk = links[0]
        if all(h is lk or (not h.is_link and h.rank in lk.link) for _, h in top):
            # only one link shows the fault: its ends cannot be told from it
            return Verdict(lk, lk.ranks(), n, "ambiguous", tuple(bad))
    return Verdict(None, _ranks_of([h for _, h in top]), max(n for n, _ in top), "", tuple(bad))


def _ranks_of(hs: list[Hyp]) -> tuple[int, ...]:
    return tuple(sorted({r for h in hs for r in h.ranks()}))
