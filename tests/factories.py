"""Record factories: a small discrete-event model of a TP x PP x DP training job that emits
the exact record streams the shim would send, with clock skew, jitter and faults.

The model (true time in ns; every rank's clock = true time + its node's skew):

* rank r = t + tp·(p + pp·d); node = r // ranks_per_node. Communicators: TP (same d, p),
  DP (same p, t), PP (same d, t; p2p between adjacent stages), each with its own id.
* each step: [pp>1: recv activations from stage p-1] compute, TP all-reduce, compute, TP
  all-reduce, [send to p+1]; backward mirrored; then DP all-reduce. A collective starts on
  a rank when its stream reaches it (arrival), finishes for everyone at last arrival +
  transfer; p2p send k pairs with recv k.
* faults (docs/cli.md SPEC kinds): noncomm-hang (compute of ``step`` never ends), crash (the
  process dies at the start of ``step``), comm-hang (the first op using a link of the rank /
  the link never finishes), noncomm-slow (compute x factor), comm-slow (transfers over the
  rank's / link's links x factor). A ring collective uses links i -> i+1 of its comm ranks.

Records follow the shim's semantics: OP once done (written ``poll_us`` after the end),
HEARTBEAT every ``hb_ms`` per comm and per process (comm 0) with issued/arrived/done and
the oldest pending op, REGISTER and COMM at start (REGISTER again every 10 heartbeats),
PEER per op and direction (progress snapshots while a collective hangs), FINAL heartbeats
at a clean exit. Each rank flushes a batch every ``flush_ms``; the master receives it
``latency_us`` later. ``replay`` drives an engine exactly like c4d.master.master: records stamped
with the latest tick, ``tick`` every ``tick_ms``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from c4d.record import schema
from c4d.record.schema import HBF_FINAL, Kind, Op, OpFlag

T0 = 1_700_000_000_000_000_000
INF = math.inf
MS = 1_000_000


@dataclass
class Fault:
    kind: str  # noncomm-hang | comm-hang | noncomm-slow | comm-slow | crash
    rank: int | None = None
    link: tuple[int, int] | None = None
    step: int = 0
    factor: float = 4.0
    until: int | None = None  # slow kinds: the first step no longer slowed (a transient fault)
    node: tuple[int, ...] = ()  # comm kinds: every link with an end among these ranks (a node)

    def touches(self, a: int, b: int) -> bool:
        if self.node:
            return a in self.node or b in self.node
        if self.rank is not None:
            return self.rank in (a, b)
        return self.link is not None and {a, b} == set(self.link)


@dataclass
class Job:
    tp: int = 2
    pp: int = 1
    dp: int = 4
    ranks_per_node: int = 4
    steps: int = 40
    compute_ms: float = 6.0  # per compute segment (4 per step)
    tp_bytes: int = 4 << 20
    dp_bytes: int = 16 << 20
    pp_bytes: int = 2 << 20
    intra_gbps: float = 8.0
    inter_gbps: float = 2.0
    lat_us: float = 20.0
    jitter: float = 0.03
    skew_ms: float = 0.0  # node clocks offset uniformly in ±skew_ms (node 0 gets +skew_ms)
    skews_ms: list[float] | None = None  # explicit per-node offsets
    hb_ms: float = 100.0
    flush_ms: float = 10.0
    poll_us: float = 200.0
    latency_us: float = 300.0
    tick_ms: float = 200.0
    peer: bool = True
    peer_intra: bool = True  # False: no PEER rows for transfers inside a node (NCCL's profiler sees none)
    hang_timeout_us: int = 1_000_000
    hang_times: int = 3
    period_s: int = 1
    seed: int = 1
    faults: list[Fault] = field(default_factory=list)
    tail_s: float | None = None  # how long the model runs after a hang starts (default T x times + 2 s)
    launch_us: float = 30.0  # host issue runs this far ahead of the stream
    group_p2p: bool = True  # stage p's send to p+1 and recv from p+1 in one ncclGroup (simtrain)
    noise_ms: float = 0.0  # mean of an exponential extra delay per compute segment (a busy host's scheduling)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def node_of(self, r: int) -> int:
        return r // self.ranks_per_node

    def node_name(self, r: int) -> str:
        return f"node-{self.node_of(r)}"


# -- the model ---------------------------------------------------------------------------
@dataclass
class _CommDef:
    cid: int
    members: list[int]  # global ranks by comm rank
    name: str


@dataclass
class _OpRec:
    comm: int  # comm index
    crank: int
    op: int
    seq: int
    peer: int
    flags: int
    nbytes: int
    issue: float
    arrive: float
    end: float  # INF: never finished (the end event: for a group, when all its ops finished)
    xend: float = INF  # this op's own transfer finished


class Model:
    """Runs the job on true time and keeps, per rank, every op it issued."""

    def __init__(self, job: Job):
        self.job = job
        self.rng = np.random.default_rng(job.seed)
        W = job.world
        n_nodes = (W + job.ranks_per_node - 1) // job.ranks_per_node
        if job.skews_ms is not None:
            sk = list(job.skews_ms) + [0.0] * n_nodes
            self.skew = [int(sk[i] * MS) for i in range(n_nodes)]
        else:
            self.skew = [
                int(job.skew_ms * MS * (1 if i == 0 else self.rng.uniform(-1, 1))) for i in range(n_nodes)
            ]
        self.comms: list[_CommDef] = []
        self.comm_of: dict[tuple[str, int], int] = {}
        self._build_comms()
        self.ops: list[list[_OpRec]] = [[] for _ in range(W)]
        self.crash_at: dict[int, float] = {}
        self.last_arrival: dict[tuple[int, int], float] = {}  # (comm idx, seq) -> L once all arrived
        # (comm idx, seq) -> (pace, {(src, dst) global: one step's move time}) of finished collectives
        self.link_moves: dict[tuple[int, int], tuple[float, dict]] = {}
        self.hang_start: float | None = None
        self.finish: list[float] = [INF] * W
        self.step_start: dict[int, float] = {}  # step -> true time the first rank began it
        self._run()

    def coords(self, r: int) -> tuple[int, int, int]:
        j = self.job
        return r // (j.tp * j.pp), (r // j.tp) % j.pp, r % j.tp

    def rank_of(self, d: int, p: int, t: int) -> int:
        j = self.job
        return t + j.tp * (p + j.pp * d)

    def _add_comm(self, kind: str, key: int, members: list[int]) -> None:
        idx = len(self.comms)
        cid = (0xC0 << 56) | ({"tp": 1, "dp": 2, "pp": 3}[kind] << 40) | (key + 1)
        self.comms.append(_CommDef(cid, members, f"{kind}{key}"))
        for m in members:
            self.comm_of[(kind, m)] = idx

    def _build_comms(self) -> None:
        j = self.job
        if j.tp > 1:
            for d in range(j.dp):
                for p in range(j.pp):
                    self._add_comm("tp", d * j.pp + p, [self.rank_of(d, p, t) for t in range(j.tp)])
        if j.dp > 1:
            for p in range(j.pp):
                for t in range(j.tp):
                    self._add_comm("dp", p * j.tp + t, [self.rank_of(d, p, t) for d in range(j.dp)])
        if j.pp > 1:
            for d in range(j.dp):
                for t in range(j.tp):
                    self._add_comm("pp", d * j.tp + t, [self.rank_of(d, p, t) for p in range(j.pp)])

    def program(self, r: int) -> list[tuple]:
        """Instructions: ('step', s), ('c', s), ('coll', kind, op, bytes, s), ('send'|'recv', peer, s)."""
        j = self.job
        d, p, t = self.coords(r)
        prog: list[tuple] = []
        for s in range(j.steps):
            prog.append(("step", s))
            if j.pp > 1 and p > 0:
                prog.append(("recv", self.rank_of(d, p - 1, t), s))
            for _ in range(2):
                prog.append(("c", s))
                if j.tp > 1:
                    prog.append(("coll", "tp", int(Op.AllReduce), j.tp_bytes, s))
            if j.pp > 1 and p < j.pp - 1:
                nxt = self.rank_of(d, p + 1, t)
                if j.group_p2p:  # as simtrain: group{send activations, recv gradients}
                    prog.append(("group", [("send", nxt, s), ("recv", nxt, s)], s))
                else:
                    prog.append(("send", nxt, s))
                    prog.append(("recv", nxt, s))
            for _ in range(2):
                prog.append(("c", s))
                if j.tp > 1:
                    prog.append(("coll", "tp", int(Op.AllReduce), j.tp_bytes, s))
            if j.pp > 1 and p > 0:
                prog.append(("send", self.rank_of(d, p - 1, t), s))
            if j.dp > 1:
                prog.append(("coll", "dp", int(Op.AllReduce), j.dp_bytes, s))
        return prog

    def _faults(self, kind: str, step: int) -> list[Fault]:
        return [f for f in self.job.faults if f.kind == kind and f.step <= step < (f.until or INF)]

    def _link_bw(self, a: int, b: int, step: int) -> float:
        """bytes per ns over link a->b at ``step``; 0 = hung."""
        j = self.job
        bw = (j.intra_gbps if j.node_of(a) == j.node_of(b) else j.inter_gbps) * 1.0
        for f in self._faults("comm-hang", step):
            if f.touches(a, b):
                return 0.0
        for f in self._faults("comm-slow", step):
            if f.touches(a, b):
                bw /= f.factor
        return bw

    def _jit(self) -> float:
        return 1.0 + self.job.jitter * self.rng.uniform(-1, 1)

    def _run(self) -> None:
        j = self.job
        W = j.world
        progs = [self.program(r) for r in range(W)]
        ip = [0] * W
        now = [0.0] * W  # true ns since T0
        step = [0] * W
        blocked: list[list | None] = [None] * W  # ops the rank's stream waits for
        groups: list[list] = [[] for _ in range(W)]  # the ops issued together with them
        dead = [False] * W
        seq_coll = [0] * len(self.comms)  # per comm: next collective seq (same on every member)
        next_seq: dict[tuple[int, int], int] = {}  # (comm idx, rank) -> own next coll seq
        p2p_seq: dict[tuple[int, int, int, int], int] = {}  # (comm, rank, op, peer rank) -> next seq
        pend_coll: dict[tuple[int, int], dict[int, _OpRec]] = {}
        pend_p2p: dict[tuple[int, int, int, int], dict[str, _OpRec]] = {}
        hung_ops: set = set()
        del seq_coll

        def op_done(g: int, rec: _OpRec) -> None:
            """rec finished on rank g; when its whole group is done the rank moves on. Ops of a
            group share the group's events: they all end when the last one does."""
            waiting = blocked[g]
            waiting.remove(rec)
            if not waiting:
                grp = groups[g]
                end = max(x.xend for x in grp)
                for x in grp:
                    x.end = end
                now[g] = end
                blocked[g] = None
                ip[g] += 1

        def finish_coll(ci: int, recs: dict[int, _OpRec], s: int) -> None:
            c = self.comms[ci]
            n = len(c.members)
            L = max(x.arrive for x in recs.values())
            self.last_arrival[(ci, next(iter(recs.values())).seq)] = L
            links = [(c.members[i], c.members[(i + 1) % n]) for i in range(n)] if n > 1 else []
            bws = [self._link_bw(a, b, s) for a, b in links]
            if any(b == 0 for b in bws):
                for x in recs.values():
                    x.end = INF
                if self.hang_start is None or self.hang_start > L:
                    self.hang_start = L
                hung_ops.add((ci, next(iter(recs.values())).seq))
                return
            nb = next(iter(recs.values())).nbytes
            # ring all-reduce: 2(n-1) steps of nb/n bytes, paced by the slowest link (as simnccl)
            jit = self._jit()
            moves = [((nb / n) / bw + j.lat_us * 1e3) * jit for bw in bws]
            pace = max(moves)
            xfer = 2 * (n - 1) * pace
            self.link_moves[(ci, next(iter(recs.values())).seq)] = (
                pace,
                dict(zip(links, moves, strict=True)),
            )
            for cr, x in recs.items():
                x.xend = L + xfer + self.rng.uniform(0, 5e3)
                op_done(c.members[cr], x)

        def finish_p2p(key, pair: dict[str, _OpRec], s: int) -> None:
            _ci, src, dst, _ = key
            L = max(pair["send"].arrive, pair["recv"].arrive)
            bw = self._link_bw(src, dst, s)
            if bw == 0:
                pair["send"].end = pair["recv"].end = INF
                if self.hang_start is None or self.hang_start > L:
                    self.hang_start = L
                return
            xfer = (pair["send"].nbytes / bw + j.lat_us * 1e3) * self._jit()
            for side, g in (("send", src), ("recv", dst)):
                pair[side].xend = L + xfer
                op_done(g, pair[side])

        progress = True
        while progress:
            progress = False
            for r in range(W):
                while not dead[r] and blocked[r] is None and ip[r] < len(progs[r]):
                    ins = progs[r][ip[r]]
                    if ins[0] == "step":
                        step[r] = ins[1]
                        self.step_start[ins[1]] = min(self.step_start.get(ins[1], INF), now[r])
                        crash = [f for f in self._faults("crash", ins[1]) if f.rank == r and f.step == ins[1]]
                        if crash:
                            self.crash_at[r] = now[r]
                            if self.hang_start is None or now[r] < self.hang_start:
                                self.hang_start = now[r]
                            dead[r] = True
                            break
                        ip[r] += 1
                        continue
                    if ins[0] == "c":
                        if any(
                            f.rank == r and f.step == ins[1] for f in self._faults("noncomm-hang", ins[1])
                        ):
                            # the stream is stuck; the host has already issued the next op
                            nxt = progs[r][ip[r] + 1] if ip[r] + 1 < len(progs[r]) else None
                            if nxt is not None and nxt[0] == "coll":
                                self._issue_only(r, nxt, now[r], next_seq, p2p_seq)
                            if self.hang_start is None or now[r] < self.hang_start:
                                self.hang_start = now[r]
                            dead[r] = True
                            break
                        dur = j.compute_ms * MS * self._jit()
                        if j.noise_ms:
                            dur += self.rng.exponential(j.noise_ms) * MS
                        for f in self._faults("noncomm-slow", ins[1]):
                            if f.rank == r:
                                dur *= f.factor
                        now[r] += dur
                        ip[r] += 1
                        progress = True
                        continue
                    if ins[0] == "coll":
                        _, kind, op, nb, s = ins
                        ci = self.comm_of[(kind, r)]
                        c = self.comms[ci]
                        cr = c.members.index(r)
                        k = next_seq.get((ci, r), 0)
                        next_seq[(ci, r)] = k + 1
                        a = now[r] + j.launch_us * 1e3
                        rec = _OpRec(ci, cr, op, k, -1, int(OpFlag.DEVICE_TIMING), nb, now[r], a, INF)
                        self.ops[r].append(rec)
                        recs = pend_coll.setdefault((ci, k), {})
                        recs[cr] = rec
                        blocked[r], groups[r] = [rec], [rec]
                        if len(recs) == len(c.members):
                            finish_coll(ci, recs, s)
                            del pend_coll[(ci, k)]
                        progress = True
                        continue
                    # p2p: one op, or a group of them (issued together, one set of events)
                    parts = ins[1] if ins[0] == "group" else [ins]
                    ci = self.comm_of[("pp", r)]
                    c = self.comms[ci]
                    fl = int(OpFlag.DEVICE_TIMING | OpFlag.P2P)
                    if ins[0] == "group":
                        fl |= int(OpFlag.IN_GROUP)
                    a = now[r] + j.launch_us * 1e3
                    recs_r, ready = [], []
                    for side, peer, s in parts:
                        op = int(Op.Send) if side == "send" else int(Op.Recv)
                        k = p2p_seq.get((ci, r, op, peer), 0)
                        p2p_seq[(ci, r, op, peer)] = k + 1
                        rec = _OpRec(ci, c.members.index(r), op, k, c.members.index(peer), fl, j.pp_bytes,
                                     now[r], a, INF)  # fmt: skip
                        self.ops[r].append(rec)
                        recs_r.append(rec)
                        src, dst = (r, peer) if side == "send" else (peer, r)
                        key = (ci, src, dst, k)
                        pair = pend_p2p.setdefault(key, {})
                        pair[side] = rec
                        if len(pair) == 2:
                            ready.append((key, pair, s))
                    blocked[r], groups[r] = list(recs_r), list(recs_r)
                    for key, pair, s in ready:
                        finish_p2p(key, pair, s)
                        del pend_p2p[key]
                    progress = True
        for r in range(W):
            if not dead[r] and blocked[r] is None and ip[r] >= len(progs[r]):
                self.finish[r] = now[r]

    def _issue_only(self, r, ins, t, next_seq, p2p_seq) -> None:
        """The host issued ``ins`` but the stream never reaches it (noncomm-hang)."""
        if ins[0] == "coll":
            ci = self.comm_of[(ins[1], r)]
            k = next_seq.get((ci, r), 0)
            next_seq[(ci, r)] = k + 1
            cr = self.comms[ci].members.index(r)
            self.ops[r].append(_OpRec(ci, cr, ins[2], k, -1, int(OpFlag.DEVICE_TIMING), ins[3], t, INF, INF))

    @property
    def end_time(self) -> float:
        """True time (ns since T0) at which the model stops emitting."""
        j = self.job
        if self.hang_start is not None:
            tail = j.tail_s if j.tail_s is not None else j.hang_timeout_us * 1e-6 * j.hang_times + 2.0
            return self.hang_start + tail * 1e9
        return max(f for f in self.finish if f < INF) + 0.5e9


