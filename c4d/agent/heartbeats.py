"""Which heartbeats a node agent forwards: those of ranks that stand still, and a few more.

The engine reads heartbeats for one thing a running job's OP records cannot tell it: where a
rank stopped (its counters, last arrival and pending op per communicator, and that this is
current). While a rank completes ops, its OP records (or the agent's OPSUM rows, which the
master counts as a report from every member) say more, and sooner. So per heartbeat the
agent decides from the rank's process heartbeat of the same instant (the shim writes it
first, with the counters of every op the rank has seen):

* the rank progressed (ops arrived or finished since its previous process heartbeat): its
  heartbeats are dropped, except a communicator's whose oldest pending op is the one pending
  at the previous heartbeat or began more than half a period before this one (an op
  outlasting a heartbeat period: where hangs start, forwarded at the first), and
  every ``every``-th of each (rank, communicator), so the master's counters lag at most that;
* the rank stood still (stopped in an op, or computing): all forwarded, as they came, and the
  next one after that too, so the master sees the state that ended the stop.

A forwarded heartbeat goes whole, as it came: its pending op's count, dtype and reduction op
(schema version 2) reach the master with it, which compares the members' pending ops
(c4d/engine/consistency.py).

A heartbeat with flags (FINAL), with more records dropped in the rank, or the first of its
(rank, communicator) is always forwarded. Without a process heartbeat of the same instant in
the batch, a row's own counters decide. The stop is forwarded at the latest one heartbeat
period later than without the merge, within the engine's stale limit (two periods + 0.25 s).

The shim's in-flight PEER records (per-peer progress of transfers not done, written with its
heartbeats) go the same way: one is forwarded once its transfer was in flight at the rank's
previous heartbeat too (a transfer that outlasted a period: where a hang stopped, what the
engine's link localization reads). Finished transfers' PEER records are forwarded as they
came (the slow judge's link evidence).

Call from one thread (the summariser's).
"""

from __future__ import annotations

import numpy as np

from c4d.record import schema
from c4d.util.sorted_lookup import find_sorted

_NONE = schema.UINT64_MAX  # pend_seq: nothing pending
_MOVES = ("n_issued", "n_arrived", "n_done", "last_arrive_ns", "last_done_ns")


# per slot: the last heartbeat's counters, pending op and dropped count, the heartbeats merged
# since one was forwarded, its time, whether the next is forwarded whatever it says, and seen
_STATE = (
    ("moves", np.uint64, (len(_MOVES),)), ("pend", np.uint64, ()), ("dropped", np.uint64, ()),
    ("skipped", np.int64, ()), ("time", np.uint64, ()), ("forced", np.bool_, ()), ("seen", np.bool_, ()),
)  # fmt: skip


