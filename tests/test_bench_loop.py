"""analysis/bench_loop.py runs as documented: the loop's cost per record, this checkout's beside
another's (--baseline: here the same checkout, so the c4d each side measured is named)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_loop_measures_the_loop_beside_a_baseline():
    cmd = [sys.executable, str(ROOT / "analysis" / "bench_loop.py"), "--ranks", "1024", "--seconds", "1",
           "--from-s", "1", "--repeats", "1", "--per-poll", "32", "--baseline", str(ROOT),
           "--json"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    runs = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(runs) == 3  # the baseline before and after this checkout's
    for r in runs:
        assert r["ranks"] == 1024 and r["records"] > 0 and r["loop_us_per_record"] > 0
        assert Path(r["c4d"]) == ROOT
    assert runs[0]["records"] == runs[1]["records"] == runs[2]["records"]  # the same batches
