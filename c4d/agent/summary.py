"""What a node agent sends the master instead of its ranks' raw stream.

    ranks' records (one node, arrival order) ─► Edge.admit ─► Summariser.feed ─► master

* A collective of a communicator whose members all run on this node (a tensor-parallel group,
  at most ``schema.OPSUM_MAX_MEMBERS``) becomes one OPSUM record once every member's OP
  record is in. The agent reduces it with the master's own code (``Comm._reduce`` on one
  host clock), so the master's engine gets the COMPLETED row it would have made itself
  (``Engine._feed_opsum``): same last arriver, wait, transfer, and every member's compute.
* Every other OP record (p2p, communicators that span nodes) is forwarded with the rank's
  compute so far in ``compute_ns`` (``OpFlag.COMPUTE_GIVEN``): the master cannot sum a
  rank's compute gaps over ops it never sees, the agent can (``state.compute_gaps``, the
  master's computation on the same stream).
* HEARTBEAT records of ranks that stand still are forwarded, most of a progressing rank's
  are not (c4d/agent/heartbeats.py).
* in-flight PEER records only of transfers that outlast a heartbeat period (the same file).
* REGISTER, COMM, STAGE and finished transfers' PEER records are forwarded as they came.

Deterministic in the rows fed and the cuts between feeds, like the engine: the test
(tests/test_agent_summary.py) replays recorded traces through per-node summarisers and the
engine, and compares the diagnoses with the direct replay's.

Call from one thread (the agent's).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from c4d import schema
from c4d.agent.heartbeats import HeartbeatMerge, PeerMerge
from c4d.engine.state import GONE_EVENTS, MAX_NRANKS, MAX_RANK, Comm, RankTable, compute_gaps
from c4d.schema import Kind, OpFlag

_P2P = int(OpFlag.P2P)
_GIVEN = np.uint8(int(OpFlag.COMPUTE_GIVEN))
_SIZED = (int(Kind.OP), int(Kind.HEARTBEAT), int(Kind.COMM))


class Summariser:
    """One node's ranks' records in, the master's input out."""

    def __init__(self, max_members: int = schema.OPSUM_MAX_MEMBERS, hb_every: int = 5) -> None:
        """``hb_every``: a progressing rank's heartbeats forwarded per communicator (1: all)."""
        self.max_members = min(max_members, schema.OPSUM_MAX_MEMBERS)
        self.heartbeats = HeartbeatMerge(hb_every)
        self.peers = PeerMerge()
        self.ranks = RankTable()  # node names (one host clock) of the ranks registered here
        self.last_end = np.zeros(0, np.int64)  # per global rank: compute_gaps' state
        self.compute = np.zeros(0, np.int64)
        self.size: dict[int, int] = {}  # comm id -> members
        self.members: dict[int, dict[int, int]] = {}  # comm id -> {comm rank: global rank} seen here
        self.comms: dict[int, Comm] = {}  # node-local communicators being summarised
        self.gone: dict[int, set[int]] = {}  # comm id -> comm ranks that finalized/destroyed/aborted it
        # comm id -> the highest collective seq forwarded as it came, before the communicator was
        # known to be node-local: those ops stay raw for every member (their other rows went raw)
        self.raw_seq: dict[int, int] = {}
        self.stats: Counter[str] = Counter()

    # -- the stream ---------------------------------------------------------------------
    def feed(self, raw: np.ndarray) -> np.ndarray:
        """Take admitted HEADER rows in arrival order; return the HEADER rows for the master."""
        if not len(raw):
            return raw
        self.stats["in"] += len(raw)
        raw = np.array(raw, copy=True)  # OP rows are annotated in place
        kind = raw["kind"]
        reg = kind == Kind.REGISTER
        if reg.any():
            r = raw[reg].view(schema.REGISTER)
            r = r[(r["rank"] >= 0) & (r["rank"] < MAX_RANK)]
            if len(r):
                self._ensure(int(r["rank"].max()))
                self.ranks.register(r)
        self._note_members(raw, kind)
        is_op = np.flatnonzero(kind == Kind.OP)
        keep = np.ones(len(raw), bool)
        sums: list[np.ndarray] = []
        if len(is_op):
            ops = raw[is_op].view(schema.OP)
            self._ensure(int(ops["rank"].max()))
            _gaps, cum = compute_gaps(ops, self.last_end, self.compute)
            local = self._local(ops)
            fwd = ~local
            if fwd.any():  # forwarded: with the compute the master cannot sum itself
                view = raw.view(schema.OP)
                view["compute_ns"][is_op[fwd]] = cum[fwd]
                view["flags"][is_op[fwd]] |= _GIVEN
            if local.any():
                keep[is_op[local]] = False
                self.stats["ops summarised"] += int(local.sum())
                sums = self._summarise(ops[local], cum[local])
        merges = (
            (Kind.HEARTBEAT, self.heartbeats, "heartbeats merged"),
            (Kind.PEER, self.peers, "peer reports merged"),
        )
        for k, merge, said in merges:
            at = np.flatnonzero(kind == k)
            if len(at):
                fwd = merge.keep(schema.take_records(raw, at).view(schema.DTYPES[k]))
                keep[at[~fwd]] = False
                self.stats[said] += int((~fwd).sum())
        out = raw[keep]
        self._forget_destroyed(raw, kind)
        if sums:
            out = schema.join_records([out, *sums], schema.HEADER)
        self.stats["out"] += len(out)
        return out

    # -- pieces -------------------------------------------------------------------------
    def _ensure(self, g: int) -> None:
        self.ranks.ensure(g)
        if g >= len(self.last_end):
            n = self.ranks.n
            self.last_end = np.concatenate([self.last_end, np.zeros(n - len(self.last_end), np.int64)])
            self.compute = np.concatenate([self.compute, np.zeros(n - len(self.compute), np.int64)])

    def _note_members(self, raw: np.ndarray, kind: np.ndarray) -> None:
        """Which comm ranks of which communicators run here (sized records name them)."""
        sized = np.flatnonzero(np.isin(kind, _SIZED))
        if not len(sized):
            return
        rows = raw[sized]
        cid = rows.view(schema.OP)["comm_id"]  # comm_id is the first body field of every kind
        cr = np.zeros(len(rows), np.int64)
        nr = np.zeros(len(rows), np.int64)
        for k, dt in ((Kind.OP, schema.OP), (Kind.HEARTBEAT, schema.HEARTBEAT), (Kind.COMM, schema.COMM)):
            m = rows["kind"] == k
            if m.any():
                v = rows[m].view(dt)
                cr[m], nr[m] = v["comm_rank"], v["comm_nranks"]
        ok = (cid != 0) & (nr >= 1) & (nr <= MAX_NRANKS) & (cr >= 0) & (cr < nr)
        if not ok.any():
            return
        key = np.stack([cid[ok].astype(np.int64), cr[ok], nr[ok], rows["rank"][ok].astype(np.int64)], axis=1)
        for c, r, n, g in np.unique(key, axis=0).tolist():
            c = c & 0xFFFFFFFFFFFFFFFF  # comm ids are u64 (viewed as int64 for the unique)
            if self.size.setdefault(c, n) != n:
                continue  # a changed size: the master refuses those; never summarised
            self.members.setdefault(c, {})[r] = g

    def _forget_destroyed(self, raw: np.ndarray, kind: np.ndarray) -> None:
        """A communicator every member here has destroyed (or finalized, aborted) is forgotten:
        the agent's memory follows the job's live communicators."""
        cm = kind == Kind.COMM
        if not cm.any():
            return
        c = raw[cm].view(schema.COMM)
        rows = zip(c["comm_id"].tolist(), c["comm_rank"].tolist(), c["event"].tolist(), strict=True)
        for cid, cr, ev in rows:
            if ev in GONE_EVENTS:
                self.gone.setdefault(cid, set()).add(cr)
            elif cid in self.gone:
                self.gone[cid].discard(cr)
            mem = self.members.get(cid)
            if mem is not None and self.gone.get(cid, set()) >= set(mem):
                for d in (self.comms, self.members, self.size, self.gone, self.raw_seq):
                    d.pop(cid, None)
                self.heartbeats.forget(cid)

    def _local(self, ops: np.ndarray) -> np.ndarray:
        """Per OP row: summarise it (a collective of a communicator all of whose members are
        known to run here, registered on this one node)."""
        out = np.zeros(len(ops), bool)
        coll = ((ops["flags"] & _P2P) == 0) & (ops["comm_nranks"] <= self.max_members)
        if not coll.any():
            return out
        seq = ops["seq"].astype(np.int64)
        for cid in np.unique(ops["comm_id"][coll]).tolist():
            mine = coll & (ops["comm_id"] == cid)
            if self._is_local(cid):
                # a member's rows of an op that went raw (a member registered late: the ranks'
                # first batches come in any order) go raw too, so the master has them all
                out |= mine & (seq > self.raw_seq.get(cid, -1))
            raw = mine & ~out
            if raw.any():
                self.raw_seq[cid] = max(self.raw_seq.get(cid, -1), int(seq[raw].max()))
        return out

    def _is_local(self, cid: int) -> bool:
        if cid in self.comms:
            return True
        n, mem = self.size.get(cid), self.members.get(cid, {})
        if n is None or n > self.max_members or len(mem) != n:
            return False
        g = np.array([mem[r] for r in range(n)], np.int64)
        if (g >= self.ranks.n).any():
            return False
        nd = self.ranks.node[g]
        if (nd < 0).any() or (nd != nd[0]).any():
            return False
        c = self.comms[cid] = Comm(len(self.comms), cid, n)
        c.grank[:] = g
        return True

    def _summarise(self, ops: np.ndarray, cum: np.ndarray) -> list[np.ndarray]:
        """Scatter node-local collectives into their communicators' rings; OPSUM rows of the
        ops every member has now finished."""
        out = []
        order = np.argsort(ops["comm_id"], kind="stable")
        ops, cum = ops[order], cum[order]
        cid = ops["comm_id"]
        cuts = np.flatnonzero(cid[1:] != cid[:-1]) + 1
        for part, pc in zip(np.split(ops, cuts), np.split(cum, cuts), strict=True):
            c = self.comms[int(part["comm_id"][0])]
            if (part["comm_nranks"] != c.n).any():  # the master refuses a changed size
                continue
            done = c.add_collectives(part, pc, self.ranks, 0.0)  # gain 0: no clock refinement here
            gaps = c.pending_gaps
            c.pending, c.pending_gaps = [], []
            if not len(done):
                continue
            G = np.concatenate(gaps)
            s = np.zeros(len(done), schema.OPSUM)
            s["kind"], s["version"] = Kind.OPSUM, schema.SCHEMA_VERSION
            s["rank"] = c.grank[done["last"]]
            s["time_ns"] = part["time_ns"].max()
            s["comm_id"] = c.id
            s["seq"] = done["seq"]
            s["bytes"] = done["bytes"]
            s["last_arrive_ns"] = done["last_arrive"]  # no offsets here: the members' host clock
            s["transfer_ns"] = done["transfer"]
            s["margin_ns"] = done["margin"]
            s["wait_med_ns"] = done["wait_med"]
            s["wait_max_ns"] = done["wait_max"]
            s["comm_rank"] = done["last"]
            s["comm_nranks"] = c.n
            s["compute_ns"] = np.nan
            s["compute_ns"][:, : c.n] = G
            s["op"] = done["op"]
            s["flags"] = np.where(done["ends_known"], schema.OPSF_ENDS_KNOWN, 0)
            self.stats["summaries"] += len(s)
            out.append(s)
        return out
