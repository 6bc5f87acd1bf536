"""What a node agent sends the master instead of its ranks' raw stream.

    ranks' records (one node, arrival order) ─► Edge.admit ─► Summariser.feed ─► master

* A collective of a communicator whose members all run on this node (a tensor-parallel group,
  at most ``schema.OPSUM_MAX_MEMBERS``) becomes one OPSUM record once every member's OP
  record is in. The agent reduces it with the master's own code (``Comm._reduce`` on one
  host clock), so the master's engine gets the COMPLETED row it would have made itself
  (``ingest_summaries.SummaryIngest.feed``): same last arriver, wait, transfer, and every member's compute.
  Of a busy communicator only the ops of the slow judge's window sample go, and each flush's
  last op (c4d/agent/sample.py).
* A collective whose members disagree (op, count, dtype, root, reduction op: the master's
  c4d/engine/consistency.py) is never summarised: every member's OP record of it goes to the
  master as it came (the agent holds the records of a node-local collective until every member's
  is in, so the ones that came before the disagreement go too), and the master names it.
* Every other OP record (p2p, communicators that span nodes) is forwarded with the rank's
  compute so far in ``compute_ns`` (``OpFlag.COMPUTE_GIVEN``): the master cannot sum a
  rank's compute gaps over ops it never sees, the agent can (``compute.compute_gaps``, the
  master's computation on the same stream). Two members' records of one collective that
  come in the same flush go as one OPPART record, the node's part of the op, which the master
  unpacks losslessly (c4d/record/oppart.py).
* HEARTBEAT records of ranks that stand still are forwarded, most of a progressing rank's
  are not (c4d/agent/heartbeats.py).
* in-flight PEER records only of transfers that outlast a heartbeat period (the same file).
* finished transfers' PEER records of collectives: those of ops that stall, and of finished
  ops those the slow judge's link localization can read (c4d/agent/peers.py).
* REGISTER, COMM, STAGE and p2p transfers' PEER records are forwarded as they came.

Deterministic in the rows fed and the cuts between feeds, like the engine: the test
(tests/test_agent_summary.py) replays recorded traces through per-node summarisers and the
engine, and compares the diagnoses with the direct replay's.

Call from one thread (the agent's).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from c4d.agent.heartbeats import HeartbeatMerge, PeerMerge
from c4d.agent.peers import PeerSieve
from c4d.agent.sample import SummarySample
from c4d.engine.comm import Comm
from c4d.engine.compute import compute_gaps
from c4d.engine.config import EngineConfig
from c4d.engine.consistency import signature
from c4d.engine.ranks import RankTable
from c4d.engine.rows import GONE_EVENTS, MAX_NRANKS, MAX_RANK
from c4d.record import oppart, schema
from c4d.record.schema import Kind, OpFlag

_P2P = int(OpFlag.P2P)
_GIVEN = np.uint8(int(OpFlag.COMPUTE_GIVEN))
_SIZED = (int(Kind.OP), int(Kind.HEARTBEAT), int(Kind.COMM))


class Summariser:
    """One node's ranks' records in, the master's input out."""

    def __init__(
        self,
        max_members: int = schema.OPSUM_MAX_MEMBERS,
        hb_every: int = 5,
        max_comm_bytes: int = 128 << 20,
        peer_every: int = 4,
        window_ops: int = EngineConfig.slow_window_ops,
        period_s: float | None = None,
        parts: bool = True,
    ) -> None:
        """``hb_every``: a progressing rank's heartbeats forwarded per communicator (1: all);
        ``peer_every``: one finished collective in that many forwards all its PEER rows (0: every
        finished transfer's PEER rows forwarded as they came);
        ``max_comm_bytes``: what the communicators being summarised may hold (C4D_AGENT_COMM_BYTES);
        beyond it a new node-local communicator's ops are forwarded as they came;
        ``window_ops``, ``period_s``: the slow judge's window sample (C4D_SLOW_WINDOW_OPS, 0: every
        op sent; the window, default the job's C4D_CONN_BW_CHECK_PERIOD);
        ``parts``: forwarded records of one collective go two to an OPPART record."""
        self.max_members = min(max_members, schema.OPSUM_MAX_MEMBERS)
        self.heartbeats = HeartbeatMerge(hb_every)
        self.peers = PeerMerge()
        self.sieve = PeerSieve(peer_every) if peer_every > 0 else None
        self.sample = SummarySample(window_ops, period_s)
        self.parts = parts
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
        # node-local collectives not every member has reported yet: their OP rows (compute
        # annotated, ready to go raw) until the op is whole, and the ops whose members disagree
        self.held = np.zeros(0, schema.OP)
        self.disagree: dict[int, set[int]] = {}  # comm id -> seqs forwarded raw
        self.stats: Counter[str] = Counter()
        self.max_comm_bytes = max_comm_bytes
        self.comm_bytes = 0  # what self.comms hold, as estimated when each was made
        self._cost: dict[int, int] = {}

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
                li = np.flatnonzero(local)
                go_raw, earlier = self._agree(ops[li], cum[li])
                if go_raw.any():  # members that disagree: every member's record to the master
                    view = raw.view(schema.OP)
                    view["compute_ns"][is_op[li[go_raw]]] = cum[li[go_raw]]
                    view["flags"][is_op[li[go_raw]]] |= _GIVEN
                    li = li[~go_raw]
                if len(earlier):
                    sums.append(earlier.view(schema.HEADER))
                keep[is_op[li]] = False
                self.stats["ops summarised"] += len(li)
                made = self._summarise(ops[li], cum[li])
                if made:
                    self.sample.period(self.ranks.job.get("bw_check_period_s"))
                    picked = self.sample.pick(schema.join_records(made, schema.OPSUM))
                    self.stats["summaries sent"] += len(picked)
                    sums.append(picked.view(schema.HEADER))
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
        if self.sieve is not None:
            sums += self._sieve(raw, kind, is_op, keep)
        if self.parts and len(is_op) > 1:
            sums += self._pack(raw, is_op, keep)
        out = raw[keep]
        self._forget_destroyed(raw, kind)
        if sums:
            out = schema.join_records([out, *sums], schema.HEADER)
        self.stats["out"] += len(out)
        return out

    # -- pieces -------------------------------------------------------------------------
    def _sieve(
        self, raw: np.ndarray, kind: np.ndarray, is_op: np.ndarray, keep: np.ndarray
    ) -> list[np.ndarray]:
        """Finished transfers' PEER rows through the sieve (c4d/agent/peers.py), in place in
        ``keep``; returns the held rows that go now."""
        assert self.sieve is not None
        if len(is_op):
            self.sieve.note_ops(raw[is_op].view(schema.OP))
        hb = np.flatnonzero(kind == Kind.HEARTBEAT)
        if len(hb):
            self.sieve.note_heartbeats(schema.take_records(raw, hb).view(schema.HEARTBEAT))
        at = np.flatnonzero((kind == Kind.PEER) & keep)
        if not len(at) and not len(self.sieve.held):
            return []
        fwd, released = self.sieve.keep(schema.take_records(raw, at).view(schema.PEER))
        keep[at[~fwd]] = False
        self.stats["peer reports sieved"] = self.sieve.stats["dropped"]
        return [released.view(schema.HEADER)] if len(released) else []

    def _pack(self, raw: np.ndarray, is_op: np.ndarray, keep: np.ndarray) -> list[np.ndarray]:
        """Forwarded OP rows (compute given) two to an OPPART row, in place in ``keep``."""
        at = is_op[keep[is_op] & ((raw.view(schema.OP)["flags"][is_op] & _GIVEN) != 0)]
        if len(at) < 2:
            return []
        parts, held = oppart.pack(raw[at].view(schema.OP))
        if not len(parts):
            return []
        keep[at[held]] = False
        self.stats["ops in parts"] += len(held)
        self.stats["parts sent"] += len(parts)
        return [parts.view(schema.HEADER)]

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
                self.forget([cid])

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

    def forget(self, cids: list[int]) -> None:
        """Communicators the edge freed (idle, destroyed, evicted): everything held for them goes."""
        gone = {int(c) & 0xFFFFFFFFFFFFFFFF for c in cids}
        for cid in gone:
            c = self.comms.pop(cid, None)
            if c is not None:
                self.comm_bytes -= self._cost.pop(cid, 0)
            for d in (self.members, self.size, self.gone, self.raw_seq):
                d.pop(cid, None)
        self.heartbeats.forget_many(gone)
        self.sample.forget(gone)
        if self.sieve is not None:
            self.sieve.forget_many(gone)

    def _agree(self, ops: np.ndarray, cum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Node-local collective rows: which go raw (their op's members disagree), and the held
        rows of those ops that came earlier (to forward too). The rest of an op not yet whole
        is held."""
        cur = np.array(ops, copy=True)
        cur["compute_ns"] = cum
        cur["flags"] |= _GIVEN
        rows = schema.join_records([self.held, cur]) if len(self.held) else cur
        new = np.r_[np.zeros(len(self.held), bool), np.ones(len(cur), bool)]
        cid, seq = rows["comm_id"], rows["seq"].astype(np.int64)
        raw_before = np.zeros(len(rows), bool)
        for c, seqs in self.disagree.items():  # later members of an op already gone raw
            raw_before |= (cid == c) & np.isin(seq, list(seqs))
        o = np.lexsort((seq, cid))
        c_o, s_o = cid[o], seq[o]
        heads = np.flatnonzero(np.r_[True, (c_o[1:] != c_o[:-1]) | (s_o[1:] != s_o[:-1])])
        sig = signature(rows["op"].astype(np.uint64) | (rows["dtype"].astype(np.uint64) << np.uint64(8))
                        | (rows["redop"].astype(np.uint64) << np.uint64(16)), rows["peer"])[o]  # fmt: skip
        cnt = rows["count"][o]
        alike = (np.minimum.reduceat(sig, heads) == np.maximum.reduceat(sig, heads)) & (
            np.minimum.reduceat(cnt, heads) == np.maximum.reduceat(cnt, heads)
        )
        size = np.diff(np.r_[heads, len(rows)])
        whole = size >= rows["comm_nranks"][o][heads]
        bad = np.repeat(~alike, size)
        for c, s in {(int(c_o[h]), int(s_o[h])) for h in heads[~alike].tolist()}:
            self.disagree.setdefault(c, set()).add(s)
            self.stats["ops with disagreeing members"] += 1
        go = np.zeros(len(rows), bool)
        go[o] = bad
        go |= raw_before
        hold = np.zeros(len(rows), bool)
        hold[o] = ~np.repeat(whole, size)
        hold &= ~go
        for c, seqs in self.disagree.items():  # keep what tells the latest ops apart only
            if len(seqs) > 64:
                self.disagree[c] = set(sorted(seqs)[-64:])
        self.held = rows[hold]
        return go[new], rows[go & ~new]

    def _is_local(self, cid: int) -> bool:
        if cid in self.comms:
            return True
        n, mem = self.size.get(cid), self.members.get(cid, {})
        if n is None or n > self.max_members or len(mem) != n:
            return False
        if self.comm_bytes >= self.max_comm_bytes:  # forwarded as they came: the master reduces them
            self.stats["not summarised (agent memory budget)"] += 1
            return False
        g = np.array([mem[r] for r in range(n)], np.int64)
        if (g >= self.ranks.n).any():
            return False
        nd = self.ranks.node[g]
        if (nd < 0).any() or (nd != nd[0]).any():
            return False
        c = self.comms[cid] = Comm(len(self.comms), cid, n)
        c.grank[:] = g
        # its arrays and its op ring once made (W slots x members x 25 bytes)
        cost = sum(a.nbytes for a in vars(c).values() if isinstance(a, np.ndarray)) + c.W * n * 25 + 2048
        self._cost[cid] = cost
        self.comm_bytes += cost
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
            _rows, gaps = c.take_all()
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
