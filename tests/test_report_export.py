"""Issue 4: `c4d report` pictures, pandas API, Parquet export and Prometheus metrics on a real sim trace."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pandas as pd
import pytest

from c4d import analyze, trace
from tests.conftest import c4d_cmd, free_port, metrics_text, wait_for

SLOW_RANK = 5


def run_c4d(*args: str, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "c4d", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def slow_trace(tmp_path_factory, libc4d, simtrain):
    path = tmp_path_factory.mktemp("rep") / "slow.c4d"
    p = run_c4d(
        "sim",
        "--ranks",
        "8",
        "--ranks-per-node",
        "4",
        "--tp",
        "2",
        "--pp",
        "2",
        "--steps",
        "150",
        "--fault",
        f"noncomm-slow@rank={SLOW_RANK},step=10,factor=4",
        "--trace",
        str(path),
        env={"C4D_CONN_BW_CHECK_PERIOD": "1"},
    )
    assert p.returncode == 0, p.stderr
    return path


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_report_writes_plots_and_a_page_naming_the_culprit(slow_trace, tmp_path):
    out = tmp_path / "report"
    p = run_c4d("report", str(slow_trace), "-o", str(out))
    assert p.returncode == 0, p.stderr
    for name in ("lateness", "wait_transfer", "busbw", "diagnoses"):
        png = out / f"{name}.png"
        w, h = _png_size(png)
        assert w >= 800 and h >= 300 and png.stat().st_size > 10_000, name
    page = (out / "report.html").read_text()
    assert "RankNonCommSlow" in page and f"rank {SLOW_RANK} (node-1)" in page
    assert page.count("data:image/png;base64,") == 4  # self-contained


def test_lateness_picture_blames_the_slow_rank_not_its_partners(slow_trace):
    """Rank 5 computes 4x longer; its pipeline partner (rank 1: same dp and tp index, stage 0)
    arrives late only because it waited for rank 5, so it must not be painted like the culprit."""
    import matplotlib.pyplot as plt

    from c4d import report

    tr = analyze.load(slow_trace)
    ex = report.extra_compute(tr.ops_split)  # the engine's compute per rank and op
    per_rank = ex[ex["arrive_s"] > ex["arrive_s"].quantile(0.5)].groupby("rank")["extra_ms"].median()
    assert per_rank.idxmax() == SLOW_RANK
    assert per_rank[1] < 0.2 * per_rank[SLOW_RANK], per_rank.to_dict()
    inp = report.from_trace(tr)
    # the busbw plot draws its medians (one marker per size, visible with a single size)
    fig = report.busbw_by_size_figure(inp)
    medians = [ln for ln in fig.axes[0].get_lines() if ln.get_label().endswith(" median")]
    assert {ln.get_label() for ln in medians} >= {"AllReduce median", "AllGather median"}
    assert all(ln.get_marker() == "D" and len(ln.get_xdata()) >= 1 for ln in medians)
    plt.close(fig)
    # the diagnoses plot labels culprit ranks with integers only
    fig = report.diagnosis_timeline_figure(inp)
    ticks = [float(t) for t in fig.axes[0].get_yticks()]
    culprits = sorted({r for d in inp.diagnoses for r in d["ranks"]})
    assert SLOW_RANK in culprits and ticks == [float(r) for r in culprits]
    plt.close(fig)


def test_pandas_api_columns_and_dtypes(slow_trace):
    tr = analyze.load(slow_trace)
    ops = tr.ops_split
    for col, kind in [
        ("rank", "i"),
        ("comm_id", "u"),
        ("seq", "u"),
        ("bytes", "u"),
        ("start_ns", "u"),
        ("wait_ns", "f"),
        ("transfer_ns", "f"),
        ("busbw_gbs", "f"),
        ("lateness_ns", "f"),
    ]:
        assert ops[col].dtype.kind == kind, col
    assert ops["op_name"].isin(["AllReduce", "AllGather", "ReduceScatter", "Send", "Recv"]).all()
    late = ops.dropna(subset=["lateness_ns"]).groupby("rank")["lateness_ns"].median()
    assert late.idxmax() == SLOW_RANK
    d = tr.diagnoses
    assert list(d.columns[:4]) == ["time", "level", "kind", "comm"]
    assert (d["kind"] == "RankNonCommSlow").any()
    assert all(r == [SLOW_RANK] for r in d[d["kind"] == "RankNonCommSlow"]["ranks"])


def test_ops_split_is_the_engines_own_split(slow_trace):
    """One wait/transfer computation: ops_split carries exactly the engine's per-rank rows, so
    the report and the metrics agree with the diagnoses (clock offsets included)."""
    tr = analyze.load(slow_trace)
    ops = tr.ops_split
    _, split = analyze.run_engine(tr.raw)
    coll = ops[(ops["flags"].astype(int) & 4) == 0].dropna(subset=["wait_ns"])
    assert len(coll) > 0.9 * ((ops["flags"].astype(int) & 4) == 0).sum()  # nearly every collective
    eng = pd.DataFrame({k: split[k] for k in ("comm_id", "seq", "comm_rank", "wait_ns", "transfer_ns")})
    eng = eng[split["peer"] == -1]
    m = coll.merge(eng, on=["comm_id", "seq", "comm_rank"], suffixes=("", "_engine"))
    assert len(m) == len(coll)
    assert (m["wait_ns"] == m["wait_ns_engine"]).all() and (m["transfer_ns"] == m["transfer_ns_engine"]).all()
    assert (coll["wait_ns"] >= 0).all()
    # every op's last arriver waited 0, and all members of an op share its transfer
    per_op = coll.groupby(["comm_id", "seq"])
    assert (per_op["wait_ns"].min() == 0).all()
    assert (per_op["transfer_ns"].nunique() == 1).all()
    # the p2p transfers the engine could measure carry a transfer and no wait
    p2p = ops[(ops["flags"].astype(int) & 4) != 0]
    assert p2p["wait_ns"].isna().all()


def test_the_record_loader_knows_no_engine(slow_trace):
    tr = trace.load(slow_trace)
    assert len(tr.ops) and tr.nodes
    with pytest.raises(AttributeError, match=r"c4d\.analyze\.load"):
        tr.ops_split  # noqa: B018


def test_export_parquet_roundtrip(slow_trace, tmp_path):
    out = tmp_path / "ops.parquet"
    p = run_c4d("export", str(slow_trace), str(out))
    assert p.returncode == 0, p.stderr
    back = pd.read_parquet(out)
    assert len(back) == len(trace.load(slow_trace).ops)
    assert {"wait_ns", "transfer_ns", "busbw_gbs"} <= set(back.columns)
    p = run_c4d("export", str(slow_trace), str(tmp_path / "d.parquet"), "--table", "diagnoses")
    assert p.returncode == 0, p.stderr


def test_offline_commands_reject_garbage_with_one_line(tmp_path):
    bad = tmp_path / "garbage.bin"
    bad.write_bytes(os.urandom(4096))
    for cmd in ("analyze", "report", "export"):
        args = [cmd, str(bad)] + ([str(tmp_path / "o.parquet")] if cmd == "export" else [])
        p = run_c4d(*args)
        assert p.returncode != 0
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_prometheus_metrics_during_a_run(tmp_path, libc4d, simtrain):
    port = free_port()
    proc = subprocess.Popen(
        c4d_cmd(
            "sim",
            "--ranks",
            4,
            "--ranks-per-node",
            2,
            "--steps",
            100000,
            "--max-seconds",
            60,
            "--metrics-port",
            port,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        want = ("c4d_transfer_seconds_count", "c4d_busbw_gbs{")
        body = wait_for(lambda: metrics_text(port, *want), 60, "metrics with collectives", interval=0.3)
        assert 'c4d_records_total{kind="op"}' in body
        assert "c4d_wait_seconds_bucket" in body and "c4d_records_dropped 0.0" in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
