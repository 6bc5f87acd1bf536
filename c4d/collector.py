"""The collector: a ZeroMQ PULL socket that turns rank batches into record arrays.

Owned by the master thread (ZeroMQ sockets are not thread-safe). A message that does
not decode is counted by reason class and logged at most once per class per minute
(c4d.ratelog), never allowed to stop ingestion.

Who may send (docs/reliability.md):

* CURVE (``curve=``, ``c4d master --curve KEYDIR``): only a sender holding the master's public
  key completes the handshake; every other connection is refused by libzmq before any byte
  of it is read, and counted here from the socket's monitor (``handshake: ...`` reasons).
  Bound beyond loopback without CURVE, the collector warns once.
* One job: the shim sends its job id as the connection property ``X-C4D-Job`` (and in its
  REGISTER records). The collector serves one job, the one given (``--job``) or else the first
  it hears; messages of another job are refused whole and counted (``other job``), so two
  jobs pointed at one master by mistake never mix. A message that names no job (an old
  libzmq without ZMQ_METADATA, no REGISTER in it) can't be told apart and is taken.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from c4d import names, schema, wire
from c4d.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from c4d.curve import Keys

log = logging.getLogger("c4d.collector")

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
# A shim batch is at most 512 records (64 KiB); an aggregator's may be larger. libzmq closes the
# connection of a peer that sends a bigger message before allocating it.
MAX_MESSAGE_BYTES = 4 << 20
JOB_PROPERTY = "X-C4D-Job"  # ZMTP connection property the shim sets (ZMQ_METADATA)
JOB_BYTES = schema.REGISTER["job"].itemsize - 1  # a job id is compared on what REGISTER holds
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def job_key(job: str | bytes) -> str:
    """A job id as the master compares it: a C string cut to what a REGISTER record holds."""
    raw = job.encode() if isinstance(job, str) else job
    return raw.split(b"\0", 1)[0][:JOB_BYTES].decode("utf-8", errors="replace")


def exposed(endpoint: str) -> bool:
    """Whether a bound endpoint can be reached from other hosts (TCP or WebSocket beyond loopback)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme not in ("tcp", "ws", "wss"):
        return False  # ipc (file permissions), inproc
    host = rest.rsplit(":", 1)[0].split("/", 1)[0].strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name or an interface: assume reachable


class Collector:
    def __init__(
        self,
        bind: str = DEFAULT_ENDPOINT,
        ctx: zmq.Context | None = None,
        rcvhwm: int = 10000,
        curve: Keys | None = None,
        job: str | None = None,
    ):
        self.ctx = ctx or zmq.Context.instance()
        self.curve = curve
        self.sock = self._socket(rcvhwm)
        # handshakes libzmq refused (no CURVE, wrong key): seen only on the socket's monitor
        self._monitor: zmq.Socket | None = self.sock.get_monitor_socket(_HANDSHAKE_FAILED)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError as e:
            self._close_monitor()
            self.sock.close()
            raise OSError(f"cannot bind the master to {bind}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.messages = 0
        self.records = 0
        self.bad_messages = 0
        self.bad_reasons: Counter[str] = Counter()
        self.refused_handshakes = 0
        self.other_job_records = 0
        self.ratelog = RateLimitedLog(log)
        self.job: str | None = None
        self.serve(job)
        if curve is None and exposed(self.endpoint):
            log.warning(
                "the master listens on %s without CURVE: anyone who can reach it can send records and "
                "make it blacklist a node; use --curve KEYDIR (docs/reliability.md)",
                self.endpoint,
            )

    def _socket(self, rcvhwm: int) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if self.curve is not None:
            sock.curve_secretkey = self.curve.secret
            sock.curve_publickey = self.curve.public
            sock.curve_server = True
        return sock

    def serve(self, job: str | None) -> None:
        """Serve ``job`` from now on (None: the first job heard); ``c4d run`` calls it per attempt."""
        self.job = job_key(job) if job else None
        self._served_prop: object = None  # the connection property last found to name the job served

    def poll(self, timeout_s: float, max_messages: int = 1000) -> list[np.ndarray]:
        """Wait up to ``timeout_s`` for batches; return every batch ready (at most ``max_messages``)."""
        out: list[np.ndarray] = []
        ready = self.sock.poll(max(0, int(timeout_s * 1000)))
        self._handshakes()
        if not ready:
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
            if not self._same_job(msg, raw):
                continue
            self.records += len(raw)
            out.append(raw)
        return out

    def _same_job(self, msg: zmq.Frame, raw: np.ndarray) -> bool:
        """Whether the message belongs to the job served (pinning it at the first job heard)."""
        try:
            prop = msg.get(JOB_PROPERTY)
            if prop == self._served_prop:  # nearly every message: no key to derive again
                return True
            job = job_key(str(prop))
        except zmq.ZMQError:  # the connection named no job: look for one in REGISTER records
            prop = None
            job = ""
            reg = raw["kind"] == schema.Kind.REGISTER
            if reg.any():
                job = job_key(bytes(raw[reg].view(schema.REGISTER)["job"][0]))
        if not job:
            return True
        if self.job is None:
            self.job = job
            log.info("serving job %s (messages of other jobs are refused)", names.clean(job))
        if job == self.job:
            if prop is not None:
                self._served_prop = prop
            return True
        self.bad_messages += 1
        self.bad_reasons["other job"] += 1
        self.other_job_records += len(raw)
        self.ratelog(
            "other job",
            "refused records of job %s: this master serves job %s",
            names.clean(job),
            names.clean(self.job),
            n=len(raw),
        )
        return False

    def _handshakes(self) -> None:
        """Count the connections libzmq refused since the last call (never blocks)."""
        while self._monitor is not None and self._monitor.poll(0):
            try:
                ev = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            if not ev["event"] & _HANDSHAKE_FAILED:
                continue
            why = ev["value"]
            if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                reason = "handshake: broken off"  # the peer went away mid-handshake (value: errno)
            elif why == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
                reason = "handshake: wrong key"
            elif why == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                reason = "handshake: no CURVE" if self.curve is not None else "handshake: CURVE sender"
            else:
                reason = "handshake: refused"
            self.refused_handshakes += 1
            self.bad_reasons[reason] += 1
            self.ratelog(
                reason, "refused a connection (%s, ZeroMQ event 0x%x value 0x%x)", reason, ev["event"], why
            )

    def _close_monitor(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def close(self) -> None:
        self._close_monitor()
        self.sock.close(linger=0)
