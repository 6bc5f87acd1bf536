"""Hangs, mismatches and lost ranks: a wait-for graph rebuilt at every tick from the latest heartbeats.

Nodes are the ops ranks are blocked in: a collective (C, k) (a member has arrived,
``n_arrived > k = n_done``) or a p2p op (C, w, op, q, s) (w's oldest pending op is a send/recv
with peer q that has started). From every node some member has waited in for more than T,
the graph is walked towards what it waits for:

* a collective waits for its members that have not arrived at k; a p2p op for its peer;
* such a rank that is itself blocked in another op is a *victim*: follow that op;
* a rank that is blocked nowhere is a *culprit* → RankNonCommHang (its compute or host is
  stuck, or its stream is busy before the op);
* a collective every member has arrived at → RankCommHang (a transfer stopped), localized
  by peer progress, a two-rank communicator, cross-comm evidence, else every member is a
  suspect;
* a p2p op whose counterpart has also started or already finished → RankCommHang on the
  link (localized by the p2p pair);
* ops that wait for each other in a cycle → CollectiveMismatch: the ranks on the shortest
  cycles, each with the op it is blocked in and the op it never entered (a program-order
  bug: never isolates a node); ranks that wait on the cycle from outside are victims;
* a silent rank (no record for longer than the stale limit) is no evidence: once it is
  lost it explains everyone waiting on it (RankLost), and its victims are not blamed.

Evidence must be current: a culprit (or a rank of a cycle) is named only when one of its
own reports, written at least T/2 into the wait, still shows it not arrived (so a rank that
crashed a moment after its last heartbeat turns into RankLost, not RankNonCommHang).
Durations are on the master clock: rank times minus the rank's estimated offset.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from c4d.engine import blame
from c4d.engine.calibration import localize
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.peer import global_links, hang_links, starved_segment
from c4d.engine.ranks import RankTable
from c4d.engine.rows import P2P
from c4d.engine.types import CycleMember, DiagKind, How, Localization, OpRef, Target
from c4d.engine.wait_view import WaitView
from c4d.record.schema import Op, OpFlag, op_name

SEND, RECV = int(Op.Send), int(Op.Recv)
IN_GROUP = int(OpFlag.IN_GROUP)
MOST = 0.5  # fewer than this share of the running ranks still reporting: no RankLost


# -- graph nodes and what explains them -------------------------------------------------
@dataclass(frozen=True, order=True)
class NodeKey:
    """An op ranks are blocked in: a collective (comm, seq), or w's p2p op with peer q."""

    p2p: bool
    comm: int  # communicator index
    seq: int
    w: int = -1  # p2p: the blocked comm rank
    op: int = -1  # p2p: its op (Send / Recv)
    q: int = -1  # p2p: its peer (comm rank)


@dataclass(frozen=True)
class Culprit:
    """Rank ``g`` is blocked nowhere and has not arrived at ``via``: RankNonCommHang."""

    g: int
    via: NodeKey


@dataclass(frozen=True)
class Stuck:
    """Every member arrived at collective (comm, seq) and it is not done: RankCommHang."""

    comm: int
    seq: int


@dataclass(frozen=True)
class StuckLink:
    """A send and its receive both started (or one already ended) and the pair is stuck."""

    comm: int
    sender: int  # global ranks
    receiver: int
    seq: int


@dataclass(frozen=True)
class Lost:
    g: int


@dataclass(frozen=True)
class CycleHit:
    """The walk came back to ``node``: it is on a wait cycle (resolved in ``_cycles``)."""

    node: NodeKey


Term = Culprit | Stuck | StuckLink | Lost | CycleHit


@dataclass(frozen=True)
class UnknownMember:
    """A comm rank whose global rank is not known yet (no record of it so far)."""

    comm: int
    cr: int


@dataclass
class Finding:
    """A hang, mismatch or loss in progress; the engine turns it into diagnoses as its count grows."""

    key: Hashable
    kind: DiagKind
    comm: WaitView | None
    op: int | None
    seq: int | None
    ranks: tuple[int, ...]
    start_ns: int  # master clock: when the waiting (or the silence) began
    loc: Localization
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Node:
    key: NodeKey
    comm: WaitView
    op: int | None
    waiters: list[tuple[int, int]] = field(default_factory=list)  # (global rank, since master ns)

    @property
    def seq(self) -> int:
        return self.key.seq

    @property
    def start(self) -> int:
        return min(s for _, s in self.waiters)

    @property
    def last_arrival(self) -> int:
        return max(s for _, s in self.waiters)


@dataclass
class _Expl:
    terms: set[Term] = field(default_factory=set)
    pending: set[int | UnknownMember] = field(default_factory=set)  # evidence stale or unknown

    def merge(self, o: _Expl) -> None:
        self.terms |= o.terms
        self.pending |= o.pending


