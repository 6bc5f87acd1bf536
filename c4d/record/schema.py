"""numpy mirror of native/include/c4d/record.h — the one record schema.

Records are 128-byte little-endian structs that share a 16-byte header (kind tag
first). A batch or a trace body is decoded once with ``numpy.frombuffer`` into
``RAW`` rows, then viewed per kind with the dtypes below: never one Python object
per record. tests/test_schema.py compiles a probe against the C header and checks
every size and offset here byte for byte.

Version rule (same as the header): SCHEMA_VERSION changes when a field moves,
changes type or meaning; old versions are normalised in ``upgrade`` only (version 1: the
heartbeat without its pending op's count, dtype and reduction op). A new record
kind or a new value of an enum field (a comm event) does not bump it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

SCHEMA_VERSION = 2  # 2: the heartbeat's pending op says its count, dtype and reduction op
RECORD_SIZE = 128
BATCH_MAGIC = 0x42443443  # "C4DB"


class Kind(enum.IntEnum):
    REGISTER = 1
    OP = 2
    HEARTBEAT = 3
    COMM = 4
    PEER = 5
    TICK = 6  # master-written: the engine ran at time_ns (master clock)
    STAGE = 7  # the training code set the rank's hang timeout (c4d.hang_timeout)
    OPSUM = 8  # a node agent's summary of one collective of a node-local communicator (c4d/agent)
    OPPART = 9  # a node agent's pack of two members' OP records of a collective spanning nodes


class Op(enum.IntEnum):
    """NCCL operation kinds, c4d's stable numbering (record.h: c4d_op_kind)."""

    AllReduce = 0
    Broadcast = 1
    Reduce = 2
    AllGather = 3
    ReduceScatter = 4
    AlltoAll = 5
    Gather = 6
    Scatter = 7
    Send = 8
    Recv = 9


class OpFlag(enum.IntEnum):
    """Bits of OpRecord.flags (record.h: c4d_op_flags). IntEnum, not IntFlag: IntFlag members are
    iterable, which pandas treats as sequences in `&`."""

    DEVICE_TIMING = 1 << 0
    IN_GROUP = 1 << 1
    P2P = 1 << 2
    INPLACE = 1 << 3
    CONFIG_CALL = 1 << 4
    NO_EVENT = 1 << 5
    EVENT_ERROR = 1 << 6
    COMPUTE_GIVEN = 1 << 7  # a node agent's forwarded OP: compute_ns holds the rank's compute so far


HBF_FINAL = 1  # heartbeat hb_flags: the process is exiting cleanly


class CommEvent(enum.IntEnum):
    INIT_RANK = 1
    INIT_RANK_CONFIG = 2
    INIT_ALL = 3
    INIT_SCALABLE = 4
    SPLIT = 5
    SHRINK = 6
    FINALIZE = 7
    DESTROY = 8
    ABORT = 9
    REVOKE = 10  # ncclCommRevoke: in-flight ops stopped; the comm stays until destroyed
    SUSPEND = 11  # ncclCommSuspend: no ops until RESUME
    RESUME = 12


# Op names for arrays of op codes (unknown codes read "?"): OP_NAMES[ops["op"]]
OP_NAMES = np.array([o.name for o in Op] + ["?"] * (256 - len(Op)), dtype=object)


def op_name(op: int | None) -> str | None:
    """The name of an op code (``Op``), ``op<N>`` for a code this version does not know."""
    if op is None:
        return None
    try:
        return Op(int(op)).name
    except ValueError:
        return f"op{int(op)}"


class DType(enum.IntEnum):
    """ncclDataType_t (nccl_abi.h); 255 = unknown (imports of tools that do not say)."""

    int8 = 0
    uint8 = 1
    int32 = 2
    uint32 = 3
    int64 = 4
    uint64 = 5
    float16 = 6
    float32 = 7
    float64 = 8
    bfloat16 = 9
    float8e4m3 = 10
    float8e5m2 = 11
    unknown = 255


# bytes per element by ncclDataType_t (nccl_abi.h: c4d_dtype_size); index with a DType
DTYPE_SIZE = np.array([1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1], dtype=np.uint64)
DTYPE_NAMES = [d.name for d in DType if d is not DType.unknown]

# docs/design.md's job-side threshold defaults (REGISTER carries the job's values; the engine and
# the importers fall back to these)
DEFAULT_HANG_TIMEOUT_US = 10_000_000  # C4D_HANG_TIMEOUT
DEFAULT_HANG_TIMES = 18  # C4D_HANG_TIMES
DEFAULT_BW_CHECK_PERIOD_S = 10  # C4D_CONN_BW_CHECK_PERIOD
DEFAULT_HEARTBEAT_MS = 1000  # C4D_HEARTBEAT_MS

LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]

_HEADER = [("kind", "<u2"), ("version", "<u2"), ("rank", "<i4"), ("time_ns", "<u8")]

BATCH_HEADER = np.dtype(
    [("magic", "<u4"), ("version", "<u2"), ("record_size", "<u2"), ("n_records", "<u4"), ("rank", "<i4")]
)

HEADER = np.dtype(_HEADER + [("body", "V112")])

REGISTER = np.dtype(
    _HEADER
    + [
        ("hang_timeout_us", "<u8"),
        ("pid", "<i4"),
        ("world_size", "<i4"),
        ("local_rank", "<i4"),
        ("cuda_device", "<i4"),
        ("nccl_version", "<i4"),
        ("hang_times", "<i4"),
        ("bw_check_period_s", "<i4"),
        ("heartbeat_ms", "<i4"),
        ("build_rev", "<u4"),
        ("log_level", "u1"),
        ("stats_output", "u1"),
        ("device_timing", "u1"),
        ("reserved0", "u1"),
        ("node", "S40"),
        ("job", "S24"),
    ]
)

OP = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("seq", "<u8"),
        ("issue_ns", "<u8"),
        ("start_ns", "<u8"),
        ("end_ns", "<u8"),
        ("count", "<u8"),
        ("bytes", "<u8"),
        ("stream", "<u8"),
        ("group_id", "<u8"),
        ("return_ns", "<u8"),
        ("comm_rank", "<i4"),
        ("comm_nranks", "<i4"),
        ("peer", "<i4"),
        ("device", "<i4"),
        ("result", "<i4"),
        ("op", "u1"),
        ("dtype", "u1"),
        ("redop", "u1"),
        ("flags", "u1"),
        ("compute_ns", "<i8"),  # 0 from a shim; with OpFlag.COMPUTE_GIVEN (agents): compute so far
    ]
)

HEARTBEAT = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("n_issued", "<u8"),
        ("n_arrived", "<u8"),
        ("n_done", "<u8"),
        ("last_arrive_ns", "<u8"),
        ("last_done_ns", "<u8"),
        ("pend_seq", "<u8"),
        ("pend_issue_ns", "<u8"),
        ("pend_start_ns", "<u8"),
        ("pend_count", "<u8"),  # version 2: the pending op's element count (0 none)
        ("sent", "<u8"),
        ("dropped", "<u4"),  # saturates at 2**32 - 1 (64 bits in version 1)
        ("comm_rank", "<i4"),
        ("comm_nranks", "<i4"),
        ("pend_peer", "<i4"),
        ("device", "<i2"),
        ("p2p_in_flight", "u1"),  # saturates at 255
        ("hb_flags", "u1"),
        ("pend_op", "u1"),
        ("pend_flags", "u1"),
        ("pend_dtype", "u1"),  # version 2: ncclDataType_t, 255 none or unknown
        ("pend_redop", "u1"),  # version 2: ncclRedOp_t, 255 none or unknown
    ]
)

# Version 1's heartbeat (no pending count, dtype or reduction op): read by ``upgrade`` only
HEARTBEAT_V1 = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("n_issued", "<u8"),
        ("n_arrived", "<u8"),
        ("n_done", "<u8"),
        ("last_arrive_ns", "<u8"),
        ("last_done_ns", "<u8"),
        ("pend_seq", "<u8"),
        ("pend_issue_ns", "<u8"),
        ("pend_start_ns", "<u8"),
        ("dropped", "<u8"),
        ("comm_rank", "<i4"),
        ("comm_nranks", "<i4"),
        ("pend_peer", "<i4"),
        ("pend_op", "u1"),
        ("pend_flags", "u1"),
        ("hb_flags", "<u2"),
        ("p2p_in_flight", "<u4"),
        ("device", "<i4"),
        ("sent", "<u8"),
    ]
)

COMM = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("parent_id", "<u8"),
        ("handle", "<u8"),
        ("comm_rank", "<i4"),
        ("comm_nranks", "<i4"),
        ("color", "<i4"),
        ("key", "<i4"),
        ("device", "<i4"),
        ("result", "<i4"),
        ("event", "u1"),
        ("reserved", "V63"),
    ]
)

