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
    def __init__(self) -> None:
        self.ranks: dict[int, RankInfo] = {}
        self.comms: dict[int, CommInfo] = {}
        self.records = 0
        self.world_size = 0

    def _rank(self, r: int) -> RankInfo:
        info = self.ranks.get(r)
        if info is None:
            info = self.ranks[r] = RankInfo(rank=r)
        return info

    def _comm(self, c: int) -> CommInfo:
        info = self.comms.get(c)
        if info is None:
            info = self.comms[c] = CommInfo(comm_id=c)
        return info

    def add(self, raw: np.ndarray, recv_ns: int, kinds: dict[schema.Kind, np.ndarray] | None = None) -> None:
        """Count a batch; ``kinds`` is ``schema.by_kind(raw)`` when the caller already split it."""
        self.records += len(raw)
        ranks, counts = np.unique(raw["rank"], return_counts=True)
        for r, n in zip(ranks.tolist(), counts.tolist(), strict=True):
            info = self._rank(r)
            info.records += n
            info.last_seen_ns = recv_ns
        k = kinds if kinds is not None else schema.by_kind(raw)
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
        ops = k[schema.Kind.OP]
        if len(ops):
            cids, inv = np.unique(ops["comm_id"], return_inverse=True)
            for i, cid in enumerate(cids.tolist()):
                sel = ops[inv == i]
                c = self._comm(cid)
                c.ops += len(sel)
                c.bytes += int(sel["bytes"].sum())
                coll = sel[(sel["flags"] & schema.OpFlag.P2P) == 0]
                if len(coll):
                    c.max_seq = max(c.max_seq, int(coll["seq"].max()))
                c.nranks = c.nranks or int(sel["comm_nranks"][0])
                c.ranks.update(np.unique(sel["rank"]).tolist())
            r_ids, r_counts = np.unique(ops["rank"], return_counts=True)
            for r, n in zip(r_ids.tolist(), r_counts.tolist(), strict=True):
                self._rank(r).ops += n
        for rec in k[schema.Kind.HEARTBEAT]:
            info = self._rank(int(rec["rank"]))
            info.dropped = max(info.dropped, int(rec["dropped"]))
            info.sent = max(info.sent, int(rec["sent"]))
            if int(rec["hb_flags"]) & schema.HBF_FINAL:
                info.final = True
            if int(rec["comm_id"]):
                c = self._comm(int(rec["comm_id"]))
                c.nranks = c.nranks or int(rec["comm_nranks"])
                c.ranks.add(int(rec["rank"]))
                info.comms.add(c.comm_id)

    def forget(self, cids: list[int]) -> None:
        """Drop freed communicators (destroyed or long silent: c4d/validate.py, Edge.expire)."""
        for cid in cids:
            c = self.comms.pop(int(cid), None)
            if c is None:
                continue
            for r in c.ranks:
                info = self.ranks.get(r)
                if info is not None:
                    info.comms.discard(c.comm_id)

    @property
    def dropped(self) -> int:
        return sum(r.dropped for r in self.ranks.values())