class HeartbeatMerge:
    """Per (communicator, rank) slot: the state of its last heartbeat, in one plain array per
    field (a structured array's fields gathered by index cost several times as much)."""

    moves: np.ndarray
    pend: np.ndarray
    dropped: np.ndarray
    skipped: np.ndarray
    time: np.ndarray
    forced: np.ndarray
    seen: np.ndarray

    def __init__(self, every: int = 5) -> None:
        self.every = max(1, every)
        self.slot: dict[tuple[int, int], int] = {}  # (comm id, 0: the process; global rank) -> slot
        self.free: list[int] = []
        self._grow(64)

    def _grow(self, m: int) -> None:
        """Room for ``m`` slots, the state of those in use kept."""
        old = len(self.seen) if hasattr(self, "seen") else 0
        for name, dtype, shape in _STATE:
            a = np.zeros((m, *shape), dtype)
            if old:
                a[:old] = getattr(self, name)
            setattr(self, name, a)
        self.free.extend(range(m - 1, old - 1, -1))

    def keep(self, hb: np.ndarray) -> np.ndarray:
        """Per HEARTBEAT row (arrival order): forward it."""
        n = len(hb)
        if not n:
            return np.ones(0, bool)
        cid, rank, t = hb["comm_id"], hb["rank"], hb["time_ns"]
        idx = self._slots(cid.tolist(), rank.tolist())
        moves = np.stack([hb[f] for f in _MOVES], axis=1)
        prog = self._progress(idx, cid, rank, t, moves)
        # a (comm, rank)'s rows in arrival order: its k-th rows of the batch in round k
        order = np.argsort(idx, kind="stable")
        si = idx[order]
        heads = np.r_[True, si[1:] != si[:-1]]
        if heads.all():  # each slot once (the usual batch): one round of every row
            return self._round(hb, idx, moves, prog)
        occ = np.empty(n, np.int64)
        occ[order] = np.arange(n) - np.maximum.accumulate(np.where(heads, np.arange(n), 0))
        out = np.ones(n, bool)
        for r in range(int(occ.max()) + 1):
            rows = np.flatnonzero(occ == r)
            out[rows] = self._round(hb[rows], idx[rows], moves[rows], prog[rows])
        return out

    def _progress(self, idx, cid, rank, t, moves) -> np.ndarray:
        """Per row: whether its rank progressed at that instant (its process heartbeat against
        its previous one); -1 where the batch holds no process heartbeat of that instant."""
        n = len(idx)
        prog = np.full(n, -1, np.int8)
        proc = np.flatnonzero(cid == 0)
        if not len(proc):
            return prog
        ps = proc[np.lexsort((proc, idx[proc]))]  # per rank, in arrival order
        pi = idx[ps]
        first = np.r_[True, pi[1:] != pi[:-1]]
        cur = moves[ps, 1:3]  # ops arrived, done
        prev = np.empty_like(cur)
        prev[first] = self.moves[pi[first], 1:3]
        prev[~first] = cur[np.flatnonzero(~first) - 1]
        moved = (self.seen[pi] | ~first) & (cur != prev).any(axis=1)
        if first.all():  # one process heartbeat a rank: a row's is its rank's, if of its instant
            pr = rank[ps]
            by = np.argsort(pr)
            pos, hit = find_sorted(pr[by], rank)
            j = ps[by][pos]
            hit &= t[j] == t
            prog[hit] = moved[by][pos][hit]
            return prog
        at = dict(zip(zip(rank[ps].tolist(), t[ps].tolist(), strict=True), moved.tolist(), strict=True))
        prog[:] = [at.get(k, -1) for k in zip(rank.tolist(), t.tolist(), strict=True)]
        return prog

    def _round(self, h: np.ndarray, j: np.ndarray, mv: np.ndarray, prog: np.ndarray) -> np.ndarray:
        """Rows of distinct slots ``j``: forward each, and keep its state."""
        seen = self.seen[j]
        p = np.where(prog >= 0, prog == 1, (mv != self.moves[j]).any(axis=1))
        # a communicator's oldest pending op outlasted a period, or began more than half a
        # period ago (a hang forwarded at its first heartbeat); the process's pending op
        # says nothing the communicators' do not
        pend_seq, time_ns = h["pend_seq"], h["time_ns"].astype(np.int64)
        pending = (h["comm_id"] != 0) & (pend_seq != _NONE)
        since = h["pend_start_ns"].astype(np.int64)
        since = np.where(since > 0, since, h["pend_issue_ns"].astype(np.int64))
        half = (time_ns - self.time[j].astype(np.int64)) // 2
        long = (since > 0) & (time_ns - since > half)
        stalled = pending & ((pend_seq == self.pend[j]) | (seen & long))
        stop = ~p | stalled
        dropped = h["dropped"]
        skipped = self.skipped[j]
        fwd = (
            ~seen
            | stop
            | (h["hb_flags"] != 0)
            | (dropped != self.dropped[j])
            | self.forced[j]  # the one after a forwarded stop (or the first)
            | (skipped + 1 >= self.every)
        )
        self.moves[j], self.pend[j], self.dropped[j], self.time[j] = mv, pend_seq, dropped, time_ns
        self.skipped[j] = np.where(fwd, 0, skipped + 1)
        self.forced[j] = stop | ~seen
        self.seen[j] = True
        return fwd

    def forget(self, cid: int) -> None:
        """A communicator every member here has left."""
        self.forget_many({cid})

    def forget_many(self, cids: set[int]) -> None:
        """Communicators every member here has left, or the edge freed: one pass over the slots."""
        if not cids:
            return
        for k in [k for k in self.slot if k[0] in cids]:
            j = self.slot.pop(k)
            for name, _, _ in _STATE:
                getattr(self, name)[j] = 0
            self.free.append(j)

    def _slots(self, cid: list[int], rank: list[int]) -> np.ndarray:
        got = list(map(self.slot.get, zip(cid, rank, strict=True)))
        if None in got:  # new (communicator, rank)s: a slot each, the arrays grown where full
            for i, k in enumerate(zip(cid, rank, strict=True)):
                if got[i] is None:
                    j = self.slot.get(k)
                    if j is None:
                        if not self.free:
                            self._grow(2 * len(self.seen))
                        j = self.slot[k] = self.free.pop()
                    got[i] = j
        return np.fromiter(got, np.int64, len(got))


_XFER = ("comm_id", "seq", "comm_rank", "peer", "direction", "op")


class PeerMerge:
    def __init__(self) -> None:
        # global rank -> [time of its latest in-flight report, transfers in flight then, at the one before]
        self.inflight: dict[int, list] = {}

    def keep(self, peers: np.ndarray) -> np.ndarray:
        """Per PEER row (arrival order): forward it."""
        out = np.ones(len(peers), bool)
        live = np.flatnonzero(peers["done"] == 0)
        if not len(live):
            return out
        rows = peers[live]
        keys = zip(*(rows[f].tolist() for f in _XFER), strict=True)
        who = zip(live.tolist(), rows["rank"].tolist(), rows["time_ns"].tolist(), keys, strict=True)
        for i, g, t, k in who:
            s = self.inflight.get(g)
            if s is None:
                s = self.inflight[g] = [t, set(), set()]
            elif s[0] != t:  # the rank's next heartbeat
                s[:] = [t, set(), s[1]]
            s[1].add(k)
            out[i] = k in s[2]
        return out
