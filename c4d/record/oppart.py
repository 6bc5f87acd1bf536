"""Two members' OP records of one collective in one OPPART record, and back.

A node agent forwards the OP records of communicators that span nodes (c4d/agent/summary.py):
it cannot reduce an op whose other members run elsewhere, but where two of its members run on
its node it can send their records as one, the node's part of the op: half the records of a
world group, of data-parallel groups with several members a node, to the master's loop and
its edge. The master unpacks each part into the two OP records before anything else reads
them (c4d.intake.ingest; the offline tables read the trace through ``unpack`` too), so its
engine gets the rows it would have got, field for field in what it reads: the pack is
lossless there. The stream, the return time and the device are not carried (0, 0, -1).

``pack`` pairs records only when that holds: the two agree on the schema version, the op,
count, size, root, datatype, reduction op and flags, neither is in an ncclGroup (``group_id``
0), both returned ncclSuccess, the bytes are count × the datatype's size, and every time lies
within 2^32 - 2 ns of the earliest (``base_ns``); the others go as they came.
"""

from __future__ import annotations

import numpy as np

from c4d.record import schema
from c4d.record.schema import Kind, Op, OpFlag

OPPART = int(Kind.OPPART)
_OP = int(Kind.OP)
_SPAN = (1 << 32) - 2  # offsets are t - base + 1 in a uint32, 0 for a time that is 0
_NOT_PACKED = int(OpFlag.P2P) | int(OpFlag.IN_GROUP)
_TIMES = ("time_ns", "issue_ns", "start_ns", "end_ns")
_SAME = ("version", "count", "comm_nranks", "peer", "op", "dtype", "redop", "flags")
_P2P_OPS = (int(Op.Send), int(Op.Recv))


def packable(ops: np.ndarray) -> np.ndarray:
    """Per OP row: whether it may go in a part (before pairing)."""
    dt = ops["dtype"].astype(np.int64)
    known = dt < len(schema.DTYPE_SIZE)
    size = schema.DTYPE_SIZE[np.where(known, dt, 0)]
    return (
        (ops["kind"] == _OP)
        & ((ops["flags"] & _NOT_PACKED) == 0)
        & ~np.isin(ops["op"], _P2P_OPS)
        & (ops["group_id"] == 0)
        & (ops["result"] == 0)
        & known
        & (ops["bytes"] == ops["count"] * size)
    )


def pack(ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OP rows (schema.OP) -> (OPPART rows, the positions of ``ops`` they hold). Records of one
    collective pair in comm-rank order; a record left without a partner, or whose partner
    differs, is not held."""
    cand = np.flatnonzero(packable(ops))
    none = np.zeros(0, schema.OPPART), np.zeros(0, np.int64)
    if len(cand) < 2:
        return none
    c = ops[cand]
    o = np.lexsort((c["comm_rank"], c["seq"], c["comm_id"]))
    cand, c = cand[o], c[o]
    cid, seq = c["comm_id"], c["seq"]
    head = np.r_[True, (cid[1:] != cid[:-1]) | (seq[1:] != seq[:-1])]
    start = np.maximum.accumulate(np.where(head, np.arange(len(c)), 0))
    first = ((np.arange(len(c)) - start) % 2 == 0) & np.r_[~head[1:], False]
    a = np.flatnonzero(first)
    b = a + 1
    ok = (c["rank"][a] != c["rank"][b]) & (c["comm_rank"][a] != c["comm_rank"][b])
    for f in _SAME:
        ok &= c[f][a] == c[f][b]
    t = np.stack([c[f][a] for f in _TIMES] + [c[f][b] for f in _TIMES], axis=1).astype(np.uint64)
    nz = t > 0
    big = np.iinfo(np.uint64).max
    base = np.where(nz, t, big).min(axis=1)
    base = np.where(nz.any(axis=1), base, 0)
    top = np.where(nz, t, 0).max(axis=1)
    ok &= (top - np.minimum(base, top)) <= _SPAN
    a, b, t, base = a[ok], b[ok], t[ok], base[ok]
    if not len(a):
        return none
    p = np.zeros(len(a), schema.OPPART)
    A, B = c[a], c[b]
    p["kind"] = OPPART
    p["rank"] = A["rank"]
    p["time_ns"] = np.maximum(A["time_ns"], B["time_ns"])
    for f in ("comm_id", "seq", *_SAME, "comm_rank"):
        p[f] = A[f]
    p["rank1"], p["comm_rank1"] = B["rank"], B["comm_rank"]
    p["compute_ns"] = np.stack([A["compute_ns"], B["compute_ns"]], axis=1)
    p["base_ns"] = base
    off = np.where(t > 0, t - base[:, None] + np.uint64(1), 0).astype(np.uint32)
    p["off"] = off.reshape(len(a), schema.OPPART_MEMBERS, len(_TIMES))
    return p, np.concatenate([cand[a], cand[b]])


def unpack(raw: np.ndarray) -> np.ndarray:
    """HEADER rows -> the same rows with each OPPART row replaced, where it lies, by the two OP
    rows it holds (``raw`` itself when it has none). Checks nothing: the edge admits a part only
    when both records it unpacks into are valid OP records (c4d/intake/validate.py)."""
    kind = raw["kind"]
    at = np.flatnonzero(kind == OPPART)
    if not len(at):
        return raw
    counts = np.ones(len(raw), np.int64)
    counts[at] = schema.OPPART_MEMBERS
    out = np.repeat(raw, counts)
    first = (np.cumsum(counts) - counts)[at]
    p = raw[at].view(schema.OPPART)
    for m in range(schema.OPPART_MEMBERS):
        out[first + m] = members(p, m).view(schema.HEADER)
    return out


def members(p: np.ndarray, m: int) -> np.ndarray:
    """Member ``m``'s OP rows of OPPART rows ``p``."""
    o = np.zeros(len(p), schema.OP)
    o["kind"] = _OP
    o["rank"] = p["rank"] if m == 0 else p["rank1"]
    o["comm_rank"] = p["comm_rank"] if m == 0 else p["comm_rank1"]
    base = p["base_ns"]
    for j, f in enumerate(_TIMES):
        off = p["off"][:, m, j].astype(np.uint64)
        o[f] = np.where(off > 0, base + off - np.uint64(1), 0)
    for f in ("comm_id", "seq", *_SAME):
        o[f] = p[f]
    dt = p["dtype"].astype(np.int64)
    o["bytes"] = p["count"] * schema.DTYPE_SIZE[np.where(dt < len(schema.DTYPE_SIZE), dt, 0)]
    o["compute_ns"] = p["compute_ns"][:, m]
    o["device"] = -1
    return o
