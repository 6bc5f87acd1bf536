"""Batches on the wire: one ZeroMQ message = a 16-byte batch header + n fixed-size records.

Decoding is one ``numpy.frombuffer`` per message (or, for a reader that joins many messages,
``check`` per message and one view of the records joined). A message that does not parse is
rejected whole with a one-line reason (``BadBatch``), never guessed at.
"""

from __future__ import annotations

import struct

import numpy as np

from c4d.record import schema


class BadBatch(ValueError):
    """A message that is not a c4d batch of the supported schema.

    ``reason`` is its class ("bad magic", ...): a fixed string to count and rate-limit by;
    the message carries the values.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


_HEADER = struct.Struct("<IHHIi")  # schema.BATCH_HEADER: magic, version, record_size, n_records, rank
assert _HEADER.size == schema.BATCH_HEADER.itemsize
HEADER_BYTES = _HEADER.size  # where a batch's records start


def decode(msg: bytes | memoryview) -> np.ndarray:
    """Return the batch's records as ``schema.HEADER`` rows (a copy-free view of ``msg``)."""
    n, version = check(msg)
    raw = np.frombuffer(msg, dtype=schema.HEADER, count=n, offset=_HEADER.size)
    # a writer of the current version writes every record in it (the edge refuses a heartbeat
    # of an older one inside: validate.py); an older writer's batch is normalised row by row
    return raw if version == schema.SCHEMA_VERSION else schema.upgrade(raw)


def check(msg: bytes | memoryview) -> tuple[int, int]:
    """The batch's record count and schema version, its header checked (``BadBatch``): what a
    reader that joins many batches' records before viewing them needs (c4d.master.collector)."""
    n_bytes = len(msg)
    if n_bytes < _HEADER.size:
        raise BadBatch(f"message of {n_bytes} bytes is shorter than a batch header", "short message")
    # the header read with struct: a numpy scalar per field cost more than the records' view
    magic, version, record_size, n, _rank = _HEADER.unpack_from(msg)
    if magic != schema.BATCH_MAGIC:
        raise BadBatch(f"bad magic 0x{magic:08x}", "bad magic")
    if version > schema.SCHEMA_VERSION or version < 1:
        raise BadBatch(
            f"schema version {version} not supported (this master reads ≤ {schema.SCHEMA_VERSION})",
            "unsupported schema version",
        )
    if record_size != schema.RECORD_SIZE:
        raise BadBatch(f"record size {record_size} != {schema.RECORD_SIZE}", "bad record size")
    expect = _HEADER.size + n * schema.RECORD_SIZE
    if n_bytes != expect:
        raise BadBatch(
            f"batch says {n} records ({expect} bytes) but the message has {n_bytes} bytes", "length mismatch"
        )
    return n, version


def encode(records: np.ndarray, rank: int = -1) -> bytes:
    """Build a batch message from 128-byte records of any schema dtype (tests, replays, agents)."""
    if records.dtype.itemsize != schema.RECORD_SIZE:
        raise ValueError(f"records must be {schema.RECORD_SIZE} bytes, got {records.dtype.itemsize}")
    hdr = np.zeros(1, dtype=schema.BATCH_HEADER)
    hdr["magic"] = schema.BATCH_MAGIC
    hdr["version"] = schema.SCHEMA_VERSION
    hdr["record_size"] = schema.RECORD_SIZE
    hdr["n_records"] = len(records)
    hdr["rank"] = rank
    return hdr.tobytes() + np.ascontiguousarray(records).tobytes()
