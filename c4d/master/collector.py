"""The collector: a ZeroMQ PULL socket that turns rank batches into record arrays.

Owned by the master thread (ZeroMQ sockets are not thread-safe). A message that does
not decode is counted by reason class and logged at most once per class per minute
(c4d.util.ratelog), never allowed to stop ingestion.

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

What it may hold, in bytes (``Intake``, docs/untrusted-input.md): libzmq holds, per connection,
its queue (a high-water mark counted in messages) and the message it is reading, each at most
``MAX_MESSAGE_BYTES``. So the mark is the per-sender budget over that (``sender_bytes``), and the
collector bounds the connections at once (``queued_bytes`` over what one may hold): one over it is
shut as the socket's monitor reports it accepted, and its sender reconnects later, as ZeroMQ
does. (The mark is set once: libzmq applies a new one to the connections it has, but doing so
while one of them ends crashed libzmq 4.3.5.) One poll takes at most ``poll_bytes`` from the
socket and leaves the rest queued, where the senders' own queues take the back-pressure. A flood
of large batches, over as many connections as it can open, costs the master its time, never its
memory.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from c4d.record import names, schema, wire
from c4d.util.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from c4d.master.curve import Keys

log = logging.getLogger("c4d.master.collector")

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
# A shim batch is at most 255 records (32,656 bytes); a node agent's messages are at most this too
# (c4d/agent/agent.py). libzmq closes the connection of a peer that sends a bigger message before
# allocating it. A connection's queue is counted in messages (Intake.hwm), and its reader tells
# libzmq's I/O thread "read on" every (mark + 1) / 2 messages read: at 128 KiB the budget held
# two, a wake-up of that thread for every message (15% of a 16,384-rank master's capacity,
# docs/performance.md); at 32 KiB it holds eight, in less memory.
MAX_MESSAGE_BYTES = 32 << 10
JOB_PROPERTY = "X-C4D-Job"  # ZMTP connection property the shim sets (ZMQ_METADATA)
JOB_BYTES = schema.REGISTER["job"].itemsize - 1  # a job id is compared on what REGISTER holds
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_MONITORED = _HANDSHAKE_FAILED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


@dataclass(frozen=True)
class Intake:
    """What the socket may hold, in bytes (``C4D_RECV_SENDER_BYTES``, ``C4D_RECV_QUEUED_BYTES``,
    ``C4D_RECV_BYTES``)."""

    sender_bytes: int = 256 << 10
    """C4D_RECV_SENDER_BYTES: what libzmq may queue for one connection (its high-water mark is this
    over MAX_MESSAGE_BYTES messages, at least 1; plus the message being read)."""
    queued_bytes: int = 768 << 20
    """C4D_RECV_QUEUED_BYTES: what libzmq may hold for every connection together; connections
    beyond this over ``held_per_sender`` are shut as they come (the default: 2,730 at once)."""
    poll_bytes: int = 64 << 20
    """C4D_RECV_BYTES: what one poll takes from the socket; the rest stays queued per connection."""

    @property
    def hwm(self) -> int:
        return max(1, self.sender_bytes // MAX_MESSAGE_BYTES)

    def held_per_sender(self) -> int:
        """The most one connection can make libzmq hold: its queue and the message being read."""
        return (self.hwm + 1) * MAX_MESSAGE_BYTES

    @property
    def connections(self) -> int:
        """The most connections at once."""
        return max(1, self.queued_bytes // self.held_per_sender())

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Intake:
        """A malformed value logs a line and keeps the default."""
        env = dict(os.environ if env is None else env)
        out = cls()
        for var, name in (
            ("C4D_RECV_SENDER_BYTES", "sender_bytes"),
            ("C4D_RECV_QUEUED_BYTES", "queued_bytes"),
            ("C4D_RECV_BYTES", "poll_bytes"),
        ):
            if var not in env:
                continue
            try:
                v = int(env[var])
                if v <= 0:
                    raise ValueError
            except ValueError:
                log.warning(
                    "c4d: %s=%r is not a positive number of bytes; using %d",
                    var,
                    env[var],
                    getattr(out, name),
                )
                continue
            out = cls(**{**out.__dict__, name: v})
        return out


def job_key(job: str | bytes) -> str:
    """A job id as the master compares it: a C string cut to what a REGISTER record holds."""
    raw = job.encode() if isinstance(job, str) else job
    return raw.split(b"\0", 1)[0][:JOB_BYTES].decode("utf-8", errors="replace")


def _shut(fd: int, endpoint: str, shut: bool = True) -> bool:
    """End the connection on descriptor ``fd`` (libzmq's: it sees the end and closes it itself) if
    it is one of ``endpoint``'s: a socket whose local end is that address. ``shut=False``: only
    say whether it is."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:  # a duplicate: closing it leaves libzmq's open
            local = s.getsockname()
            scheme, _, rest = endpoint.partition("://")
            if s.family == socket.AF_UNIX:
                mine = scheme == "ipc" and local in (rest, rest.encode())
            else:
                mine = scheme in ("tcp", "ws", "wss") and rest.rsplit(":", 1)[-1] == str(local[1])
            if mine and shut:
                s.shutdown(socket.SHUT_RDWR)
            return mine
    except OSError:  # gone meanwhile: nothing to end
        return False


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
        curve: Keys | None = None,
        job: str | None = None,
        intake: Intake | None = None,
        name: str = "master",
        agree: int = 1,
    ):
        self.ctx = ctx or zmq.Context.instance()
        self.curve = curve
        self.intake = intake or Intake.from_env()
        self.name = name  # who serves: "master" or "agent" (its log lines say so)
        self._live: dict[int, None] = {}  # connections accepted and not yet gone (fds, oldest first)
        self._shut_now = 0  # connections shut whose handshake may still report itself broken off
        self.sock = self._socket(self.intake.hwm)
        # connections accepted and gone, handshakes libzmq refused (no CURVE, wrong key): seen only
        # on the socket's monitor
        self._monitor: zmq.Socket | None = self.sock.get_monitor_socket(_MONITORED)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError as e:
            self._close_monitor()
            self.sock.close()
            raise OSError(f"cannot bind the master to {bind}: {e}") from None
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.messages = 0
        self.records = 0
        self.bad_messages = 0
        self.bad_reasons: Counter[str] = Counter()
        self.refused_handshakes = 0
        self.refused_connections = 0  # over Intake.connections at once (shut as they came)
        self.other_job_records = 0
        self.held_polls = 0  # polls that stopped at Intake.poll_bytes (the rest waited queued)
        self.ratelog = RateLimitedLog(log)
        self.job: str | None = None
        # with no job named, the job served is the first one ``agree`` ranks registered with
        # (1: the first heard); the messages heard before, held meanwhile
        self.agree = max(1, agree)
        self._agreeing: dict[str, set[int]] = {}
        self._held: list[tuple[str, np.ndarray]] = []
        self._held_bytes = 0
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
        self.named = self.job is not None  # named by the operator, not the first heard
        self._served_prop: object = None  # the connection property last found to name the job served
        self._agreeing, self._held, self._held_bytes = {}, [], 0

    def poll(self, timeout_s: float, max_messages: int = 1000) -> list[np.ndarray]:
        """Wait up to ``timeout_s`` for batches; return every batch ready (at most ``max_messages``
        messages'), in order. Consecutive messages of the job served come joined into one batch:
        a message is ~25 records from a node agent at 16,384 ranks, and a view of each, then their
        join, cost the master's loop a tenth of its time."""
        out: list[np.ndarray] = []
        if not self._wait(timeout_s):
            return out
        deadline = time.monotonic() + 0.05  # never starve the caller's tick
        room = self.intake.poll_bytes
        run: list[memoryview] = []  # records of the job served, their headers checked, not yet viewed
        taken = 0
        while taken < max_messages and time.monotonic() < deadline:
            if room <= 0:  # the rest waits in the senders' queues (bounded per connection)
                self.held_polls += 1
                self.ratelog(
                    "receive budget",
                    "c4d %s: more than %d MiB arrived within one poll; the rest waits queued "
                    "(C4D_RECV_BYTES; a flood costs time, not memory)",
                    self.name,
                    self.intake.poll_bytes >> 20,
                )
                break
            try:
                msg = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.messages += 1
            taken += 1
            buf = msg.buffer
            room -= len(buf)
            try:
                _, version = wire.check(buf)
            except wire.BadBatch as e:
                self.bad_messages += 1
                self.bad_reasons[e.reason] += 1
                self.ratelog(e.reason, "dropped a malformed message: %s", e)
                continue
            if version == schema.SCHEMA_VERSION and self._served_by(msg):
                run.append(buf[wire.HEADER_BYTES :])  # nearly every message
                continue
            self._join_run(run, out)
            self._one(msg, wire.decode(buf), out)
        self._join_run(run, out)
        return out

    def _served_by(self, msg: zmq.Frame) -> bool:
        """Whether the message came on a connection found to name the job served (its property)."""
        if self._served_prop is None:
            return False
        try:
            return msg.get(JOB_PROPERTY) == self._served_prop
        except zmq.ZMQError:
            return False

    def _one(self, msg: zmq.Frame, raw: np.ndarray, out: list[np.ndarray]) -> None:
        """A message judged alone: its job, the job's agreement, the REGISTERs of a job named."""
        job = self._job_of(msg, raw)
        if self.job is None and job and self.agree > 1:
            self._candidate(job, raw, out)
            return
        if not self._same_job(job, raw) or not self._registers_named(raw):
            return
        self.records += len(raw)
        out.append(raw)

    def _join_run(self, run: list[memoryview], out: list[np.ndarray]) -> None:
        """Messages of the job served, their records joined; under a job named, judged alone
        after all when a REGISTER among them names another (``_registers_named``, as one by one)."""
        if not run:
            return
        raw = np.frombuffer(bytearray().join(run), schema.HEADER)
        if not self._registers_named(raw, refuse=False):
            for part in run:
                one = np.frombuffer(part, schema.HEADER)
                if self._registers_named(one):
                    self.records += len(one)
                    out.append(one)
        else:
            self.records += len(raw)
            out.append(raw)
        run.clear()

    def _registers_named(self, raw: np.ndarray, refuse: bool = True) -> bool:
        """Under a job named (--job J), a message naming no job is not J, and neither is one whose
        REGISTER records name another job or none (compared in the sanitized form the edge
        writes them in); ``refuse``: such a message refused (counted, logged)."""
        if not self.named:
            return True
        reg = raw["kind"] == schema.Kind.REGISTER
        jobs = {names.clean(job_key(bytes(j))) for j in np.unique(raw[reg].view(schema.REGISTER)["job"])}
        if jobs <= {names.clean(self.job or "")}:
            return True
        if refuse:
            self._refuse(next(iter(jobs - {names.clean(self.job or "")})), raw)
        return False

    def _job_of(self, msg: zmq.Frame, raw: np.ndarray) -> str:
        """The job a message names: its connection's property, else its first REGISTER's ("" none)."""
        try:
            prop = msg.get(JOB_PROPERTY)
            if prop == self._served_prop:  # nearly every message: no key to derive again
                return self.job or ""
            job = job_key(str(prop))
            if job and job == self.job:
                self._served_prop = prop
            return job
        except zmq.ZMQError:  # the connection named no job: look for one in REGISTER records
            reg = raw["kind"] == schema.Kind.REGISTER
            if reg.any():
                return job_key(bytes(raw[reg].view(schema.REGISTER)["job"][0]))
            return ""

    def _same_job(self, job: str, raw: np.ndarray) -> bool:
        """Whether a message of ``job`` belongs to the job served (pinning the first job heard).
        One that names none is taken, unless the job was named (``--job``): it is not that job."""
        if not job and not self.named:
            return True
        if self.job is None:
            self._pin(job)
        if job == self.job:
            return True
        self._refuse(job, raw)
        return False

    def _refuse(self, job: str, raw: np.ndarray) -> None:
        self.bad_messages += 1
        self.bad_reasons["other job"] += 1
        self.other_job_records += len(raw)
        self.ratelog(
            "other job",
            "refused records of job %s: this %s serves job %s",
            names.clean(job) if job else "(none named)",
            self.name,
            names.clean(self.job or ""),
            n=len(raw),
        )

    def _pin(self, job: str) -> None:
        self.job = job
        log.info("the %s is serving job %s (messages of other jobs are refused)", self.name, names.clean(job))

    def _candidate(self, job: str, raw: np.ndarray, out: list[np.ndarray]) -> None:
        """No job named yet and ``agree`` ranks needed: hold the message until ``agree`` distinct
        ranks registered with one job; then that job is served, the held messages of it go on
        (in order) and the others are refused. What is held is bounded by Intake.poll_bytes:
        beyond it the oldest held message is dropped (``job not agreed``)."""
        reg = raw["kind"] == schema.Kind.REGISTER
        if reg.any():
            self._agreeing.setdefault(job, set()).update(raw["rank"][reg].tolist())
        self._held.append((job, raw))
        self._held_bytes += raw.nbytes
        while self._held_bytes > self.intake.poll_bytes and len(self._held) > 1:
            _, old = self._held.pop(0)
            self._held_bytes -= old.nbytes
            self.bad_messages += 1
            self.bad_reasons["job not agreed"] += 1
            self.ratelog(
                "job not agreed",
                "c4d %s: no job named and none agreed by %d ranks yet (heard: %s); dropped the "
                "oldest records held (name the job: --job or C4D_JOB_ID)",
                self.name,
                self.agree,
                ", ".join(f"{names.clean(j)} from {len(r)} rank(s)" for j, r in self._agreeing.items()),
                n=len(old),
            )
        if len(self._agreeing.get(job, ())) < self.agree:
            return
        self._pin(job)
        held, self._held, self._held_bytes, self._agreeing = self._held, [], 0, {}
        for j, r in held:
            if self._same_job(j, r):
                self.records += len(r)
                out.append(r)

    synced = True  # (a receiver's process may hold messages: c4d.master.receiver; this one holds none)

    def sync(self) -> None:
        """Nothing to ask for: what arrived waits on the socket."""

    def adopt(self, job: str) -> list[np.ndarray]:
        """Serve ``job``, the one the master upstream serves, when none is named or agreed yet
        (a node agent: c4d/agent/agent.py); the messages held of it are returned, the others refused."""
        if self.job is not None:
            return []
        self._pin(job_key(job))
        held, self._held, self._held_bytes, self._agreeing = self._held, [], 0, {}
        out = []
        for j, r in held:
            if self._same_job(j, r):
                self.records += len(r)
                out.append(r)
        return out

    def _wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a message, following the connections meanwhile."""
        end = time.monotonic() + max(0.0, timeout_s)
        while True:
            ready = dict(self._poller.poll(max(0, int((end - time.monotonic()) * 1000))))
            self._handshakes()
            if self.sock in ready:
                return True
            if time.monotonic() >= end:
                return False

    @property
    def connections(self) -> int:
        """Connections accepted and not gone."""
        return len(self._live)

    def _handshakes(self) -> None:
        """Follow the connections on the socket's monitor (never blocks): at most
        ``Intake.connections`` at once."""
        while self._monitor is not None and self._monitor.poll(0):
            try:
                ev = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            what, why = ev["event"], int(ev["value"])
            if what == zmq.EVENT_ACCEPTED:
                self._live[why] = None
            elif what == zmq.EVENT_DISCONNECTED:
                self._live.pop(why, None)
            elif what & _HANDSHAKE_FAILED:
                self._refused(what, why)
        self._shut_now = 0  # (those shut before reported their handshakes broken off by now)
        # the newest over the budget are shut; their DISCONNECTED events are read at the next call
        # (libzmq reports a connection gone before it closes the descriptor, so one in _live is open)
        over = len(self._live) - self.intake.connections
        if over > 0:
            # a DISCONNECTED the monitor dropped (its queue is bounded; a busy master reads it
            # late) leaves a descriptor that is no longer one of ours: forget those first, or
            # the count only grows and every new connection is shut
            for fd in [fd for fd in self._live if not _shut(fd, self.endpoint, shut=False)]:
                del self._live[fd]
            over = len(self._live) - self.intake.connections
        for fd in list(self._live)[len(self._live) - max(0, over) :]:
            mine = _shut(fd, self.endpoint)
            del self._live[fd]  # shut, or gone meanwhile
            if mine:
                self._shut_now += 1
                self.refused_connections += 1
                self.bad_reasons["too many connections"] += 1
                self.ratelog(
                    "too many connections",
                    "c4d %s: shut a connection: %d are open, the most C4D_RECV_QUEUED_BYTES (%d MiB) "
                    "holds at %d KiB a message (its sender reconnects; send through node agents or "
                    "raise it)",
                    self.name,
                    len(self._live),
                    self.intake.queued_bytes >> 20,
                    MAX_MESSAGE_BYTES >> 10,
                )

    def _refused(self, what: int, why: int) -> None:
        """A handshake libzmq refused (no CURVE, wrong key): counted by reason."""
        if what == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self._shut_now:
            self._shut_now -= 1  # one the collector shut (counted as that)
            return
        if what == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            reason = "handshake: broken off"  # the peer went away mid-handshake (value: errno)
        elif why == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            reason = "handshake: wrong key"
        elif why == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            reason = "handshake: no CURVE" if self.curve is not None else "handshake: CURVE sender"
        else:
            reason = "handshake: refused"
        self.refused_handshakes += 1
        self.bad_reasons[reason] += 1
        self.ratelog(reason, "refused a connection (%s, ZeroMQ event 0x%x value 0x%x)", reason, what, why)

    def _close_monitor(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def close(self) -> None:
        self._close_monitor()
        self.sock.close(linger=0)
