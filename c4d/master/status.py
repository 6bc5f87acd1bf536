"""The master's status endpoint: its diagnoses, as the JSON objects ``--json`` prints, on request.

A process that starts a job on a running master (``c4d sim --master EP``) has to stop the job on
that master's ERROR, as it does with a master of its own; the record socket only flows towards the
master (ranks PUSH, the master PULLs), so ``c4d master`` also answers requests on a second
endpoint: by default the port below ``--bind``'s (``tcp://H:5555`` -> ``tcp://H:5554``; the port
above is the node agent's default), or ``ipc://PATH.status`` (``status_endpoint``). A request is
``{"since": N}``; the answer is ``{"job": ..., "count": ..., "since": N, "diagnoses": [...]}``,
the diagnoses from the N-th on (at most ``MAX_PER_REPLY``), each exactly the object ``--json``
writes (docs/cli.md's JSON form). ``StatusFollower`` polls it and hands those objects out as
``c4d run``'s ``JsonFollower`` hands out the lines of ``c4d master --json > FILE``
(c4d/run/diagnoses.py): one source interface, one form. With ``--curve`` the endpoint takes the
same CURVE keys as the record socket.

Requests are untrusted input: one that is not ``{"since": N}`` gets ``{"error": ...}`` and
nothing else happens; a message larger than ``MAX_REQUEST_BYTES`` closes its connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import zmq

from c4d.master.curve import server_key

MAX_PER_REPLY = 500
MAX_REQUEST_BYTES = 4096
RESEND_S = 2.0
"""A request unanswered this long is sent again (a master restarted, a dropped connection)."""
MAX_REPLY_BYTES = 64 << 20  # MAX_PER_REPLY diagnoses with their evidence; a larger message closes
_PAST_THE_END = 1 << 53  # a "since" no master reaches: its answer carries no diagnoses


def status_endpoint(endpoint: str) -> str | None:
    """Where a master bound at ``endpoint`` answers status requests (None: none can be derived)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return None
    if scheme == "ipc":
        return f"{endpoint}.status"
    if scheme != "tcp":
        return None
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or int(port) <= 1:
        return None
    return f"tcp://{host}:{int(port) - 1}"


class StatusServer:
    """The master's side: a ROUTER socket (never blocks on a peer that went away)."""

    def __init__(self, bind: str, keys: Any = None, ctx: zmq.Context | None = None):
        self.sock: zmq.Socket = (ctx or zmq.Context.instance()).socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self.sock.setsockopt(zmq.SNDHWM, 100)
        if keys is not None:
            self.sock.curve_secretkey = keys.secret
            self.sock.curve_publickey = keys.public
            self.sock.curve_server = True
        try:
            self.sock.bind(bind)
        except zmq.ZMQError as e:
            self.sock.close()
            raise OSError(f"cannot bind {bind}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.requests = 0

    def serve(self, diagnoses: list[Any], job: str | None) -> int:
        """Answer every request waiting (never waits); how many were answered."""
        n = 0
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return n
            if len(frames) != 3 or frames[1] != b"":
                continue  # not a REQ/DEALER request: nothing to answer to
            ident, payload = frames[0], frames[2]
            reply = self._answer(payload, diagnoses, job)
            with contextlib.suppress(zmq.ZMQError):  # the peer is gone or not reading: it asks again
                self.sock.send_multipart([ident, b"", json.dumps(reply).encode()], zmq.NOBLOCK)
            n += 1
            self.requests += 1

    @staticmethod
    def _answer(payload: bytes, diagnoses: list[Any], job: str | None) -> dict[str, Any]:
        try:
            req = json.loads(payload)
            since = req["since"] if isinstance(req, dict) else None
            if not isinstance(since, int) or isinstance(since, bool) or since < 0:
                raise ValueError
        except (ValueError, KeyError, UnicodeDecodeError):
            return {"error": 'a request is {"since": N}, N ≥ 0'}
        part = diagnoses[since : since + MAX_PER_REPLY]
        return {"job": job, "count": len(diagnoses), "since": since, "diagnoses": [d.to_json() for d in part]}

    def close(self) -> None:
        self.sock.close(linger=0)


def _dealer(endpoint: str, curve_server_key: str | None) -> zmq.Socket:
    """A DEALER connected to a status endpoint (CURVE with the master's key, when given or in
    C4D_CURVE_SERVER_KEY)."""
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
    key = curve_server_key or os.environ.get("C4D_CURVE_SERVER_KEY")
    if key:
        try:
            public, secret = zmq.curve_keypair()
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_key(key))
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        except (OSError, ValueError, zmq.ZMQError) as e:
            sock.close(linger=0)
            raise OSError(f"C4D_CURVE_SERVER_KEY: {e}") from None
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close(linger=0)
        raise OSError(f"cannot connect to {endpoint}: {e}") from None
    return sock