@dataclass(frozen=True)
class _Edge:
    """Rank g has not arrived at ``node`` and is blocked in ``to`` (current evidence)."""

    node: NodeKey
    g: int
    to: NodeKey


class WaitGraph:
    """One tick's wait-for graph (see module doc), over the views of the communicators someone
    waits in (wait_view.busy_views): never a live ``Comm``, so it can be built where the
    communicators are not."""

    def __init__(
        self,
        ranks: RankTable,
        views: dict[int, WaitView],
        th: ResolvedThresholds,
        now: int,
        lik: blame.Likelihoods | None = None,
    ) -> None:
        self.r, self.views, self.th, self.now = ranks, views, th, now
        self.lik = lik if lik is not None else EngineConfig().likelihoods()
        T = th.hang_timeout_ns
        self.T = T
        seen = ranks.seen
        # silence until the previous tick: what was fed since then is stamped with its time
        # (Engine.tick), so a late tick does not make every rank look silent
        ref = ranks.prev_tick_ns or now
        silence = np.where(seen, ref - ranks.last_recv, 0)
        running = seen & ~ranks.final
        # records waiting in a backlog are not silence: the limits grow by the delivery lag
        lag = ranks.delivery_lag_ns
        alive = running & (silence <= th.lost_after_ns + lag)
        self.stale = running & (silence > th.stale_after_ns + lag)
        # More than half the job silent at once is the master's problem (its backlog, its
        # network) or the job's end, as when every rank is: not ranks that died.
        self.lost = running & (silence > th.lost_after_ns + lag) & (alive.sum() >= MOST * running.sum())
        self.silence = silence
        self.nodes: dict[NodeKey, _Node] = {}
        self.blocks_of: dict[int, list[NodeKey]] = {}
        self.view: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._off = ranks.offsets(np.arange(ranks.n))  # once per tick, not once per communicator
        for c in views.values():
            self._collect(c)
        self._memo: dict[NodeKey, _Expl] = {}
        self._stack: set[NodeKey] = set()
        self.edges: set[_Edge] = set()  # victim edges seen by the walk (for cycles)

    # -- graph nodes -------------------------------------------------------------------
    def _view(self, c: WaitView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """c's arrived and done counts per member and its members' clock offsets (this tick)."""
        v = self.view.get(c.idx)
        if v is None:
            done = c.done_eff()
            g = c.grank
            ok = (g >= 0) & (g < len(self._off))
            off = np.zeros(len(g), np.int64)
            off[ok] = self._off[g[ok]]
            v = self.view[c.idx] = (np.maximum(c.n_arrived, done), done, off)
        return v

    def _collect(self, c: WaitView) -> None:
        done = c.done_eff()
        arr = np.maximum(c.n_arrived, done)
        live = c.hb_seen & ~c.gone & (c.grank >= 0)
        wait = np.flatnonzero(live & (arr > done))
        pb = live & (c.pend_seq >= 0) & ((c.pend_flags & P2P) != 0) & (c.pend_start > 0)
        if not len(wait) and not pb.any():
            return
        _, _, off = self._view(c)
        for cr in wait.tolist():
            k = int(done[cr])
            t = int(c.last_arrive[cr]) or int(c.pend_start[cr]) or int(c.pend_issue[cr]) or int(c.hb_time[cr])
            op = int(c.pend_op[cr]) if c.pend_seq[cr] == k and not c.pend_flags[cr] & P2P else None
            self._add(NodeKey(False, c.idx, k), c, op, int(c.grank[cr]), t - int(off[cr]))
        for cr in np.flatnonzero(pb).tolist():
            op, q, s = int(c.pend_op[cr]), int(c.pend_peer[cr]), int(c.pend_seq[cr])
            if c.p2p_done.get((cr, op, q), 0) > s:
                continue  # its OP record already says done: the heartbeat is behind
            key = NodeKey(True, c.idx, s, cr, op, q)
            self._add(key, c, op, int(c.grank[cr]), int(c.pend_start[cr]) - int(off[cr]))

    def _add(self, key: NodeKey, c: WaitView, op: int | None, g: int, since: int) -> None:
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node(key, c, op)
        elif node.op is None:
            node.op = op
        node.waiters.append((g, since))
        self.blocks_of.setdefault(g, []).append(key)

    def report_ns(self, c: WaitView, cr: int) -> int:
        """Master time of member cr's latest report on comm c."""
        return int(c.hb_time[cr]) - int(self._view(c)[2][cr])

    def since(self, g: int, key: NodeKey) -> int:
        """When rank g began waiting in node ``key`` (master clock)."""
        return min(s for h, s in self.nodes[key].waiters if h == g)

    # -- walking -----------------------------------------------------------------------
    def sources(self) -> list[NodeKey]:
        """Nodes in which a rank with current reports has waited longer than T."""
        out = []
        for key, node in self.nodes.items():
            if any(self.now - s > self.T and not self.stale[g] for g, s in node.waiters):
                out.append(key)
        return sorted(out, key=lambda k: (self.nodes[k].start, k))

    def oldest_wait(self) -> int | None:
        """When the oldest wait still in progress (a rank with current reports) began."""
        starts = (s for node in self.nodes.values() for g, s in node.waiters if not self.stale[g])
        return min(starts, default=None)

    def explain(self, key: NodeKey) -> _Expl:
        if key in self._memo:
            return self._memo[key]
        if key in self._stack:
            return _Expl(terms={CycleHit(key)})
        self._stack.add(key)
        node = self.nodes[key]
        e = self._p2p(node) if key.p2p else self._coll(node)
        self._stack.discard(key)
        self._memo[key] = e
        return e

    def _rank(
        self, g: int, via: _Node, conf_t: int, c: WaitView, cr: int, e: _Expl, certain: bool = True
    ) -> None:
        """Non-arrived rank g (comm rank cr of c) reached from node ``via``. ``certain``: g is
        known to be what ``via`` waits for (not inferred from a group's other ops), so the
        edge may close a mismatch cycle."""
        if self.lost[g]:
            e.terms.add(Lost(g))
            return
        if self.stale[g]:
            e.pending.add(g)
            return
        seen = c.hb_seen[cr]
        t = self.report_ns(c, cr) if seen else int(self.r.last_recv[g])
        current = t >= conf_t or bool(self.r.final[g])
        others = [k for k in self.blocks_of.get(g, []) if k != via.key]
        if others:
            for k in others:
                if current and certain:
                    self.edges.add(_Edge(via.key, g, k))
                e.merge(self.explain(k))
            return
        if current:
            e.terms.add(Culprit(g, via.key))
        else:
            e.pending.add(g)

    def _coll(self, node: _Node) -> _Expl:
        c, k = node.comm, node.seq
        arr, done, _ = self._view(c)
        e = _Expl()
        members = c.members()
        if (done[members] > k).any():
            return e  # finished somewhere: the waiters' reports are just behind
        conf_t = node.start + self.T // 2
        nonarr = members[arr[members] <= k]
        if not len(nonarr):
            e.terms |= self._everyone_arrived(
                c, members.tolist(), node.last_arrival + self.T // 2, e, Stuck(c.idx, k)
            )
            return e
        for cr in nonarr.tolist():
            g = int(c.grank[cr])
            if g < 0:
                e.pending.add(UnknownMember(c.idx, cr))
                continue
            self._rank(g, node, conf_t, c, cr, e)
        return e

    def _everyone_arrived(
        self, c: WaitView, members: list[int], conf_t: int, e: _Expl, term: Term
    ) -> set[Term]:
        """Every needed member is in the op: a stopped transfer, once all reports confirm it."""
        out: set[Term] = set()
        ok = True
        for cr in members:
            g = int(c.grank[cr])
            if g < 0:
                e.pending.add(UnknownMember(c.idx, cr))
                ok = False
            elif self.lost[g]:
                out.add(Lost(g))
                ok = False
            elif self.stale[g] or (self.report_ns(c, cr) < conf_t and not self.r.final[g]):
                e.pending.add(g)
                ok = False
        if ok:
            out.add(term)
        return out

    @staticmethod
    def _group_partners(c: WaitView, w: int, op: int, q: int) -> list[int]:
        """The peers of w's other p2p ops in its group (besides ``op`` with ``q``) whose side
        is not finished: the next seq w has not finished with a peer it has finished with
        before, and a peer whose pending op is with w (w's first op with it has no past)."""
        out = []
        for (a, op2, q2), done in sorted(c.p2p_done.items()):
            if a != w or (op2 == op and q2 == q):
                continue
            if c.p2p_done.get((q2, _counter(op2), w), 0) <= done:  # q2 has not finished seq `done`
                out.append(q2)
        mid = (c.pend_peer == w) & ((c.pend_flags & P2P) != 0) & (c.pend_seq >= 0) & c.hb_seen
        for q2 in np.flatnonzero(mid).tolist():
            op2 = _counter(int(c.pend_op[q2]))  # w's side of q2's pending op
            if (op2 == op and q2 == q) or c.p2p_done.get((w, op2, q2), 0) > int(c.pend_seq[q2]):
                continue
            out.append(q2)
        return sorted(set(out))

    def _p2p(self, node: _Node) -> _Expl:
        c, s, w, q, op = node.comm, node.seq, node.key.w, node.key.q, node.key.op
        e = _Expl()
        if not 0 <= q < c.n or c.grank[q] < 0:
            e.pending.add(UnknownMember(c.idx, q))
            return e
        gq = int(c.grank[q])
        counter = _counter(op)
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
            others = self._group_partners(c, w, op, q)
            if q in others or not others:
                # the usual group (a pipeline stage: send activations to q, receive its
                # gradients): the other op is with the same peer. Ops with other peers whose next
                # seq is unfinished may just not be issued yet (they come later in the step).
                # With no partner in sight (w's side of its first exchange with a peer that
                # reports another pending op), q is the likeliest: a transfer q finished
                # cannot be what stopped.
                others = [q]
            if others:
                for q2 in others:
                    if not 0 <= q2 < c.n or c.grank[q2] < 0:
                        e.pending.add(UnknownMember(c.idx, q2))
                    else:
                        self._rank(int(c.grank[q2]), node, node.start + self.T // 2, c, q2, e, certain=False)
                return e
        if q_done or q_in:
            sender, receiver = (int(c.grank[w]), gq) if op == SEND else (gq, int(c.grank[w]))
            need = [w] if q_done else [w, q]
            conf_t = node.last_arrival + self.T // 2
            e.terms |= self._everyone_arrived(c, need, conf_t, e, StuckLink(c.idx, sender, receiver, s))
            return e
        self._rank(gq, node, node.start + self.T // 2, c, q, e)
        return e

    # -- cycles --------------------------------------------------------------------------
    def cycles(self, hits: set[NodeKey]) -> list[tuple[frozenset[NodeKey], list[_Edge]]]:
        """Wait cycles through the nodes the walk came back to: per strongly connected set of
        nodes, the edges that lie on its shortest cycles (see module doc)."""
        adj: dict[NodeKey, list[_Edge]] = {}
        for ed in sorted(self.edges, key=lambda x: (x.node, x.g, x.to)):
            adj.setdefault(ed.node, []).append(ed)
        out: list[tuple[frozenset[NodeKey], list[_Edge]]] = []
        done: set[NodeKey] = set()
        for start in sorted(hits):
            if start in done:
                continue
            scc = _scc_of(start, adj)
            done |= scc
            if len(scc) < 2 and not any(ed.to == start for ed in adj.get(start, [])):
                continue
            on = _shortest_cycle_edges(scc, adj)
            if on:
                out.append((frozenset(scc), on))
        return out


def _reach(start: NodeKey, nxt: dict[NodeKey, list[NodeKey]]) -> set[NodeKey]:
    seen, todo = {start}, [start]
    while todo:
        for m in nxt.get(todo.pop(), []):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _scc_of(start: NodeKey, adj: dict[NodeKey, list[_Edge]]) -> set[NodeKey]:
    fwd: dict[NodeKey, list[NodeKey]] = {}
    back: dict[NodeKey, list[NodeKey]] = {}
    for n, eds in adj.items():
        for ed in eds:
            fwd.setdefault(n, []).append(ed.to)
            back.setdefault(ed.to, []).append(n)
    return _reach(start, fwd) & _reach(start, back)


def _shortest_cycle_edges(scc: set[NodeKey], adj: dict[NodeKey, list[_Edge]]) -> list[_Edge]:
    """Edges inside ``scc`` that lie on a cycle of minimum length (BFS from every node)."""
    inner = {n: [ed for ed in adj.get(n, []) if ed.to in scc] for n in scc}
    best: int | None = None
    on: set[_Edge] = set()
    for s in sorted(scc):
        # BFS tree from s; a cycle through s closes at an edge back to s
        dist = {s: 0}
        parent: dict[NodeKey, _Edge] = {}
        order = [s]
        for n in order:
            for ed in inner[n]:
                if ed.to == s:
                    length = dist[n] + 1
                    if best is None or length < best:
                        best, on = length, set()
                    if length == best:
                        path = [ed]
                        m = n
                        while m != s:
                            path.append(parent[m])
                            m = parent[m].node
                        on |= set(path)
                elif ed.to not in dist:
                    dist[ed.to] = dist[n] + 1
                    parent[ed.to] = ed
                    order.append(ed.to)
    return sorted(on, key=lambda x: (x.node, x.g, x.to))


def _counter(op: int) -> int:
    return SEND if op == RECV else RECV


def _op_of(c: WaitView, k: int, node_op: int | None) -> int | None:
    if node_op is not None and node_op != 255:
        return node_op
    slot = k % c.W
    return int(c.opk[slot]) if c.tag[slot] == k else None


def _op_ref(G: WaitGraph, key: NodeKey, as_peer_of: int | None = None) -> OpRef:
    """The op a node stands for; ``as_peer_of``: the matching op on the other side of a p2p."""
    node = G.nodes[key]
    c = node.comm
    if key.p2p:
        me, peer = int(c.grank[key.w]), int(c.grank[key.q])
        if as_peer_of is not None:  # the counterpart: q's send/recv with w
            return OpRef(c.id, key.seq, op_name(_counter(key.op)), me)
        return OpRef(c.id, key.seq, op_name(key.op), peer)
    return OpRef(c.id, key.seq, op_name(_op_of(c, key.seq, node.op)))


def _hex(c: WaitView) -> str:
    return f"{c.id:016x}"


@dataclass(frozen=True)
class Evaluation:
    findings: list[Finding]
    # master ns at which the oldest wait still in progress began (a rank with current
    # reports); the slow judge holds the windows it may still change (slow.py)
    oldest_wait: int | None
    # communicators whose PEER rows the graph read (a stuck collective's: hang_links), which
    # their owner joins as reading a Comm's did (wait_view.join_peers)
    peers_read: list[int] = field(default_factory=list)


def evaluate(
    ranks: RankTable,
    views: dict[int, WaitView],
    th: ResolvedThresholds,
    now: int,
    lik: blame.Likelihoods | None = None,
) -> Evaluation:
    """Every hang, mismatch and loss in progress at master time ``now`` (durations may still be < T),
    from the views of the communicators someone waits in (wait_view.busy_views)."""
    G = WaitGraph(ranks, views, th, now, lik)
    findings = _findings(G)
    read = sorted({f.key.comm for f in findings if isinstance(f.key, Stuck)})  # (hang_links)
    return Evaluation(findings, G.oldest_wait(), read)


def _findings(G: WaitGraph) -> list[Finding]:
    comms, ranks = G.views, G.r
    out: list[Finding] = []
    term_sources: dict[Term, list[NodeKey]] = {}
    pending: set[int | UnknownMember] = set()
    hits: set[NodeKey] = set()
    for key in G.sources():
        e = G.explain(key)
        pending |= e.pending
        for t in e.terms:
            term_sources.setdefault(t, []).append(key)
            if isinstance(t, CycleHit):
                hits.add(t.node)
    missing = sorted(p for p in pending if isinstance(p, int))
    unknown = sorted(f"{comms[p.comm].id:016x}/{p.cr}" for p in pending if isinstance(p, UnknownMember))

    def common(srcs: list[NodeKey], d: dict[str, Any], exclude: set[int] | None = None) -> dict[str, Any]:
        victims = sorted({g for k in srcs for g, _ in G.nodes[k].waiters} - (exclude or set()))
        d["victims"] = victims[:64]
        d["victim_comms"] = sorted({_hex(G.nodes[k].comm) for k in srcs})
        d["missing"] = missing[:64]
        if unknown:
            d["unknown_comm_ranks"] = unknown[:64]
        return d

    out += _noncomm(G, term_sources, missing, common)
    out += _comm_hangs(G, comms, term_sources, common, G.now)
    out += _mismatches(G, hits, term_sources, common)
    out += _lost(G, ranks, term_sources, common)
    return out


def _noncomm(G: WaitGraph, term_sources, missing: list[int], common) -> list[Finding]:
    """RankNonCommHang: a culprit may be missing from several ops; it is charged to the one
    waited on longest. Every culprit of the tick forms one diagnosis (a whole node that hangs
    is one event), keyed by the op waited on longest, so it keeps its count while more
    culprits are confirmed."""
    via_of: dict[int, NodeKey] = {}
    for t in term_sources:
        if isinstance(t, Culprit):
            cur = via_of.get(t.g)
            if cur is None or (G.nodes[t.via].start, t.via) < (G.nodes[cur].start, cur):
                via_of[t.g] = t.via
    if not via_of:
        return []
    culprits = sorted(via_of)
    via = min(via_of.values(), key=lambda k: (G.nodes[k].start, k))
    node = G.nodes[via]
    c = node.comm
    states = {}
    for g in culprits:
        n2 = G.nodes[via_of[g]]
        c2 = n2.comm
        cr = int(np.flatnonzero(c2.grank == g)[0]) if (c2.grank == g).any() else -1
        if n2.key.p2p:
            states[str(g)] = "not at the matching p2p op"
        elif cr >= 0 and c2.n_issued[cr] > n2.seq:
            states[str(g)] = "issued, its stream has not reached the op"
        else:
            states[str(g)] = "not issued"
    op = _counter(via.op) if via.p2p else node.op
    srcs = [k for t, ks in term_sources.items() if isinstance(t, Culprit) for k in ks]
    d: dict[str, Any] = {"waiting_ranks": sorted({g for g, _ in node.waiters}), "culprit_state": states}
    d = common(sorted(set(srcs)), d)
    if len(culprits) > 1:
        d["culprit_ops"] = {
            str(g): f"{_hex(G.nodes[v].comm)}#{G.nodes[v].seq}" for g, v in sorted(via_of.items())
        }
    who = ", ".join(map(str, culprits))
    loc = localize(
        DiagKind.RankNonCommHang, How.arrival, Target.rank, culprits,
        f"rank {who} never arrived at ops others wait in, and is blocked in no other op",
        refine="" if not missing else "missing",
    )  # fmt: skip
    return [
        Finding(("nc", via), DiagKind.RankNonCommHang, c, _op_of(c, node.seq, op), node.seq,
                tuple(culprits), node.start, loc, d)
    ]  # fmt: skip


def _comm_hangs(G: WaitGraph, comms: dict[int, WaitView], term_sources, common, now: int) -> list[Finding]:
    """RankCommHang on collectives everyone has arrived at, and on stuck p2p pairs: each stuck op
    a unit of evidence (it stopped), and each network link of a stuck collective that NCCL
    reports progress for (stalled, or moved on) another; the evidence model (blame.py) names
    the rank, link or node behind each."""
    stuck = sorted(
        (t for t in term_sources if isinstance(t, Stuck | StuckLink)),
        key=lambda t: (t.comm, t.seq, getattr(t, "sender", -1)),
    )
    if not stuck:
        return []
    node_of = _nodes_of(G.r, [g for t in stuck for g in _term_ranks(t, comms)])
    units: list[blame.UnitShape] = []
    per_term: dict[Term, tuple[list[blame.Hyp], dict[str, Any], list[int]]] = {}
    for t in stuck:
        c = comms[t.comm]
        if isinstance(t, StuckLink):
            lk = blame.link_of(t.sender, t.receiver)
            one = frozenset({lk})
            units.append(blame.UnitShape(("p2p", t.comm, t.sender, t.receiver, t.seq),
                                         frozenset(lk), one, one, "slow", 0.0, "p2p"))  # fmt: skip
            cands = [blame.Hyp(rank=t.sender), blame.Hyp(rank=t.receiver), blame.Hyp(link=lk)]
            # a node's fault stops every pair with an end on it: one verdict for all of them
            ends = sorted({node_of.get(t.sender, -1), node_of.get(t.receiver, -1)} - {-1})
            cands += [_node_hyp(G.r, n) for n in ends]
            per_term[t] = (cands, {}, [])
            continue
        members_g = [int(g) for g in c.grank[c.members()] if g >= 0]
        ring_cr = [int(x) for x in c.members().tolist()]
        edges = (
            [(ring_cr[i], ring_cr[(i + 1) % len(ring_cr)]) for i in range(len(ring_cr))]
            if len(ring_cr) > 1
            else []
        )
        visible = {
            (a, b) for a, b in edges if node_of.get(int(c.grank[a]), -1) != node_of.get(int(c.grank[b]), -2)
        }
        hl = hang_links(c, t.seq, visible)
        if any(node_of.get(int(c.grank[a]), -1) == node_of.get(int(c.grank[b]), -2) for a, b in hl.progress):
            # this source reports transfers inside a node too (not NCCL's profiler): every ring
            # edge is one it would report
            visible = set(edges)
            hl = hang_links(c, t.seq, visible)
        d: dict[str, Any] = {}
        if hl.evidence:
            d.update(global_links(hl.evidence, c))
        seen = set(hl.progress)
        links = blame.ring_links(members_g) | {
            blame.link_of(int(c.grank[a]), int(c.grank[b])) for a, b in seen
        }
        op_unit = blame.shape(("op", t.comm, t.seq), tuple(sorted(members_g)), links, node_of)
        op_unit.pacing = op_unit.links  # a stop on any link stops the op, inside a node too
        op_unit.state = "slow"
        units.append(op_unit)
        pmin = min(hl.progress.values()) if hl.progress else 1.0
        starved = starved_segment(hl.progress, edges, visible | seen)
        for a, b in sorted(visible | seen):
            ga, gb = int(c.grank[a]), int(c.grank[b])
            lk = blame.link_of(ga, gb)
            p = hl.progress.get((a, b))
            st = "unknown" if p is None else "slow" if p <= pmin + 1e-9 and pmin < 1.0 else "clear"
            if starved is not None and (a, b) == starved[0]:
                st = "clear"  # it moved what reached it: its own link works
            units.append(blame.UnitShape(("peer", t.comm, t.seq, ga, gb), frozenset(lk), frozenset({lk}),
                                         frozenset({lk}), st, 1.0 if p is None else p, "peer"))  # fmt: skip
        if starved is not None:
            # the stop is on one of the unobserved links that fed the starved one
            seg = frozenset(blame.link_of(int(c.grank[a]), int(c.grank[b])) for a, b in starved[1])
            seg_ranks = frozenset(r for lk in seg for r in lk)
            seg_unit = blame.UnitShape(("segment", t.comm, t.seq), seg_ranks, seg, seg, "slow", 0.0, "peer")
            units.append(seg_unit)
            d["starved_link"] = "{}->{}".format(*(int(c.grank[x]) for x in starved[0]))
            d["stop_among"] = [f"{int(c.grank[a])}->{int(c.grank[b])}" for a, b in starved[1]]
        nodes = sorted({node_of[g] for g in members_g if node_of.get(g, -1) >= 0})
        cands = [blame.Hyp(rank=g) for g in members_g] + [blame.Hyp(link=lk) for lk in sorted(links)]
        cands += [_node_hyp(G.r, n) for n in nodes]
        no_peer = sorted(int(c.grank[r]) for r in hl.missing if c.grank[r] >= 0)[:64]
        per_term[t] = (cands, d, no_peer)
    out: list[Finding] = []
    kind = DiagKind.RankCommHang
    for t in stuck:
        c = comms[t.comm]
        srcs = term_sources[t]
        cands, d, no_peer = per_term[t]
        v = blame.decide(cands, units, G.lik)
        if isinstance(t, StuckLink):
            s = t.seq
            nodes_p = [n for k, n in G.nodes.items() if k.p2p and n.comm is c and k.seq == s]
            start = max(n.last_arrival for n in nodes_p) if nodes_p else now
            loc = _hang_localization(v, node_of, G.r, 2, p2p=(t.sender, t.receiver))
            if not d:
                d = {}
            out.append(Finding(t, kind, c, SEND, s, loc.ranks, start, loc, common(srcs, d)))
            continue
        k = t.seq
        node = G.nodes[NodeKey(False, c.idx, k)]
        d["waiting_ranks"] = sorted({g for g, _ in node.waiters})
        loc = _hang_localization(v, node_of, G.r, len([g for g in c.grank[c.members()] if g >= 0]))
        d["no_peer_progress"] = no_peer
        out.append(
            Finding(t, kind, c, _op_of(c, k, node.op), k, loc.ranks, node.last_arrival, loc, common(srcs, d))
        )
    return out


def _node_hyp(ranks: RankTable, n: int) -> blame.Hyp:
    return blame.Hyp(node=n, node_ranks=ranks.ranks_on(n), node_name=ranks.node_names[n])


def _nodes_of(ranks: RankTable, gs: list[int]) -> dict[int, int]:
    return {g: ranks.known_node(g) for g in gs if 0 <= g < ranks.n}


def _hang_localization(
    v: blame.Verdict, node_of: dict[int, int], ranks: RankTable, n: int, p2p: tuple[int, int] | None = None
) -> Localization:
    """The model's verdict on a stuck op as a Localization (see _comm_hangs)."""
    kind = DiagKind.RankCommHang
    runner = v.runner_up.name() if v.runner_up is not None else None
    alts = tuple(h.name() for h in v.alternatives)
    h = v.hyp
    peer = any(u.source == "peer" for u in v.decisive)
    nd = blame.on_one_node(v, node_of) if v.refine in ("", "equivalent") else None
    if nd is not None:
        nr = ranks.ranks_on(nd)
        return localize(
            kind, How.exclusion, Target.node, nr,
            f"every candidate lies on node {ranks.node_name(nr[0])}; nothing visible tells them apart",
            refine="equivalent", runner_up=runner,
            alternatives=((h.name(),) if h is not None else ()) + alts,
        )  # fmt: skip
    if h is None:
        why = ("a link whose progress is not reported yet may tell them apart" if v.refine == "undecided"
               else "every member arrived and nothing tells which transfer stopped")  # fmt: skip
        return localize(
            kind, How.none, Target.suspects, v.suspects, why,
            prior=1 / max(len(v.suspects), 1), refine=v.refine, runner_up=runner, alternatives=alts,
        )  # fmt: skip
    if h.is_link:
        a, b = h.link
        if p2p is not None and set(p2p) == {a, b}:
            a, b = p2p
        how = (
            How.p2p_pair
            if p2p is not None
            else How.peer_progress
            if peer
            else How.two_rank
            if n == 2
            else How.exclusion
        )
        text = f"link {a}-{b} stopped" + (f"; nothing visible tells it from {', '.join(alts)}" if alts else
                                          "; the other links of its ranks moved on")  # fmt: skip
        return localize(kind, how, Target.link, (a, b), text, refine=v.refine, link=(a, b),
                        posterior=v.posterior, runner_up=runner, alternatives=alts)  # fmt: skip
    target = Target.node if h.is_node else Target.rank
    how = How.peer_progress if peer else How.cross_comm if v.support >= 2 else How.exclusion
    text = (
        f"{h.name()}: its links stopped and the others moved on"
        if peer
        else (
            f"{h.name()} is in {v.support} stuck ops"
            if v.support >= 2
            else f"{h.name()}: the others are ruled out"
        )
    )
    return localize(kind, how, target, h.ranks(), text, refine=v.refine,
                    posterior=v.posterior, runner_up=runner, alternatives=alts)  # fmt: skip


def _mismatches(G: WaitGraph, hits: set[NodeKey], term_sources, common) -> list[Finding]:
    """CollectiveMismatch: one per set of ops that wait on each other (see module doc)."""
    out: list[Finding] = []
    for scc, edges in G.cycles(hits):
        members = tuple(
            CycleMember(ed.g, _op_ref(G, ed.to), _op_ref(G, ed.node, as_peer_of=ed.g))
            for ed in sorted(edges, key=lambda x: (x.g, x.to, x.node))
        )
        ranks_c = tuple(sorted({m.rank for m in members}))
        srcs = sorted(
            {k for t, ks in term_sources.items() if isinstance(t, CycleHit) and t.node in scc for k in ks}
        )
        # the deadlock exists once the last rank of the cycle is blocked in its op
        start = max(G.since(ed.g, ed.to) for ed in edges)
        first = min(scc, key=lambda k: (G.nodes[k].start, k))
        node = G.nodes[first]
        d = common(srcs, {}, exclude=set(ranks_c))
        d["cycle_ops"] = sorted({f"{_hex(G.nodes[k].comm)}#{k.seq}" for k in scc})
        text = "; ".join(
            f"rank {m.rank} is in {m.blocked_in}, never entered {m.never_entered}" for m in members
        )
        loc = localize(
            DiagKind.CollectiveMismatch, How.cycle, Target.cycle, ranks_c,
            f"wait cycle (mismatched collective order): {text}", cycle=members,
        )  # fmt: skip
        key = ("cycle", tuple(sorted((ed.g, ed.to) for ed in edges)))
        c = node.comm
        out.append(
            Finding(key, DiagKind.CollectiveMismatch, c, _op_of(c, first.seq, node.op) if not first.p2p
                    else first.op, first.seq, ranks_c, start, loc, d)
        )  # fmt: skip
    return out


def _lost(G: WaitGraph, ranks: RankTable, term_sources, common) -> list[Finding]:
    """RankLost: silent ranks (one diagnosis for all of them: a node that dies is one event,
    keyed by the first to fall silent); the hangs they explain are listed, not blamed on the
    victims."""
    lost = np.flatnonzero(G.lost).tolist()
    if not lost:
        return []
    first = min(lost, key=lambda g: (int(ranks.last_recv[g]), g))
    d: dict[str, Any] = {"silent_s": {str(g): round(int(G.silence[g]) / 1e9, 3) for g in lost}}
    explained = [Lost(g) for g in lost if Lost(g) in term_sources]
    if explained:
        d = common(sorted({k for t in explained for k in term_sources[t]}), d)
    # ranks of a lost rank's node that are silent too but not for long enough yet: a node that
    # dies is one event, so the first diagnosis waits for them (emission.Emission._count, up to T/2)
    nodes = {int(ranks.node[g]) for g in lost if ranks.node[g] >= 0}
    near = np.flatnonzero(G.stale & ~G.lost & np.isin(ranks.node[: len(G.stale)], list(nodes)))
    if len(near):
        d["missing"] = sorted(set(d.get("missing", [])) | set(near.tolist()))[:64]
    who = ", ".join(map(str, lost))
    said = f"rank {who} sent nothing for longer than the loss limit, without a clean exit"
    onsets = [int(ranks.last_recv[g]) for g in lost]
    if len(nodes) > 1 and max(onsets) - min(onsets) <= G.th.lost_after_ns:
        # k nodes silent at once: k independent losses (each a fault, model_fault_prior apiece)
        # against one cause they share (a switch, the path to the master, an overloaded host):
        # the nodes are suspects, not culprits, and nothing is isolated on them
        k = len(nodes)
        odds = math.exp((k - 1) * G.lik.fault_prior)
        loc = localize(
            DiagKind.RankLost, How.heartbeat, Target.suspects, lost,
            f"{said}; {k} nodes at once: one cause they share is likelier than {k} lost nodes",
            posterior=odds / (1 + odds),
            runner_up="one cause outside these nodes (a switch, the network to the master)",
        )  # fmt: skip
    else:
        loc = localize(DiagKind.RankLost, How.heartbeat, Target.rank, lost, said)
    start = int(ranks.last_recv[first])
    return [Finding(("lost", first), DiagKind.RankLost, None, None, None, tuple(lost), start, loc, d)]


def _term_ranks(t: Stuck | StuckLink, comms: dict[int, WaitView]) -> list[int]:
    if isinstance(t, StuckLink):
        return [t.sender, t.receiver]
    c = comms[t.comm]
    return [int(g) for g in c.grank[c.members()] if g >= 0]
