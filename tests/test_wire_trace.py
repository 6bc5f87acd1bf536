"""Batches and the trace file: decode what we encode, reject garbage, survive any cut."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.record import framing, schema, trace, wire
from tests.records import ops, register


def test_batch_roundtrip():
    recs = ops(10, rank=3)
    raw = wire.decode(wire.encode(recs, rank=3))
    assert len(raw) == 10
    back = raw.view(schema.OP)
    assert np.array_equal(back["seq"], recs["seq"])
    assert np.array_equal(back["bytes"], recs["bytes"])


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: b[:10], "shorter than a batch header"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:-1], "records"),
        (lambda b: b[:4] + (99).to_bytes(2, "little") + b[6:], "schema version 99"),
        (lambda b: b[:6] + (64).to_bytes(2, "little") + b[8:], "record size 64"),
    ],
)
def test_bad_batches_are_rejected_with_a_reason(mutate, reason):
    with pytest.raises(wire.BadBatch, match=reason):
        wire.decode(mutate(wire.encode(ops(3))))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_garbage_never_crashes_the_decoder(blob):
    try:
        raw = wire.decode(blob)
    except wire.BadBatch:
        return
    assert raw.dtype == schema.HEADER


def _write_trace(path, n_ops=200):
    w = trace.TraceWriter(path, {"job": "t"})
    w.write(register(0, "node-0"))
    w.write(register(1, "node-1"))
    w.write(ops(n_ops, rank=0))
    w.tick(123)
    w.write(ops(n_ops, rank=1))
    w.close()
    return 2 + 1 + 2 * n_ops


def test_trace_roundtrip(tmp_path):
    p = tmp_path / "t.c4d"
    n = _write_trace(p)
    rt = trace.read_raw(p)
    assert rt.meta["schema_version"] == schema.SCHEMA_VERSION and rt.meta["job"] == "t"
    assert len(rt.raw) == n and rt.truncated_bytes == 0
    tr = trace.load(p)
    assert len(tr.ops) == 400 and tr.nodes == {0: "node-0", 1: "node-1"}
    assert (tr.ops["duration_ns"] == 500).all()


def test_trace_cut_at_50_random_offsets_keeps_every_complete_record(tmp_path):
    p = tmp_path / "t.c4d"
    _write_trace(p)
    blob = p.read_bytes()
    full = trace.read_raw(p).raw
    # where each record's bytes end in the file: frames are a 16-byte header + whole records
    body_start = blob.index(framing.SYNC)
    ends, pos = [], body_start
    while pos < len(blob):
        n = int.from_bytes(blob[pos + 8 : pos + 12], "little") // schema.RECORD_SIZE
        first = pos + framing.HEAD_BYTES
        ends += [first + (i + 1) * schema.RECORD_SIZE for i in range(n)]
        pos = first + n * schema.RECORD_SIZE
    assert len(ends) == len(full)
    rng = random.Random(7)
    cut_p = tmp_path / "cut.c4d"
    for off in sorted(rng.randrange(body_start, len(blob)) for _ in range(50)):
        cut_p.write_bytes(blob[:off])
        rt = trace.read_raw(cut_p)
        complete = sum(e <= off for e in ends)
        assert len(rt.raw) == complete
        assert not rt.damaged  # a cut is not damage
        assert rt.raw.tobytes() == full[:complete].tobytes()


def test_trace_cut_inside_header_is_a_clear_error(tmp_path):
    p = tmp_path / "t.c4d"
    _write_trace(p)
    blob = p.read_bytes()
    for off in (0, 5, 17, 30):
        (tmp_path / "h.c4d").write_bytes(blob[:off])
        with pytest.raises(trace.TraceError):
            trace.read_raw(tmp_path / "h.c4d")


def test_garbage_records_are_skipped_and_counted(tmp_path):
    p = tmp_path / "t.c4d"
    w = trace.TraceWriter(p)
    w.write(ops(5))
    junk = np.frombuffer(bytes(range(256)) * 2, dtype=schema.HEADER).copy()
    junk["kind"] = 999
    w.write(junk)
    w.write(ops(5, start_seq=5))
    w.close()
    rt = trace.read_raw(p)
    assert rt.skipped == 4 and len(rt.kinds[schema.Kind.OP]) == 10


def test_not_a_trace(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"hello world, not a trace at all")
    with pytest.raises(trace.TraceError, match="not a c4d trace"):
        trace.read_raw(p)
    with pytest.raises(trace.TraceError):
        trace.read_raw(tmp_path / "missing")
