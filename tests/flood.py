"""Floods a hostile sender can make against loopback (issue 41), as a process of its own:
well-formed batches of OP records as large as the master takes (MAX_MESSAGE_BYTES) from a rank
that never registered, over as many connections as asked, and a REGISTER claiming the largest
world followed by a thousand new communicators per message. The tests run them against a real
``c4d master`` or ``c4d agent`` process and read its RSS from /proc.

    python -m tests.flood ops ENDPOINT SECONDS [CONNECTIONS]
    python -m tests.flood comms ENDPOINT SECONDS [PER_MESSAGE]
    python -m tests.flood rings ENDPOINT SECONDS [MEMBERS]
    python -m tests.flood kept ENDPOINT SECONDS [WINDOW_S]

Prints one line of JSON at the end: messages and bytes sent.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import zmq

from c4d.master.collector import MAX_MESSAGE_BYTES
from c4d.record import schema, wire

# records of the largest message the master takes, as a node agent may send
BIG = (MAX_MESSAGE_BYTES - schema.BATCH_HEADER.itemsize) // schema.RECORD_SIZE


def big_ops(rank: int, t: int, n: int = BIG, cid: int = 0xBAD) -> np.ndarray:
    """``n`` well-formed AllReduce records of ``rank`` at time ``t`` (a 2-member communicator)."""
    a = np.zeros(n, schema.OP)
    a["kind"], a["version"], a["rank"], a["time_ns"] = schema.Kind.OP, schema.SCHEMA_VERSION, rank, t
    a["comm_id"], a["comm_rank"], a["comm_nranks"], a["peer"] = cid, rank % 2, 2, -1
    a["seq"] = np.arange(n)
    a["issue_ns"], a["start_ns"], a["end_ns"], a["return_ns"] = t - 4000, t - 3000, t - 1000, t - 3500
    a["count"], a["bytes"], a["dtype"] = 1024, 4096, 7
    return a


def register(
    rank: int, world: int, t: int, node: bytes = b"node-0", job: bytes = b"", pid: int = 4242
) -> np.ndarray:
    r = np.zeros(1, schema.REGISTER)
    r["kind"], r["version"], r["rank"], r["time_ns"] = schema.Kind.REGISTER, schema.SCHEMA_VERSION, rank, t
    r["hang_timeout_us"], r["pid"], r["world_size"], r["local_rank"] = 1_000_000, pid, world, 0
    r["hang_times"], r["bw_check_period_s"], r["heartbeat_ms"], r["log_level"] = 3, 1, 1000, 2
    r["node"], r["job"] = node, job
    return r


def new_comm_ops(rank: int, first_cid: int, n: int, t: int) -> np.ndarray:
    """One collective on each of ``n`` new one-member communicators of ``rank``."""
    a = big_ops(rank, t, n)
    a["comm_id"] = first_cid + np.arange(n)
    a["comm_rank"], a["comm_nranks"], a["seq"] = 0, 1, 0
    return a


def _sockets(endpoint: str, n: int, job: str | None) -> list[zmq.Socket]:
    ctx = zmq.Context.instance()
    ctx.set(zmq.MAX_SOCKETS, max(1024, n + 64))  # more connections than libzmq's default 1,023
    out = []
    for _ in range(n):
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, 4)
        s.setsockopt(zmq.LINGER, 0)
        if job:
            s.setsockopt(zmq.METADATA, f"X-C4D-Job:{job}".encode())
        s.connect(endpoint)
        out.append(s)
    return out


def flood_ops(endpoint: str, seconds: float, conns: int = 8, job: str | None = None) -> dict:
    """The largest batches of OP records of rank 7, which never registered, on ``conns`` connections."""
    socks = _sockets(endpoint, conns, job)
    sent = nbytes = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        msg = wire.encode(big_ops(7, time.time_ns()).view(schema.HEADER), 7)
        for s in socks:
            try:
                s.send(msg, zmq.NOBLOCK)
                sent, nbytes = sent + 1, nbytes + len(msg)
            except zmq.Again:
                pass
        if not sent:
            time.sleep(0.001)
    for s in socks:
        s.close(linger=0)
    return {"messages": sent, "bytes": nbytes}


def flood_comms(endpoint: str, seconds: float, per_message: int = BIG, job: str | None = None) -> dict:
    """One REGISTER claiming a world of 131,072 ranks, then ``per_message`` new communicators a
    message (by default as many as the largest message the master takes holds: 1,023)."""
    (s,) = _sockets(endpoint, 1, job)
    s.setsockopt(zmq.SNDHWM, 16)
    s.send(wire.encode(register(0, 1 << 17, time.time_ns(), job=(job or "").encode()).view(schema.HEADER), 0))
    sent = nbytes = 0
    cid = 0x7000_0000
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        msg = wire.encode(new_comm_ops(0, cid, per_message, time.time_ns()).view(schema.HEADER), 0)
        try:
            s.send(msg, zmq.NOBLOCK)
            sent, nbytes, cid = sent + 1, nbytes + len(msg), cid + per_message
        except zmq.Again:
            time.sleep(0.001)
    s.close(linger=0)
    return {"messages": sent, "bytes": nbytes, "communicators": cid - 0x7000_0000}


def ring_ops(first_cid: int, n: int, t: int, k: int) -> np.ndarray:
    """Message ``k`` of the ring flood: rows of ops that never complete (2 of ``n`` members each)
    on communicator ``first_cid + k // per``, their seqs and comm ranks spread so that every row
    falls on a page of the op ring (W x n) not written yet: the whole ring becomes resident."""
    w = int(min(1024, max(64, (1 << 20) // n)))
    per = max(1, 2 * w // BIG)  # messages per communicator
    a = big_ops(0, t, BIG)
    j = (k % per) * BIG + np.arange(BIG)
    a["comm_id"], a["comm_nranks"] = first_cid + k // per, n
    a["seq"] = j // 2 % w
    a["comm_rank"] = (j % 2) * (n // 2)
    a["rank"] = a["comm_rank"]
    return a


def flood_rings(endpoint: str, seconds: float, members: int = 1024, job: str | None = None) -> dict:
    """One REGISTER claiming a world of 131,072 ranks, then communicators of ``members`` members
    (the edge admits 256 of 1,024), each with ops only two members report, spread over its op
    ring: each ring is made, and written page by page (26 MiB for 1,024 members)."""
    (s,) = _sockets(endpoint, 1, job)
    s.setsockopt(zmq.SNDHWM, 16)
    s.send(wire.encode(register(0, 1 << 17, time.time_ns(), job=(job or "").encode()).view(schema.HEADER), 0))
    sent = nbytes = k = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        msg = wire.encode(ring_ops(0x5000_0000, members, time.time_ns(), k).view(schema.HEADER), 0)
        try:
            s.send(msg, zmq.NOBLOCK)
            sent, nbytes, k = sent + 1, nbytes + len(msg), k + 1
        except zmq.Again:
            time.sleep(0.001)
    s.close(linger=0)
    w = int(min(1024, max(64, (1 << 20) // members)))
    return {"messages": sent, "bytes": nbytes, "communicators": k // max(1, 2 * w // BIG) + 1}


def flood_kept(endpoint: str, seconds: float, window_s: int = 10, job: str | None = None) -> dict:
    """A REGISTER whose slow-detection window is ``window_s`` (the job's first), then the largest
    batches of collectives that complete at once (one-member communicators): every op is a row
    the slow judge keeps until its window closes."""
    (s,) = _sockets(endpoint, 1, job)
    s.setsockopt(zmq.SNDHWM, 16)
    r = register(0, 8, time.time_ns(), job=(job or "").encode())
    r["bw_check_period_s"] = window_s
    s.send(wire.encode(r.view(schema.HEADER), 0))
    sent = nbytes = seq = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = big_ops(0, time.time_ns())
        a["comm_rank"], a["comm_nranks"], a["seq"] = 0, 1, seq + np.arange(len(a))
        msg = wire.encode(a.view(schema.HEADER), 0)
        try:
            s.send(msg, zmq.NOBLOCK)
            sent, nbytes, seq = sent + 1, nbytes + len(msg), seq + len(a)
        except zmq.Again:
            time.sleep(0.001)
    s.close(linger=0)
    return {"messages": sent, "bytes": nbytes, "ops": seq}


def rss_of(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process ``pid`` in MiB: its resident memory now and at its peak."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                got[k] = int(v.split()[0]) / 1024
    return got["VmRSS"], got["VmHWM"]


def main(argv: list[str]) -> int:
    what, endpoint, seconds = argv[0], argv[1], float(argv[2])
    job = next((a.split("=", 1)[1] for a in argv if a.startswith("--job=")), None)
    rest = [int(a) for a in argv[3:] if not a.startswith("--")]
    if what == "ops":
        out = flood_ops(endpoint, seconds, *rest, job=job)
    elif what == "comms":
        out = flood_comms(endpoint, seconds, *rest, job=job)
    elif what == "rings":
        out = flood_rings(endpoint, seconds, *rest, job=job)
    elif what == "kept":
        out = flood_kept(endpoint, seconds, *rest, job=job)
    else:
        print(f"unknown flood {what}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
