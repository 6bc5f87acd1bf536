"""Hangs and lost ranks: a wait-for graph rebuilt at every tick from the latest heartbeats.

Nodes are the ops ranks are blocked in: a collective ``(C, k)`` (a member has arrived,
``n_arrived > k = n_done``) or a p2p op ``(C, w, op, q, s)`` (w's oldest pending op is a
send/recv with peer q that has started). From every node some member has waited in for
more than T, the graph is walked towards what it waits for:

* a collective waits for its members that have not arrived at k; a p2p op for its peer;
* such a rank that is itself blocked in another op is a *victim*: follow that op;
* a rank that is blocked nowhere is a *culprit* → RankNonCommHang (its compute or host is
  stuck, or its stream is busy before the op);
* a collective every member has arrived at → RankCommHang (a transfer stopped), localized
  by peer progress, else cross-comm evidence, else every member is a suspect;
* a p2p op whose counterpart has also started or already finished → RankCommHang on the
  link (localized by the p2p pair);
* a silent rank (no record for longer than the stale limit) is no evidence: once it is
  lost it explains everyone waiting on it (RankLost), and its victims are not blamed.

Evidence must be current: a culprit is named only when one of its own reports, written
at least T/2 into the wait, still shows it not arrived (so a rank that crashed a moment
after its last heartbeat turns into RankLost, not RankNonCommHang). Durations are on the
master clock: rank times minus the rank's estimated offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from c4d.engine.config import ResolvedThresholds
from c4d.engine.peer import global_links, localize_hang
from c4d.engine.state import P2P, Comm, RankTable
from c4d.engine.types import DiagKind
from c4d.schema import Op, OpFlag

SEND, RECV = int(Op.Send), int(Op.Recv)
IN_GROUP = int(OpFlag.IN_GROUP)


@dataclass
class Finding:
    """A hang (or loss) in progress; the engine turns it into diagnoses as its count grows."""

    key: tuple
    kind: DiagKind
    comm: Comm | None
    op: int | None
    seq: int | None
    ranks: tuple[int, ...]
    start_ns: int  # master clock: when the waiting (or the silence) began
    localized: bool
    detail: dict = field(default_factory=dict)


@dataclass
class _Node:
    key: tuple
    comm: Comm
    seq: int
    op: int | None
    p2p: bool
    waiters: list[tuple[int, int]] = field(default_factory=list)  # (global rank, since master ns)
    w: int = -1  # p2p: blocked comm rank
    q: int = -1  # p2p: its peer (comm rank)

    @property
    def start(self) -> int:
        return min(s for _, s in self.waiters)

    @property
    def last_arrival(self) -> int:
        return max(s for _, s in self.waiters)


@dataclass
class _Expl:
    terms: set = field(default_factory=set)
    pending: set = field(default_factory=set)  # ranks whose evidence is stale or unknown
    cycle: bool = False

    def merge(self, o: _Expl) -> None:
        self.terms |= o.terms
        self.pending |= o.pending
        self.cycle |= o.cycle


class WaitGraph:
    """One tick's wait-for graph (see module doc)."""

    def __init__(self, ranks: RankTable, comms: dict[int, Comm], th: ResolvedThresholds, now: int):
        self.r, self.comms, self.th, self.now = ranks, comms, th, now
        T = th.hang_timeout_ns
        self.T = T
        seen = ranks.seen
        silence = np.where(seen, now - ranks.last_recv, 0)
        running = seen & ~ranks.final
        alive = running & (silence <= th.lost_after_ns)
        self.stale = running & (silence > th.stale_after_ns)
        self.lost = running & (silence > th.lost_after_ns) & (alive.sum() > 0)
        self.silence = silence
        self.nodes: dict[tuple, _Node] = {}
        self.blocks_of: dict[int, list[tuple]] = {}
        self.view: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for c in comms.values():
            self._collect(c)
        self._memo: dict[tuple, _Expl] = {}
        self._stack: set[tuple] = set()

    # -- graph nodes -------------------------------------------------------------------
    def _collect(self, c: Comm) -> None:
        done = c.done_eff()
        arr = np.maximum(c.n_arrived, done)
        off = self.r.offsets(c.grank)
        self.view[c.idx] = (arr, done, off)
        live = c.hb_seen & ~c.gone & (c.grank >= 0)
        if not live.any():
            return
        for cr in np.flatnonzero(live & (arr > done)).tolist():
            k = int(done[cr])
            t = int(c.last_arrive[cr]) or int(c.pend_start[cr]) or int(c.pend_issue[cr]) or int(c.hb_time[cr])
            op = int(c.pend_op[cr]) if c.pend_seq[cr] == k and not c.pend_flags[cr] & P2P else None
            self._add(("c", c.idx, k), c, k, op, False, int(c.grank[cr]), t - int(off[cr]))
        pb = live & (c.pend_seq >= 0) & ((c.pend_flags & P2P) != 0) & (c.pend_start > 0)
        for cr in np.flatnonzero(pb).tolist():
            op, q, s = int(c.pend_op[cr]), int(c.pend_peer[cr]), int(c.pend_seq[cr])
            if c.p2p_done.get((cr, op, q), 0) > s:
                continue  # its OP record already says done: the heartbeat is behind
            key = ("p", c.idx, cr, op, q, s)
            self._add(key, c, s, op, True, int(c.grank[cr]), int(c.pend_start[cr]) - int(off[cr]), cr, q)

    def _add(self, key, c, seq, op, p2p, g, since, w=-1, q=-1) -> None:
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node(key, c, seq, op, p2p, w=w, q=q)
        elif node.op is None:
            node.op = op
        node.waiters.append((g, since))
        self.blocks_of.setdefault(g, []).append(key)

    def report_ns(self, c: Comm, cr: int) -> int:
        """Master time of member cr's latest report on comm c."""
        return int(c.hb_time[cr]) - int(self.view[c.idx][2][cr])

    # -- walking -----------------------------------------------------------------------
    def sources(self) -> list[tuple]:
        """Nodes in which a rank with current reports has waited longer than T."""
        out = []
        for key, node in self.nodes.items():
            if any(self.now - s > self.T and not self.stale[g] for g, s in node.waiters):
                out.append(key)
        return sorted(out, key=lambda k: (self.nodes[k].start, k))

    def explain(self, key: tuple) -> _Expl:
        if key in self._memo:
            return self._memo[key]
        if key in self._stack:
            return _Expl(cycle=True)
        self._stack.add(key)
        node = self.nodes[key]
        e = self._p2p(node) if node.p2p else self._coll(node)
        self._stack.discard(key)
        self._memo[key] = e
        return e

    def _rank(self, g: int, via: _Node, conf_t: int, c: Comm, cr: int, e: _Expl) -> None:
        """Non-arrived rank g (comm rank cr of c) reached from node ``via``."""
        if self.lost[g]:
            e.terms.add(("lost", g))
            return
        if self.stale[g]:
            e.pending.add(g)
            return
        others = [k for k in self.blocks_of.get(g, []) if k != via.key]
        if others:
            for k in others:
                e.merge(self.explain(k))
            return
        seen = c.hb_seen[cr]
        t = self.report_ns(c, cr) if seen else int(self.r.last_recv[g])
        if t >= conf_t or self.r.final[g]:
            e.terms.add(("nc", g, via.key))
        else:
            e.pending.add(g)

    def _coll(self, node: _Node) -> _Expl:
        c, k = node.comm, node.seq
        arr, done, _ = self.view[c.idx]
        e = _Expl()
        members = c.members()
        if (done[members] > k).any():
            return e  # finished somewhere: the waiters' reports are just behind
        conf_t = node.start + self.T // 2
        nonarr = members[arr[members] <= k]
        if not len(nonarr):
            e.terms |= self._everyone_arrived(
                c, members, node.last_arrival + self.T // 2, e, ("stuck", c.idx, k)
            )
            return e
        for cr in nonarr.tolist():
            g = int(c.grank[cr])
            if g < 0:
                e.pending.add(("comm-rank", c.idx, cr))
                continue
            self._rank(g, node, conf_t, c, cr, e)
        return e

    def _everyone_arrived(self, c: Comm, members, conf_t: int, e: _Expl, term: tuple) -> set:
        """Every needed member is in the op: a stopped transfer, once all reports confirm it."""
        out, ok = set(), True
        for cr in members.tolist() if hasattr(members, "tolist") else members:
            g = int(c.grank[cr])
            if g < 0:
                e.pending.add(("comm-rank", c.idx, cr))
                ok = False
            elif self.lost[g]:
                out.add(("lost", g))
                ok = False
            elif self.stale[g] or (self.report_ns(c, cr) < conf_t and not self.r.final[g]):
                e.pending.add(g)
                ok = False
        if ok:
            out.add(term)
        return out

    @staticmethod
    def _group_partners(c: Comm, w: int, op: int | None, q: int) -> list[int]:
        out = []
        for (a, op2, q2), done in sorted(c.p2p_done.items()):
            if a != w or (op2 == op and q2 == q):
                continue
            if c.p2p_done.get((q2, _counter(op2), w), 0) <= done:  # q2 has not finished seq `done`
                out.append(q2)
        return sorted(set(out))

    def _p2p(self, node: _Node) -> _Expl:
        c, s, w, q = node.comm, node.seq, node.w, node.q
        e = _Expl()
        if not 0 <= q < c.n or c.grank[q] < 0:
            e.pending.add(("comm-rank", c.idx, q))
            return e
        gq = int(c.grank[q])
        counter = SEND if node.op == RECV else RECV
        q_done = c.p2p_done.get((q, counter, w), 0) > s
        q_in = bool(
            c.hb_seen[q]
            and c.pend_flags[q] & P2P
            and c.pend_op[q] == counter
            and c.pend_peer[q] == w
            and c.pend_seq[q] == s
            and c.pend_start[q] > 0
        )
        if q_done and (c.pend_flags[w] & IN_GROUP or c.p2p_in_flight[w] > 1):
            # This op's transfer is over, but it shares its group's events: w waits for the
            # group's other p2p ops. Those are the next seqs w has not finished with each
            # peer whose side of that seq has not finished either.
            others = self._group_partners(c, w, node.op, q)
            if others:
                for q2 in others:
                    if not 0 <= q2 < c.n or c.grank[q2] < 0:
                        e.pending.add(("comm-rank", c.idx, q2))
                    else:
                        self._rank(int(c.grank[q2]), node, node.start + self.T // 2, c, q2, e)
                return e
        if q_done or q_in:
            sender, receiver = (int(c.grank[w]), gq) if node.op == SEND else (gq, int(c.grank[w]))
            need = [w] if q_done else [w, q]
            conf_t = node.last_arrival + self.T // 2
            e.terms |= self._everyone_arrived(c, need, conf_t, e, ("link", c.idx, sender, receiver, s))
            return e
        self._rank(gq, node, node.start + self.T // 2, c, q, e)
        return e


def _counter(op: int) -> int:
    return SEND if op == RECV else RECV


def _op_of(c: Comm, k: int, node_op: int | None) -> int | None:
    if node_op is not None and node_op != 255:
        return node_op
    slot = k % c.W
    return int(c.opk[slot]) if c.tag[slot] == k else None


def evaluate(ranks: RankTable, comms: dict[int, Comm], th: ResolvedThresholds, now: int) -> list[Finding]:
    """Every hang and loss in progress at master time ``now`` (durations may still be < T)."""
    G = WaitGraph(ranks, comms, th, now)
    out: list[Finding] = []
    term_sources: dict[tuple, list[tuple]] = {}
    pending: set = set()
    for key in G.sources():
        e = G.explain(key)
        pending |= e.pending
        terms = set(e.terms)
        if not terms and not e.pending and e.cycle:
            terms.add(("cycle", key))
        for t in terms:
            term_sources.setdefault(t, []).append(key)
    missing = sorted(p for p in pending if isinstance(p, int))
    unknown = sorted(f"{comms[p[1]].id:016x}/{p[2]}" for p in pending if isinstance(p, tuple))

    def common(t: tuple, d: dict) -> dict:
        srcs = term_sources[t]
        victims = sorted({g for k in srcs for g, _ in G.nodes[k].waiters})
        d["victims"] = victims[:64]
        d["victim_comms"] = sorted({f"{G.nodes[k].comm.id:016x}" for k in srcs})
        d["missing"] = missing[:64]
        if unknown:
            d["unknown_comm_ranks"] = unknown[:64]
        return d

    # RankNonCommHang: a culprit may be missing from several ops; it is charged to the one
    # waited on longest. Every culprit of the tick forms one diagnosis (a whole node that
    # hangs is one event), keyed by the op waited on longest, so it keeps its count while
    # more culprits are confirmed.
    via_of: dict[int, tuple] = {}
    for t in term_sources:
        if t[0] == "nc":
            g, via = t[1], t[2]
            cur = via_of.get(g)
            if cur is None or (G.nodes[via].start, via) < (G.nodes[cur].start, cur):
                via_of[g] = via
    if via_of:
        culprits = sorted(via_of)
        via = min(via_of.values(), key=lambda k: (G.nodes[k].start, k))
        node = G.nodes[via]
        c = node.comm
        states = {}
        for g in culprits:
            n2 = G.nodes[via_of[g]]
            c2 = n2.comm
            cr = int(np.flatnonzero(c2.grank == g)[0]) if (c2.grank == g).any() else -1
            if n2.p2p:
                states[str(g)] = "not at the matching p2p op"
            elif cr >= 0 and c2.n_issued[cr] > n2.seq:
                states[str(g)] = "issued, its stream has not reached the op"
            else:
                states[str(g)] = "not issued"
        op = _counter(node.op) if node.p2p and node.op is not None else node.op
        srcs = [t for t in term_sources if t[0] == "nc"]
        d = {
            "localized_by": "arrival",
            "localized": True,
            "confidence": 0.9 if not missing else 0.75,
            "suspects": culprits,
            "waiting_ranks": sorted({g for g, _ in node.waiters}),
            "culprit_state": states,
        }
        d = common(srcs[0], d)
        d["victims"] = sorted({v for t in srcs for k in term_sources[t] for v, _ in G.nodes[k].waiters})[:64]
        d["victim_comms"] = sorted({f"{G.nodes[k].comm.id:016x}" for t in srcs for k in term_sources[t]})
        if len(culprits) > 1:
            d["culprit_ops"] = {
                str(g): f"{G.nodes[v].comm.id:016x}#{G.nodes[v].seq}" for g, v in sorted(via_of.items())
            }
        out.append(
            Finding(("nc", via), DiagKind.RankNonCommHang, c, _op_of(c, node.seq, op), node.seq,
                    tuple(culprits), node.start, True, d)
        )  # fmt: skip

    # RankCommHang on collectives everyone has arrived at, and on stuck p2p pairs
    stuck = sorted(t for t in term_sources if t[0] in ("stuck", "link"))
    shared: dict[int, int] = {}
    for t in stuck:
        for g in _term_ranks(t, comms):
            shared[g] = shared.get(g, 0) + 1
    for t in stuck:
        c = comms[t[1]]
        if t[0] == "link":
            sender, receiver, s = t[2], t[3], t[4]
            nodes = [n for k, n in G.nodes.items() if n.p2p and n.comm is c and n.seq == s]
            start = max(n.last_arrival for n in nodes) if nodes else now
            d = {
                "localized_by": "p2p-pair",
                "localized": True,
                "confidence": 0.8,
                "suspects": [sender, receiver],
                "link": [sender, receiver],
            }
            out.append(
                Finding(t, DiagKind.RankCommHang, c, SEND, s, (sender, receiver), start, True, common(t, d))
            )
            continue
        k = t[2]
        node = G.nodes[("c", c.idx, k)]
        verdict, no_peer = localize_hang(c, k)
        members_g = [int(g) for g in c.grank[c.members()] if g >= 0]
        d = {"waiting_ranks": sorted({g for g, _ in node.waiters})}
        if verdict is not None:
            ranks_g = tuple(int(c.grank[r]) for r in verdict.ranks)
            d.update(localized_by="peer-progress", localized=True, confidence=verdict.confidence)
            d.update(global_links(verdict.evidence, c))
            if verdict.is_link:
                d["link"] = list(ranks_g)
            localized = True
        elif len(members_g) == 2:
            # a two-rank communicator is a single link: nothing finer to localize
            ranks_g = tuple(sorted(members_g))
            d.update(localized_by="heartbeat", localized=True, confidence=0.7, link=list(ranks_g))
            localized = True
        else:
            multi = sorted(g for g in members_g if shared.get(g, 0) > 1)
            if len(multi) == 1:
                ranks_g = (multi[0],)
                d.update(localized_by="cross-comm", localized=True, confidence=0.6)
                localized = True
            else:
                ranks_g = tuple(sorted(members_g))
                d.update(
                    localized_by="heartbeat", localized=False, confidence=round(1 / max(len(members_g), 1), 2)
                )
                localized = False
        d["suspects"] = list(ranks_g)
        d["no_peer_progress"] = sorted(int(c.grank[r]) for r in no_peer if c.grank[r] >= 0)[:64]
        out.append(
            Finding(t, DiagKind.RankCommHang, c, _op_of(c, k, node.op), k, ranks_g,
                    node.last_arrival, localized, common(t, d))
        )  # fmt: skip

    for t in sorted(t for t in term_sources if t[0] == "cycle"):
        node = G.nodes[t[1]]
        involved = sorted({g for k in term_sources[t] for g, _ in G.nodes[k].waiters})
        d = {
            "localized_by": "heartbeat",
            "localized": False,
            "confidence": 0.1,
            "suspects": involved,
            "note": "ranks wait on each other in a cycle (mismatched collective order?)",
        }
        out.append(
            Finding(t, DiagKind.RankCommHang, node.comm, _op_of(node.comm, node.seq, node.op), node.seq,
                    tuple(involved), node.start, False, common(t, d))
        )  # fmt: skip

    # RankLost: silent ranks (one diagnosis for all of them: a node that dies is one event,
    # keyed by the first to fall silent); the hangs they explain are listed, not blamed on
    # the victims.
    lost = np.flatnonzero(G.lost).tolist()
    if lost:
        first = min(lost, key=lambda g: (int(ranks.last_recv[g]), g))
        d = {
            "localized_by": "heartbeat",
            "localized": True,
            "confidence": 0.95,
            "suspects": lost,
            "silent_s": {str(g): round(int(G.silence[g]) / 1e9, 3) for g in lost},
        }
        explained = [("lost", g) for g in lost if ("lost", g) in term_sources]
        if explained:
            d = common(explained[0], d)
            d["victims"] = sorted(
                {v for t in explained for k in term_sources[t] for v, _ in G.nodes[k].waiters}
            )[:64]
            d["victim_comms"] = sorted(
                {f"{G.nodes[k].comm.id:016x}" for t in explained for k in term_sources[t]}
            )
        start = int(ranks.last_recv[first])
        out.append(Finding(("lost", first), DiagKind.RankLost, None, None, None, tuple(lost), start, True, d))
    return out


def _term_ranks(t: tuple, comms: dict[int, Comm]) -> list[int]:
    if t[0] == "link":
        return [t[2], t[3]]
    c = comms[t[1]]
    return [int(g) for g in c.grank[c.members()] if g >= 0]
