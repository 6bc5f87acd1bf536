"""Where a fault is: one evidence model for rank, link and node, shared by the hang and slow judges.

A fault is hardware (docs/design.md). Each *hypothesis* names what is broken and so which links
it slows or stops:

* a **rank** (its NIC, its PCIe link): every link with that rank as an end, both directions;
* a **link** between two ranks: that link;
* a **node** (host, NIC, switch port): every link with an end on that node.

Each *unit* of evidence is something the engine measured and judged: a communicator's main
collective in a check window, a p2p link, a stuck op, one network link that NCCL's profiler
reports progress for. A unit has the links it uses and the links that set its pace (its links
across nodes when it has any: a slowed NVLink stays faster than a network link; all of them
otherwise). A hypothesis *predicts* each unit:

* ``affected`` — a link it slows sets the unit's pace: the unit must show it;
* ``hidden`` — it slows only links that do not set the unit's pace: the unit may or may not;
* ``clear`` — it touches none of the unit's links.

A unit's judged state is ``slow`` (or stalled), ``degraded``, ``clear`` or unknown; an unknown
unit (not judged in this window, or a transfer inside a node, which NCCL does not report) is
not evidence either way. The score of a hypothesis is the log-likelihood of the judged states
under its predictions (``Likelihoods``: the chance of each state given each prediction, one
documented table in ``EngineConfig``), the posterior its share of the candidates' likelihoods
(uniform prior per fault). Culprits named in the last windows are part of every hypothesis
(explaining away): a unit such a culprit affects is predicted affected whatever the candidate,
and a candidate that is not one of them, nor includes one, pays the prior of a second fault.

The verdict is the best hypothesis with its posterior and runner-up, unless others tie with it
(within ``Likelihoods.tie`` in log-likelihood):

* a tied hypothesis that is a culprit already named: it (one fault, seen again);
* tied hypotheses that some judged-later unit could tell apart (a rank's other communicator not
  judged in this window): **undecided** — suspects now, revised when that unit is judged;
* tied hypotheses that only a unit a named culprit also slows would tell apart: **masked** —
  the judge waits a window, then names as below;
* tied hypotheses that nothing observable tells apart: the one whose faulty links every other
  one's include is named (one link seen stopped, its two ends' other links invisible: the link,
  its ends listed as ``alternatives``), or, when they all lie on one node, the **node**;
* otherwise suspects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Link = tuple[int, int]

AFFECTED, HIDDEN, CLEAR = "affected", "hidden", "clear"
STATES = ("slow", "degraded", "clear", "dim")  # dim: between the degraded and the clear lines


@dataclass(frozen=True, order=True)
class Hyp:
    """A rank (``rank``), an undirected link (``link``, sorted ends) or a node (``node``, its ranks
    in ``node_ranks``) at fault."""

    rank: int = -1
    link: Link = (-1, -1)
    node: int = -1
    node_ranks: tuple[int, ...] = ()
    node_name: str = field(default="", compare=False)

    @property
    def is_link(self) -> bool:
        return self.link[0] >= 0

    @property
    def is_node(self) -> bool:
        return self.node >= 0

    def ranks(self) -> tuple[int, ...]:
        if self.is_node:
            return self.node_ranks
        return self.link if self.is_link else (self.rank,)

    def breaks(self, lk: Link) -> bool:
        """Does this fault slow or stop link ``lk`` (undirected)?"""
        if self.is_link:
            return lk == self.link
        if self.is_node:
            return lk[0] in self.node_ranks or lk[1] in self.node_ranks
        return self.rank in lk

    def name(self) -> str:
        if self.is_node:
            return f"node {self.node_name or self.node}"
        return f"link {self.link[0]}-{self.link[1]}" if self.is_link else f"rank {self.rank}"


def link_of(a: int, b: int) -> Link:
    return (a, b) if a <= b else (b, a)


@dataclass
class UnitShape:
    """A unit of evidence: its ranks, its links, which of them set its pace, its judged state."""

    key: tuple
    members: frozenset[int]
    links: frozenset[Link]  # undirected, global ranks
    pacing: frozenset[Link]  # the links whose class sets the unit's pace
    state: str = "unknown"  # slow | degraded | clear | unknown
    ratio: float = 1.0  # bandwidth / reference (slow units); progress (PEER links)
    source: str = "unit"  # what measured it: unit | peer | p2p (the verdict's ``how``)
    sib_pacing: tuple[frozenset[Link], ...] = ()
    """Judged against siblings (units of its shape in the same window): the pacing links of
    its sibling group, its own ``sib_self`` entries among them (one tuple the group shares: a
    tuple per unit of the others' is quadratic in the group's size, thousands in a large job). A
    fault that slows half of the others or more moves the reference too: the unit cannot show it."""
    sib_self: int = 0


def shape(
    key: tuple, members: tuple[int, ...], links: set[Link], node_of: dict[int, int], source: str = "unit"
) -> UnitShape:
    """A unit's shape; ``links`` undirected. Its pacing class: the links across nodes when it
    has any (network links are the slow ones), else all of them."""
    cross = {lk for lk in links if node_of.get(lk[0], -1) != node_of.get(lk[1], -2)}
    return UnitShape(key, frozenset(members), frozenset(links), frozenset(cross or links), source=source)


def ring_links(granks: list[int]) -> set[Link]:
    """The links of a ring over comm ranks in order (simnccl's ring; NCCL's own rings follow
    the topology, and PEER records add the links really seen)."""
    n = len(granks)
    if n < 2:
        return set()
    if n == 2:
        return {link_of(granks[0], granks[1])}
    return {link_of(granks[i], granks[(i + 1) % n]) for i in range(n)}


def predict(hs: tuple[Hyp, ...], u: UnitShape) -> str:
    """What the faults ``hs`` together predict for unit ``u``."""
    if any(h.breaks(lk) for h in hs for lk in u.pacing):
        others = len(u.sib_pacing) - u.sib_self
        if others <= 0:
            return AFFECTED
        # its own entries are broken too (its pacing is): counted, then taken off
        hit = sum(1 for sp in u.sib_pacing if any(h.breaks(lk) for h in hs for lk in sp)) - u.sib_self
        return HIDDEN if 2 * hit >= others else AFFECTED
    if any(h.breaks(lk) for h in hs for lk in u.links):
        return HIDDEN
    return CLEAR


@dataclass(frozen=True)
class Likelihoods:
    """P(judged state | prediction), each a (slow, degraded, clear) triple: the model's error
    rates (``EngineConfig.model_*``, documented there). ``tie``: hypotheses within this
    log-likelihood of the best are not told apart by the evidence."""

    affected: tuple[float, float, float]
    hidden: tuple[float, float, float]
    clear: tuple[float, float, float]
    tie: float
    fault_prior: float
    """log prior odds of one more fault: a hypothesis that needs a fault beside the culprits
    already named pays it once per fault that none of the others includes."""
    dim: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """P(dim) per prediction (affected, hidden, clear); the rows above are given not dim (the
    hang judge's units are never dim)."""

    def log(self, pred: str, state: str) -> float:
        i = (AFFECTED, HIDDEN, CLEAR).index(pred)
        if state == "dim":
            return math.log(self.dim[i])
        row = (self.affected, self.hidden, self.clear)[i]
        return math.log((1.0 - self.dim[i]) * row[STATES.index(state)])


@dataclass
class Verdict:
    hyp: Hyp | None  # None: suspects only
    suspects: tuple[int, ...]
    posterior: float  # the named hypothesis's share of the candidates' likelihood (0: none named)
    runner_up: Hyp | None
    refine: str  # "": told apart; "equivalent": nothing observable tells it from ``alternatives``;
    #              "masked": a unit would, but a culprit already named slows it too;
    #              "undecided": a unit not judged now may tell (suspects now)
    alternatives: tuple[Hyp, ...] = ()
    decisive: tuple[UnitShape, ...] = ()  # judged units that tell the winner from the runner-up
    contradicted: tuple[Hyp, ...] = ()  # candidates a clear unit they must show rules out
    support: int = 0  # slow or degraded units the named hypothesis explains
    scores: dict[Hyp, float] = field(default_factory=dict)


def score(
    h: Hyp, units: list[UnitShape], lik: Likelihoods, named: tuple[Hyp, ...] = ()
) -> tuple[float, bool, int]:
    """Log-likelihood of the judged units under ``h`` (with the ``named`` culprits), whether a
    clear unit it must show contradicts it, and how many bad units it explains."""
    with_named = tuple(sorted({h, *named}))
    faults = sum(1 for x in with_named if not any(y != x and _within(x, y) for y in with_named))
    total, bad, support = faults * lik.fault_prior, False, 0
    for u in units:
        if u.state not in STATES:
            continue
        pred = predict(with_named, u)
        total += lik.log(pred, u.state)
        if u.state == "clear" and predict((h,), u) == AFFECTED:
            bad = True
        if u.state in ("slow", "degraded") and predict((h,), u) != CLEAR:
            support += 1
    return total, bad, support


def decide(
    candidates: list[Hyp],
    units: list[UnitShape],
    lik: Likelihoods,
    named: tuple[Hyp, ...] = (),
    later: tuple[UnitShape, ...] = (),
    past: dict[Hyp, float] | None = None,
    again: tuple[Hyp, ...] = (),
) -> Verdict:
    """The model's verdict over ``candidates`` (see module doc). ``later``: units known from
    earlier windows that are not judged now (their state may tell tied hypotheses apart).
    ``past``: each hypothesis's log-likelihood relative to the best in earlier windows of the
    same episode (``Evidence``), added to this window's. ``again``: culprits named before from
    this same evidence: not explaining it away (``past`` carries what told them; this window's
    evidence may revise them), but the one named when it still ties (one fault, seen again)."""
    cands = sorted(set(candidates))
    if not cands:
        return Verdict(None, (), 0.0, None, "")
    scored = {h: score(h, units, lik, named) for h in cands}
    past = past or {}
    sc = {h: s + past.get(h, 0.0) for h, (s, _, _) in scored.items()}
    best = max(sc.values())
    z = sum(math.exp(s - best) for s in sc.values())
    post = {h: math.exp(s - best) / z for h, s in sc.items()}
    order = sorted(cands, key=lambda h: (-sc[h], _size(h), h))
    top = [h for h in order if sc[h] >= best - lik.tie]
    contradicted = tuple(h for h in cands if scored[h][1])
    runner = next((h for h in order if h not in top), None)
    # a culprit already named, the one that includes the most of the tied (a rank over its link)
    seen = (*named, *again)
    held = sorted((h for h in top if h in seen), key=lambda h: -sum(_within(o, h) for o in top))
    if len(top) == 1 or held:
        h = held[0] if held else top[0]
        p = sum(post[o] for o in top if _within(o, h))  # what it includes is the same fault
        alts = tuple(o for o in top if not _within(o, h))
        return Verdict(h, h.ranks(), p, runner, "equivalent" if alts else "", alts,
                       _decisive(h, runner, units, named), contradicted, scored[h][2], sc)  # fmt: skip
    judged = [u for u in units if u.state in STATES]
    keys = {x.key for x in judged}
    unjudged = [u for u in (*units, *later) if u.state not in STATES or u.key not in keys]
    pairs = [(a, b) for i, a in enumerate(top) for b in top[i + 1 :]]
    ranks = tuple(sorted({r for h in top for r in h.ranks()}))
    if any(_tells(a, b, u, named) for u in unjudged for a, b in pairs):
        return Verdict(None, ranks, 0.0, top[0], "undecided", tuple(top), (), contradicted, 0, sc)
    # a judged unit that would tell them apart but for a named culprit that slows it too
    masked = any(_tells(a, b, u, ()) for u in judged if u.state != "clear" for a, b in pairs)
    small = [h for h in top if all(_within(h, o) for o in top)]
    if small:
        h = small[0]
        alts = tuple(o for o in top if o != h)
        return Verdict(h, h.ranks(), post[h], runner, "masked" if masked else "equivalent", alts,
                       _decisive(h, runner, units, named), contradicted, scored[h][2], sc)  # fmt: skip
    return Verdict(None, ranks, 0.0, top[0], "", tuple(top), (), contradicted, 0, sc)


class Evidence:
    """What earlier windows said of the hypotheses behind each slow unit (an episode): per unit,
    the sum of each hypothesis's log-likelihood relative to the best of each window, a window's
    weight ``memory`` times the next one's. One window's noise (a host that descheduled a
    process) then moves a verdict less than a fault that shows window after window; an episode
    whose unit is no longer slow fades out."""

    def __init__(self, memory: float) -> None:
        self.memory = memory
        self.acc: dict[tuple, dict[Hyp, float]] = {}
        self.now: dict[tuple, dict[Hyp, float]] = {}

    def past(self, key: tuple) -> dict[Hyp, float]:
        return self.acc.get(key, {})

    def add(self, key: tuple, v: Verdict, past: dict[Hyp, float]) -> None:
        """The verdict on unit ``key`` in this window (its scores include ``past``)."""
        if not v.scores:
            return
        raw = {h: s - past.get(h, 0.0) for h, s in v.scores.items()}
        best = max(raw.values())
        self.now[key] = {h: s - best for h, s in raw.items()}

    def close_window(self) -> None:
        out: dict[tuple, dict[Hyp, float]] = {}
        for key in self.acc.keys() | self.now.keys():
            acc = {h: self.memory * x for h, x in self.acc.get(key, {}).items()}
            for h, x in self.now.get(key, {}).items():
                acc[h] = acc.get(h, 0.0) + x
            acc = {h: x for h, x in acc.items() if x < -0.05}
            if acc:
                out[key] = acc
        self.acc, self.now = out, {}


def on_one_node(v: Verdict, node_of: dict[int, int]) -> int | None:
    """The node a verdict's tied hypotheses all lie on, when that node is all it can tell: a
    verdict without a culprit, or one whose culprit ties with two or more ranks (a link inside
    a node and its ends: transfers inside a node are not observed, so its ranks cannot be told
    apart). A culprit tied only with what contains it (a rank and its node) is told: None."""
    if not v.alternatives:
        return None
    tied = (*((v.hyp,) if v.hyp is not None else ()), *v.alternatives)
    if v.hyp is not None and sum(1 for h in tied if not h.is_link and not h.is_node) < 2:
        return None
    nodes = {h.node for h in tied if h.is_node}
    nodes |= {node_of.get(r, -1) for h in tied if not h.is_node for r in h.ranks()}
    return next(iter(nodes)) if len(nodes) == 1 and -1 not in nodes else None


def _size(h: Hyp) -> int:
    return 2 if h.is_link else len(h.node_ranks) * 8 if h.is_node else 4


def _within(h: Hyp, o: Hyp) -> bool:
    """Is every link ``h`` breaks one that ``o`` breaks too (``h`` the smaller fault)?"""
    if h == o:
        return True
    if h.is_link:
        return o.breaks(h.link)
    if o.is_node and not h.is_node:
        return h.rank in o.node_ranks
    return False


def _tells(a: Hyp, b: Hyp, u: UnitShape, named: tuple[Hyp, ...]) -> bool:
    return predict((a, *named), u) != predict((b, *named), u)


def _decisive(h: Hyp, r: Hyp | None, units: list[UnitShape], named: tuple[Hyp, ...]) -> tuple[UnitShape, ...]:
    if r is None:
        return tuple(u for u in units if u.state in STATES and predict((h,), u) != CLEAR)
    return tuple(u for u in units if u.state in STATES and _tells(h, r, u, named))
