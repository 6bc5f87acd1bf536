"""Which heartbeats a node agent forwards: those of ranks that stand still, and a few more.

The engine reads heartbeats for one thing a running job's OP records cannot tell it: where a
rank stopped (its counters, last arrival and pending op per communicator, and that this is
current). While a rank completes ops, its OP records (or the agent's OPSUM rows, which the
master counts as a report from every member) say more, and sooner. So per heartbeat the
agent decides from the rank's process heartbeat of the same instant (the shim writes it
first, with the counters of every op the rank has seen):

* the rank progressed (ops arrived or finished since its previous process heartbeat): its
  heartbeats are dropped, except a communicator's whose oldest pending op is the one pending
  at the previous heartbeat (an op outlasting a heartbeat period: where hangs start), and
  every ``every``-th of each (rank, communicator), so the master's counters lag at most that;
* the rank stood still (stopped in an op, or computing): all forwarded, as they came, and the
  next one after that too, so the master sees the state that ended the stop.

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

from c4d import schema

_NONE = schema.UINT64_MAX  # pend_seq: nothing pending
_MOVES = ("n_issued", "n_arrived", "n_done", "last_arrive_ns", "last_done_ns")


class HeartbeatMerge:
    def __init__(self, every: int = 5) -> None:
        self.every = max(1, every)
        # comm id (0: the process) -> global rank -> [counters..., pend_seq, dropped, skipped, forced]
        self.state: dict[int, dict[int, list[int]]] = {}

    def keep(self, hb: np.ndarray) -> np.ndarray:
        """Per HEARTBEAT row (arrival order): forward it."""
        out = np.ones(len(hb), bool)
        if not len(hb):
            return out
        cid = hb["comm_id"].tolist()
        rank = hb["rank"].tolist()
        t = hb["time_ns"].tolist()
        flags = hb["hb_flags"].tolist()
        pend = hb["pend_seq"].tolist()
        dropped = hb["dropped"].tolist()
        moves = list(zip(*(hb[f].tolist() for f in _MOVES), strict=True))
        # the rank's progress at each instant: its process heartbeat against the previous one
        progressed: dict[tuple[int, int], bool] = {}
        proc = self.state.get(0, {})
        last = {g: s[1:3] for g, s in proc.items()}  # (n_arrived, n_done) per rank
        for i in np.flatnonzero(hb["comm_id"] == 0).tolist():
            now = list(moves[i][1:3])
            before = last.get(rank[i])
            progressed[(rank[i], t[i])] = before is not None and now != before
            last[rank[i]] = now
        for i in range(len(hb)):
            ranks = self.state.setdefault(cid[i], {})
            s = ranks.get(rank[i])
            new = [*moves[i], pend[i], dropped[i]]
            if s is None:
                ranks[rank[i]] = [*new, 0, 1]
                continue
            prog = progressed.get((rank[i], t[i]))
            if prog is None:
                prog = list(moves[i]) != s[: len(_MOVES)]
            # a communicator's oldest pending op outlasted a period (the process's pending op
            # says nothing the communicators' do not)
            stalled = cid[i] != 0 and pend[i] != _NONE and pend[i] == s[len(_MOVES)]
            stop = not prog or stalled
            fwd = (
                stop
                or flags[i] != 0
                or dropped[i] != s[len(_MOVES) + 1]
                or s[-1] == 1  # the one after a forwarded stop
                or s[-2] + 1 >= self.every
            )
            ranks[rank[i]] = [*new, 0 if fwd else s[-2] + 1, int(stop)]
            out[i] = fwd
        return out

    def forget(self, cid: int) -> None:
        """A communicator every member here has left."""
        self.state.pop(cid, None)


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
