"""The master's receiving in a process of its own (``c4d master --receiver-process``).

At tens of thousands of ranks the master's loop is the bound (docs/performance.md, Scale): per
message it reads the socket (libzmq's I/O thread), decodes the batch and checks its job, tens
of thousands of messages a second of a few dozen records each. Here a process does that: it runs
the ``Collector`` (the bound endpoint, CURVE, the job served, the connections budget, every
count of what it refused) and hands the master each poll's batches joined into one, in the
order they came, over a socket pair. The master's loop then takes a few large messages a
second instead; what it does with them (the edge, the trace, the engine) is what it did with
the Collector's batches, so the diagnoses and a replay of the trace are the same.

The receiver sends its counts with every message (JSON: numbers and reason names); the master
reads them as the Collector's own. ``sync`` asks for everything received so far (the master's
drain before it stops). If the receiver's process dies, the master logs one ERROR and binds the
endpoint itself (a Collector of its own, serving the job that was served): what libzmq had
queued in the dead process is lost, the senders reconnect.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np
import zmq

from c4d.master.collector import Collector
from c4d.record import schema
from c4d.util.ratelog import RateLimitedLog

log = logging.getLogger("c4d.master.receiver")

DATA, COUNTS, READY, FAILED, SYNC, STOP = b"D", b"C", b"R", b"E", b"Y", b"Q"
START_S = 60.0  # the receiver's process imports numpy, pyzmq and c4d: seconds on a loaded host
QUEUE_MESSAGES = 8  # each a poll's batches (at most C4D_RECV_BYTES): the pair's memory is bounded by this
POLL_S = 0.05  # the receiver's wait for senders, so that it answers the master's requests this soon
COUNTS_S = 1.0  # with nothing received, the counts (refused connections, handshakes) go this often
SYNC_S = 1.0  # a sync takes what is queued for at most this long (a flood never ends it), as Master.drain
_COUNTS = ("messages", "records", "bad_messages", "refused_handshakes", "refused_connections",
           "other_job_records", "held_polls")  # fmt: skip


def _counts(col: Collector) -> bytes:
    c: dict[str, Any] = {k: getattr(col, k) for k in _COUNTS}
    c["bad_reasons"], c["job"], c["connections"] = dict(col.bad_reasons), col.job, col.connections
    return json.dumps(c).encode()


def _serve(endpoint: str, bind: str, curve: str | None, job: str | None, level: int) -> None:
    """The receiver's process: receive and hand over until STOP or until the master is gone."""
    logging.basicConfig(level=level, stream=sys.stderr, format="c4d %(levelname)s %(message)s")
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, QUEUE_MESSAGES)
    sock.connect(endpoint)
    parent = os.getppid()
    try:
        from c4d.master import curve as curves

        keys = curves.load(curve) if curve else None
        col = Collector(bind, curve=keys, job=job)
    except (OSError, ValueError) as e:  # the master says it and stops, as it would binding itself
        sock.send(FAILED + str(e).encode())
        sock.close(0)
        ctx.term()
        sys.exit(2)
    sock.send(READY + col.endpoint.encode())

    asked = {SYNC: False, STOP: False}

    def requests() -> None:
        while sock.poll(0):
            op = sock.recv()[:1]
            if op in asked:
                asked[op] = True

    def send(frames: list[Any]) -> bool:
        while not sock.poll(500, zmq.POLLOUT):  # the master is behind: the senders' queues wait
            requests()
            if os.getppid() != parent or asked[STOP]:
                return False
        sock.send_multipart(frames, copy=False)
        return True

    sent = b""
    last = time.monotonic()
    try:
        while os.getppid() == parent:
            raws = col.poll(POLL_S)
            requests()
            if asked[STOP]:
                return
            sync, asked[SYNC] = asked[SYNC], False
            until = time.monotonic() + SYNC_S
            while True:
                if raws:
                    joined = schema.join_records(raws, schema.HEADER)
                    if not send([DATA + _counts(col), joined]):
                        return
                    sent, last = b"", time.monotonic()
                if not sync or not raws or time.monotonic() > until:
                    break
                raws = col.poll(0)  # a sync: every message already queued, then the mark
            now = _counts(col)
            if sync or (now != sent and time.monotonic() - last >= COUNTS_S):
                if not send([(SYNC if sync else COUNTS) + now]):
                    return
                sent, last = now, time.monotonic()
            col.ratelog.flush()
    finally:
        col.close()
        sock.close(0)
        ctx.term()


