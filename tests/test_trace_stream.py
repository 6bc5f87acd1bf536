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

from c4d.offline import analyze
from c4d.record import framing, schema, trace
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


# -- report, export and load in bounded memory; a directory of node traces ------------------


def _split_by_node(src: Path, out: Path) -> list[str]:
    """What ``c4d agent --trace`` leaves on each node, made from a master's trace: each node's
    ranks' records, in arrival order, and the master's TICKs (an agent ticks at its flushes)."""
    from c4d.record import names

    out.mkdir()
    rt = trace.read_raw(src)
    raw = rt.raw
    regs = raw[raw["kind"] == schema.Kind.REGISTER].view(schema.DTYPES[schema.Kind.REGISTER])
    node = {
        int(r): names.clean(bytes(n))
        for r, n in zip(regs["rank"].tolist(), regs["node"].tolist(), strict=True)
    }
    nodes = sorted(set(node.values()))
    writers = [
        trace.TraceWriter(out / f"{n}.c4d", {"command": "agent", "created_ns": rt.meta["created_ns"]})
        for n in nodes
    ]
    of = np.array([nodes.index(node.get(int(r), nodes[0])) for r in raw["rank"].tolist()])
    prev = 0
    ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK).tolist()
    for i in [*ticks, len(raw)]:
        for k, w in enumerate(writers):
            part = raw[prev:i][of[prev:i] == k]
            if len(part):
                w.write(part)
            if i < len(raw):
                w.tick(int(raw["time_ns"][i]))
        prev = i + 1
    for w in writers:
        w.close()
    return nodes


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*c4d_cmd(), *args], capture_output=True, text=True, timeout=300)


def test_a_directory_of_node_traces_is_analyzed_as_one_job(tmp_path):
    """One trace per node (as agents write them), merged by time in a stream: the same
    diagnoses as the master's one trace, and report and export read the directory too."""
    p = _golden("comm-hang-rank", tmp_path)  # 4 nodes
    d = tmp_path / "nodes"
    nodes = _split_by_node(p, d)
    assert len(nodes) >= 2
    (d / "README").write_text("not a trace: ignored")
    whole, merged = _run("analyze", str(p), "--json"), _run("analyze", str(d), "--json")
    assert merged.returncode == whole.returncode and merged.stdout == whole.stdout, merged.stderr
    assert merged.stdout.strip()
    # the records are the same (order within a tick's batch aside), and so are the TICKs' times
    a, b = trace.read_raw(p).raw, trace.read_raw(d).raw
    tick = schema.Kind.TICK

    def rows(x: np.ndarray) -> list[bytes]:
        x = x[x["kind"] != tick]
        return sorted(x.tobytes()[i : i + 128] for i in range(0, x.nbytes, 128))

    assert rows(a) == rows(b)
    assert (a["time_ns"][a["kind"] == tick] == b["time_ns"][b["kind"] == tick]).all()
    # pieces as small as a frame: each node's file is read a little at a time
    st_ = trace.open_stream(d, chunk_bytes=1 << 12)
    assert isinstance(st_, trace.TraceSet) and all(s.chunk_bytes == 64 << 10 for s in st_.streams)
    diags = analyze.replay_chunks(st_.chunks(), analyze.make_engine(), int(st_.meta["created_ns"]))
    assert [json.dumps(x.to_json()) for x in diags] == merged.stdout.splitlines()
    r = _run("report", str(d), "-o", str(tmp_path / "rep"))
    assert r.returncode == 0 and (tmp_path / "rep" / "report.html").exists(), r.stderr
    e = _run("export", str(d), str(tmp_path / "ops.parquet"))
    assert e.returncode == 0, e.stderr
    import pandas as pd

    assert len(pd.read_parquet(tmp_path / "ops.parquet")) == len(trace.load(p).ops)
    empty = tmp_path / "empty"
    empty.mkdir()
    for cmd in (["analyze", str(empty)], ["export", str(empty), str(tmp_path / "x.parquet")]):
        r = _run(*cmd)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_streamed_report_below_keep_is_the_whole_loads(tmp_path):
    from c4d.offline import report

    p = _golden("comm-slow-rank", tmp_path)
    tr = analyze.load(p)
    want = report.from_trace(tr)
    got, _ = report.from_stream(p, chunk_bytes=1 << 14)
    assert not got.stats.folded and got.stats.rows == int(tr.ops_split["wait_ns"].notna().sum())
    assert (got.n_ops, got.nodes, got.diagnoses) == (want.n_ops, want.nodes, want.diagnoses)
    assert [i.row() for i in got.incidents] == [i.row() for i in want.incidents]
    import pandas as pd

    pd.testing.assert_frame_equal(got.stats.wait_transfer(), want.stats.wait_transfer())
    for (n1, p1, b1), (n2, p2, b2) in zip(got.stats.busbw(), want.stats.busbw(), strict=True):
        assert n1 == n2 and len(p1) == len(p2)
        pd.testing.assert_series_equal(b1, b2, check_index_type=False)
    g1, g2 = report._lateness_grid(got, [], 60), report._lateness_grid(want, [], 60)
    assert g1[0] == g2[0] and g1[1] == g2[1]
    np.testing.assert_allclose(g1[3], g2[3], rtol=1e-12, atol=1e-15)  # the same rows, summed in another order


