"""The node agent: receive the node's ranks' batches, summarise, forward to the master.

    ranks (C4D_MASTER_ADDR = the agent) ──PUSH──► Collector (PULL, bind, node-local)
        └► node trace (optional: the full stream, as it arrived)
        └► Edge.admit ─► Summariser.feed ─► PUSH (connect) ─► c4d master

One thread owns everything (sockets, edge, summariser, trace), as in the master: ``step``
receives for at most one flush period and then forwards what it has, so records reach the
master at most one period later than they would directly. The period is ``flush_s`` when given,
else it follows the job's size as its REGISTER records tell it (c4d/agent/flush.py: 100 ms for
up to 1,000 nodes, longer beyond, so that the master's messages stay bounded). ``c4d agent``
runs ``Agent.run``; ``c4d run`` steps an ``Agent`` from its supervisor loop (docs/run.md).

What it holds is bounded in bytes (docs/untrusted-input.md): the receive side as the master's
(``c4d.master.collector.Intake``), what waits for the next flush (flushed early at
``flush.FLUSH_BYTES`` or ``Intake.poll_bytes``, the less), the queue to the master
(``send_bytes`` in messages of at most ``SEND_MESSAGE_BYTES``), and its communicator tables,
which follow the edge's: a communicator no record named for ``C4D_AGENT_COMM_IDLE_S`` (its
ranks stopped using it), destroyed or evicted is forgotten by the summariser too.

One job, named (``--job``, else the job id in its environment as the shim reads it) or else the
first job ``agree`` ranks registered with (c4d.master.collector: messages are held until then), and never
one the master refuses: the agent asks the master's status endpoint (c4d/master/status.py) which job it
serves. With none named or agreed yet, the master's job is the agent's; a master that serves another
job than the agent's refuses every record of it, so the agent says so once and forwards nothing
(dropped, counted) until the master serves its job or none (a restarted master).

The master may be down, restarting or slow: sends never block (a full queue drops the
batch, counted), ZeroMQ reconnects by itself, and when the connection comes (back) up the
agent first repeats every rank's latest REGISTER and STAGE, so a restarted master knows the
job at once instead of at the ranks' next REGISTER repeat. The agent's death shows at the
master as its ranks' silence: one RankLost for the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import zmq
import zmq.utils.monitor

from c4d.agent.flush import FLUSH_BYTES, FLUSH_MIN_S, flush_period_s
from c4d.agent.summary import Summariser
from c4d.engine.config import EngineConfig
from c4d.intake.validate import Edge, Limits
from c4d.master.collector import MAX_MESSAGE_BYTES, Collector, job_key
from c4d.master.curve import server_key
from c4d.master.status import ServedJob, status_endpoint
from c4d.record import names, schema, wire
from c4d.record.trace import TraceWriter
from c4d.util.ratelog import RateLimitedLog

log = logging.getLogger("c4d.agent")

# a message to the master: at most what the master takes (c4d/master/collector.py), so that the queue's
# bound in messages is one in bytes
SEND_MESSAGE_BYTES = MAX_MESSAGE_BYTES
MAX_BATCH = (SEND_MESSAGE_BYTES - schema.BATCH_HEADER.itemsize) // schema.RECORD_SIZE
AGREE = 2  # ranks that must register with one job before an agent with no job named serves it
COMM_IDLE_S = 60.0  # an agent forgets a communicator no record named this long (C4D_AGENT_COMM_IDLE_S)


@dataclass
class AgentConfig:
    master: str
    """the master's endpoint (what C4D_MASTER_ADDR would say without an agent)"""
    bind: str = "tcp://127.0.0.1:*"
    """where this node's ranks send (their C4D_MASTER_ADDR)"""
    flush_s: float | None = None
    """forward this often (None: by the job's size, c4d/agent/flush.py)"""
    trace: str | None = None
    """a node-local trace of the full stream, every batch as it arrived"""
    send_bytes: int = 256 << 20
    """bytes queued for the master before batches are dropped (never blocks): that many
    SEND_MESSAGE_BYTES messages (C4D_AGENT_SEND_BYTES)"""
    job: str | None = None
    """the one job served, and sent to the master as the X-C4D-Job connection property as the
    shim does (None: C4D_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID from the environment; none
    there either: the first job ``agree`` ranks register with)"""
    agree: int = AGREE
    """with no job named: how many distinct ranks must register with a job before it is served
    (C4D_AGENT_AGREE)"""
    curve_server_key: str | None = None
    """the master's CURVE public key (a certificate file or its 40 Z85 characters), as the
    shim's C4D_CURVE_SERVER_KEY (None: that variable, if set)"""
    master_status: str | None = "auto"
    """the master's status endpoint, asked which job it serves (``auto``: next to ``master``, as
    ``c4d master --status-bind auto`` binds it; None: not asked)"""


