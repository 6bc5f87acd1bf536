"""Which engine shard a record belongs to: the routing step of an engine sharded by
communicator (docs/engine-shards.md).

A communicator's records (OP, OPSUM, HEARTBEAT, COMM, PEER: every kind that names one) go to
the one shard that owns it, chosen by a hash of its id, so each shard keeps whole
communicators; rank-level records (REGISTER, STAGE, a process's own heartbeats: comm id 0)
go to every shard, which each need the ranks' names, nodes and liveness. Arrival order is kept
within each shard's rows: a shard sees its communicators' records in the order one engine sees
them (the chunks they are ingested in, and what crosses communicators, are the sharded engine's
to keep as one engine's: docs/engine-shards.md).
"""

from __future__ import annotations

import numpy as np

from c4d.record import schema

# kinds whose records name a communicator (comm_id at the same offset in each)
_PER_COMM = tuple(k for k, dt in schema.DTYPES.items() if "comm_id" in (dt.names or ()))


def _cid_offset(dt: np.dtype) -> int:
    fields = dt.fields
    if fields is None:  # (every per-communicator kind is a structured dtype)
        raise TypeError(f"{dt} has no fields")
    return int(fields["comm_id"][1])


_CID_AT = {_cid_offset(schema.DTYPES[k]) for k in _PER_COMM}
if len(_CID_AT) != 1:
    raise ImportError("c4d.engine.shard reads comm_id at one offset; the record kinds keep it at several")
CID_OFFSET = _CID_AT.pop()
_PER_COMM_KIND = np.zeros(256, bool)
_PER_COMM_KIND[[int(k) for k in _PER_COMM]] = True


def owner(comm_id: np.ndarray, shards: int) -> np.ndarray:
    """Each communicator id's shard in [0, shards): splitmix64 of the id, so ids that come in
    sequence (a launcher's, a test's) spread as evenly as random ones; the same in every
    process and run."""
    x = np.asarray(comm_id, np.uint64).copy()
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(shards)).astype(np.int64)


def comm_ids(rows: np.ndarray) -> np.ndarray:
    """Each HEADER row's communicator id; 0 for a kind that names none (REGISTER, STAGE) and
    for a record of an unknown kind, which every shard then sees (and drops as one engine
    would)."""
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), schema.RECORD_SIZE)
    cid = raw[:, CID_OFFSET : CID_OFFSET + 8].copy().view("<u8").ravel()
    kind = np.ascontiguousarray(rows["kind"])
    return np.where(_PER_COMM_KIND[np.minimum(kind, 255)], cid, np.uint64(0))


def split(rows: np.ndarray, shards: int) -> list[np.ndarray]:
    """HEADER rows -> each shard's rows, in arrival order: its communicators' records and
    every record that names no communicator."""
    if shards <= 1:
        return [rows]
    cid = comm_ids(rows)
    to = np.where(cid == 0, -1, owner(cid, shards))
    everyone = to < 0
    return [schema.take_records(rows, everyone | (to == s)) for s in range(shards)]
