"""The engine's record rows and the numpy helpers every part of it cuts them with.

The row types the engine makes (``COMPLETED``: one reduced collective; ``P2P_DONE``: one
measured p2p transfer; ``OP_SPLIT``: one rank's wait / transfer split of an op), the op codes
and limits the ingest checks against, and the sorts, medians and cuts over whole columns
that a chunk's hundred thousand rows go through. Apart because every other module of the
engine's memory (ranks, pool, comm, reduce, p2p_pairs) uses them and they use none of those.

Times: ``*_ns`` from records are the sending rank's clock; the engine converts with the
per-rank offset (rank clock minus master clock, c4d/engine/clock.py) wherever it compares
ranks or compares with the master's clock.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from c4d.record import schema
from c4d.record.columns import Columns
from c4d.record.schema import Op, OpFlag

MAX_RANK = 1 << 20
MAX_NRANKS = 1 << 17
P2P = int(OpFlag.P2P)
IN_GROUP = int(OpFlag.IN_GROUP)
SEND, RECV = int(Op.Send), int(Op.Recv)
END_SYNC_OPS = (int(Op.AllReduce), int(Op.AllGather), int(Op.ReduceScatter), int(Op.AlltoAll))
END_SYNC = np.zeros(256, bool)  # by op code: END_SYNC_OPS
END_SYNC[list(END_SYNC_OPS)] = True
GONE_EVENTS = (int(schema.CommEvent.FINALIZE), int(schema.CommEvent.DESTROY), int(schema.CommEvent.ABORT))

COMPLETED = np.dtype(
    [
        ("seq", "<i8"),
        ("op", "u1"),
        ("bytes", "<i8"),
        ("last_arrive", "<i8"),  # L: latest aligned arrival (master clock)
        ("first_arrive", "<i8"),
        ("transfer", "<i8"),  # median aligned end - L
        ("busbw", "<f8"),  # GB/s, nccl-tests formula
        ("last", "<i4"),  # comm rank that arrived last
        ("margin", "<i8"),  # L - next-to-last arrival
        ("wait_med", "<i8"),
        ("wait_max", "<i8"),
        ("aligned", "?"),  # every member's clock offset was known when it was reduced
        ("ends_known", "?"),  # every member's end time was known
    ]
)

# Per rank and op, the wait / transfer split of a completed op (Engine(split=True) hands them
# out; c4d.offline.analyze's ops_split and the Prometheus metrics read them). Times are master clock
# (aligned with the engine's offsets) or durations; NaN where unknown (p2p ops have no wait).
OP_SPLIT = np.dtype(
    [
        ("comm_id", "<u8"),
        ("seq", "<i8"),
        ("rank", "<i4"),  # global
        ("comm_rank", "<i4"),
        ("peer", "<i4"),  # p2p: the other end (comm rank); -1 for collectives
        ("op", "u1"),
        ("bytes", "<i8"),
        ("arrive_ns", "<f8"),  # this rank's arrival, master clock
        ("last_arrive_ns", "<f8"),  # the op's last arrival L, master clock
        ("wait_ns", "<f8"),  # L - own arrival (from own durations across hosts: reduce.py)
        ("transfer_ns", "<f8"),  # the op's: last arrival -> done
        ("lateness_ns", "<f8"),  # own arrival - the op's median arrival
        ("compute_ns", "<f8"),  # own compute since its previous op of this communicator
        ("algbw_gbs", "<f8"),
        ("busbw_gbs", "<f8"),
    ]
)

# A paired p2p transfer whose transfer time is measurable (see P2PPairs).
P2P_DONE = np.dtype(
    [
        ("src", "<i4"),
        ("dst", "<i4"),
        ("seq", "<i8"),
        ("bytes", "<i8"),
        ("last_arrive", "<i8"),  # master clock (aligned), for the window
        ("transfer", "<i8"),
        ("aligned", "?"),
    ]
)

NO_ROWS = 1 << 62  # the earliest last arrival of no rows


def grow(a: np.ndarray, n: int, fill) -> np.ndarray:
    out = np.full(n, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


cat = schema.join_records  # short names: the engine joins and cuts rows everywhere
take = schema.take_records


def lexsort(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """``np.lexsort(keys)`` (the last key sorts first) for integer keys: one stable argsort of
    the keys packed into one int64 when their ranges fit in 62 bits. Records come in runs
    (a rank's in order, a batch per sender), which a stable sort takes as they are, much
    faster than np.lexsort on a chunk's collectives. Keys of wider ranges go to np.lexsort."""
    m = len(keys[0])
    if m < 2:
        return np.zeros(m, np.int64)
    packed = np.zeros(m, np.int64)
    shift = 0
    for k in keys:
        lo, hi = int(k.min()), int(k.max())
        bits = (hi - lo).bit_length()
        if shift + bits > 62:
            return np.lexsort(keys)
        if bits:  # offsets from the minimum (an unsigned key's in its own type: no overflow)
            d = k - k.min() if k.dtype.kind == "u" else k.astype(np.int64) - lo
            packed |= d.astype(np.int64) << shift
        shift += bits
    return np.argsort(packed, kind="stable")


class OpCols(NamedTuple):
    """OP fields that several steps of a chunk read, read once, as contiguous columns: the
    rows' words transposed in one pass (c4d.record.columns). A field of 128-byte rows read where it
    lies is a pass over every cache line of them, and the gaps, own pace, group sharing,
    membership, collectives and p2p steps read a dozen of them again and again."""

    rank: np.ndarray  # int64
    flags: np.ndarray
    nranks: np.ndarray  # comm_nranks, int64
    comm_rank: np.ndarray  # int64
    arr: np.ndarray  # arrival: the start event, else the issue time (int64)
    cid: np.ndarray  # comm_id (uint64)
    seq: np.ndarray  # int64
    op: np.ndarray  # uint8
    nbytes: np.ndarray  # bytes, int64
    end: np.ndarray  # end_ns, int64
    peer: np.ndarray  # int64
    compute: np.ndarray  # compute_ns, int64
    elems: np.ndarray  # elements as passed to NCCL (uint64; consistency.py)
    kinds: np.ndarray  # op | dtype << 8 | redop << 16 (uint64; consistency.py)

    @classmethod
    def of(cls, ops: np.ndarray, rank: np.ndarray | None = None) -> OpCols:
        """``rank``: the rows' rank field as int64 when the caller has read it."""
        c = Columns.of(ops)
        i64 = np.int64
        start = c["start_ns"].view(i64)  # (a view: the same bits as astype from uint64)
        arr = np.where(start > 0, start, c["issue_ns"].view(i64))
        g = c["rank"].astype(i64) if rank is None else rank
        return cls(
            g, c["flags"], c["comm_nranks"].astype(i64), c["comm_rank"].astype(i64), arr, c["comm_id"],
            c["seq"].view(i64), c["op"], c["bytes"].view(i64), c["end_ns"].view(i64),
            c["peer"].astype(i64), c["compute_ns"], c["count"],
            (c.words[14] >> np.uint64(32)) & np.uint64(0xFFFFFF),  # op, dtype, redop: one word's bytes
        )  # fmt: skip

    def take(self, idx: np.ndarray) -> OpCols:
        return OpCols(*(a[idx] for a in self))


# Batcher's odd-even merge sort of 8: 19 compare-exchanges, each a minimum and a maximum of
# two columns over every row at once (np.sort along rows of 8 sorts row by row)
_SORT8 = ((0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7), (1, 2), (5, 6), (0, 4),
          (3, 7), (1, 5), (2, 6), (1, 4), (3, 6), (2, 4), (3, 5), (3, 4))  # fmt: skip


def _sort_rows(a: np.ndarray, nan: np.ndarray) -> np.ndarray:
    """Each row sorted, NaN last (``nan``: where they are), flat."""
    if a.shape[1] != 8 or a.shape[0] < 64:
        return np.sort(a, axis=1).ravel()
    inf = np.array(np.inf, a.dtype)
    cols = [np.where(nan[:, j], inf, a[:, j]) for j in range(8)]  # NaN as +inf: after every value
    for i, j in _SORT8:
        lo = np.minimum(cols[i], cols[j])
        np.maximum(cols[i], cols[j], out=cols[j])
        cols[i] = lo
    return np.stack(cols, axis=1).ravel()


Cut = tuple[np.ndarray, ...]


def copy_rows(a: np.ndarray) -> np.ndarray:
    """``a.copy()``, whole records at once for a structured array (numpy copies one field at a
    time, several times slower for the engine's many-field rows)."""
    if not a.dtype.names:
        return a.copy()
    return a.view(np.dtype((np.void, a.dtype.itemsize))).copy().view(a.dtype)


def split_rows(keep: np.ndarray, *cols: np.ndarray) -> tuple[Cut, Cut | None]:
    """Row-aligned arrays cut into the rows taken and those kept (``keep``; None: none). When
    the kept come after the others (the usual order) the taken are views and the kept copied:
    a window's rows at 16,384 ranks are ~1 GiB, copied once more by masks."""
    j = len(keep) - int(np.count_nonzero(keep))
    if keep[j:].all():
        return tuple(a[:j] for a in cols), (tuple(copy_rows(a[j:]) for a in cols) if j < len(keep) else None)

    def pick(a: np.ndarray, m: np.ndarray) -> np.ndarray:  # whole records (numpy copies fields one by one)
        return take(a, m) if a.dtype.names else a[m]

    return tuple(pick(a, ~keep) for a in cols), tuple(pick(a, keep) for a in cols)


def row_median(a: np.ndarray) -> np.ndarray:
    """``np.median(a, axis=1)`` of an integer matrix, from one sort of its rows: np.median's
    partition and mean cost several times this on short rows, and a chunk's reduction runs it
    on every op. The two middle values are averaged in float64, as np.mean does."""
    n = a.shape[1]
    s = np.sort(a, axis=1)
    return (s[:, (n - 1) // 2].astype(np.float64) + s[:, n // 2].astype(np.float64)) / 2


def row_nanmedian(a: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN (NaN when a row has none); np.nanmedian is much slower here."""
    m, n = a.shape
    nan = np.isnan(a)
    srt = _sort_rows(a, nan)  # NaN sort last
    if n == 8 and nan.flags.c_contiguous:  # a node agent's summaries: a row's 8 flags are one word
        k = n - np.bitwise_count(nan.view(np.uint64)).ravel().astype(np.int64)
    else:  # (a reduction along short rows is slow)
        k = n - nan.sum(axis=1)
    at = np.arange(m) * n
    lo = srt[at + np.maximum((k - 1) // 2, 0)].astype(np.float64)  # float32 values exactly
    hi = srt[at + np.maximum(k // 2, 0)]
    return np.where(k > 0, (lo + hi) / 2, np.nan)