# -- records -----------------------------------------------------------------------------
def _empty(n: int) -> np.ndarray:
    return np.zeros(n, schema.HEADER)


class Stream:
    """Every record of every rank with its true write time, then batched for delivery."""

    def __init__(self, model: Model):
        self.m = model
        self.job = model.job
        j = self.job
        self.batches: list[tuple[float, np.ndarray]] = []  # (true receive time, HEADER rows)
        self._tl: dict = {}
        W = j.world
        self._sk = [model.skew[j.node_of(r)] for r in range(W)]
        end = model.end_time
        for r in range(W):
            stop = model.crash_at.get(r, INF)
            fin = model.finish[r]
            rows, times = self._rank_records(r, min(end, stop), fin)
            self._batch(r, rows, times, min(end, stop))

    # each rank's clock
    def clk(self, r: int, t: float) -> int:
        return int(T0 + t + self._sk[r])

    def _rank_records(self, r: int, stop: float, fin: float):
        j, m = self.job, self.m
        recs: list[tuple[float, np.ndarray]] = []
        my_comms = [(i, c) for i, c in enumerate(m.comms) if r in c.members]
        # REGISTER + COMM at start
        recs.append((0.0, self._register(r, 0.0)))
        for i, c in my_comms:
            recs.append((0.0, self._comm(r, i, c, 0.0)))
        # OP records
        for o in m.ops[r]:
            if o.end < INF:
                recs.append((o.end + j.poll_us * 1e3, self._op(r, o, o.end + j.poll_us * 1e3)))
        # PEER records of completed collectives
        if j.peer:
            for o in m.ops[r]:
                if o.end < INF and not o.flags & OpFlag.P2P:
                    recs += self._peer_done(r, o)
        # heartbeats
        hb = j.hb_ms * MS
        phase = (r * 7919 % 97) / 97 * hb
        t = phase
        n_hb = 0
        last = min(stop, fin if fin < INF else INF)
        while t < last:
            for i, c in my_comms:
                recs.append((t, self._heartbeat(r, i, c, t)))
                if j.peer:
                    recs += self._peer_progress(r, i, c, t)
            recs.append((t, self._proc_heartbeat(r, t, final=False)))
            n_hb += 1
            if n_hb % 10 == 0:
                recs.append((t, self._register(r, t)))
            t += hb
        if fin < INF and fin <= stop:
            for i, c in my_comms:
                recs.append((fin, self._heartbeat(r, i, c, fin)))
            recs.append((fin + 1, self._proc_heartbeat(r, fin + 1, final=True)))
        recs = [x for x in recs if x[0] <= stop]
        recs.sort(key=lambda x: x[0])
        rows = _empty(len(recs))
        kinds = np.array([x[1]["kind"] for x in recs])
        for kind, dt in schema.DTYPES.items():
            idx = np.flatnonzero(kinds == kind)
            if not len(idx):
                continue
            df = pd.DataFrame.from_records([recs[i][1] for i in idx]).fillna(0)
            part = np.zeros(len(idx), dt)
            for name in df.columns:
                col = df[name].to_numpy()
                part[name] = col.astype(dt[name]) if col.dtype != object else list(col)
            rows[idx] = part.view(schema.HEADER)
        times = np.array([x[0] for x in recs], dtype=float)
        return rows, times

    def _batch(self, r: int, rows: np.ndarray, times: np.ndarray, stop: float) -> None:
        j = self.job
        fl = j.flush_ms * MS
        phase = (r * 104729 % 89) / 89 * fl
        idx = np.floor((times - phase) / fl).astype(np.int64) + 1
        for k in np.unique(idx):
            sel = idx == k
            flush = phase + k * fl
            if flush > stop:
                flush = stop  # the last partial batch of a crashing rank still goes out
            self.batches.append((flush + j.latency_us * 1e3, rows[sel]))

    # record builders --------------------------------------------------------------------
    def _hdr(self, n: int, kind: Kind, r: int, t: float, dt: np.dtype) -> dict:
        """One record as a dict of fields (arrays are built per kind at the end: much faster)."""
        return {"kind": int(kind), "version": schema.SCHEMA_VERSION, "rank": r, "time_ns": self.clk(r, t)}

    def _register(self, r: int, t: float) -> np.ndarray:
        j = self.job
        a = self._hdr(1, Kind.REGISTER, r, t, schema.REGISTER)
        a["hang_timeout_us"] = j.hang_timeout_us
        a["pid"] = 1000 + r
        a["world_size"] = j.world
        a["local_rank"] = r % j.ranks_per_node
        a["hang_times"] = j.hang_times
        a["bw_check_period_s"] = j.period_s
        a["heartbeat_ms"] = int(j.hb_ms)
        a["device_timing"] = 1
        a["node"] = j.node_name(r).encode()
        a["job"] = b"test"
        return a

    def _comm(self, r: int, i: int, c: _CommDef, t: float) -> np.ndarray:
        a = self._hdr(1, Kind.COMM, r, t, schema.COMM)
        a["comm_id"] = c.cid
        a["comm_rank"] = c.members.index(r)
        a["comm_nranks"] = len(c.members)
        a["event"] = int(schema.CommEvent.INIT_RANK)
        a["color"] = -1
        return a

    def _op(self, r: int, o: _OpRec, t: float) -> np.ndarray:
        c = self.m.comms[o.comm]
        a = self._hdr(1, Kind.OP, r, t, schema.OP)
        a["comm_id"] = c.cid
        a["seq"] = o.seq
        a["issue_ns"] = self.clk(r, o.issue)
        a["start_ns"] = self.clk(r, o.arrive)
        a["end_ns"] = self.clk(r, o.end)
        a["return_ns"] = self.clk(r, o.issue + 5e3)
        a["count"] = o.nbytes // 4
        a["bytes"] = o.nbytes
        a["dtype"] = 7
        a["comm_rank"] = o.crank
        a["comm_nranks"] = len(c.members)
        a["peer"] = o.peer
        a["op"] = o.op
        a["flags"] = o.flags
        return a

    def _peer_row(self, r, c, seq, op, peer, direction, t, first, last, done, total, nbytes, state):
        a = self._hdr(1, Kind.PEER, r, t, schema.PEER)
        a["comm_id"] = c.cid
        a["seq"] = seq
        a["first_ns"] = self.clk(r, first)
        a["last_ns"] = self.clk(r, last)
        a["bytes_done"] = nbytes
        a["comm_rank"] = c.members.index(r)
        a["peer"] = peer
        a["steps_total"] = total
        a["steps_done"] = done
        a["direction"] = direction
        a["state"] = state
        a["op"] = op
        a["done"] = int(done >= total)
        return a

    def _peer_done(self, r: int, o: _OpRec) -> list:
        c = self.m.comms[o.comm]
        n = len(c.members)
        if n < 2:
            return []
        total = 2 * (n - 1)
        L = self.m.last_arrival[(o.comm, o.seq)]
        t = o.end + self.job.poll_us * 1e3
        nb = total * o.nbytes // n
        pace, moves = self.m.link_moves[(o.comm, o.seq)]
        out = []
        for direction, peer in ((0, (o.crank + 1) % n), (1, (o.crank - 1) % n)):
            link = (r, c.members[peer]) if direction == 0 else (c.members[peer], r)
            if not self.job.peer_intra and self.job.node_of(link[0]) == self.job.node_of(link[1]):
                continue
            # simnccl: step s starts at L + s * pace and takes this link's own move time
            last = L + (total - 1) * pace + moves[link]
            row = self._peer_row(r, c, o.seq, o.op, peer, direction, t, L, last, total, total, nb, 0)
            if direction == 0:  # the sender's own transfer time: SendWait -> stop of each step
                row["wire_ns"] = int(total * moves[link])
            out.append((t, row))
        return out

    def _peer_progress(self, r: int, i: int, c: _CommDef, t: float) -> list:
        """While r is inside a hung collective: its two ring transfers, as simnccl models them: a
        hung link's step 0 stuck in SendWait/RecvWait; a link d hops after the nearest hung one
        moved d steps and waits for data (its sender in SendGPUWait); no hung link before it: done."""
        ops, _, _arr, end = self._timeline(r, i)
        if not ops or ops[0].flags & OpFlag.P2P or end[-1] < INF:
            return []
        o = ops[int(np.searchsorted(end, INF, "left"))]
        n = len(c.members)
        L = self.m.last_arrival.get((i, o.seq), INF)
        if n < 2 or o.arrive > t or t < L:
            return []  # not everyone is in yet: the transfer has not begun
        total = 2 * (n - 1)
        s = 1 << 30  # the hung op is at or after every fault's step
        hung = [self.m._link_bw(c.members[j], c.members[(j + 1) % n], s) == 0 for j in range(n)]
        out = []
        for direction, peer in ((0, (o.crank + 1) % n), (1, (o.crank - 1) % n)):
            a, b = (r, c.members[peer]) if direction == 0 else (c.members[peer], r)
            if not self.job.peer_intra and self.job.node_of(a) == self.job.node_of(b):
                continue
            src = o.crank if direction == 0 else peer
            hops = next((d for d in range(n) if hung[(src - d) % n]), n)  # to the nearest hung link
            done = min(hops, total)
            state = 0 if done == total else 10 if direction == 1 else 9 if hops == 0 else 8
            nb = done * o.nbytes // n
            out.append(
                (t, self._peer_row(r, c, o.seq, o.op, peer, direction, t, L, t, done, total, nb, state))
            )
        return out

    def _timeline(self, r: int, i: int):
        """(ops, issue, arrive, end) of rank r on comm i, in issue order (one stream: all monotonic)."""
        key = (r, i)
        tl = self._tl.get(key)
        if tl is None:
            ops = [o for o in self.m.ops[r] if o.comm == i]
            tl = self._tl[key] = (
                ops,
                np.array([o.issue for o in ops], float),
                np.array([o.arrive for o in ops], float),
                np.array([o.end for o in ops], float),
            )
        return tl

    def _heartbeat(self, r: int, i: int, c: _CommDef, t: float) -> np.ndarray:
        ops, iss, arr, end = self._timeline(r, i)
        is_coll = not (ops and ops[0].flags & OpFlag.P2P)
        a = self._hdr(1, Kind.HEARTBEAT, r, t, schema.HEARTBEAT)
        a["comm_id"] = c.cid
        n_iss = int(np.searchsorted(iss, t, "right"))
        n_arr = int(np.searchsorted(arr, t, "right"))
        n_done = int(np.searchsorted(end, t, "right"))
        if is_coll:
            a["n_issued"], a["n_arrived"], a["n_done"] = n_iss, n_arr, n_done
            a["last_arrive_ns"] = self.clk(r, arr[n_arr - 1]) if n_arr else 0
            a["last_done_ns"] = self.clk(r, end[n_done - 1]) if n_done else 0
        a["pend_seq"] = schema.UINT64_MAX
        a["pend_op"] = 255
        a["pend_peer"] = -1
        a["pend_dtype"] = a["pend_redop"] = 255
        if n_done < n_iss:
            o = ops[n_done]
            a["pend_seq"] = o.seq
            a["pend_op"] = o.op
            a["pend_peer"] = o.peer
            a["pend_flags"] = o.flags
            a["pend_count"], a["pend_dtype"], a["pend_redop"] = o.nbytes // 4, 7, 0  # as its OP record
            a["pend_issue_ns"] = self.clk(r, o.issue)
            a["pend_start_ns"] = self.clk(r, o.arrive) if o.arrive <= t else 0
        a["p2p_in_flight"] = 0 if is_coll else min(n_iss - n_done, 255)  # (8 bits, saturating)
        a["comm_rank"] = c.members.index(r)
        a["comm_nranks"] = len(c.members)
        return a

    def _proc_heartbeat(self, r: int, t: float, final: bool) -> np.ndarray:
        a = self._hdr(1, Kind.HEARTBEAT, r, t, schema.HEARTBEAT)
        a["comm_id"] = 0
        a["pend_seq"] = schema.UINT64_MAX
        a["pend_op"] = 255
        a["pend_peer"] = -1
        a["pend_dtype"] = a["pend_redop"] = 255
        a["comm_rank"] = r
        a["comm_nranks"] = self.job.world
        a["hb_flags"] = HBF_FINAL if final else 0
        return a