PEER = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("seq", "<u8"),
        ("first_ns", "<u8"),
        ("last_ns", "<u8"),
        ("bytes_done", "<u8"),
        ("comm_rank", "<i4"),
        ("peer", "<i4"),
        ("steps_total", "<u4"),
        ("steps_done", "<u4"),
        ("direction", "u1"),
        ("state", "u1"),
        ("op", "u1"),
        ("done", "u1"),
        ("reserved0", "V4"),
        ("wire_ns", "<u8"),  # send side: SendWait -> step stop, summed; 0 unknown
        ("reserved", "V40"),
    ]
)

STAGE = np.dtype(
    _HEADER
    + [
        ("hang_timeout_us", "<i8"),
        ("generation", "<u8"),
        ("reserved", "V96"),
    ]
)

OPSUM_MAX_MEMBERS = 8
OPSF_ENDS_KNOWN = 1  # OPSUM flags: every member's end time was known
# OPSUM sample_shift: the agent sends the ops whose seq the slow window's sample keeps at this
# shift (c4d/engine/sampling.py: one in 2^shift), and each flush's last op for progress; a row
# outside its own sample counts for progress only (0: every op sent, as before it existed)
OPSUM_MAX_SHIFT = 20

# Written by a node agent (c4d/agent), never by a rank: see record.h, c4d_opsum_record
OPSUM = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("seq", "<u8"),
        ("bytes", "<u8"),
        ("last_arrive_ns", "<u8"),
        ("transfer_ns", "<i8"),
        ("margin_ns", "<i8"),
        ("wait_med_ns", "<i8"),
        ("wait_max_ns", "<i8"),
        ("comm_rank", "<i4"),
        ("comm_nranks", "<i4"),
        ("compute_ns", "<f4", (OPSUM_MAX_MEMBERS,)),
        ("op", "u1"),
        ("flags", "u1"),
        ("sample_shift", "u1"),
        ("reserved", "V5"),
    ]
)

OPPART_MEMBERS = 2
# Written by a node agent, never by a rank: see record.h, c4d_oppart_record (c4d/record/oppart.py
# packs and unpacks it)
OPPART = np.dtype(
    _HEADER
    + [
        ("comm_id", "<u8"),
        ("seq", "<u8"),
        ("count", "<u8"),
        ("base_ns", "<u8"),
        ("compute_ns", "<i8", (OPPART_MEMBERS,)),
        ("comm_nranks", "<i4"),
        ("comm_rank", "<i4"),
        ("rank1", "<i4"),
        ("comm_rank1", "<i4"),
        ("peer", "<i4"),
        ("op", "u1"),
        ("dtype", "u1"),
        ("redop", "u1"),
        ("flags", "u1"),
        ("off", "<u4", (OPPART_MEMBERS, 4)),
        ("reserved", "V8"),
    ]
)

DTYPES: dict[Kind, np.dtype] = {
    Kind.REGISTER: REGISTER,
    Kind.OP: OP,
    Kind.HEARTBEAT: HEARTBEAT,
    Kind.COMM: COMM,
    Kind.PEER: PEER,
    Kind.STAGE: STAGE,
    Kind.OPSUM: OPSUM,
    Kind.OPPART: OPPART,
}

UINT64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)

for _name, _dt in [
    ("HEADER", HEADER),
    ("HEARTBEAT_V1", HEARTBEAT_V1),
    *((k.name, d) for k, d in DTYPES.items()),
]:
    assert _dt.itemsize == RECORD_SIZE, (_name, _dt.itemsize)
assert BATCH_HEADER.itemsize == 16


def upgrade(raw: np.ndarray) -> np.ndarray:
    """Normalise records of older schema versions to the current layout.

    Version 1 differs in the heartbeat only: its rows are rewritten in the version 2 layout
    (pending count, dtype and reduction op unknown: 0, 255, 255; the dropped count, device and
    transfers in flight narrowed, saturating) and stamped version 2; every other row is left as
    it came. ``raw`` itself is never written: a copy is returned when something changed.
    Records from a newer writer are refused by the caller (``version > SCHEMA_VERSION``),
    never guessed at.
    """
    if not len(raw):
        return raw
    ver = raw["version"]
    if ver.min() >= SCHEMA_VERSION:  # the common case: one strided read of a column
        return raw
    old = np.flatnonzero((ver < 2) & (raw["kind"] == Kind.HEARTBEAT))
    if not len(old):
        return raw
    out = raw.copy()
    v1 = raw[old].view(HEARTBEAT_V1)
    v2 = np.zeros(len(old), HEARTBEAT)
    for f in set(HEARTBEAT.names or ()) & set(HEARTBEAT_V1.names or ()):
        v2[f] = v1[f]
    v2["version"] = SCHEMA_VERSION
    v2["dropped"] = np.minimum(v1["dropped"], np.uint64(0xFFFFFFFF))
    v2["p2p_in_flight"] = np.minimum(v1["p2p_in_flight"], np.uint32(255))
    v2["device"] = np.clip(v1["device"], -1, 0x7FFF)
    v2["hb_flags"] = np.minimum(v1["hb_flags"], np.uint16(255))
    v2["pend_dtype"] = v2["pend_redop"] = 255
    out[old] = v2.view(HEADER)
    return out


