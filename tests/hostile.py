"""Record builders for the edge tests: a small well-behaved job (what a real shim sends, with the
times of now) and the hostile records issue 14 found, plus memory probes."""

from __future__ import annotations

import time
import tracemalloc
from contextlib import contextmanager

import numpy as np

from c4d.record import schema
from c4d.record.schema import Kind

WORLD_COMM = 0xC0FFEE


def _hdr(a: np.ndarray, kind: Kind, rank, t) -> np.ndarray:
    a["kind"] = kind
    a["version"] = schema.SCHEMA_VERSION
    a["rank"] = rank
    a["time_ns"] = t
    return a


def registers(world: int, t: int, node_of=lambda r: f"node-{r // 4}".encode()) -> np.ndarray:
    a = _hdr(np.zeros(world, schema.REGISTER), Kind.REGISTER, np.arange(world), t)
    a["hang_timeout_us"] = 1_000_000
    a["pid"] = 1000 + np.arange(world)
    a["world_size"] = world
    a["local_rank"] = np.arange(world) % 4
    a["hang_times"] = 3
    a["bw_check_period_s"] = 1
    a["heartbeat_ms"] = 100
    a["log_level"] = 2
    a["node"] = [node_of(r) for r in range(world)]
    a["job"] = b"job-1"
    return a


def comm_init(ranks, cid: int, nranks: int, t: int, event=schema.CommEvent.INIT_RANK) -> np.ndarray:
    ranks = np.asarray(ranks)
    a = _hdr(np.zeros(len(ranks), schema.COMM), Kind.COMM, ranks, t)
    a["comm_id"] = cid
    a["comm_rank"] = np.arange(len(ranks))
    a["comm_nranks"] = nranks
    a["color"] = a["key"] = -1
    a["event"] = event
    return a


def allreduces(world: int, seqs, t: int, cid: int = WORLD_COMM) -> np.ndarray:
    """One AllReduce record per rank and seq (rank r is comm rank r), done 1 ms apart."""
    seqs = np.asarray(list(seqs))
    r = np.tile(np.arange(world), len(seqs))
    s = np.repeat(seqs, world)
    a = _hdr(np.zeros(len(r), schema.OP), Kind.OP, r, t)
    a["comm_id"] = cid
    a["seq"] = s
    a["issue_ns"] = t - 10_000_000 + s * 1_000_000
    a["start_ns"] = a["issue_ns"] + 1000 + r * 100
    a["end_ns"] = a["issue_ns"] + 500_000
    a["return_ns"] = a["issue_ns"] + 2000
    a["count"] = 1024
    a["bytes"] = 4096
    a["dtype"] = 7
    a["comm_rank"] = r
    a["comm_nranks"] = world
    a["peer"] = -1
    a["device"] = 0
    a["flags"] = schema.OpFlag.DEVICE_TIMING
    return a


def heartbeats(world: int, t: int, cid: int = WORLD_COMM, done: int = 0) -> np.ndarray:
    a = _hdr(np.zeros(world, schema.HEARTBEAT), Kind.HEARTBEAT, np.arange(world), t)
    a["comm_id"] = cid
    a["n_issued"] = a["n_arrived"] = a["n_done"] = done
    a["pend_seq"] = schema.UINT64_MAX
    a["pend_op"] = 255
    a["pend_peer"] = -1
    a["comm_rank"] = np.arange(world)
    a["comm_nranks"] = world
    return a


def as_header(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(p).view(schema.HEADER) for p in parts])


def now_ns() -> int:
    return time.time_ns()


@contextmanager
def traced_growth():
    """Yields a dict whose "mib" is the tracemalloc growth (Python and numpy) over the block."""
    out = {"mib": 0.0}
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        yield out
        after, _ = tracemalloc.get_traced_memory()
        out["mib"] = (after - before) / 2**20
    finally:
        tracemalloc.stop()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


_TIME_FIELDS = {
    Kind.OP: ("issue_ns", "start_ns", "end_ns", "return_ns"),
    Kind.HEARTBEAT: ("last_arrive_ns", "last_done_ns", "pend_issue_ns", "pend_start_ns"),
    Kind.PEER: ("first_ns", "last_ns"),
}


def shifted(raw: np.ndarray, delta_ns: int) -> np.ndarray:
    """A copy of HEADER rows with every known time moved by ``delta_ns`` (0 stays "unknown")."""
    out = np.ascontiguousarray(raw).view(schema.HEADER).copy()
    d = np.uint64(delta_ns)
    t = out["time_ns"]
    out["time_ns"] = np.where(t > 0, t + d, t)
    for kind, names in _TIME_FIELDS.items():
        idx = np.flatnonzero(out["kind"] == kind)
        if len(idx):
            v = out[idx].view(schema.DTYPES[kind])
            for f in names:
                v[f] = np.where(v[f] > 0, v[f] + d, v[f])
            out[idx] = v.view(schema.HEADER)
    return out