# -- driving an engine -------------------------------------------------------------------
@dataclass
class Run:
    job: Job
    model: Model
    diagnoses: list
    engine: object

    def kinds(self) -> list[str]:
        return [d.kind.value for d in self.diagnoses]

    def onset_s(self) -> float | None:
        """Master time (s) the first fault took effect: the hang start, else the fault step's start."""
        h = self.model.hang_start
        if h is None and self.job.faults:
            h = self.model.step_start.get(min(f.step for f in self.job.faults))
        return None if h is None else (T0 + h) / 1e9


def build(job: Job) -> tuple[Model, list[tuple[float, np.ndarray]]]:
    model = Model(job)
    st = Stream(model)
    batches = sorted(st.batches, key=lambda x: x[0])
    return model, batches


def replay(job: Job, engine_factory, batches=None, model=None) -> Run:
    """Feed the job's batches to a fresh engine like c4d.master.master does; collect every diagnosis."""
    if batches is None:
        model, batches = build(job)
    eng = engine_factory()
    tick = job.tick_ms * MS
    out: list = []
    last_tick = T0
    next_tick = tick
    end = model.end_time + 2 * tick
    bi = 0
    while next_tick <= end:
        while bi < len(batches) and batches[bi][0] <= next_tick:
            eng.feed(batches[bi][1], last_tick)
            bi += 1
        last_tick = int(T0 + next_tick)
        out += eng.tick(last_tick)
        next_tick += tick
    return Run(job, model, out, eng)