def test_folded_report_holds_no_more_than_it_may_and_draws_close(tmp_path):
    """Past ``keep`` rows the report keeps histograms and cells, never the rows: with keep=500,
    pieces of 16 KiB and 100 dots per op kind, nothing held comes near the trace's size, and
    the pictures' figures stay within the histograms' precision."""
    from c4d.offline import report

    p = _golden("comm-slow-rank", tmp_path)
    want = report.from_trace(analyze.load(p))
    got, sp = report.from_stream(p, chunk_bytes=1 << 14, keep=500)
    got.stats.max_points = 100
    st = got.stats
    assert st.folded and st.rows > 5 * 500
    assert st.max_buffered <= 500 + 64 * 8  # keep, plus one tick's split rows at most
    assert sp.largest_piece * schema.RECORD_SIZE <= 2 * (1 << 14) < p.stat().st_size / 10
    a, b = st.wait_transfer(), want.stats.wait_transfer()
    assert list(a.index) == list(b.index)
    np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=0.04)
    for (n1, _, b1), (n2, _, b2) in zip(st.busbw(), want.stats.busbw(), strict=True):
        assert n1 == n2 and list(b1.index) == list(b2.index)
        np.testing.assert_allclose(b1.to_numpy(), b2.to_numpy(), rtol=0.02)
    # the extra compute folded into cells keeps each rank's sum and count exactly
    _, _, lat = st.lateness_cells()
    per_rank = lat.groupby("rank")[["sum", "n"]].sum()
    ex = report.extra_compute(want.stats.frame()).groupby("rank")["extra_ms"].agg(["sum", "count"])
    np.testing.assert_allclose(per_rank["sum"], ex["sum"], rtol=1e-9, atol=1e-9)
    assert (per_rank["n"].to_numpy() == ex["count"].to_numpy()).all()
    assert lat.groupby("rank").size().max() <= 2 * st.bins
    ranks, _, _, grid = report._lateness_grid(got, [], 60)
    assert 30 <= grid.shape[1] <= 60 and len(ranks) == grid.shape[0]
    out = report.write(got, tmp_path / "rep")
    assert "1 incident(s)" in out["html"].read_text()


def test_thinned_bus_bandwidth_dots_stay_a_sample(tmp_path):
    from c4d.offline import report

    p = _golden("comm-slow-rank", tmp_path)
    stats = report.ReportStats(keep=10, max_points=100)
    got, _ = report.from_stream(p, chunk_bytes=1 << 14, keep=10)
    stats = got.stats
    stats2 = report.ReportStats(keep=10, max_points=100)
    sp = analyze.StreamPass(p, (), on_split=stats2.add_split)
    for _ in sp.frames():
        pass
    stats2.finish()
    for name, pts, _ in stats2.busbw():
        assert 25 <= len(pts) <= 100, (name, len(pts))
    assert sum(len(x[1]) for x in stats.busbw()) > sum(len(x[1]) for x in stats2.busbw())


def test_streamed_export_is_the_whole_export_and_the_join_waits_little(tmp_path):
    import pandas as pd

    p = _golden("comm-slow-rank", tmp_path)
    tr = analyze.load(p)
    want = analyze.parquet_frame(tr.ops_split, "ops")
    sp = analyze.to_parquet(p, tmp_path / "ops.parquet", chunk_bytes=1 << 14)
    got = pd.read_parquet(tmp_path / "ops.parquet")
    assert sp.rows_written == len(got) == len(want) and list(got.columns) == list(want.columns)
    key = ["rank", "comm_id", "seq", "peer", "time_ns"]
    pd.testing.assert_frame_equal(
        got.sort_values(key).reset_index(drop=True),
        want.sort_values(key).reset_index(drop=True),
        check_dtype=False,
    )
    assert sp.join.expired == 0 and sp.join.max_held < len(want) / 10
    for table in ("heartbeats", "registrations", "diagnoses"):
        analyze.to_parquet(p, tmp_path / f"{table}.parquet", table, chunk_bytes=1 << 14)
        want = analyze.parquet_frame(tr.table(table), table)
        got = pd.read_parquet(tmp_path / f"{table}.parquet")
        assert len(got) == len(want) and list(got.columns) == list(want.columns), table


