"""Which finished transfers' PEER records a node agent forwards: those of ops that stall, and
those the slow judge's link localization can use.

The engine reads finished PEER rows (``done``) twice (c4d/engine/peer.py):

* ``hang_links``: every row of a stuck op, finished ones included (a link that finished is not
  the stuck one; a member that reported other transfers of the op but not this one made no
  progress there). So the rows of an op the rank has not finished are held until its OP
  record shows it finished, and forwarded as they came once a later heartbeat of the rank
  shows it did not (the op outlasted it: where hangs start). Nothing is lost, at most one
  heartbeat period later.
* ``pace_setters``, for ops the ranks finished: per op, the link(s) whose transfer took
  longest, within 1 % (ties share), and every directed link seen in a window's ops. A row
  that is not within 1 % of the longest of the rows of its op *here* cannot be within 1 %
  of the longest of all the op's rows (that longest is at least this one), so it is dropped,
  except in every ``every``-th op of a communicator, which goes whole: the window's links
  are seen in it. What decides "longest" is the engine's: each sender's own move time per
  step (``wire_ns``) where every sender reports one, else ``last_ns - first_ns``; both are
  kept, and one sender without ``wire_ns`` so that the engine chooses as it would.

p2p transfers (Send/Recv) and in-flight rows (c4d/agent/heartbeats.py: PeerMerge) are not
touched here. Deterministic in the rows fed; call from one thread (the summariser's).
"""

from __future__ import annotations

import numpy as np

from c4d.record import schema

_P2P_OPS = (int(schema.Op.Send), int(schema.Op.Recv))
HELD_MAX = 1 << 16  # rows held for their OP record at most; beyond it the oldest go as they came


class PeerSieve:
    def __init__(self, every: int = 4) -> None:
        """``every``: one op in ``every`` of a communicator forwards all its finished rows."""
        self.every = max(1, every)
        self.done: dict[
            tuple[int, int], int
        ] = {}  # (global rank, comm id) -> highest collective seq finished
        self.hb: dict[int, int] = {}  # global rank -> time of its latest process heartbeat
        self.held = np.zeros(0, schema.PEER)
        self.stats = {"dropped": 0, "held": 0, "stalled": 0}

    def note_ops(self, ops: np.ndarray) -> None:
        """OP rows (any order): the collectives their ranks finished."""
        coll = (ops["flags"] & int(schema.OpFlag.P2P)) == 0
        if not coll.any():
            return
        key = zip(
            ops["rank"][coll].tolist(), ops["comm_id"][coll].tolist(), ops["seq"][coll].tolist(), strict=True
        )
        d = self.done
        for g, c, s in key:
            if s > d.get((g, c), -1):
                d[(g, c)] = s

    def note_heartbeats(self, hb: np.ndarray) -> None:
        """HEARTBEAT rows: the latest process heartbeat of each rank."""
        p = hb[hb["comm_id"] == 0]
        for g, t in zip(p["rank"].tolist(), p["time_ns"].tolist(), strict=True):
            if t > self.hb.get(g, -1):
                self.hb[g] = t

    def keep(self, peers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per PEER row (arrival order): forward it now; and held rows of earlier feeds that go
        now (PEER rows, to forward after this feed's)."""
        fwd = np.ones(len(peers), bool)
        mine = np.flatnonzero((peers["done"] != 0) & ~np.isin(peers["op"], _P2P_OPS))
        if not len(mine) and not len(self.held):
            return fwd, self.held[:0]
        rows = schema.join_records([self.held, peers[mine]], schema.PEER) if len(self.held) else peers[mine]
        new = np.r_[np.zeros(len(self.held), bool), np.ones(len(mine), bool)]
        g, c, s, t = (rows[f].tolist() for f in ("rank", "comm_id", "seq", "time_ns"))
        finished = np.array([q <= self.done.get((a, b), -1) for a, b, q in zip(g, c, s, strict=True)], bool)
        stalled = ~finished & np.array([self.hb.get(a, -1) > x for a, x in zip(g, t, strict=True)], bool)
        send = finished & self._useful(rows, finished)
        go = send | stalled
        hold = ~finished & ~stalled
        if hold.sum() > HELD_MAX:  # bounded: the oldest go as they came
            over = np.flatnonzero(hold)[: int(hold.sum()) - HELD_MAX]
            hold[over], go[over] = False, True
        self.stats["dropped"] += int((finished & ~send).sum())
        self.stats["stalled"] += int(stalled.sum())
        fwd[mine] = go[new]
        released = rows[go & ~new]
        self.held = rows[hold]
        self.stats["held"] = len(self.held)
        return fwd, released

    def _useful(self, rows: np.ndarray, finished: np.ndarray) -> np.ndarray:
        """Per row (of finished ops): what pace_setters may read (module doc)."""
        out = np.zeros(len(rows), bool)
        idx = np.flatnonzero(finished)
        r = rows[idx]
        seq = r["seq"].astype(np.int64)
        out[idx[seq % self.every == 0]] = True  # every link of the op: the window's links seen
        timed = r["steps_total"] > 0
        if not timed.any():
            return out
        idx, r, seq = idx[timed], r[timed], seq[timed]
        cid = r["comm_id"]
        o = np.lexsort((seq, cid))
        head = np.r_[True, (cid[o][1:] != cid[o][:-1]) | (seq[o][1:] != seq[o][:-1])]
        grp = np.empty(len(o), np.int64)
        grp[o] = np.cumsum(head) - 1
        ng = int(grp.max()) + 1
        d = r["last_ns"].astype(np.int64) - r["first_ns"].astype(np.int64)
        out[idx] |= _within(d, grp, ng, np.ones(len(r), bool))
        send = r["direction"] == 0
        wire = r["wire_ns"] > 0
        all_wire = np.ones(ng, bool)
        np.logical_and.at(all_wire, grp[send], wire[send])
        dw = (r["wire_ns"] // np.maximum(r["steps_done"], 1)).astype(np.int64)
        timed_w = send & all_wire[grp]
        out[idx] |= _within(dw, grp, ng, timed_w)
        # one sender without wire_ns per op that has one: the engine then reads every row's span
        nowire = send & ~wire
        first = np.zeros(ng, bool)
        for i in np.flatnonzero(nowire).tolist():
            if not first[grp[i]]:
                first[grp[i]] = True
                out[idx[i]] = True
        return out

    def forget_many(self, cids: set[int]) -> None:
        """Communicators gone: what is held or known of them goes."""
        if not cids:
            return
        self.done = {k: v for k, v in self.done.items() if k[1] not in cids}
        if len(self.held):
            self.held = self.held[~np.isin(self.held["comm_id"], list(cids))]


def _within(d: np.ndarray, grp: np.ndarray, ng: int, sel: np.ndarray) -> np.ndarray:
    """Rows of ``sel`` whose ``d`` is within 1 % of their group's longest (as pace_setters ties)."""
    out = np.zeros(len(d), bool)
    if not sel.any():
        return out
    top = np.full(ng, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(top, grp[sel], d[sel])
    t = top[grp]
    out[sel] = d[sel] >= t[sel] - t[sel] // 100
    return out
