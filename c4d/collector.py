"""The collector: a ZeroMQ PULL socket that turns rank batches into record arrays.

Owned by the master thread (ZeroMQ sockets are not thread-safe). A message that does
not decode is counted and reported once per reason, never allowed to stop ingestion.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zmq

from c4d import wire

log = logging.getLogger("c4d.collector")

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"


class Collector:
    def __init__(self, bind: str = DEFAULT_ENDPOINT, ctx: zmq.Context | None = None, rcvhwm: int = 10000):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError as e:
            self.sock.close()
            raise OSError(f"cannot bind the master to {bind}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.messages = 0
        self.records = 0
        self.bad_messages = 0
        self._bad_reasons: set[str] = set()

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
                reason = str(e).split(" (")[0]
                if reason not in self._bad_reasons:
                    self._bad_reasons.add(reason)
                    log.warning("dropped a malformed message: %s", e)
                continue
            self.records += len(raw)
            out.append(raw)
        return out

    def close(self) -> None:
        self.sock.close(linger=0)
