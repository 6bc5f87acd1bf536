"""The nccl-tests parser against every real capture in tests/data/nccl-tests, and against the
layouts nccl-tests' util.cu can print that those captures don't show (built from its format
strings)."""

from __future__ import annotations

import json
import math

import pytest

from c4d.formats.nccl_tests import NcclTestsError, parse_file, parse_json, parse_text
from tests.conftest import nccl_tests_data

DATA = nccl_tests_data()
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"no nccl-tests captures at {DATA}")

# file -> (program, avg busbw, rows, first size, last size, wrong total, out of bounds, devices,
#          hosts, failures)
EXPECTED = {
    "nccl-tests-sample-1.txt": ("all_reduce_perf", 70.742, 31, 8, 8589934592, 0, 0, 16, 2, 0),
    "nccl-tests-sample-2.txt": (None, 1.15327, 31, 0, 1073741824, 0, 0, 2, 2, 0),
    "nccl-tests-sample-3.txt": ("all_reduce_perf", 4.79995, 25, 8, 134217728, 128, 4, 2, 2, 2),
    "nccl-tests-sample-5.txt": ("alltoall_perf", 0.0, 1, 33554432, 33554432, 0, 0, 1, 1, 0),
}


@needs_data
def test_every_sample_is_covered():
    assert sorted(p.name for p in DATA.glob("*.txt")) == sorted(EXPECTED)


@needs_data
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_samples(name):
    prog, avg, nrows, first, last, wrong, oob, ndev, nhosts, nfail = EXPECTED[name]
    runs = parse_file(DATA / name)
    assert len(runs) == 1
    run = runs[0]
    assert run.program == prog
    assert run.avg_busbw_gbs == pytest.approx(avg)
    assert len(run.rows) == nrows
    assert run.rows["size"].iloc[0] == first and run.rows["size"].iloc[-1] == last
    assert run.wrong_total == wrong
    assert run.out_of_bounds == oob
    assert len(run.devices) == ndev and len(run.hosts) == nhosts
    assert len(run.failures) == nfail
    # The trailer is the mean of every busbw printed; the printed values are rounded to 0.01.
    assert run.computed_avg_busbw_gbs == pytest.approx(avg, abs=0.01)
    json.dumps(run.to_dict())  # JSON-ready, NaN-free


@needs_data
def test_sample_details():
    s1 = parse_file(DATA / "nccl-tests-sample-1.txt")[0]
    assert s1.devices[8].host == "ztan-mig-gq73" and s1.devices[8].rank == 8 and s1.devices[8].device == 0
    assert s1.devices[0].name == "NVIDIA H100 80GB HBM3" and s1.devices[0].pci == "0000:04:00"
    assert s1.params["max_bytes"] == "8589934592" and s1.params["iters"] == "20"
    assert s1.params["warmup_iters"] == "5" and s1.params["agg_iters"] == "1"
    assert s1.rows["oop_time_us"].iloc[-3] == 12646  # "%.0f" fallback of getFloatStr
    assert s1.collective == "AllReduce"

    s2 = parse_file(DATA / "nccl-tests-sample-2.txt")[0]  # mpirun prefixes + NCCL INFO noise
    assert s2.nccl_version == "2.12.7+cuda11.4"
    assert s2.hosts == ["test-nccl-efa-worker-0", "test-nccl-efa-worker-1"]
    assert list(s2.rows["size"].head(3)) == [0, 0, 4]

    s3 = parse_file(DATA / "nccl-tests-sample-3.txt")[0]
    assert s3.version == "2.17.8" and s3.nccl_version == "2.29.2"
    bad = s3.rows[s3.rows["oop_wrong"] > 0]
    assert list(bad["size"]) == [1048576]
    assert bad["oop_wrong"].iloc[0] == 96 and bad["ip_wrong"].iloc[0] == 32
    assert s3.failures[0] == "gpu-1-1 pid 662195: Test failure common.cu:1189"

    s5 = parse_file(DATA / "nccl-tests-sample-5.txt")[0]
    assert s5.rows["redop"].iloc[0] == "none"
    assert math.isnan(s5.rows["ip_wrong"].iloc[0])  # "N/A"
    assert s5.rows["ip_algbw_gbs"].iloc[0] == 43046.10
    row = s5.to_dict()["rows"][0]
    assert row["in_place"]["wrong"] is None and row["out_of_place"]["wrong"] == 0


# Lines built with nccl-tests' own format strings: "%12li  %12li  %8s  %6s  %6s" + per block
# "  %7s  %6s  %6s  %6g".
def _row(size, count, t1, bw1, w1, t2, bw2, w2, root="-1", op="sum", typ="float"):
    return (
        f"{size:12d}  {count:12d}  {typ:>8s}  {op:>6s}  {root:>6s}"
        f"  {t1:>7s}  {bw1:>6s}  {bw1:>6s}  {w1:>6s}  {t2:>7s}  {bw2:>6s}  {bw2:>6s}  {w2:>6s}"
    )


# writeResultHeader's three lines.
HEADER = (
    "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place\n"
    "#       size         count      type   redop    root"
    "     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                          "
    "     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
)
PRE = (
    "# nThread 1 nGpus 8 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 "
    "agg iters: 1 validation: 1 graph: 0\n#\n"
)


def test_old_error_column_without_root():
    text = (
        PRE
        + "#       size         count      type   redop"
        + "     time   algbw   busbw  error     time   algbw   busbw  error\n"
        + "           8             2     float     sum"
        + "    30.01    0.00    0.00  0e+00    29.52    0.00    0.00  0e+00\n"
        + "          16             4     float     sum"
        + "    29.89    0.00    0.00  4e-07    29.90    0.00    0.00  0e+00\n"
        + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.00123 \n"
    )
    run = parse_text(text)[0]
    assert run.wrong_column == "error" and run.wrong_total is None
    assert run.rows["oop_error"].iloc[1] == pytest.approx(4e-07)
    assert run.rows["root"].isna().all()
    assert len(run.rows) == 2 and run.avg_busbw_gbs == pytest.approx(0.00123)


