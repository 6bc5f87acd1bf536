"""Golden traces: recorded sim jobs (tests/golden/*.c4d.gz) and the diagnoses the engine gave
them when they were recorded. A replay = live test cannot see an engine change that shifts
both alike; these can: any change of a verdict (time, level, kind, culprit, how it was
localized) fails here until the goldens are re-recorded on purpose (tests/golden/make_golden.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from tests.golden import make_golden

GOLDEN = Path(make_golden.__file__).resolve().parent
NAMES = sorted(p.name.removesuffix(".expected.json") for p in GOLDEN.glob("*.expected.json"))


def test_every_case_is_recorded():
    assert sorted(make_golden.CASES) == NAMES


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_replay_gives_the_recorded_diagnoses(name, tmp_path):
    expected = json.loads((GOLDEN / f"{name}.expected.json").read_text())
    path = tmp_path / f"{name}.c4d"
    with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    got = make_golden.diagnose(path)
    assert got == expected["diagnoses"], f"{expected['scenario']}: the engine's verdicts changed"


def test_the_goldens_say_what_their_faults_are():
    """The recorded verdicts are right, not only stable: each names its injected culprit."""
    for name in NAMES:
        exp = json.loads((GOLDEN / f"{name}.expected.json").read_text())
        sc = make_golden.CASES[name]
        ds = exp["diagnoses"]
        if sc.fault is None:
            assert ds == [], name
            continue
        assert ds and all(d["kind"] == sc.expected_kind for d in ds), name
        assert any(set(d["ranks"]) == sc.expected_ranks for d in ds), name
