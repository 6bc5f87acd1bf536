"""What the master has received, per rank and per communicator (cheap running totals).

This is the master's own bookkeeping for the summary and the live view header; the
diagnosis engine keeps its own state. It sees only records the edge admitted
(c4d/validate.py): ranks below the registered world size, names already sanitized, and
communicators within the job's budget; ``forget`` drops the communicators the edge freed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from c4d import names, schema


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
    """Per-rank counters live in arrays (a batch updates them in one numpy call each; a loop over
    a batch's ranks was a tenth of the master at 4,096 ranks through agents) and are written
    into the ``RankInfo`` objects when ``ranks`` is read (the live view, the summary)."""

    _COUNTERS = ("records", "ops", "last_seen_ns", "dropped", "sent")

    def __init__(self) -> None:
        self._info: dict[int, RankInfo] = {}  # in the order ranks were first seen
        self._c = {k: np.zeros(0, np.int64) for k in self._COUNTERS}
        self._final = np.zeros(0, bool)
        self._has_info = np.zeros(0, bool)
        self.comms: dict[int, CommInfo] = {}
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

    def _seen(self, r_ids: np.ndarray) -> None:
        """Ranks (unique, ascending) known from now on, new ones in that order."""
        if len(r_ids):
            self._grow(int(r_ids[-1]) + 1)
            for r in r_ids[~self._has_info[r_ids]].tolist():
                self._rank(r)

    def _comm(self, c: int) -> CommInfo:
        info = self.comms.get(c)
        if info is None:
            info = self.comms[c] = CommInfo(comm_id=c)
            self._cidx[c] = self._next_cidx
            self._next_cidx += 1
            self._lookup = None
        return info

    def _pair_keys(self, cid: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Key of each (communicator, rank) pair; -1 for a communicator not known yet."""
        if self._lookup is None:
            ids = np.fromiter(self._cidx, np.uint64, len(self._cidx))
            idx = np.fromiter(self._cidx.values(), np.int64, len(self._cidx))
            o = np.argsort(ids)
            self._lookup = ids[o], idx[o]
        ids, idx = self._lookup
        if not len(ids):
            return np.full(len(cid), -1, np.int64)
        pos = np.minimum(np.searchsorted(ids, cid), len(ids) - 1)
        hit = ids[pos] == cid
        return np.where(hit, (idx[pos] << 32) | g, -1)

    def add(self, raw: np.ndarray, recv_ns: int, kinds: dict[schema.Kind, np.ndarray] | None = None) -> None:
        """Count a batch; ``kinds`` is ``schema.by_kind(raw)`` when the caller already split it."""
        k = kinds if kinds is not None else schema.by_kind(raw)
        self._identity(raw, recv_ns, k)
        self._ops(k[schema.Kind.OP])
        self._heartbeats(k[schema.Kind.HEARTBEAT])

    def _identity(self, raw: np.ndarray, recv_ns: int, k: dict[schema.Kind, np.ndarray]) -> None:
        """Records per rank, and who the ranks and communicators are (REGISTER, COMM: few)."""
        self.records += len(raw)
        ranks, counts = np.unique(raw["rank"].astype(np.int64), return_counts=True)
        self._seen(ranks)
        self._c["records"][ranks] += counts
        self._c["last_seen_ns"][ranks] = recv_ns
        for rec in k[schema.Kind.REGISTER]:
            info = self._rank(int(rec["rank"]))
            info.node = names.clean(bytes(rec["node"]))
            info.pid = int(rec["pid"])
            self.world_size = max(self.world_size, int(rec["world_size"]))
        for rec in k[schema.Kind.COMM]:
            c = self._comm(int(rec["comm_id"]))
            c.nranks = int(rec["comm_nranks"])
            c.parent_id = int(rec["parent_id"]) or c.parent_id
            c.ranks.add(int(rec["rank"]))
            self._rank(int(rec["rank"])).comms.add(c.comm_id)

    def _ops(self, ops: np.ndarray) -> None:
        if len(ops):
            # per communicator at once (a per-record loop was a fifth of the master's time
            # with node agents' heartbeats, 1,024 ranks)
            cid, g = ops["comm_id"], ops["rank"].astype(np.int64)
            o = np.argsort(cid, kind="stable")
            cs = cid[o]
            heads = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
            n = np.diff(np.r_[heads, len(o)])
            nbytes = np.add.reduceat(ops["bytes"][o].astype(np.uint64), heads)
            coll = (ops["flags"][o] & schema.OpFlag.P2P) == 0
            seq = np.where(coll, ops["seq"][o].astype(np.int64), -1)
            top = np.maximum.reduceat(seq, heads)
            first_n = ops["comm_nranks"][o][heads]
            for c_id, k_n, k_b, k_top, k_nr in zip(
                cs[heads].tolist(), n.tolist(), nbytes.tolist(), top.tolist(), first_n.tolist(), strict=True
            ):
                c = self._comm(c_id)
                c.ops += k_n
                c.bytes += k_b
                c.max_seq = max(c.max_seq, k_top)
                c.nranks = c.nranks or k_nr
            self._members(cid, g, of_rank=False)
            r_ids, r_counts = np.unique(g, return_counts=True)
            self._seen(r_ids)
            self._c["ops"][r_ids] += r_counts

    def _heartbeats(self, hb: np.ndarray) -> None:
        if len(hb):
            g = hb["rank"].astype(np.int64)
            o = np.argsort(g, kind="stable")
            gs = g[o]
            heads = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
            dropped = np.maximum.reduceat(hb["dropped"][o].astype(np.int64), heads)
            sent = np.maximum.reduceat(hb["sent"][o].astype(np.int64), heads)
            final = np.logical_or.reduceat((hb["hb_flags"][o] & schema.HBF_FINAL) != 0, heads)
            r = gs[heads]
            self._seen(r)
            cnt = self._c
            cnt["dropped"][r] = np.maximum(cnt["dropped"][r], dropped)
            cnt["sent"][r] = np.maximum(cnt["sent"][r], sent)
            self._final[r] |= final
            on = hb["comm_id"] != 0
            if on.any():
                cid, nr = hb["comm_id"][on], hb["comm_nranks"][on]
                sized = nr != 0
                u, first = np.unique(cid[sized], return_index=True)  # the first size it says
                for c_id, k_nr in zip(u.tolist(), nr[sized][first].tolist(), strict=True):
                    c = self._comm(c_id)
                    c.nranks = c.nranks or k_nr
                self._members(cid, g[on], of_rank=True)

    def _members(self, cid: np.ndarray, g: np.ndarray, of_rank: bool) -> None:
        """Rank g[i] is a member of communicator cid[i], once per distinct pair (``of_rank``:
        the rank's own list of communicators too, as heartbeats and COMM records say)."""
        known = self._known[of_rank]
        fresh = ~_in_sorted(self._pair_keys(cid, g), known)
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
        keys = self._pair_keys(cs[new], gs[new])  # every communicator is known now
        for k in (True, False) if of_rank else (False,):
            self._known[k] = np.union1d(self._known[k], keys)

    def forget(self, cids: list[int]) -> None:
        """Drop freed communicators (destroyed or long silent: c4d/validate.py, Edge.expire)."""
        gone = [self._cidx.pop(int(cid)) for cid in cids if int(cid) in self._cidx]
        if gone:
            self._lookup = None
            for k, known in self._known.items():
                self._known[k] = known[~np.isin(known >> 32, gone)]
        for cid in cids:
            c = self.comms.pop(int(cid), None)
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
    """Whether each key is in the sorted array ``known`` (-1 never is)."""
    if not len(known):
        return np.zeros(len(keys), bool)
    pos = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    return (known[pos] == keys) & (keys >= 0)
