"""The node agent: receive the node's ranks' batches, summarise, forward to the master.

    ranks (C4D_MASTER_ADDR = the agent) ──PUSH──► Collector (PULL, bind, node-local)
        └► node trace (optional: the full stream, as it arrived)
        └► Edge.admit ─► Summariser.feed ─► PUSH (connect) ─► c4d master

One thread owns everything (sockets, edge, summariser, trace), as in the master: ``step``
receives for at most ``flush_s`` and then forwards what it has, so records reach the master
at most one flush later than they would directly. ``c4d agent`` runs ``Agent.run``;
``c4d run`` steps an ``Agent`` from its supervisor loop (docs/run.md).

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
from dataclasses import dataclass

import numpy as np
import zmq
import zmq.utils.monitor

from c4d import schema, wire
from c4d.agent.summary import Summariser
from c4d.collector import MAX_MESSAGE_BYTES, Collector
from c4d.ratelog import RateLimitedLog
from c4d.trace import TraceWriter
from c4d.validate import Edge, Limits

log = logging.getLogger("c4d.agent")

# records per message to the master: below the collector's MAX_MESSAGE_BYTES
MAX_BATCH = (MAX_MESSAGE_BYTES - schema.BATCH_HEADER.itemsize) // schema.RECORD_SIZE - 1


@dataclass
class AgentConfig:
    master: str
    """the master's endpoint (what C4D_MASTER_ADDR would say without an agent)"""
    bind: str = "tcp://127.0.0.1:*"
    """where this node's ranks send (their C4D_MASTER_ADDR)"""
    flush_s: float = 0.1
    trace: str | None = None
    """a node-local trace of the full stream, every batch as it arrived"""
    sndhwm: int = 1000
    """messages queued for the master before batches are dropped (never blocks)"""
    job: str | None = None
    """the job id sent to the master as the X-C4D-Job connection property, as the shim does
    (None: C4D_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID from the environment, if any)"""
    curve_server_key: str | None = None
    """the master's CURVE public key (a certificate file or its 40 Z85 characters), as the
    shim's C4D_CURVE_SERVER_KEY (None: that variable, if set)"""


_JOB_VARS = ("C4D_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")  # the shim's, in its order


def _server_key(value: str) -> bytes:
    """The master's public key: 40 Z85 characters, or a certificate file (``c4d keygen``)."""
    if len(value) == 40 and not os.path.exists(value):
        return value.encode()
    import zmq.auth

    public, _ = zmq.auth.load_certificate(value)
    if not public or len(public) != 40:
        raise ValueError(f"{value}: no public key in it")
    return public


class Agent:
    def __init__(
        self, cfg: AgentConfig, ctx: zmq.Context | None = None, limits: Limits | None = None
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx or zmq.Context.instance()
        self.collector = Collector(cfg.bind, self.ctx)
        self.endpoint = self.collector.endpoint
        try:
            self.push = self._push(cfg.master)
        except zmq.ZMQError as e:
            self.collector.close()
            raise OSError(f"cannot connect to the master at {cfg.master}: {e}") from None
        self.edge = Edge(limits or Limits.from_env())
        self.summary = Summariser()
        self.trace = (
            TraceWriter(cfg.trace, {"command": "agent", "endpoint": self.endpoint}) if cfg.trace else None
        )
        self.stats: Counter[str] = Counter()
        self.ratelog = RateLimitedLog(log)
        self._buf: list[np.ndarray] = []
        self._next_flush = time.monotonic() + cfg.flush_s
        # the latest REGISTER and STAGE per rank: repeated to a master that (re)connects
        self._hello: dict[tuple[int, int], bytes] = {}

    def _push(self, endpoint: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, self.cfg.sndhwm)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        env = os.environ
        job = self.cfg.job or next((env[v] for v in _JOB_VARS if env.get(v)), None)
        if job:  # the master serves one job (c4d/collector.py); an old libzmq: it goes by REGISTER
            with contextlib.suppress(AttributeError, zmq.ZMQError):
                s.setsockopt(zmq.METADATA, f"X-C4D-Job:{job}".encode())
        key = self.cfg.curve_server_key or env.get("C4D_CURVE_SERVER_KEY")
        if key:
            try:
                s.curve_serverkey = _server_key(key)
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
        self._buf.extend(raws)
        self._reconnected()
        if time.monotonic() < self._next_flush:
            return 0
        self._next_flush = time.monotonic() + self.cfg.flush_s
        return self.flush()

    def flush(self) -> int:
        """Summarise and forward everything received so far."""
        if self.trace:
            try:
                self.trace.tick(time.time_ns())
                self.trace.flush()
            except Exception as e:
                self._failed("trace write", e, 0)
        if not self._buf:
            return 0
        raws, self._buf = self._buf, []
        raw = schema.join_records(raws, schema.HEADER)
        try:
            ok = self.edge.admit(raw, time.time_ns())
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
    def _send(self, out: np.ndarray) -> int:
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

    def _remember_hello(self, out: np.ndarray) -> None:
        for k in (schema.Kind.REGISTER, schema.Kind.STAGE):
            rows = out[out["kind"] == k]
            for r in rows:
                self._hello[(int(k), int(r["rank"]))] = r.tobytes()

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
        self.collector.close()
        self.push.disable_monitor()
        self.monitor.close(linger=0)
        self.push.close(linger=0)
        if self.trace:
            self.trace.close()