def test_cputime_timestamps_and_min_bw_flag():
    head = HEADER.replace("    time", " cputime").replace("#wrong\n", "#wrong            timestamp\n", 1)
    r = _row(8, 2, "10.00", "0.00", "0", "9.00", "0.00", "0") + "  2025-01-02 03:04:05\n"
    text = PRE + head + r + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0 FAILED\n"
    run = parse_text(text)[0]
    assert run.cputime and run.rows["timestamp"].iloc[0] == "2025-01-02 03:04:05"
    assert run.rows["oop_time_us"].iloc[0] == 10.0 and run.avg_busbw_flag == "FAILED"


def test_per_iteration_columns():
    head = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "    i_min    i_max    i_p99    i_cv%     time   algbw   busbw #wrong    i_min    i_max"
        "    i_p99    i_cv%\n"
    )
    row = (
        "        1024           256     float     sum      -1    10.00    0.10    0.19      0"
        "     9.00    11.00    11.00     3.00    10.50    0.10    0.18      0     9.50    11.50"
        "    11.50     4.00\n"
    )
    run = parse_text(PRE + head + row + "# Avg bus bandwidth    : 0.185 \n")[0]
    assert run.rows["oop_imax_us"].iloc[0] == 11.0 and run.rows["ip_icv_pct"].iloc[0] == 4.0
    assert run.to_dict()["rows"][0]["in_place"]["icv_pct"] == 4.0


def test_srun_labels_two_streams_and_truncation():
    a = [_row(8, 2, "10.00", "1.00", "0", "10.00", "1.00", "0")]
    stream0 = [PRE.splitlines()[0], *HEADER.splitlines(), *a, "# Avg bus bandwidth    : 1 "]
    stream1 = [
        PRE.splitlines()[0],
        *HEADER.splitlines(),
        _row(8, 2, "10.00", "3.00", "0", "10.00", "3.00", "0"),
    ]
    lines = []
    for i in range(max(len(stream0), len(stream1))):  # interleaved, like two processes' stdout
        if i < len(stream0):
            lines.append(f"0: {stream0[i]}")
        if i < len(stream1):
            lines.append(f"1: {stream1[i]}")
    runs = parse_text("\n".join(lines))
    assert len(runs) == 2
    assert runs[0].avg_busbw_gbs == 1.0 and runs[1].avg_busbw_gbs is None  # stream 1 cut short
    assert runs[1].rows["oop_busbw_gbs"].iloc[0] == 3.0


def test_two_runs_in_one_file_and_no_out_of_place_block():
    one = (
        PRE
        + HEADER
        + _row(8, 2, "5.00", "1.00", "0", "5.00", "1.00", "0")
        + "\n# Avg bus bandwidth    : 1 \n"
    )
    # writeBenchMarkLineNullBody: 32 blanks where the out-of-place block would be.
    replay = f"{16:12d}  {4:12d}  {'float':>8s}  {'none':>6s}  {'-1':>6s}" + " " * 32
    replay += f"  {'5.00':>7s}  {'2.00':>6s}  {'2.00':>6s}  {0:6g}"
    two = (
        "# nccl-tests version 2.17.8 nccl-headers=22902 nccl-library=22902\n"
        "# Collective test starting: all_gather_perf\n"
        + PRE
        + HEADER
        + replay
        + "\n"
        + "# Avg bus bandwidth    : 2 \n# Collective test concluded: all_gather_perf\n"
    )
    runs = parse_text("$ ./all_reduce_perf -b 8\n" + one + two)
    assert [r.program for r in runs] == ["all_reduce_perf", "all_gather_perf"]
    assert runs[1].collective == "AllGather" and runs[1].version == "2.17.8"
    assert math.isnan(runs[1].rows["oop_time_us"].iloc[0]) and runs[1].rows["ip_busbw_gbs"].iloc[0] == 2.0
    assert runs[1].to_dict()["rows"][0]["out_of_place"] is None


def test_no_result_is_an_error():
    with pytest.raises(NcclTestsError, match="no nccl-tests result"):
        parse_text("NCCL WARN something\nsegmentation fault\n")


def test_json_report():
    doc = {
        "version": 2,
        "args": ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-J", "out.json"],
        "nccl_version": 22703,
        "config": {
            "nthreads": 1,
            "ngpus": 1,
            "devices": [
                {
                    "rank": 0,
                    "group": 0,
                    "pid": 5,
                    "hostname": "n0",
                    "device": 0,
                    "device_hex": "0x1",
                    "device_info": "H100",
                }
            ],
        },
        "results": [
            {
                "size": 8,
                "count": 2,
                "type": "float",
                "redop": "sum",
                "root": "    -1",
                "out_of_place": {"time": 10.5, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
                "in_place": {"time": 10.1, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 3.0},
            }
        ],
        "out_of_bounds": {"count": 1, "okay": "false"},
        "average_bus_bandwidth": {"bandwidth": 0.0, "okay": "unchecked"},
    }
    run = parse_json(json.dumps(doc))
    assert run.program == "all_reduce_perf" and run.nccl_version == "2.27.3"
    assert run.devices[0].host == "n0" and run.rows["root"].iloc[0] == -1
    assert run.wrong_total == 3 and run.out_of_bounds == 1 and run.avg_busbw_gbs == 0.0
    with pytest.raises(NcclTestsError):
        parse_json("{not json")