class ReceiverProcess:
    """A ``Collector`` in a process of its own (see the module's docstring): the same calls and
    counts as one in the master's process."""

    def __init__(self, bind: str, curve: str | None = None, job: str | None = None) -> None:
        self._curve, self._asked_job = curve, job
        self.local: Collector | None = None  # the master's own, once the receiver's process died
        self.ratelog = RateLimitedLog(log)  # (the receiver's process writes its own lines)
        self._c: dict[str, Any] = {k: 0 for k in _COUNTS}
        self._c.update(bad_reasons={}, job=None, connections=0)
        self._synced = True
        self._dir = tempfile.mkdtemp(prefix="c4d-receiver-")
        endpoint = f"ipc://{os.path.join(self._dir, 'receiver')}"
        self._ctx = zmq.Context(1)
        self._sock = self._ctx.socket(zmq.PAIR)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, QUEUE_MESSAGES)
        self._sock.bind(endpoint)
        level = logging.getLogger("c4d").getEffectiveLevel()
        conf = json.dumps([bind, curve, job, level])
        # a new interpreter, not a fork: the master has threads (ZeroMQ's, the metrics server's)
        self._proc = subprocess.Popen([sys.executable, "-m", "c4d.master.receiver", endpoint, conf])
        self.endpoint = self._hello(bind)

    def _hello(self, bind: str) -> str:
        end = time.monotonic() + START_S
        while not self._sock.poll(200):
            if self._proc.poll() is not None or time.monotonic() > end:
                self._stop()
                raise OSError(f"cannot bind the master to {bind}: its receiving process did not start")
        msg = self._sock.recv()
        if msg[:1] != READY:
            self._stop()
            raise OSError(msg[1:].decode(errors="replace"))
        return msg[1:].decode()

    @property
    def pid(self) -> int | None:
        """The receiver's process; None once the master took its receiving back."""
        return self._proc.pid if self.local is None else None

    # -- the Collector's calls ------------------------------------------------------------
    def poll(self, timeout_s: float, max_messages: int = 1) -> list[np.ndarray]:
        """Wait up to ``timeout_s`` for the receiver's batches; the first ``max_messages`` ready
        (one: what one of the Collector's polls takes, so the master's batches and the memory
        they hold are what they are without a receiving process)."""
        if self.local is not None:
            return self.local.poll(timeout_s)
        out: list[np.ndarray] = []
        end = time.monotonic() + max(0.0, timeout_s)
        while not self._sock.poll(max(0, min(500, int((end - time.monotonic()) * 1000)))):
            if self._proc.poll() is not None:
                return self._take_over(f"exited with code {self._proc.returncode}").poll(0)
            if time.monotonic() >= end:
                return out
        for _ in range(max_messages):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            head = frames[0].bytes
            self._c = json.loads(head[1:])
            if head[:1] == DATA:
                out.append(np.frombuffer(frames[1].buffer, schema.HEADER))
            elif head[:1] == SYNC:
                self._synced = True
        return out

    def sync(self) -> None:
        """Ask for every message received so far; ``synced`` once they are here."""
        if self.local is None:
            self._synced = False
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(SYNC, zmq.NOBLOCK)

    @property
    def synced(self) -> bool:
        return self._synced or self.local is not None

    def serve(self, job: str | None) -> None:
        raise NotImplementedError("a receiver process serves the job it started with (c4d run keeps its own)")

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        self._stop()

    def _stop(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(STOP, zmq.NOBLOCK)
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._sock.close(0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _take_over(self, why: str) -> Collector:
        from c4d.master import curve as curves

        log.error(
            "the master's receiving process %s: receiving in the master's own process from now on "
            "(what it had queued is lost; the senders reconnect)",
            why,
        )
        keys = curves.load(self._curve) if self._curve else None
        self.local = Collector(self.endpoint, curve=keys, job=self._c["job"] or self._asked_job)
        return self.local

    # -- its counts, as the Collector's --------------------------------------------------
    def __getattr__(self, name: str) -> int:
        """``messages``, ``records``, ``bad_messages`` and the Collector's other counts: the
        receiver's, then its own Collector's after a take-over."""
        if name not in _COUNTS:
            raise AttributeError(name)
        return int(self._c[name]) + (getattr(self.local, name) if self.local is not None else 0)

    @property
    def bad_reasons(self) -> Counter[str]:
        out = Counter(self._c["bad_reasons"])
        if self.local is not None:
            out.update(self.local.bad_reasons)
        return out

    @property
    def job(self) -> str | None:
        return self.local.job if self.local is not None else self._c["job"]

    @property
    def connections(self) -> int:
        return self.local.connections if self.local is not None else int(self._c["connections"])


if __name__ == "__main__":
    _serve(sys.argv[1], *json.loads(sys.argv[2]))
