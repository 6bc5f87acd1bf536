"""A synthetic TP x PP x DP job's record streams, as its ranks (raw) or its node agents send them.

Built with numpy from one round's template, so a sender keeps up with any master: round k
(every ``1 / rate`` s of job time) is a tensor-parallel all-reduce on every rank; every
``pp_every`` rounds a pipeline send/recv between adjacent stages, every ``dp_every`` rounds
a data-parallel all-reduce. The rates are issue 12's Megatron arithmetic: 80 layers x 4
all-reduces x 8 micro-batches per ~5 s step is ~500 collectives per second per rank; 1F1B
sends and receives once forward and once backward per micro-batch (4 p2p ops of an inner
stage, 32 a step: 6.4 a second), so an inner stage's send + recv every 156 rounds.
Heartbeats every ``hb_ms`` per rank and communicator and per process; REGISTER and COMM
records at the start (REGISTER again every 10 heartbeats).
All valid v1 records (the master's edge admits them).

Layout as Megatron (and tests/factories.py): rank = t + tp * (p + pp * d), TP groups are
consecutive ranks on one node (``ranks_per_node = tp``), DP groups strided across nodes.

``agents=True`` gives what one node agent per node forwards (c4d/agent/summary.py): one OPSUM
per TP all-reduce instead of ``tp`` OP records (those of the agents' window sample and each
flush's last, a window of rounds being one flush: c4d/agent/sample.py; ``Shape.window_ops`` 0
sends every one), the other OP records with the rank's compute attached, the heartbeats the
agent's merge keeps (c4d/agent/heartbeats.py), everything else as the ranks sent it. ``hang``
(round, rank) stops that rank before round ``k``: its TP group waits there (heartbeats show the
members arrived, the rank not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from c4d.agent.heartbeats import HeartbeatMerge
from c4d.agent.sample import SummarySample
from c4d.engine.config import EngineConfig
from c4d.record import schema
from c4d.record.schema import Kind, Op, OpFlag

_V = np.dtype((np.void, schema.RECORD_SIZE))
US = 1000


@dataclass
class Shape:
    tp: int = 8
    pp: int = 4
    dp: int = 8
    rate: float = 500.0  # collectives per second per rank (round rate)
    pp_every: int = 156  # Megatron's 1F1B (above); 25 sends 6x as many p2p ops (--pp-every)
    dp_every: int = 100
    hb_ms: int = 200
    hang_timeout_us: int = 1_000_000
    window_s: int = 1  # slow-detection window (C4D_CONN_BW_CHECK_PERIOD; the default is 10)
    # the agents' sample of each TP group's all-reduces per window (C4D_SLOW_WINDOW_OPS; 0: all sent)
    window_ops: int = EngineConfig.slow_window_ops
    hang_times: int = 3
    flush_ms: float = 0  # the agents' flush (0: the period an agent takes for the job, c4d/agent/flush.py)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return self.world // self.tp

    @property
    def period_ns(self) -> int:
        return int(1e9 / self.rate)


class Load:
    def __init__(self, shape: Shape, t0_ns: int, agents: bool = False, hang: tuple[int, int] | None = None):
        self.s, self.t0, self.agents, self.hang = shape, int(t0_ns), agents, hang
        s = shape
        g = np.arange(s.world)
        self.t, self.p, self.d = g % s.tp, (g // s.tp) % s.pp, g // (s.tp * s.pp)
        self.node = g // s.tp
        self.tp_id = (1 << 40) | (g // s.tp)
        self.dp_id = (2 << 40) | (self.p * s.tp + self.t)
        self.pp_id = (3 << 40) | (self.d * s.tp + self.t)
        self.hb_every = max(1, int(s.hb_ms * 1e6 // s.period_ns))
        self.merge = HeartbeatMerge() if agents else None
        # the agents' window sample (the product's rule, c4d/agent/sample.py): every TP group's
        # all-reduces come at the same rounds, so one group's sample stands for all
        self.sample = SummarySample(s.window_ops, s.window_s)
        self.sample.period(None)
        self.tp_sent: dict[int, int] = {}  # with agents: this window's rounds sent, their shift
        # members' compute before a TP all-reduce jitters by up to 50 us an op (a healthy group:
        # kernels on 8 GPUs of one node), from a table so that making the job stays cheap
        self.jitter = np.random.default_rng(0).uniform(0, 50 * US, (4099, s.tp)).astype(np.float32)

    # -- start-up ----------------------------------------------------------------------
    def hello(self) -> np.ndarray:
        """REGISTER of every rank and COMM init of every communicator member (HEADER rows)."""
        s, g = self.s, np.arange(self.s.world)
        r = np.zeros(s.world, schema.REGISTER)
        self._hdr(r, Kind.REGISTER, g, self.t0)
        r["hang_timeout_us"], r["hang_times"] = s.hang_timeout_us, s.hang_times
        r["pid"], r["world_size"], r["local_rank"] = 1000 + g, s.world, self.t
        r["cuda_device"], r["bw_check_period_s"], r["heartbeat_ms"] = self.t, s.window_s, s.hb_ms
        r["log_level"], r["device_timing"] = 2, 1
        r["node"] = np.char.encode(np.char.add("node-", self.node.astype(str)))
        r["job"] = b"bench"
        parts = [r.view(schema.HEADER)]
        for cid, cr, n in (
            (self.tp_id, self.t, s.tp),
            (self.dp_id, self.d, s.dp),
            (self.pp_id, self.p, s.pp),
        ):
            c = np.zeros(s.world, schema.COMM)
            self._hdr(c, Kind.COMM, g, self.t0)
            c["comm_id"], c["comm_rank"], c["comm_nranks"] = cid, cr, n
            c["color"] = c["key"] = -1
            c["device"], c["event"] = self.t, schema.CommEvent.INIT_RANK
            parts.append(c.view(schema.HEADER))
        return np.concatenate([p.view(_V) for p in parts]).view(schema.HEADER)

    # -- rounds --------------------------------------------------------------------------
    def window(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """Rounds [k0, k1): HEADER rows and each row's sender (its rank, or with agents its node:
        a window is one flush of theirs)."""
        if self.agents:
            self.tp_sent = self._tp_sample(k0, k1)
        rows: list[np.ndarray] = []
        who: list[np.ndarray] = []
        for k in range(k0, k1):
            for part in self._round(k):
                rows.append(part.view(_V))
                who.append(self._sender(part))
        if not rows:
            return np.empty(0, schema.HEADER), np.empty(0, np.int64)
        return np.concatenate(rows).view(schema.HEADER), np.concatenate(who)

    def by_sender(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """``window`` as the master receives it: each sender's rows together, in order."""
        raw, who = self.window(k0, k1)
        order = np.argsort(who, kind="stable")
        return raw[order], who[order]

    def messages(self, k0: int, k1: int, max_rows: int) -> tuple[list[bytes], np.ndarray]:
        """Rounds [k0, k1) as ZeroMQ messages: each sender's (rank's or node agent's) rows in
        messages of at most ``max_rows``, as an agent splits a flush, and each message's sender."""
        raw, who = self.by_sender(k0, k1)
        return _encoded(raw, who, max_rows)

    def hello_messages(self, max_rows: int, time_ns: int) -> tuple[list[bytes], np.ndarray]:
        """``hello`` as its senders send it (each sender's rows in messages of at most
        ``max_rows``), stamped ``time_ns``, and each message's sender."""
        h = self.hello()
        h["time_ns"] = time_ns
        who = self._sender(h)
        order = np.argsort(who, kind="stable")
        return _encoded(h[order], who[order], max_rows)

    def _sender(self, part: np.ndarray) -> np.ndarray:
        g = part["rank"].astype(np.int64)
        return self.node[g] if self.agents else g

    def _round(self, k: int) -> list[np.ndarray]:
        s = self.s
        t = self.t0 + k * s.period_ns
        out = []
        alive = np.ones(s.world, bool)
        stuck_tp = np.zeros(s.world, bool)
        if self.hang is not None and k >= self.hang[0]:
            culprit = self.hang[1]
            stuck_tp = self.tp_id == self.tp_id[culprit]
            alive[culprit] = False
        go = ~stuck_tp
        # the TP all-reduce: arrivals spread over 20 us, done 100 us after the last one
        g = np.flatnonzero(go)
        if len(g):
            arr = t + 10 * US + (g % s.tp) * 2 * US
            end = t + 10 * US + (s.tp - 1) * 2 * US + 100 * US
            if self.agents:
                if k in self.tp_sent:
                    out.append(self._opsum(g[self.t[g] == s.tp - 1], k, t, end, self.tp_sent[k]))
            else:
                out.append(self._ops(g, self.tp_id[g], self.t[g], s.tp, k, Op.AllReduce, arr, end, -1, t))
        if k % s.pp_every == 0 and s.pp > 1:
            j = k // s.pp_every
            snd = np.flatnonzero(go & alive & (self.p < s.pp - 1))
            rcv = np.flatnonzero(go & alive & (self.p > 0))
            e = t + 200 * US
            out.append(self._ops(snd, self.pp_id[snd], self.p[snd], s.pp, j, Op.Send, t + 150 * US, e,
                                 self.p[snd] + 1, t, p2p=True))  # fmt: skip
            out.append(self._ops(rcv, self.pp_id[rcv], self.p[rcv], s.pp, j, Op.Recv, t + 150 * US, e,
                                 self.p[rcv] - 1, t, p2p=True))  # fmt: skip
        if k % s.dp_every == 0 and s.dp > 1:
            j = k // s.dp_every
            g = np.flatnonzero(go & alive)
            out.append(self._ops(g, self.dp_id[g], self.d[g], s.dp, j, Op.AllReduce, t + 300 * US,
                                 t + 800 * US, -1, t))  # fmt: skip
        hb = np.flatnonzero(np.arange(s.world) % self.hb_every == k % self.hb_every)
        if len(hb):
            h = self._heartbeats(hb, k, t, stuck_tp)
            if self.merge is not None:  # what the agents forward (the product's own rule)
                x = schema.join_records(h[::-1], schema.HEARTBEAT)  # the process's first, as the shim
                h = [x[self.merge.keep(x)].view(schema.HEADER)]
            out.extend(h)
        if k and k % (10 * self.hb_every) == 0:
            reg = self.hello()[: s.world].copy()
            reg["time_ns"] = t
            out.append(reg)
        return [o for o in out if len(o)]

    def _hdr(self, a: np.ndarray, kind: Kind, g: np.ndarray, t) -> None:
        a["kind"], a["version"], a["rank"], a["time_ns"] = kind, schema.SCHEMA_VERSION, g, t

    def _ops(self, g, cid, cr, n, seq, op, arr, end, peer, t, p2p=False) -> np.ndarray:
        a = np.zeros(len(g), schema.OP)
        self._hdr(a, Kind.OP, g, np.asarray(end) + 50 * US)
        a["comm_id"], a["seq"], a["comm_rank"], a["comm_nranks"] = cid, seq, cr, n
        a["issue_ns"], a["start_ns"], a["end_ns"], a["return_ns"] = t, arr, end, t + 5 * US
        a["count"], a["bytes"], a["dtype"], a["redop"] = 1 << 20, 4 << 20, schema.DType.float32, 0
        a["peer"], a["device"], a["op"] = peer, self.t[g], op
        flags = int(OpFlag.DEVICE_TIMING) | (int(OpFlag.P2P) if p2p else 0)
        if self.agents:  # forwarded by an agent: the rank's compute so far
            flags |= int(OpFlag.COMPUTE_GIVEN)
            a["compute_ns"] = (seq + 1) * (self.s.period_ns - 150 * US)
        a["flags"] = flags
        return a.view(schema.HEADER)

    def _tp_sample(self, k0: int, k1: int) -> dict[int, int]:
        """The rounds of [k0, k1) whose TP all-reduces the agents send in this flush, and each
        one's sample shift (SummarySample.pick of one group's summaries)."""
        k = np.arange(k0, k1)
        one = np.zeros(len(k), schema.OPSUM)
        one["comm_id"], one["seq"], one["last_arrive_ns"] = 1, k, self.t0 + k * self.s.period_ns
        sent = self.sample.pick(one)
        return dict(zip(sent["seq"].tolist(), sent["sample_shift"].tolist(), strict=True))

    def _opsum(self, last: np.ndarray, k: int, t: int, end: int, shift: int = 0) -> np.ndarray:
        """One OPSUM per TP group (``last``: each group's last arriver), as Summariser makes them."""
        s = self.s
        a = np.zeros(len(last), schema.OPSUM)
        self._hdr(a, Kind.OPSUM, last, end + 50 * US)
        L = t + 10 * US + (s.tp - 1) * 2 * US
        a["comm_id"], a["seq"], a["bytes"] = self.tp_id[last], k, 4 << 20
        a["last_arrive_ns"], a["transfer_ns"] = L, end - L
        a["margin_ns"], a["wait_med_ns"], a["wait_max_ns"] = 2 * US, s.tp // 2 * 2 * US, (s.tp - 1) * 2 * US
        a["comm_rank"], a["comm_nranks"] = s.tp - 1, s.tp
        a["compute_ns"] = np.nan
        jitter = self.jitter[(k + last) % len(self.jitter)]
        a["compute_ns"][:, : s.tp] = float(s.period_ns - 150 * US) + jitter
        a["op"], a["flags"], a["sample_shift"] = Op.AllReduce, schema.OPSF_ENDS_KNOWN, shift
        return a.view(schema.HEADER)

    def _heartbeats(self, g: np.ndarray, k: int, t: int, stuck_tp: np.ndarray) -> list[np.ndarray]:
        s = self.s
        out = []
        hang_k, culprit = self.hang if self.hang is not None else (None, -1)
        for cid, cr, n, done in (
            (self.tp_id, self.t, s.tp, k),
            (self.dp_id, self.d, s.dp, k // s.dp_every),
            (self.pp_id, self.p, s.pp, 0),
            (None, None, s.world, 0),
        ):
            h = np.zeros(len(g), schema.HEARTBEAT)
            self._hdr(h, Kind.HEARTBEAT, g, t)
            h["pend_seq"], h["pend_op"], h["pend_peer"] = schema.UINT64_MAX, 255, -1
            h["device"] = self.t[g]
            if cid is None:  # the process: its ops so far (a stuck TP group's stop at the hang)
                h["comm_rank"], h["comm_nranks"] = g, n
                kk = np.where(stuck_tp[g], min(k, hang_k), k) if hang_k is not None else np.full(len(g), k)
                h["n_issued"] = h["n_arrived"] = h["n_done"] = kk + kk // s.dp_every
            else:
                h["comm_id"], h["comm_rank"], h["comm_nranks"] = cid[g], cr[g], n
                h["n_issued"] = h["n_arrived"] = h["n_done"] = done
                if cid is self.tp_id and hang_k is not None:
                    st = stuck_tp[g]  # the culprit's group: the others arrived at hang_k, it did not
                    h["n_done"][st] = hang_k
                    h["n_issued"][st] = h["n_arrived"][st] = hang_k + 1
                    h["pend_seq"][st], h["pend_op"][st] = hang_k, Op.AllReduce
                    h["pend_issue_ns"][st] = h["pend_start_ns"][st] = self.t0 + hang_k * s.period_ns + 10 * US
                    me = g == culprit
                    h["n_issued"][me] = h["n_arrived"][me] = hang_k
                    h["pend_seq"][me], h["pend_op"][me] = schema.UINT64_MAX, 255
                    h["pend_issue_ns"][me] = h["pend_start_ns"][me] = 0
            out.append(h.view(schema.HEADER))
        return out


def _encoded(raw: np.ndarray, who: np.ndarray, max_rows: int) -> tuple[list[bytes], np.ndarray]:
    """``raw`` (each sender's rows together, ``who`` the sender of each) as messages of at most
    ``max_rows`` rows of one sender, and each message's sender."""
    from c4d.record import wire

    if not len(raw):
        return [], np.empty(0, np.int64)
    # a running index within each sender's rows: a new message every max_rows of them
    start = np.r_[0, np.flatnonzero(who[1:] != who[:-1]) + 1]
    within = np.arange(len(who)) - np.repeat(start, np.diff(np.r_[start, len(who)]))
    key = who.astype(np.int64) * (len(raw) + 1) + within // max_rows
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    return [wire.encode(part) for part in np.split(raw, cuts)], who[np.r_[0, cuts]]
