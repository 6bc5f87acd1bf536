"""The soak's smoke run (analysis/soak.py --quick): 8 simnccl ranks and a 256-rank synthetic stream,
each with its own real master, about a minute; the 10-minute run's figures are in docs/performance.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[1] / "analysis" / "soak.py"


@pytest.mark.slow
def test_quick_soak_diagnoses_every_fault_and_nothing_before():
    r = subprocess.run(
        [sys.executable, str(SOAK), "--quick", "--json"], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.splitlines()[-1])
    assert res["ok"] and res["quick"]
    for part in ("sim", "synthetic"):
        assert [d for d in res[part]["clean_diagnoses"] if d["level"] != "INFO"] == []
        assert all(f["diagnosed"] for f in res[part]["faults"]), res[part]["faults"]
        assert res[part]["master_slope_kib_per_min"] is not None
    kinds = {f["kind"] for part in ("sim", "synthetic") for f in res[part]["faults"]}
    assert kinds == {"RankNonCommSlow", "RankCommSlow", "RankNonCommHang", "RankLost"}
    assert res["synthetic"]["records"] > 10_000
