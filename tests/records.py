"""Tiny record builders for tests of the wire and the trace (the engine has richer factories)."""

from __future__ import annotations

import numpy as np

from c4d.record import schema


def ops(n: int, rank: int = 0, comm_id: int = 0xC0FFEE, start_seq: int = 0) -> np.ndarray:
    a = np.zeros(n, dtype=schema.OP)
    a["kind"] = schema.Kind.OP
    a["version"] = schema.SCHEMA_VERSION
    a["rank"] = rank
    a["comm_id"] = comm_id
    a["seq"] = np.arange(start_seq, start_seq + n)
    a["issue_ns"] = 1_000_000 + a["seq"] * 1000
    a["start_ns"] = a["issue_ns"] + 10
    a["end_ns"] = a["start_ns"] + 500
    a["count"] = 256
    a["dtype"] = 7
    a["bytes"] = 1024
    a["comm_nranks"] = 2
    a["time_ns"] = a["end_ns"]
    return a


def register(rank: int, node: str) -> np.ndarray:
    a = np.zeros(1, dtype=schema.REGISTER)
    a["kind"] = schema.Kind.REGISTER
    a["version"] = schema.SCHEMA_VERSION
    a["rank"] = rank
    a["node"] = node.encode()
    a["pid"] = 1000 + rank
    a["world_size"] = 2
    return a