def run(job: Job, **cfg) -> Run:
    from c4d.engine import Engine, EngineConfig

    return replay(job, lambda: Engine(EngineConfig(**cfg)))


def as_master(
    job: Job,
    batches,
    agents: bool = False,
    early: bool = True,
    summariser: dict | None = None,
    flush_s: float = 0.0,
    engine_factory=None,
    **cfg,
) -> tuple[list, Any]:
    """The diagnoses of the stream fed as c4d.master.master feeds it: stamped with the latest tick's time,
    a tick every ``tick_ms``, and (``early``) one more when its pending watch
    (consistency.PendingWatch) says the batch just fed completed a disagreement, a quarter tick
    after the last tick at the earliest. ``agents``: each node's batches through its own node
    agent's summariser first (c4d/agent/summary.py; ``summariser``: their options), forwarded at
    once, or (``flush_s``) what came in each flush period together, as an agent flushes.
    ``cfg``: the engine's (``engine_factory(EngineConfig)``: another engine than ``Engine``).
    (diagnoses, the pending watch)."""
    from c4d.agent.summary import Summariser
    from c4d.engine import Engine, EngineConfig
    from c4d.engine.consistency import PendingWatch

    eng = (engine_factory or Engine)(EngineConfig(**cfg))
    watch, summ, out = PendingWatch(), {}, []
    tick = job.tick_ms * MS
    last, nxt = 0.0, tick  # master times relative to T0
    end = max(t for t, _ in batches) + 4 * tick

    def evaluate(t: float) -> None:
        nonlocal last
        out.extend(eng.tick(int(T0 + t)))
        last = t
        watch.take()

    held: list[np.ndarray] = []
    flush = flush_s * 1e3 * MS  # batches' times are in ns
    flush_at = flush
    for k, (t, b) in enumerate(batches):
        while True:  # the ticks due before this batch arrives
            due = min(nxt, last + tick / 4) if watch.due else nxt
            if due >= t:
                break
            evaluate(due)
            if due == nxt:
                nxt += tick
        rows = b.view(schema.HEADER)
        if agents and flush_s > 0:
            held.append(rows)
            if t < flush_at and k + 1 < len(batches):
                continue
            rows, held, flush_at = schema.join_records(held, schema.HEADER), [], t + flush
        if agents:
            parts = []
            for node in np.unique(rows["rank"] // job.ranks_per_node).tolist():
                s = summ.setdefault(node, Summariser(**(summariser or {})))
                parts.append(s.feed(rows[rows["rank"] // job.ranks_per_node == node]))
            parts = [p for p in parts if len(p)]
            rows = schema.join_records(parts, schema.HEADER) if parts else rows[:0]
        if len(rows):
            eng.feed(rows, int(T0 + last))
            if early and watch.feed(rows) and t >= last + tick / 4:
                evaluate(t)
    while nxt <= end:
        evaluate(nxt)
        nxt += tick
    return out, watch


_BUILT: dict[str, tuple[Model, list]] = {}


def build_cached(job: Job) -> tuple[Model, list[tuple[float, np.ndarray]]]:
    """``build`` memoised on the job's fields (tests replay one stream through several engines)."""
    key = repr(job)
    if key not in _BUILT:
        _BUILT[key] = build(job)
    return _BUILT[key]


def run_cached(job: Job, **cfg) -> Run:
    from c4d.engine import Engine, EngineConfig

    model, batches = build_cached(job)
    return replay(job, lambda: Engine(EngineConfig(**cfg)), batches, model)
