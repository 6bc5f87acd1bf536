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

_NONE = schema.UINT64_MAX  # pend_seq: nothing pending
_MOVES = ("n_issued", "n_arrived", "n_done", "last_arrive_ns", "last_done_ns")


_STATE = np.dtype(
    [("moves", "<u8", (len(_MOVES),)), ("pend", "<u8"), ("dropped", "<u8"), ("skipped", "<i8"),
     ("time", "<u8"), ("forced", "?"), ("seen", "?")]
)  # fmt: skip


class HeartbeatMerge:
    def __init__(self, every: int = 5) -> None:
        self.every = max(1, every)
        self.slot: dict[tuple[int, int], int] = {}  # (comm id, 0: the process; global rank) -> row of .s
        self.s = np.zeros(64, _STATE)
        self.free: list[int] = list(range(63, -1, -1))

    def keep(self, hb: np.ndarray) -> np.ndarray:
        """Per HEARTBEAT row (arrival order): forward it."""
        n = len(hb)
        out = np.ones(n, bool)
        if not n:
            return out
        cid, rank, t = hb["comm_id"], hb["rank"], hb["time_ns"]
        idx = self._slots(cid.tolist(), rank.tolist())
        moves = np.stack([hb[f] for f in _MOVES], axis=1)
        # the rank's progress at each instant: its process heartbeat against its previous one
        prog = np.full(n, -1, np.int8)  # -1: no process heartbeat of that instant here
        proc = np.flatnonzero(cid == 0)
        if len(proc):
            ps = proc[np.lexsort((proc, idx[proc]))]  # per rank, in arrival order
            pi = idx[ps]
            first = np.r_[True, pi[1:] != pi[:-1]]
            cur = moves[ps, 1:3]  # ops arrived, done
            prev = np.empty_like(cur)
            prev[first] = self.s["moves"][pi[first], 1:3]
            prev[~first] = cur[np.flatnonzero(~first) - 1]
            moved = (self.s["seen"][pi] | ~first) & (cur != prev).any(axis=1)
            at = dict(zip(zip(rank[ps].tolist(), t[ps].tolist(), strict=True), moved.tolist(), strict=True))
            prog[:] = [at.get(k, -1) for k in zip(rank.tolist(), t.tolist(), strict=True)]
        # a (comm, rank)'s rows in arrival order: its k-th rows of the batch in round k
        order = np.argsort(idx, kind="stable")
        si = idx[order]
        heads = np.r_[True, si[1:] != si[:-1]]
        occ = np.empty(n, np.int64)
        occ[order] = np.arange(n) - np.maximum.accumulate(np.where(heads, np.arange(n), 0))
        S = self.s
        for r in range(int(occ.max()) + 1):
            rows = np.flatnonzero(occ == r)
            j = idx[rows]
            h = hb[rows]
            mv = moves[rows]
            seen = S["seen"][j]
            p = np.where(prog[rows] >= 0, prog[rows] == 1, (mv != S["moves"][j]).any(axis=1))
            # a communicator's oldest pending op outlasted a period, or began more than half a
            # period ago (a hang forwarded at its first heartbeat); the process's pending op
            # says nothing the communicators' do not
            pending = (h["comm_id"] != 0) & (h["pend_seq"] != _NONE)
            since = h["pend_start_ns"].astype(np.int64)
            since = np.where(since > 0, since, h["pend_issue_ns"].astype(np.int64))
            half = (h["time_ns"].astype(np.int64) - S["time"][j].astype(np.int64)) // 2
            long = (since > 0) & (h["time_ns"].astype(np.int64) - since > half)
            stalled = pending & ((h["pend_seq"] == S["pend"][j]) | (seen & long))
            stop = ~p | stalled
            fwd = (
                ~seen
                | stop
                | (h["hb_flags"] != 0)
                | (h["dropped"] != S["dropped"][j])
                | S["forced"][j]  # the one after a forwarded stop (or the first)
                | (S["skipped"][j] + 1 >= self.every)
            )
            S["moves"][j], S["pend"][j], S["dropped"][j] = mv, h["pend_seq"], h["dropped"]
            S["time"][j] = h["time_ns"]
            S["skipped"][j] = np.where(fwd, 0, S["skipped"][j] + 1)
            S["forced"][j] = stop | ~seen
            S["seen"][j] = True
            out[rows] = fwd
        return out

    def forget(self, cid: int) -> None:
        """A communicator every member here has left."""
        self.forget_many({cid})

    def forget_many(self, cids: set[int]) -> None:
        """Communicators every member here has left, or the edge freed: one pass over the slots."""
        if not cids:
            return
        for k in [k for k in self.slot if k[0] in cids]:
            j = self.slot.pop(k)
            self.s[j] = np.zeros(1, _STATE)[0]
            self.free.append(j)

    def _slots(self, cid: list[int], rank: list[int]) -> np.ndarray:
        out = np.empty(len(cid), np.int64)
        for i, k in enumerate(zip(cid, rank, strict=True)):
            j = self.slot.get(k)
            if j is None:
                if not self.free:
                    m = len(self.s)
                    self.s = np.concatenate([self.s, np.zeros(m, _STATE)])
                    self.free = list(range(2 * m - 1, m - 1, -1))
                j = self.slot[k] = self.free.pop()
            out[i] = j
        return out


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