_JOB_VARS = ("C4D_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")  # the shim's, in its order


def _env_number(var: str, default, kind=int):
    """A positive number from the environment; a malformed one is a line and the default."""
    v = os.environ.get(var)
    if v is None:
        return default
    try:
        x = kind(v)
        if x <= 0:
            raise ValueError
        return x
    except ValueError:
        log.warning("c4d agent: %s=%r is not a positive number; using %s", var, v, default)
        return default


def agent_limits(env: dict[str, str] | None = None) -> Limits:
    """The master's limits (C4D_* in the environment), with the agent's own idle time: a
    communicator's ranks stopped using it when no record (a heartbeat names every live one)
    named it for C4D_AGENT_COMM_IDLE_S."""
    lim = Limits.from_env(env)
    idle = _env_number("C4D_AGENT_COMM_IDLE_S", COMM_IDLE_S, float)
    return replace(
        lim, comm_idle_s=min(lim.comm_idle_s, idle), destroyed_grace_s=min(lim.destroyed_grace_s, idle)
    )


class Agent:
    def __init__(
        self, cfg: AgentConfig, ctx: zmq.Context | None = None, limits: Limits | None = None
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx or zmq.Context.instance()
        env = os.environ
        self.job = cfg.job or next((env[v] for v in _JOB_VARS if env.get(v)), None)
        agree = cfg.agree if cfg.agree != AGREE else _env_number("C4D_AGENT_AGREE", AGREE)
        self.collector = Collector(cfg.bind, self.ctx, job=self.job, name="agent", agree=agree)
        self.endpoint = self.collector.endpoint
        self.send_bytes = _env_number("C4D_AGENT_SEND_BYTES", cfg.send_bytes)
        try:
            self.push = self._push(cfg.master)
        except zmq.ZMQError as e:
            self.collector.close()
            raise OSError(f"cannot connect to the master at {cfg.master}: {e}") from None
        self.edge = Edge(limits or agent_limits(), who="c4d agent")
        self.summary = Summariser(
            max_comm_bytes=_env_number("C4D_AGENT_COMM_BYTES", 128 << 20),
            window_ops=EngineConfig.from_env().slow_window_ops,  # the master's sample, taken here
        )
        self.trace = (
            TraceWriter(cfg.trace, {"command": "agent", "endpoint": self.endpoint}) if cfg.trace else None
        )
        self.stats: Counter[str] = Counter()
        self.ratelog = RateLimitedLog(log)
        self._buf: list[np.ndarray] = []
        self._buf_bytes = 0
        self.flush_s = cfg.flush_s or FLUSH_MIN_S  # (by the job's size once its ranks register)
        self._next_flush = time.monotonic() + self.flush_s
        self._flush_bytes = min(FLUSH_BYTES, self.collector.intake.poll_bytes)
        # the latest REGISTER and STAGE per rank: repeated to a master that (re)connects
        self._hello: dict[tuple[int, int], bytes] = {}
        self.upstream = self._served_job()
        self.refused_by: str | None = None  # the job the master serves when it refuses this one

    def _push(self, endpoint: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, max(1, self.send_bytes // SEND_MESSAGE_BYTES))
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if (
            self.job
        ):  # the master serves one job (c4d/master/collector.py); an old libzmq: it goes by REGISTER
            with contextlib.suppress(AttributeError, zmq.ZMQError):
                s.setsockopt(zmq.METADATA, f"X-C4D-Job:{self.job}".encode())
        key = self.cfg.curve_server_key or os.environ.get("C4D_CURVE_SERVER_KEY")
        if key:
            try:
                s.curve_serverkey = server_key(key)
                s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
            except (OSError, ValueError, zmq.ZMQError) as e:
                s.close(linger=0)
                raise OSError(f"C4D_CURVE_SERVER_KEY: {e}") from None
        self.monitor = s.get_monitor_socket(zmq.EVENT_CONNECTED)
        s.connect(endpoint)
        return s

    # -- the loop -----------------------------------------------------------------------
    def step(self, timeout_s: float | None = None) -> int:
        """Receive for at most ``timeout_s`` (default: until the next flush), then forward what
        is due; returns the records forwarded."""
        wait = self._next_flush - time.monotonic() if timeout_s is None else timeout_s
        raws = self.collector.poll(max(0.0, wait))
        for raw in raws:
            if self.trace:
                try:
                    self.trace.write(raw)
                except Exception as e:
                    self._failed("trace write", e, 0)
        self._upstream()
        if self.job is None and self.collector.job is not None:
            self._name_job(self.collector.job)
        self._buf.extend(raws)
        self._buf_bytes += sum(r.nbytes for r in raws)
        self._reconnected()
        # what waits for the flush is bounded (c4d/agent/flush.py): a flood is summarised sooner, not held
        if time.monotonic() < self._next_flush and self._buf_bytes < self._flush_bytes:
            return 0
        self._next_flush = time.monotonic() + self.flush_s
        return self.flush()

    def flush(self) -> int:
        """Summarise and forward everything received so far."""
        if self.trace:
            try:
                self.trace.tick(time.time_ns())
                self.trace.flush()
            except Exception as e:
                self._failed("trace write", e, 0)
        now = time.time_ns()
        try:
            freed = self.edge.expire(now)
            if freed:
                self.summary.forget(freed)
        except Exception as e:
            self._failed("expire", e, 0)
        if not self._buf:
            return 0
        raws, self._buf, self._buf_bytes = self._buf, [], 0
        raw = schema.join_records(raws, schema.HEADER)
        try:
            ok = self.edge.admit(raw, now)
        except Exception as e:  # one poll's records must never stop the agent: the master re-validates
            self._failed("validate", e, 0)
            ok = raw
        try:
            out = self.summary.feed(ok) if len(ok) else ok
        except Exception as e:  # forwarded as they came: the master diagnoses from raw records too
            self._failed("summarise", e, 0)
            out = ok
        self._remember_hello(out)
        return self._send(out)

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        while not should_stop():
            self.step()

    # -- pieces -------------------------------------------------------------------------
    def _served_job(self):
        """Who tells the agent which job the master serves (None: nobody can)."""

        where = self.cfg.master_status
        if where == "auto":
            where = status_endpoint(self.cfg.master)
        if not where:
            return None
        try:
            return ServedJob(where, self.cfg.curve_server_key)
        except OSError as e:
            log.warning("c4d agent: cannot ask the master which job it serves (%s): records of a job "
                        "it refuses would be forwarded all the same", e)  # fmt: skip
            return None

    def _upstream(self) -> None:
        """What the master's status endpoint says of the job it serves (module doc)."""
        if self.upstream is None:
            return
        theirs = self.upstream.poll()
        if theirs is None:
            return
        mine = job_key(self.job) if self.job else self.collector.job
        if theirs and mine is None:  # none named or agreed yet: the master's is the one
            log.info("c4d agent: the master at %s serves job %s", self.upstream.endpoint, names.clean(theirs))
            self._buf.extend(self.collector.adopt(theirs))
            return
        if theirs and mine is not None and theirs != mine:
            if self.refused_by != theirs:
                self.refused_by = theirs
                log.warning(
                    "c4d agent: the master at %s serves job %s and refuses job %s: this agent forwards "
                    "nothing until it serves %s (records dropped and counted)",
                    self.upstream.endpoint, names.clean(theirs), names.clean(mine), names.clean(mine),
                )  # fmt: skip
            return
        if self.refused_by is not None:
            log.warning("c4d agent: the master at %s now serves job %s; forwarding again",
                        self.upstream.endpoint, names.clean(theirs) if theirs else "(none yet)")  # fmt: skip
            self.refused_by = None
            if self._hello:  # what a master needs first (module doc)
                self._send(np.frombuffer(b"".join(self._hello.values()), schema.HEADER))

    def _send(self, out: np.ndarray) -> int:
        if self.refused_by is not None:  # the master refuses every record of this job
            self.stats["refused by the master"] += len(out)
            self.stats["dropped"] += len(out)
            return 0
        sent = 0
        for i in range(0, len(out), MAX_BATCH):
            part = out[i : i + MAX_BATCH]
            try:
                self.push.send(wire.encode(part), zmq.NOBLOCK, copy=False)
                sent += len(part)
                self.stats["messages"] += 1
            except zmq.Again:  # the master is gone or slow: drop and count, never block
                self.stats["dropped"] += len(part)
                self.ratelog("master queue full", "c4d agent: the master does not keep up or is gone; "
                             "dropped %d record(s)", len(part), n=len(part))  # fmt: skip
        self.stats["forwarded"] += sent
        return sent

    def _name_job(self, job: str) -> None:
        """The ranks agreed on ``job``: name it to the master from now on (a master told its job
        refuses messages that name none), on a new connection that repeats the registrations."""
        self.job = job
        old, mon = self.push, self.monitor
        try:
            self.push = self._push(self.cfg.master)
        except (OSError, zmq.ZMQError) as e:
            self.push, self.monitor = old, mon
            self._failed("naming the job", e, 0)
            return
        with contextlib.suppress(zmq.ZMQError):
            old.disable_monitor()
        mon.close(linger=0)
        old.close(linger=0)

    def _remember_hello(self, out: np.ndarray) -> None:
        for k in (schema.Kind.REGISTER, schema.Kind.STAGE):
            rows = out[out["kind"] == k]
            for r in rows:
                self._hello[(int(k), int(r["rank"]))] = r.tobytes()
            if k == schema.Kind.REGISTER and len(rows) and self.cfg.flush_s is None:
                self._sized()

    def _sized(self) -> None:
        """The flush period for the job its ranks registered (their latest REGISTER, kept for a
        reconnecting master; the node's ranks: those registered here, or more where a local rank
        says so)."""
        reg = np.frombuffer(
            b"".join(v for (k, _), v in self._hello.items() if k == schema.Kind.REGISTER), schema.REGISTER
        )
        world = int(reg["world_size"].max())
        local = max(len(reg), int(reg["local_rank"].max()) + 1)
        hbs = reg["heartbeat_ms"][reg["heartbeat_ms"] > 0]
        p = flush_period_s(world, local, int(hbs.min()) if len(hbs) else 0)
        if p != self.flush_s:
            log.info("c4d agent: forwarding every %d ms (a job of %d ranks, %d on this node)",
                     round(p * 1e3), world, local)  # fmt: skip
            self._next_flush += p - self.flush_s
            self.flush_s = p

    def _reconnected(self) -> None:
        """A (re)connection to the master: repeat what a master needs first (module doc)."""
        got = False
        while self.monitor.poll(0):
            ev = zmq.utils.monitor.recv_monitor_message(self.monitor)
            got |= ev["event"] == zmq.EVENT_CONNECTED
        if got and self._hello:
            self.stats["reconnects"] += 1
            self._send(np.frombuffer(b"".join(self._hello.values()), schema.HEADER))

    def _failed(self, where: str, e: BaseException, n: int) -> None:
        cls = f"{where}: {type(e).__name__}"
        self.stats[cls] += 1
        self.ratelog(
            cls, "c4d agent: %s failed, %d record(s) dropped: %s: %s", where, n, type(e).__name__, e, n=n
        )

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        self.collector.close()
        self.push.disable_monitor()
        self.monitor.close(linger=0)
        self.push.close(linger=0)
        if self.trace:
            self.trace.close()