def test_the_join_lets_go_of_rows_past_its_bounds():
    """An op row whose split does not come within the window (or past max_pending rows) goes
    out with NaN split columns and is counted: the join never holds more than it may."""
    import pandas as pd

    ops = pd.DataFrame(
        {"rank": [0, 1, 0], "comm_id": np.array([7, 7, 7], np.uint64), "seq": [1, 1, 2],
         "comm_rank": [0, 1, 0], "peer": [-1, -1, -1], "flags": [0, 0, 0], "compute_ns": [5.0, 6.0, 7.0]}
    )  # fmt: skip
    j = analyze.OpsJoin(window_ns=100, max_pending=1)
    j.add_ops(ops, fed_ns=1_000)
    split = np.zeros(2, analyze.OP_SPLIT)
    split["comm_id"], split["seq"], split["comm_rank"], split["peer"] = 7, 1, [0, 1], -1
    split["wait_ns"] = [3.0, 0.0]
    j.add_split(split)
    out = j.resolve(now_ns=1_050)
    assert list(out["seq"]) == [1, 1] and list(out["wait_ns"]) == [3.0, 0.0] and j.held == 1
    assert list(out.columns[: len(ops.columns)]) == list(ops.columns)
    out = j.resolve(now_ns=1_200)  # seq 2 waited past the window
    assert list(out["seq"]) == [2] and out["wait_ns"].isna().all() and j.expired == 1 and j.held == 0
    j.add_ops(ops, fed_ns=2_000)
    out = j.resolve(now_ns=2_000)  # three rows, room for one: the two oldest go
    assert list(out["rank"]) == [0, 1] and j.held == 1 and j.expired == 3


def test_a_selected_load_holds_the_selection_and_the_whole_jobs_diagnoses(tmp_path):
    import pandas as pd

    p = _golden("comm-slow-rank", tmp_path)
    tr = analyze.load(p)
    full = tr.ops_split
    sel = analyze.load(p, ranks=[1, 2])
    pd.testing.assert_frame_equal(sel.ops_split, full[full["rank"].isin([1, 2])].reset_index(drop=True))
    pd.testing.assert_frame_equal(sel.ops, tr.ops[tr.ops["rank"].isin([1, 2])].reset_index(drop=True))
    assert [d.to_json() for d in sel.diagnoses_list()] == [d.to_json() for d in tr.diagnoses_list()]
    assert set(sel.heartbeats["rank"]) == {1, 2} and set(sel.nodes) == {1, 2}
    comm = int(full["comm_id"].iloc[0])
    t0 = int(tr.meta["created_ns"])
    mid = float((full["time_ns"].astype("int64").median() - t0) / 1e9)
    sel = analyze.load(
        p, comms=[f"{comm:016x}"], start_s=mid, columns=["rank", "seq", "comm_id", "time_ns", "wait_ns"]
    )
    want = full[(full["comm_id"] == comm) & ((full["time_ns"].astype("int64") - t0) >= int(mid * 1e9))]
    assert list(sel.ops_split.columns) == ["rank", "time_ns", "comm_id", "seq", "wait_ns"]
    assert 0 < len(sel.ops_split) == len(want) < len(full) / 2
    np.testing.assert_array_equal(sel.ops_split["wait_ns"], want["wait_ns"])
    chunks = list(analyze.iter_table(p, "heartbeats", ranks=[3], chunk_bytes=1 << 14))
    assert len(chunks) > 1 and all(set(c["rank"]) == {3} for c in chunks)
    assert sum(map(len, chunks)) == int((tr.heartbeats["rank"] == 3).sum())
    with pytest.raises(ValueError, match="selection needs a c4d trace"):
        analyze.load(GOLDEN / "clean.expected.json", ranks=[1])


@pytest.mark.slow
def test_report_memory_does_not_follow_the_trace(tmp_path):
    """Python's own count of what the streamed report allocates (numpy and pandas report to
    tracemalloc) stays far below what the whole load allocates on the same 8 MiB trace."""
    import sys
    import tracemalloc

    sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
    import bench_analyze

    from c4d.offline import report

    p = tmp_path / "t.c4d"
    bench_analyze.write_trace(p, 8, 8)
    tracemalloc.start()
    try:
        inp, _ = report.from_stream(p, chunk_bytes=256 << 10, keep=5000)
        _, streamed = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        tr = analyze.load(p)
        tr.ops_split  # noqa: B018
        _, whole = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert inp.stats.folded and inp.n_ops == len(tr.ops)
    assert streamed < whole / 2 and streamed < 2 * p.stat().st_size, (streamed, whole, p.stat().st_size)