class ServedJob:
    """Which job a master serves, asked of its status endpoint every ``every_s`` (a node agent
    forwards nothing the master refuses: c4d/agent/agent.py). ``poll`` never waits."""

    NONE_YET = ""  # the master answered and serves no job yet

    def __init__(self, endpoint: str, curve_server_key: str | None = None, every_s: float = RESEND_S):
        self.endpoint, self.every_s = endpoint, every_s
        self.sock = _dealer(endpoint, curve_server_key)
        self._asked_at: float | None = None
        self.job: str | None = None
        """the job the master said it serves (NONE_YET: none yet); None: no answer yet"""

    def poll(self) -> str | None:
        """Ask if due, read the answers come; the latest job heard (module doc's ``job``)."""
        if self._asked_at is None or time.monotonic() - self._asked_at > self.every_s:
            with contextlib.suppress(zmq.ZMQError):  # not connected yet: ask at the next poll
                # asking from past the end: an answer with no diagnoses in it
                self.sock.send_multipart([b"", json.dumps({"since": _PAST_THE_END}).encode()], zmq.NOBLOCK)
                self._asked_at = time.monotonic()
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return self.job
            try:
                reply = json.loads(frames[-1])
            except ValueError:
                continue
            if isinstance(reply, dict) and "job" in reply and "count" in reply:
                job = reply["job"]
                self.job = job if isinstance(job, str) and job else self.NONE_YET

    def close(self) -> None:
        self.sock.close(linger=0)


class StatusFollower:
    """Follows a master's diagnoses through its status endpoint, those of ``job`` only.

    ``poll`` has ``JsonFollower``'s contract (c4d/run/diagnoses.py): wait up to ``timeout_s``, return
    the diagnoses (JSON objects) not returned before. ``answered`` says whether the master ever
    replied; ``other_job`` the job it serves when that is not ``job``.
    """

    def __init__(self, endpoint: str, job: str | None = None, curve_server_key: str | None = None):
        self.endpoint, self.job = endpoint, job
        self.sock = _dealer(endpoint, curve_server_key)
        self._next = 0
        self._asked_at: float | None = None
        self.answered = False
        self.other_job: str | None = None

    def _ask(self) -> None:
        try:
            self.sock.send_multipart([b"", json.dumps({"since": self._next}).encode()], zmq.NOBLOCK)
            self._asked_at = time.monotonic()
        except zmq.Again:
            self._asked_at = None  # not connected yet: ask at the next poll

    def poll(self, timeout_s: float) -> list[dict[str, Any]]:
        if self._asked_at is None or time.monotonic() - self._asked_at > RESEND_S:
            self._ask()
        out: list[dict[str, Any]] = []
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return out
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.extend(self._take(frames))

    def _take(self, frames: list[bytes]) -> list[dict[str, Any]]:
        try:
            reply = json.loads(frames[-1])
        except ValueError:
            return []
        if not isinstance(reply, dict) or reply.get("since") != self._next:
            return []  # an answer to an older request, already read
        self.answered = True
        self._asked_at = None  # ask again at the next poll
        job, diags = reply.get("job"), reply.get("diagnoses")
        if self.job is not None and job != self.job:
            self.other_job = job  # the master serves another job (or none yet): not our verdicts
            return []
        if not isinstance(diags, list):
            return []
        self._next += len(diags)
        return [d for d in diags if isinstance(d, dict) and "level" in d]

    def pids(self) -> dict[int, int]:
        return {}

    def final_ranks(self) -> tuple[set[int], set[int]]:
        return set(), set()

    def close(self) -> None:
        self.sock.close(linger=0)
