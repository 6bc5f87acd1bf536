"""The collector: a ZeroMQ PULL socket that turns rank batches into record arrays.

Owned by the master thread (ZeroMQ sockets are not thread-safe). A message that does
not decode is counted by reason class and logged at most once per class per minute
(c4d.ratelog), never allowed to stop ingestion. Authentication (ZeroMQ CURVE) belongs on
this socket: ``_socket`` is the one place that creates it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np
import zmq

from c4d import wire
from c4d.ratelog import RateLimitedLog

log = logging.getLogger("c4d.collector")

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
# A shim batch is at most 512 records (64 KiB); an aggregator's may be larger. libzmq closes the
# connection of a peer that sends a bigger message before allocating it.
MAX_MESSAGE_BYTES = 4 << 20


class Collector:
    def __init__(self, bind: str = DEFAULT_ENDPOINT, ctx: zmq.Context | None = None, rcvhwm: int = 10000):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self._socket(rcvhwm)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError as e:
            self.sock.close()
            raise OSError(f"cannot bind the master to {bind}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.messages = 0
        self.records = 0
        self.bad_messages = 0
        self.bad_reasons: Counter[str] = Counter()
        self.ratelog = RateLimitedLog(log)

    def _socket(self, rcvhwm: int) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        return sock

    def poll(self, timeout_s: float, max_messages: int = 1000) -> list[np.ndarray]:
        """Wait up to ``timeout_s`` for batches; return every batch ready (at most ``max_messages``)."""
        out: list[np.ndarray] = []
        if not self.sock.poll(max(0, int(timeout_s * 1000))):
            return out
        deadline = time.monotonic() + 0.05  # never starve the caller's tick
        while len(out) < max_messages and time.monotonic() < deadline:
            try:
                msg = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.messages += 1
            try:
                raw = wire.decode(msg.buffer)
            except wire.BadBatch as e:
                self.bad_messages += 1
                self.bad_reasons[e.reason] += 1
                self.ratelog(e.reason, "dropped a malformed message: %s", e)
                continue
            self.records += len(raw)
            out.append(raw)
        return out

    def close(self) -> None:
        self.sock.close(linger=0)
