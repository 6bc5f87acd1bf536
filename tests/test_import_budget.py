"""Imports that stream or refuse (issue 41): every hostile file of tests/hostile_files.py, at a size
that runs in seconds, is refused with one line (exit 1) or read within its budget, measured on a real
``c4d analyze`` child (wall time, peak RSS from wait4); well-formed input around it loses nothing.

The RSS bounds are the budget plus what ``c4d analyze`` takes with nothing read (the interpreter,
numpy, pandas: ~120 MiB) and a margin for the 1 MiB between two checks.
"""

from __future__ import annotations

import gzip
import json
import os

import hostile_files as h
import pytest

from c4d.formats.budget import MAX_LINE_BYTES, Budget, BudgetError, HostileFile, LineReader
from c4d.formats.detect import load_any
from c4d.record.schema import Kind

BASE_MIB = 200  # c4d analyze with nothing read, and slack for a loaded machine


def _one_line_error(r: dict, *words: str) -> None:
    assert r["rc"] == 1, r
    assert len(r["stderr"]) == 1, r["stderr"]
    for w in words:
        assert w in r["stderr"][0], r["stderr"]


def test_a_pickle_whose_shared_list_makes_the_walk_quadratic_is_refused_fast(tmp_path):
    d = tmp_path / "fr"
    d.mkdir()
    h.fr_shared_list(d / "nccl_trace_rank_0", entries=20_000, width=20_000)  # 0.1 MB; old: > 120 s
    r = h.measure(d, timeout=60)
    _one_line_error(r, "expands to more than", "not read")
    assert r["wall_s"] < 30 and r["peak_rss_mib"] < BASE_MIB, r


def test_a_pickle_of_references_to_one_entry_is_refused_by_the_budget(tmp_path):
    d = tmp_path / "fr"
    d.mkdir()
    h.fr_many_refs(d / "nccl_trace_rank_0", refs=1_000_000)  # 2 MB of pickle, 1 M entries
    r = h.measure(d, "--max-import-bytes", "256M", timeout=120)
    _one_line_error(r, "1,000,000 entries", "--max-import-bytes")
    assert r["peak_rss_mib"] < 256 + BASE_MIB and r["wall_s"] < 60, r


def test_a_pickle_that_builds_far_more_than_it_weighs_is_stopped_while_it_builds(tmp_path):
    d = tmp_path / "fr"
    d.mkdir()
    h.fr_empty_sets(d / "nccl_trace_rank_0", n=4_000_000)  # 4 MB: ~1 GB of empty sets
    r = h.measure(d, timeout=120)
    _one_line_error(r, "unpickling it built", "not read")
    assert r["peak_rss_mib"] < 64 * 4 + 64 + BASE_MIB, r


def test_a_gzip_bomb_is_refused_and_the_good_logs_beside_it_are_read(tmp_path):
    bomb = h.inspector_gz_bomb(tmp_path / "bomb.log.gz", inflated=100 << 20)
    r = h.measure(bomb, timeout=60)
    _one_line_error(r, "gzip inflates over 100 times")
    assert r["peak_rss_mib"] < BASE_MIB and r["wall_s"] < 30, r
    # beside a good log: the bomb is one warning, the good log's records are all read
    good = tmp_path / "dir"
    good.mkdir()
    bomb.rename(good / "bomb.log.gz")
    h.inspector_long_line(good / "good.log", line_bytes=10, good=40)
    warns: list[str] = []
    rt = load_any(good, on_warning=warns.append)
    assert rt.meta["inspector"]["records"] == 40
    assert sum("gzip inflates" in w for w in warns) == 1


def test_one_line_over_the_limit_is_one_warning_and_every_good_line_is_kept(tmp_path):
    p = h.inspector_long_line(tmp_path / "long.log", line_bytes=50 << 20, good=100)
    r = h.measure(p, timeout=60)
    assert r["rc"] in (0, 2), r
    assert sum("over 1.0 MiB skipped (first at line 51)" in x for x in r["stderr"]) == 1, r["stderr"]
    assert r["peak_rss_mib"] < BASE_MIB, r  # the old reader held the whole line: 727 MB at 200 MB
    rt = load_any(p)
    assert rt.meta["inspector"]["records"] == 100


