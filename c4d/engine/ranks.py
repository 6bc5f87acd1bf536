"""Per global rank: its node, liveness, clean exit and clock offset, in arrays indexed by rank.

Apart because the clock (c4d/engine/clock.py), the reduction of complete ops and the hang
and slow judges read it, and it knows no communicator's state: only which communicators a
rank is a member of (``comms_of``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from c4d.engine.rows import MAX_RANK, grow


class RankTable:
    """Per global rank, arrays indexed by rank (grown by doubling)."""

    def __init__(self) -> None:
        self.n = 0
        self.seen = np.zeros(0, bool)
        # ranks that sent a REGISTER, and how many: the job's size as its ranks say it (never
        # as a REGISTER claims it), which the engine's byte budgets grow with (Pool.fit)
        self.reg = np.zeros(0, bool)
        self.registered = 0
        self.node = np.zeros(0, np.int32)  # index into node_names, -1 unknown
        self.pid = np.zeros(0, np.int64)
        self.last_recv = np.zeros(0, np.int64)  # master clock of the batch that carried its last record
        self.final = np.zeros(0, bool)
        self.pend_tmax = np.zeros(0, np.int64)  # max record time_ns fed since the last tick (rank clock)
        # clock (c4d/engine/clock.py): offset = rel + anchor of the domain's island; a domain is
        # a node (a host's ranks share its clock) or a rank whose node is unknown; an island is
        # a set of domains the end-time consensus links (label: a node index, or -1 - rank);
        # theta = receipt bounds
        self.theta = np.zeros(0, np.int64)
        self.theta_cur = np.zeros(0, np.int64)
        self.theta_prev = np.zeros(0, np.int64)
        self.theta_ok = np.zeros(0, bool)
        self.rel_rank = np.zeros(0, np.float64)
        self.rel_rank_ok = np.zeros(0, bool)
        self.rel_rank_refined = np.zeros(0, bool)
        self.rel_node = np.zeros(0, np.float64)
        self.rel_node_ok = np.zeros(0, bool)
        self.rel_node_refined = np.zeros(0, bool)
        self.isl_node = np.zeros(0, np.int64)
        self.isl_rank = np.zeros(0, np.int64)
        self.anc_node = np.zeros(0, np.float64)
        self.anc_rank = np.zeros(0, np.float64)
        self.last_end = np.zeros(0, np.int64)  # latest op end seen (rank clock), for compute gaps
        self.compute_ns = np.zeros(0, np.int64)  # running sum of its compute gaps
        self.lag_hist: deque[tuple[int, int]] = deque()  # (master ns, delivery lag ns) per tick
        self.delivery_lag_ns = 0  # how late records reach the engine now, beyond usual (clock.py)
        self.prev_tick_ns = 0  # the engine's tick before the current one (what fed rows are stamped with)
        self.node_names: list[str] = []
        self._names_b = np.empty(0, "S1")  # node_names encoded as REGISTER rows hold them (register)
        self._names_ok = np.empty(0, bool)
        self._node_index: dict[str, int] = {}
        self.comms_of: list[list[tuple[int, int]]] = []  # rank -> [(comm idx, comm rank)]
        # (rank, comm idx, comm rank) of every member change since the caller last took them
        # (an engine shard's, for the join: c4d/engine/shards.py); None: not kept
        self.joined: list[tuple[int, int, int]] | None = None
        self.job: dict[str, int] = {}  # registered thresholds of the lowest rank seen
        self._job_rank = MAX_RANK

    def ensure(self, max_rank: int) -> None:
        if max_rank < self.n:
            return
        n = max(16, self.n * 2)
        while n <= max_rank:
            n *= 2
        self.seen = grow(self.seen, n, False)
        self.reg = grow(self.reg, n, False)
        self.node = grow(self.node, n, -1)
        self.pid = grow(self.pid, n, 0)
        self.last_recv = grow(self.last_recv, n, 0)
        self.final = grow(self.final, n, False)
        self.pend_tmax = grow(self.pend_tmax, n, 0)
        self.theta = grow(self.theta, n, 0)
        self.theta_cur = grow(self.theta_cur, n, np.iinfo(np.int64).min)
        self.theta_prev = grow(self.theta_prev, n, np.iinfo(np.int64).min)
        self.theta_ok = grow(self.theta_ok, n, False)
        self.rel_rank = grow(self.rel_rank, n, 0.0)
        self.rel_rank_ok = grow(self.rel_rank_ok, n, False)
        self.rel_rank_refined = grow(self.rel_rank_refined, n, False)
        old = len(self.isl_rank)
        self.isl_rank = grow(self.isl_rank, n, 0)
        self.isl_rank[old:] = -1 - np.arange(old, n)
        self.anc_rank = grow(self.anc_rank, n, 0.0)
        self.last_end = grow(self.last_end, n, 0)
        self.compute_ns = grow(self.compute_ns, n, 0)
        self.comms_of.extend([] for _ in range(n - self.n))
        self.n = n

    def member_of(self, g: int, idx: int, cr: int) -> None:
        """Rank ``g`` is now comm rank ``cr`` of communicator ``idx`` (``comms_of`` holds it once)."""
        if (idx, cr) not in self.comms_of[g]:
            self.comms_of[g].append((idx, cr))
        if self.joined is not None:
            self.joined.append((g, idx, cr))

    def leave(self, idx: int, granks: np.ndarray) -> None:
        """Communicator ``idx`` (freed) no longer has members ``granks`` (its global ranks)."""
        for g in np.unique(granks[granks >= 0]).tolist():
            self.comms_of[g] = [t for t in self.comms_of[g] if t[0] != idx]

    # what an engine shard reads of the ranks: the clock's offsets, nodes, who reported
    SHARED = ("seen", "node", "rel_rank", "rel_rank_ok", "anc_rank", "rel_node", "rel_node_ok", "anc_node")

    def shared(self) -> dict[str, np.ndarray]:
        """The arrays an engine shard reads (``SHARED``), as they are now (c4d/engine/shards.py)."""
        return {k: getattr(self, k) for k in self.SHARED}

    def adopt(self, shared: dict[str, np.ndarray]) -> None:
        """A shard's copy of the ranks: the join's ``shared()`` arrays, read only; the rest its
        own, grown to as many ranks (``last_recv`` and ``rel_node_refined`` collect what the
        shard's node summaries say of them, for the join)."""
        n = len(shared["seen"])
        if n > self.n:
            self.ensure(n - 1)
        for k, v in shared.items():
            setattr(self, k, v)
        if len(self.rel_node_refined) != len(self.rel_node):
            self.rel_node_refined = np.zeros(len(self.rel_node), bool)

    def aligned(self, g: np.ndarray) -> np.ndarray:
        """Whether each rank's clock offset is established."""
        nd = self.node[g]
        node_ok = self.rel_node_ok[np.maximum(nd, 0)] if len(self.rel_node_ok) else np.zeros(len(nd), bool)
        return np.where(nd >= 0, node_ok, self.rel_rank_ok[g])

    def add_residuals(self, g: np.ndarray, res: np.ndarray) -> None:
        """End-time consensus step: per-rank residuals, averaged per node (a host moves as one).
        The domains of ``g`` become (or stay) one island. (One communicator's step at once:
        Comm._reduce; a chunk's steps together are reduce.apply_steps's.)"""
        self.join_islands(g)
        nd = self.node[g]
        has = nd >= 0
        if has.any():
            k = len(self.node_names)
            s = np.bincount(nd[has], weights=res[has], minlength=k)
            c = np.bincount(nd[has], minlength=k)
            self.rel_node += np.where(c > 0, s / np.maximum(c, 1), 0.0)
            self.rel_node_refined |= c > 0
        if (~has).any():
            np.add.at(self.rel_rank, g[~has], res[~has])
            self.rel_rank_refined[g[~has]] = True

    def join_islands(self, g: np.ndarray) -> None:
        """The clock domains of ranks ``g`` become (or stay) one island (``add_residuals`` does
        it before its step; reduce.apply_steps before a chunk's steps)."""
        nd = self.node[g]
        self._merge(nd[nd >= 0], g[nd < 0])

    def mark_refined(self, node: int | np.ndarray) -> None:
        """What a communicator on one host clock gives the refinement: a zero step for ``node``
        (or each of several; ``add_residuals`` of zeros, without the work)."""
        self.rel_node_refined[node] = True

    def _merge(self, nodes: np.ndarray, solo: np.ndarray) -> None:
        """Join the islands of these domains, keeping every offset where it is: each joining
        island's rel moves by the difference of the anchors, which the next clock update
        replaces with the merged island's own anchor."""
        labels = sorted(set(self.isl_node[nodes].tolist()) | set(self.isl_rank[solo].tolist()))
        if len(labels) < 2:
            return
        target = labels[-1]  # a node label when there is one (they are >= 0)
        anc = self._island_anchor(target)
        for lab in labels[:-1]:
            shift = self._island_anchor(lab) - anc
            m = self.isl_node == lab
            self.rel_node[m] += shift
            self.isl_node[m] = target
            self.anc_node[m] = anc
            r = (self.isl_rank == lab) & (self.node < 0)
            self.rel_rank[r] += shift
            self.isl_rank[r] = target
            self.anc_rank[r] = anc

    def _island_anchor(self, label: int) -> float:
        m = np.flatnonzero(self.isl_node == label)
        if len(m):
            return float(self.anc_node[m[0]])
        r = np.flatnonzero((self.isl_rank == label) & (self.node < 0))
        return float(self.anc_rank[r[0]]) if len(r) else 0.0

    def known_node(self, g: int) -> int:
        """Rank ``g``'s node index, -1 where its node is not known ("?": an import without hosts)."""
        i = int(self.node[g]) if 0 <= g < self.n else -1
        return i if i >= 0 and self.node_names[i] != "?" else -1

    def ranks_on(self, node: int) -> tuple[int, ...]:
        """The registered ranks on node index ``node`` (a node hypothesis, blame.py)."""
        return tuple(np.flatnonzero(self.node[: self.n] == node).tolist()) if node >= 0 else ()

    def node_name(self, g: int) -> str:
        i = int(self.node[g]) if 0 <= g < self.n else -1
        return self.node_names[i] if i >= 0 else "?"

    def set_node(self, g: int, name: str) -> None:
        i = self._node_index.get(name)
        if i is None:
            i = self._node_index[name] = len(self.node_names)
            self.node_names.append(name)
            k = len(self.node_names)
            self.rel_node = grow(self.rel_node, k, 0.0)
            self.rel_node_ok = grow(self.rel_node_ok, k, False)
            self.rel_node_refined = grow(self.rel_node_refined, k, False)
            self.isl_node = grow(self.isl_node, k, k - 1)
            self.anc_node = grow(self.anc_node, k, 0.0)
        self.node[g] = i

    def offsets(self, granks: np.ndarray) -> np.ndarray:
        """Rank clock minus master clock (ns, int64) for each global rank (unknown: 0)."""
        g = np.asarray(granks)
        ok = g >= 0
        every = bool(ok.all())
        gi = g if every else np.where(ok, g, 0)
        nd = self.node[gi]
        if len(self.rel_node) and len(nd) and int(nd.min()) >= 0:  # every rank's node known (usual)
            # per node first (a few thousand), then one gather per row (a chunk's 100,000 rows)
            ok_node = self.rel_node_ok
            off = np.rint(self.rel_node + self.anc_node).astype(np.int64)[nd]
            if every and (ok_node.all() or ok_node[nd].all()):
                return off
            return np.where(ok & ok_node[nd], off, 0)
        elif len(self.rel_node):
            ndi = np.maximum(nd, 0)
            by_node = self.rel_node[ndi] + self.anc_node[ndi]
            rel = np.where(nd >= 0, by_node, self.rel_rank[gi] + self.anc_rank[gi])
            have = np.where(nd >= 0, self.rel_node_ok[ndi], self.rel_rank_ok[gi])
        else:
            rel, have = self.rel_rank[gi] + self.anc_rank[gi], self.rel_rank_ok[gi]
        off = np.rint(rel).astype(np.int64)
        if every and have.all():
            return off
        return np.where(ok & have, off, 0)

    def offset(self, g: int) -> int:
        if g < 0 or g >= self.n:
            return 0
        return int(self.offsets(np.array([g]))[0])

    def register(self, rows: np.ndarray) -> None:
        if len(rows) > 1 and len(self.node_names):
            # repeats that say what is known skipped at once (a rank sends one every 10
            # heartbeats: thousands a second in a large job); the job's
            # settings come from the lowest rank's, taken one by one
            gr = rows["rank"].astype(np.int64)
            nd = self.node[gr]
            same = (nd >= 0) & (rows["pid"] == self.pid[gr]) & (gr > self._job_rank)
            if same.any():
                dt = rows["node"].dtype
                if len(self._names_b) != len(self.node_names) or self._names_b.dtype != dt:
                    # a name read with replacements does not encode back to its bytes: never same
                    b = [n.encode() for n in self.node_names]
                    self._names_ok = np.array([len(x) <= dt.itemsize and "\ufffd" not in n
                                               for x, n in zip(b, self.node_names, strict=True)])  # fmt: skip
                    self._names_b = np.array(b, dt)
                at = np.flatnonzero(same)
                same[at] = (self._names_b[nd[at]] == rows["node"][at]) & self._names_ok[nd[at]]
                if not same.all():  # a rank with a change in the batch: every row of it, in order
                    same &= ~np.isin(gr, gr[~same])
                rows = rows[~same]
        gr = rows["rank"].astype(np.int64)
        fresh = np.unique(gr[~self.reg[gr]])  # (each rank counted once, whatever it re-registers)
        self.reg[fresh] = True
        self.registered += len(fresh)
        for rec in rows:
            g = int(rec["rank"])
            self.set_node(g, rec["node"].split(b"\0", 1)[0].decode(errors="replace") or "?")
            pid = int(rec["pid"])
            if pid != self.pid[g]:
                self.final[g] = False  # a restarted process
                self.pid[g] = pid
            if g <= self._job_rank:
                self._job_rank = g
                self.job = {
                    "hang_timeout_us": int(rec["hang_timeout_us"]),
                    "hang_times": int(rec["hang_times"]),
                    "bw_check_period_s": int(rec["bw_check_period_s"]),
                    "heartbeat_ms": int(rec["heartbeat_ms"]),
                }
