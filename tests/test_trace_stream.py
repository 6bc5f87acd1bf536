"""Reading a trace in pieces: the same records, cuts, skips and damage as reading it whole, the
same diagnoses from a replay fed piece by piece, the same summary table, and ``c4d analyze`` of a
trace whose memory does not grow with the file.

Traces are written by the real TraceWriter (tests/test_trace_framing.py's hang job, the golden sim
recordings); damage is made by flipping, inserting and cutting bytes of real files.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from c4d import analyze, framing, schema, trace
from tests.conftest import c4d_cmd
from tests.test_trace_framing import GOLDEN_V1, _hang_job, _write

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def hang_trace(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("stream") / "hang.c4d"
    _write(p, _hang_job())
    return p


def _scan_in_pieces(body: bytes, cuts: list[int]) -> framing.Scan:
    sc = framing.Scanner()
    parts: list[np.ndarray] = []
    prev = 0
    for c in [*sorted(cuts), len(body)]:
        parts += sc.feed(body[prev:c])
        prev = c
    parts += sc.feed(b"", final=True)
    return sc.result(np.concatenate(parts) if parts else np.empty(0, schema.HEADER))


def _same(a: framing.Scan, b: framing.Scan) -> None:
    assert a.records.tobytes() == b.records.tobytes()
    assert (a.frames, a.damaged, a.cut_records, a.truncated_bytes) == (
        b.frames,
        b.damaged,
        b.cut_records,
        b.truncated_bytes,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    damage=st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete"]), st.floats(0, 1)), max_size=4),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
def test_scanner_in_any_pieces_equals_scan_of_the_whole(hang_trace, data, damage, cut):
    raw = hang_trace.read_bytes()
    head = trace._PREFIX.size + trace._PREFIX.unpack(raw[: trace._PREFIX.size])[2]
    body = bytearray(raw[head:])
    for what, where in damage:
        at = min(int(where * len(body)), len(body) - 1)
        if what == "flip":
            body[at] ^= 0x40
        elif what == "insert":
            body[at:at] = b"\x89"
        else:
            del body[at : at + 7]
    if cut is not None:
        body = body[: int(cut * len(body))]
    body = bytes(body)
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    _same(_scan_in_pieces(body, cuts), framing.scan(body))


def test_a_piece_per_byte_region_and_a_sync_split_across_pieces(hang_trace):
    raw = hang_trace.read_bytes()
    head = trace._PREFIX.size + trace._PREFIX.unpack(raw[: trace._PREFIX.size])[2]
    body = bytearray(raw[head:])
    s = body.find(framing.SYNC, 1000)
    body[s + 20] ^= 1  # a damaged frame; the search for the next SYNC crosses piece ends
    body = bytes(body)
    nxt = body.find(framing.SYNC, s + 1)
    cuts = [s + 3, s + 17, nxt + 3, nxt + 5] + list(range(0, len(body), 4093))
    got, whole = _scan_in_pieces(body, cuts), framing.scan(body)
    _same(got, whole)
    assert len(whole.damaged) == 1 and whole.damaged[0][0] == s


@pytest.mark.parametrize("chunk", [128, 4096, 1 << 20])
def test_stream_reads_what_read_raw_reads(hang_trace, tmp_path, chunk):
    broken = tmp_path / "broken.c4d"
    b = bytearray(hang_trace.read_bytes())
    b[len(b) // 3] ^= 0xFF  # damage in a frame
    b = b[: len(b) - 70]  # and a cut in the last one
    broken.write_bytes(bytes(b))
    for p in (hang_trace, broken, GOLDEN_V1):
        whole = trace.read_raw(p)
        st_ = trace.TraceStream(p, chunk_bytes=chunk)
        got = np.concatenate(list(st_.chunks()))
        assert got.tobytes() == whole.raw.tobytes()
        assert (st_.truncated_bytes, st_.skipped, st_.damaged) == (
            whole.truncated_bytes,
            whole.skipped,
            whole.damaged,
        )
        assert st_.meta == whole.meta and st_.format_version == whole.format_version
    assert trace.TraceStream(broken).damaged == [] and trace.read_raw(broken).damaged  # known once read


def _golden(name: str, tmp_path: Path) -> Path:
    p = tmp_path / f"{name}.c4d"
    p.write_bytes(gzip.decompress((GOLDEN / f"{name}.c4d.gz").read_bytes()))
    return p


@pytest.mark.parametrize("name", ["comm-hang-rank", "noncomm-slow-dp", "mismatch", "clean"])
def test_replay_in_pieces_gives_the_replay_of_the_whole(name, tmp_path):
    if not (GOLDEN / f"{name}.c4d.gz").exists():
        pytest.skip(f"no golden {name}")
    p = _golden(name, tmp_path)
    rt = trace.read_raw(p)
    whole = analyze.replay(rt, analyze.make_engine())
    st_ = trace.TraceStream(p, chunk_bytes=1 << 14)  # many pieces, ticks falling anywhere in them
    pieces = analyze.replay_chunks(st_.chunks(), analyze.make_engine(), int(st_.meta.get("created_ns", 0)))
    assert [d.to_json() for d in pieces] == [d.to_json() for d in whole]


def test_stream_summary_is_the_summary_and_goes_approximate_within_two_percent(tmp_path):
    p = _golden("comm-slow-rank", tmp_path)
    tr = trace.load(p)
    want = analyze.summary(tr)
    exact = analyze.StreamSummary()
    for raw in trace.TraceStream(p, chunk_bytes=1 << 14).chunks():
        exact.add(raw)
    got = exact.frame()
    assert not exact.approximate and exact.n_ops == len(tr.ops) and exact.nodes == tr.nodes
    assert (
        got[["comm", "op", "ranks", "ops", "bytes"]]
        .astype(str)
        .equals(want[["comm", "op", "ranks", "ops", "bytes"]].astype(str))
    )
    np.testing.assert_allclose(got[["median_us", "p99_us"]], want[["median_us", "p99_us"]], rtol=1e-12)
    approx = analyze.StreamSummary(keep=10)
    for raw in trace.TraceStream(p, chunk_bytes=1 << 14).chunks():
        approx.add(raw)
    a = approx.frame()
    assert approx.approximate
    assert (
        a[["comm", "op", "ranks", "ops", "bytes"]]
        .astype(str)
        .equals(want[["comm", "op", "ranks", "ops", "bytes"]].astype(str))
    )
    for col in ("median_us", "p99_us"):
        for x, y in zip(a[col], want[col], strict=True):
            assert (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 0.02 * y + 1e-3, (col, x, y)


def test_cli_analyze_streams_and_reports_as_before(hang_trace, tmp_path):
    """The streamed ``c4d analyze`` names the hung rank (exit 2), --json gives the replay's
    diagnoses, and damage still needs --allow-damaged."""
    rt = trace.read_raw(hang_trace)
    want = [d.to_json() for d in analyze.replay(rt, analyze.make_engine())]
    p = subprocess.run(
        [*c4d_cmd(), "analyze", str(hang_trace), "--json"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, p.stderr
    got = [json.loads(line) for line in p.stdout.splitlines()]
    assert got == json.loads(json.dumps(want))
    assert any(d["kind"] == "RankNonCommHang" and d["ranks"] == [5] for d in got)
    p = subprocess.run([*c4d_cmd(), "analyze", str(hang_trace)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "RankNonCommHang" in p.stdout and "ops on" in p.stdout, p.stdout + p.stderr
    broken = tmp_path / "broken.c4d"
    b = bytearray(hang_trace.read_bytes())
    b[len(b) // 2] ^= 0xFF
    broken.write_bytes(bytes(b))
    p = subprocess.run(
        [*c4d_cmd(), "analyze", str(broken), "--json"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1 and p.stdout == "" and "--allow-damaged" in p.stderr
    p = subprocess.run(
        [*c4d_cmd(), "analyze", str(broken), "--json", "--allow-damaged"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode in (0, 2) and "damaged batch" in p.stderr
    bad = tmp_path / "bad.c4d"
    bad.write_bytes(b"C4DTRACE" + bytes(random.Random(1).randrange(256) for _ in range(40)))
    p = subprocess.run([*c4d_cmd(), "analyze", str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
