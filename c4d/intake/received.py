"""What the master has received, per rank and per communicator (cheap running totals).

This is the master's own bookkeeping for the summary and the live view header; the
diagnosis engine keeps its own state. It sees only records the edge admitted
(c4d/intake/validate.py): ranks below the registered world size, names already sanitized, and
communicators within the job's budget; ``forget`` drops the communicators the edge freed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from c4d.record import names, schema
from c4d.record.columns import Columns
from c4d.util.sorted_lookup import find_sorted


@dataclass
class RankInfo:
    rank: int
    node: str = "?"
    pid: int = 0
    records: int = 0
    ops: int = 0
    last_seen_ns: int = 0  # master clock
    dropped: int = 0
    sent: int = 0
    final: bool = False
    comms: set[int] = field(default_factory=set)


@dataclass
class CommInfo:
    comm_id: int
    nranks: int = 0
    parent_id: int = 0
    ranks: set[int] = field(default_factory=set)
    ops: int = 0
    bytes: int = 0
    max_seq: int = -1


class Received:
    """Per-rank and per-communicator counters live in arrays (a batch updates them in one numpy
    call each, not a loop over a batch's ranks or communicators) and are written into the ``RankInfo``
    and ``CommInfo`` objects when ``ranks`` or ``comms`` is read (the live view, the summary).
    A batch is read through views of its rows (no copy per record kind)."""

    _COUNTERS = ("records", "ops", "last_seen_ns", "dropped", "sent")
    # and the (communicator, rank) pairs counted so far, per communicator: in its ranks
    # (False), and in the ranks' communicators too (True)
    _COMM_COUNTERS = (("ops", np.int64), ("bytes", np.uint64), ("max_seq", np.int64), ("nranks", np.int64),
                      (False, np.int64), (True, np.int64))  # fmt: skip

    def __init__(self) -> None:
        self._info: dict[int, RankInfo] = {}  # in the order ranks were first seen
        self._c = {k: np.zeros(0, np.int64) for k in self._COUNTERS}
        self._final = np.zeros(0, bool)
        self._has_info = np.zeros(0, bool)
        # what each rank's latest REGISTER said (the shim repeats it every 10 heartbeats:
        # thousands a second in a large job, so never looped over)
        self._reg_pid = np.zeros(0, np.int64)
        self._reg_node = np.zeros(0, schema.REGISTER["node"])
        self._comms: dict[int, CommInfo] = {}
        # by dense communicator index (_cidx): ops, bytes, max_seq, nranks
        self._cc = {k: np.zeros(0, dt) for k, dt in self._COMM_COUNTERS}
        self.records = 0
        self.world_size = 0
        # (communicator, rank) pairs already counted, as sorted keys (dense comm index << 32 |
        # rank): membership barely changes, and a loop over a batch's pairs was most of this
        # class's time at 4,096 ranks through agents. Index False: in the comm's ranks; True:
        # in the rank's comms as well.
        self._cidx: dict[int, int] = {}
        self._next_cidx = 0
        self._lookup: tuple[np.ndarray, np.ndarray] | None = None  # sorted comm ids, their index
        self._known = {False: np.empty(0, np.int64), True: np.empty(0, np.int64)}

    @property
    def ranks(self) -> dict[int, RankInfo]:
        c, fin = self._c, self._final
        for r, info in self._info.items():
            info.records, info.ops = int(c["records"][r]), int(c["ops"][r])
            info.last_seen_ns, info.dropped = int(c["last_seen_ns"][r]), int(c["dropped"][r])
            info.sent, info.final = int(c["sent"][r]), bool(fin[r])
        return self._info

    @property
    def comms(self) -> dict[int, CommInfo]:
        cc = self._cc
        for c_id, info in self._comms.items():
            i = self._cidx[c_id]
            info.ops, info.bytes = int(cc["ops"][i]), int(cc["bytes"][i])
            info.max_seq, info.nranks = int(cc["max_seq"][i]), int(cc["nranks"][i])
        return self._comms

    def _rank(self, r: int) -> RankInfo:
        info = self._info.get(r)
        if info is None:
            self._grow(r + 1)
            info = self._info[r] = RankInfo(rank=r)
            self._has_info[r] = True
        return info

    def _grow(self, n: int) -> None:
        have = len(self._final)
        if n > have:
            size = max(n, 2 * have, 64)
            for k, a in self._c.items():
                self._c[k] = np.concatenate([a, np.zeros(size - have, np.int64)])
            self._final = np.concatenate([self._final, np.zeros(size - have, bool)])
            self._has_info = np.concatenate([self._has_info, np.zeros(size - have, bool)])
            self._reg_pid = np.concatenate([self._reg_pid, np.full(size - have, -1, np.int64)])
            self._reg_node = np.concatenate([self._reg_node, np.zeros(size - have, self._reg_node.dtype)])

    def _count(self, g: np.ndarray, counter: str) -> None:
        """One more for each row's rank ``g`` (ranks new here made known first, in rank order):
        by the rows, not a count over every rank of the job (65,536 at a time, every batch)."""
        self._grow(int(g.max()) + 1)
        new = ~self._has_info[g]
        if new.any():
            self._seen(np.unique(g[new]))
        np.add.at(self._c[counter], g, 1)

    def _seen(self, r_ids: np.ndarray) -> None:
        """Ranks (unique, ascending) known from now on, new ones in that order."""
        if len(r_ids):
            self._grow(int(r_ids[-1]) + 1)
            for r in r_ids[~self._has_info[r_ids]].tolist():
                self._rank(r)

    def _comm(self, c: int) -> CommInfo:
        info = self._comms.get(c)
        if info is None:
            info = self._comms[c] = CommInfo(comm_id=c)
            i = self._cidx[c] = self._next_cidx
            self._next_cidx += 1
            self._lookup = None
            if i >= len(self._cc["ops"]):
                size = max(64, 2 * i)
                for k, a in self._cc.items():
                    self._cc[k] = np.concatenate([a, np.zeros(size - len(a), a.dtype)])
            self._cc["max_seq"][i] = -1
        return info

    def _dense(self, ids: np.ndarray) -> np.ndarray:
        """Dense index of each communicator id (distinct ids), new ones made in that order."""
        idx = self._index(ids)
        for j in np.flatnonzero(idx < 0).tolist():
            self._comm(int(ids[j]))
            idx[j] = self._cidx[int(ids[j])]
        return idx

    def _index(self, cid: np.ndarray) -> np.ndarray:
        """Dense index of each communicator id; -1 for one not known yet."""
        if self._lookup is None:
            ids = np.fromiter(self._cidx, np.uint64, len(self._cidx))
            idx = np.fromiter(self._cidx.values(), np.int64, len(self._cidx))
            o = np.argsort(ids)
            self._lookup = ids[o], idx[o]
        ids, idx = self._lookup
        if not len(ids):
            return np.full(len(cid), -1, np.int64)
        pos, hit = find_sorted(ids, cid)
        return np.where(hit, idx[pos], -1)

    def _pair_keys(self, cid: np.ndarray, g: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """Key of each (communicator, rank) pair; -1 for a communicator not known yet (``idx``:
        the communicators' dense indices, when the caller has them)."""
        idx = self._index(cid) if idx is None else idx
        return np.where(idx >= 0, (idx << 32) | g, -1)

    def add(self, raw: np.ndarray, recv_ns: int, cols: Columns | None = None) -> None:
        """Count a batch (HEADER rows, read through views: no copy per record kind; ``cols``:
        its columns, when the edge read them: c4d.record.columns)."""
        kind = raw["kind"] if cols is None else cols["kind"]
        self._identity(raw, kind, recv_ns, cols)
        op = kind == schema.Kind.OP
        if op.any():
            self._ops(raw.view(schema.OP) if cols is None else cols.as_kind(schema.OP), op)
        hb = kind == schema.Kind.HEARTBEAT
        if hb.any():
            self._heartbeats(
                raw.view(schema.HEARTBEAT) if cols is None else cols.as_kind(schema.HEARTBEAT), hb
            )

    def _identity(self, raw: np.ndarray, kind: np.ndarray, recv_ns: int, cols: Columns | None) -> None:
        """Records per rank, and who the ranks and communicators are (REGISTER, COMM: few)."""
        self.records += len(raw)
        if not len(raw):
            return
        rank = (raw["rank"] if cols is None else cols["rank"]).astype(np.int64)
        self._count(rank, "records")  # the edge admitted ranks of the job only
        self._c["last_seen_ns"][rank] = recv_ns
        reg = kind == schema.Kind.REGISTER
        if reg.any():
            rows = raw[reg].view(schema.REGISTER)
            r, pid, node = rows["rank"].astype(np.int64), rows["pid"], rows["node"]
            new = (self._reg_pid[r] != pid) | (self._reg_node[r] != node)
            new |= rows["world_size"] > self.world_size
            if new.any():  # what a repeat says again is known
                fresh = rows[new]
                self.world_size = max(self.world_size, int(fresh["world_size"].max()))
                nodes: dict[bytes, str] = {}  # (a node's ranks name it alike: cleaned once)
                for g, p, nd in zip(fresh["rank"].tolist(), fresh["pid"].tolist(), fresh["node"].tolist(),
                                    strict=True):  # fmt: skip
                    info = self._rank(g)
                    info.node = nodes.get(nd) or nodes.setdefault(nd, names.clean(nd))
                    info.pid = p
            self._reg_pid[r], self._reg_node[r] = pid, node
        com = kind == schema.Kind.COMM
        if com.any():
            self._comm_records(raw[com].view(schema.COMM))

    def _comm_records(self, com: np.ndarray) -> None:
        """Who the communicators are: their size (the latest record's), parent (the latest
        named) and members. A large job's start brings one COMM record per member of every
        communicator (49,152 at 16,384 ranks), so they are taken per communicator and per
        rank, not one by one."""
        cid, g = com["comm_id"], com["rank"].astype(np.int64)
        ids, first, inv = np.unique(cid, return_index=True, return_inverse=True)
        order = np.argsort(inv, kind="stable")  # each communicator's records together, in order
        counts = np.bincount(inv, minlength=len(ids))
        ends = np.cumsum(counts)
        starts = ends - counts
        nranks = com["comm_nranks"][order][ends - 1].tolist()
        par = com["parent_id"][order]
        named = np.where(par != 0, np.arange(len(par)), -1)
        last = np.maximum.reduceat(named, starts)  # each one's latest record naming a parent
        parent = np.where(last >= 0, par[np.maximum(last, 0)], 0).tolist()
        members = g[order].tolist()
        ids_l, s_l, e_l = ids.tolist(), starts.tolist(), ends.tolist()
        for j in np.argsort(first, kind="stable").tolist():  # in the order they were first named
            c = self._comm(ids_l[j])
            self._cc["nranks"][self._cidx[c.comm_id]] = nranks[j]
            c.parent_id = parent[j] or c.parent_id
            c.ranks.update(members[s_l[j] : e_l[j]])
        by_rank = np.argsort(g, kind="stable")
        rs, cs = g[by_rank], cid[by_rank].tolist()
        heads = np.flatnonzero(np.r_[True, rs[1:] != rs[:-1]])
        tails = np.r_[heads[1:], len(rs)]
        for r, a, b in zip(rs[heads].tolist(), heads.tolist(), tails.tolist(), strict=True):
            self._rank(r).comms.update(cs[a:b])
        self._known_pairs(np.unique(self._pair_keys(cid, g)), (True, False))

    def _ops(self, v: np.ndarray | Columns, sel: np.ndarray) -> None:
        """OP rows (``v``: the batch viewed as OP records, ``sel`` which rows are), every
        communicator's at once by its dense index (no per-record loop, no sort by communicator)."""
        at = np.flatnonzero(sel)
        cid, g = v["comm_id"][at], v["rank"][at].astype(np.int64)
        i = self._index(cid)
        if (i < 0).any():  # named here first: made in comm-id order
            self._dense(np.unique(cid[i < 0]))
            i = self._index(cid)
        cc = self._cc
        np.add.at(cc["ops"], i, 1)
        np.add.at(cc["bytes"], i, v["bytes"][at].astype(np.uint64))
        coll = (v["flags"][at] & schema.OpFlag.P2P) == 0
        if coll.any():
            np.maximum.at(cc["max_seq"], i[coll], v["seq"][at][coll].astype(np.int64))
        unsized = cc["nranks"][i] == 0
        if unsized.any():  # the size the first of its rows says
            u, first = np.unique(i[unsized], return_index=True)
            cc["nranks"][u] = v["comm_nranks"][at][unsized][first]
        self._members(cid, g, of_rank=False, idx=i)
        self._count(g, "ops")

    def _heartbeats(self, v: np.ndarray | Columns, sel: np.ndarray) -> None:
        at = np.flatnonzero(sel)
        g = v["rank"][at].astype(np.int64)
        o = np.argsort(g, kind="stable")
        gs, ao = g[o], at[o]
        heads = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
        dropped = np.maximum.reduceat(v["dropped"][ao].astype(np.int64), heads)
        sent = np.maximum.reduceat(v["sent"][ao].astype(np.int64), heads)
        final = np.logical_or.reduceat((v["hb_flags"][ao] & schema.HBF_FINAL) != 0, heads)
        r = gs[heads]
        self._seen(r)
        cnt = self._c
        cnt["dropped"][r] = np.maximum(cnt["dropped"][r], dropped)
        cnt["sent"][r] = np.maximum(cnt["sent"][r], sent)
        self._final[r] |= final
        cid_all = v["comm_id"][at]
        on = cid_all != 0
        if on.any():
            cid, nr = cid_all[on], v["comm_nranks"][at][on].astype(np.int64)
            sized = nr != 0
            u, first = np.unique(cid[sized], return_index=True)  # the first size it says
            if len(u):
                i = self._dense(u)
                have = self._cc["nranks"][i]
                self._cc["nranks"][i] = np.where(have != 0, have, nr[sized][first])
            self._members(cid, g[on], of_rank=True)

    def _members(self, cid: np.ndarray, g: np.ndarray, of_rank: bool, idx: np.ndarray | None = None) -> None:
        """Rank g[i] is a member of communicator cid[i], once per distinct pair (``of_rank``:
        the rank's own list of communicators too, as heartbeats and COMM records say). A
        communicator whose size worth of members were counted is not searched again (a job's
        steady state); a record naming yet another rank in it (a forgery or a bug: the edge
        checks the communicator rank, not who holds it) adds none."""
        idx = self._index(cid) if idx is None else idx
        cc = self._cc
        if len(cc["nranks"]):
            at = np.maximum(idx, 0)
            n = cc["nranks"][at]
            open_ = (idx < 0) | (n == 0) | (cc[of_rank][at] < n)
            if not open_.any():
                return
            if not open_.all():
                cid, g, idx = cid[open_], g[open_], idx[open_]
        known = self._known[of_rank]
        fresh = ~_in_sorted(self._pair_keys(cid, g, idx), known)
        if not fresh.any():
            return
        cid, g = cid[fresh], g[fresh]
        o = np.lexsort((g, cid))
        cs, gs = cid[o], g[o]
        new = np.r_[True, (cs[1:] != cs[:-1]) | (gs[1:] != gs[:-1])]
        for c_id, r in zip(cs[new].tolist(), gs[new].tolist(), strict=True):
            c = self._comm(c_id)
            c.ranks.add(r)
            if of_rank:
                self._rank(r).comms.add(c_id)
        keys = np.unique(self._pair_keys(cs[new], gs[new]))  # every communicator is known now
        self._known_pairs(keys, (True, False) if of_rank else (False,))

    def _known_pairs(self, keys: np.ndarray, which: tuple[bool, ...]) -> None:
        """(communicator, rank) pair keys (sorted, distinct) counted from now on: a COMM record
        counts its pair both ways, so the heartbeats of a job's start find theirs known."""
        for k in which:
            known = self._known[k]
            add = keys[(keys >= 0) & ~_in_sorted(keys, known)]
            # into the sorted array where they go: np.union1d would sort it all again for every
            # batch that names new pairs (thousands a batch while a large job starts)
            self._known[k] = np.insert(known, np.searchsorted(known, add), add)
            np.add.at(self._cc[k], add >> 32, 1)

    def forget(self, cids: list[int]) -> None:
        """Drop freed communicators (destroyed or long silent: c4d/intake/validate.py, Edge.expire)."""
        gone = [self._cidx.pop(int(cid)) for cid in cids if int(cid) in self._cidx]
        if gone:
            self._lookup = None
            for k, known in self._known.items():
                self._known[k] = known[~np.isin(known >> 32, gone)]
        for cid in cids:
            c = self._comms.pop(int(cid), None)
            if c is None:
                continue
            for r in c.ranks:
                info = self._info.get(r)
                if info is not None:
                    info.comms.discard(c.comm_id)

    @property
    def dropped(self) -> int:
        return int(self._c["dropped"].sum())


def _in_sorted(keys: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Whether each key is in the sorted array ``known`` (-1 never is). Keys that come in runs
    (a rank's records of one communicator) are searched once per run."""
    if not len(known):
        return np.zeros(len(keys), bool)
    r = schema.runs(keys) if len(keys) > 64 else None
    if r is not None:
        h, run = r
        return _in_sorted(keys[h], known)[run]
    return find_sorted(known, keys)[1] & (keys >= 0)