@pytest.mark.slow
def test_nccl_tests_text_is_read_line_by_line(tmp_path):
    # 30 MB of log noise around 4 rows: memory stays flat, the rows are all there
    p = h.nccl_tests_text(tmp_path / "noise.txt", size=30 << 20, rows=False, tail_rows=4)
    r = h.measure(p, timeout=300)
    assert r["rc"] in (0, 2) and r["peak_rss_mib"] < BASE_MIB, r
    rt = load_any(p)
    assert (
        rt.meta["nccl_tests"]["runs"] == 1 and len(rt.kinds[Kind.OP]) == 2 * 4 * 2
    )  # 2 ranks, 4 rows, 2 blocks
    # rows past the budget: refused with one line, within it
    p = h.nccl_tests_text(tmp_path / "rows.txt", size=30 << 20)
    r = h.measure(p, "--max-import-bytes", "64M", timeout=300)
    _one_line_error(r, "rows.txt, line", "--max-import-bytes")
    assert r["peak_rss_mib"] < 64 + BASE_MIB, r


def test_the_time_budget_refuses_with_one_line(tmp_path):
    p = h.nccl_tests_text(tmp_path / "noise.txt", size=200 << 20, rows=False)
    r = h.measure(p, "--max-import-seconds", "1", timeout=120)
    _one_line_error(r, "time budget of 1 s", "--max-import-seconds")
    assert r["wall_s"] < 30, r


@pytest.mark.slow
def test_the_python_api_takes_the_same_budget(tmp_path):
    p = h.nccl_tests_text(tmp_path / "rows.txt", size=4 << 20)
    with pytest.raises(BudgetError, match="--max-import-bytes"):
        load_any(p, max_bytes=8 << 20)
    with pytest.raises(BudgetError, match="--max-import-seconds"):
        load_any(p, max_seconds=1e-9)
    assert load_any(p, max_bytes=1 << 30).meta["nccl_tests"]["runs"] == 1
    with pytest.raises(ValueError):
        load_any(p, max_bytes=0)


# ------------------------------------------------------------------------------ the line reader
@pytest.mark.parametrize("gz", [False, True])
def test_line_reader_gives_every_line_across_chunks_and_skips_long_ones(tmp_path, gz):
    rnd = os.urandom(1 << 20).hex().encode()  # compresses 2 to 1, as a log would at most 20 to 1
    lines = [rnd[:n] for n in (0, 1, 5, (1 << 20) - 3, 7, (1 << 20) + 5, 3)] + [rnd[:100]] * 30000
    data = b"\n".join(lines)  # no newline at the end: the last line still counts
    p = tmp_path / ("f.gz" if gz else "f")
    p.write_bytes(gzip.compress(data) if gz else data)
    rd = LineReader(p, Budget())
    got = list(rd)
    assert got == [x for x in lines if len(x) <= MAX_LINE_BYTES]
    assert rd.too_long == 1 and rd.first_too_long == 6
    assert "1 line(s) over 1.0 MiB skipped (first at line 6)" in (rd.warning() or "")


def test_line_reader_reads_concatenated_and_cut_gzip(tmp_path):
    p = tmp_path / "f.gz"
    p.write_bytes(gzip.compress(b"one\ntwo\n") + gzip.compress(b"three\n"))
    assert list(LineReader(p, Budget())) == [b"one", b"two", b"three"]
    whole = gzip.compress(b"".join(b"line %d\n" % i for i in range(20000)))
    p.write_bytes(whole[: len(whole) // 2])  # cut: what came before the cut is kept
    got = list(LineReader(p, Budget()))
    assert 0 < len(got) < 20000 and got[0] == b"line 0"


def test_line_reader_refuses_a_bomb_early(tmp_path):
    p = tmp_path / "b.gz"
    p.write_bytes(gzip.compress(b"\n" * (50 << 20)))
    rd = LineReader(p, Budget())
    with pytest.raises(HostileFile, match="inflates over 100 times"):
        for _ in rd:
            pass
    assert rd.bytes_out < 4 << 20


def test_a_json_report_is_parsed_whole_only_within_the_budget(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"results": [{"size": 8, "count": 2}] * 100000, "config": {}}))
    with pytest.raises(BudgetError, match="JSON report"):
        load_any(p, fmt="nccl-tests", max_bytes=16 << 20)