def by_kind(raw: np.ndarray, kinds: np.ndarray | None = None) -> dict[Kind, np.ndarray]:
    """Split ``HEADER``-typed rows into typed arrays, one per known kind (unknown kinds are
    skipped). ``kinds``: their ``kind`` field when the caller has read it."""
    if kinds is None:
        kinds = raw["kind"]
    present = np.bincount(kinds, minlength=256) if len(raw) else np.zeros(256, np.int64)
    v = raw.view(np.dtype((np.void, raw.dtype.itemsize)))  # whole records: see take_records
    out: dict[Kind, np.ndarray] = {}
    for kind, dt in DTYPES.items():
        out[kind] = v[kinds == kind].view(dt) if present[kind] else np.empty(0, dtype=dt)  # copies
    return out


class KindsOf(Mapping[Kind, np.ndarray]):
    """``by_kind(raw)``, split when first read: a trace whose reader (a replay) takes the stream
    only never pays for a second copy of its records."""

    def __init__(self, raw: np.ndarray):
        self._raw = raw
        self._split: dict[Kind, np.ndarray] | None = None

    def _kinds(self) -> dict[Kind, np.ndarray]:
        if self._split is None:
            self._split = by_kind(self._raw)
        return self._split

    def __getitem__(self, kind: Kind) -> np.ndarray:
        return self._kinds()[kind]

    def __iter__(self) -> Iterator[Kind]:
        return iter(self._kinds())

    def __len__(self) -> int:
        return len(self._kinds())


def join_records(parts: Sequence[np.ndarray], dtype: np.dtype | None = None) -> np.ndarray:
    """``np.concatenate(parts)`` for record arrays, joined as whole records (plain voids) and
    viewed as ``dtype`` (default: the first part's): numpy promotes a structured dtype field by
    field for every part, several times slower for 128-byte records. One part is returned as
    it is (as a view)."""
    dt = parts[0].dtype if dtype is None else dtype
    if len(parts) == 1:
        return parts[0] if parts[0].dtype == dt else np.ascontiguousarray(parts[0]).view(dt)
    try:  # the parts' bytes in one C loop (many parts: a batch per sender)
        return np.frombuffer(bytearray().join(parts), dt)  # type: ignore[arg-type]  # (ndarrays are buffers)
    except (BufferError, TypeError):  # a part that is not contiguous (no plain buffer)
        v = np.dtype((np.void, dt.itemsize))
        return np.concatenate([np.ascontiguousarray(p).view(v) for p in parts]).view(dt)


def runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Where each run of equal values of ``a`` starts and which run each value is in, when the
    runs are worth it (at most half as many as the values: a rank's records name communicators
    in runs, ~26,000 in 131,072 raw OP rows); None when they are not."""
    n = len(a)
    if n < 2:
        return None
    head = np.empty(n, bool)
    head[0] = True
    np.not_equal(a[1:], a[:-1], out=head[1:])
    h = np.flatnonzero(head)
    if 2 * len(h) > n:  # few runs: working on the heads saves less than finding them cost
        return None
    return h, np.cumsum(head) - 1


def unique_runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(a, return_index=True, return_inverse=True)`` (inverse flat) for values that
    come in runs: only each run's first value is sorted."""
    r = runs(a)
    if r is None:
        u, first, inv = np.unique(a, return_index=True, return_inverse=True)
        return u, first, inv.ravel()
    h, run = r
    u, first_h, inv_h = np.unique(a[h], return_index=True, return_inverse=True)
    return u, h[first_h], inv_h.ravel()[run]


def take_records(rows: np.ndarray, idx: np.ndarray | slice) -> np.ndarray:
    """``rows[idx]`` (indices or a mask) for record arrays, copied as whole records: numpy
    copies a many-field structured dtype field by field, many times slower."""
    v = np.dtype((np.void, rows.dtype.itemsize))
    return rows.view(v)[idx].view(rows.dtype)
