"""Staged hang thresholds in the engine (c4d/engine/stage.py): STAGE records from a rank that
said ``with c4d.hang_timeout(s):`` change how its RankNonCommHang is counted.

Factory-built streams (tests/factories.py) of an 8-rank job whose rank 5 stops computing at
step 10, T = 1 s, C4D_HANG_TIMES = 3; STAGE records are added as the shim sends them.
"""

from __future__ import annotations

import numpy as np
from factories import MS, T0, Fault, Job, build_cached, replay

from c4d.engine import DiagKind, Engine, EngineConfig, Level
from c4d.engine.stage import Stages
from c4d.record import schema

R = 5


def job(tail_s: float = 8.0) -> Job:
    return Job(tp=1, pp=1, dp=8, ranks_per_node=4, steps=30, hang_timeout_us=1_000_000, hang_times=3,
               tail_s=tail_s, faults=[Fault("noncomm-hang", rank=R, step=10)])  # fmt: skip


def stage_row(rank: int, timeout_us: int, gen: int) -> np.ndarray:
    a = np.zeros(1, schema.STAGE)
    a["kind"], a["version"], a["rank"] = schema.Kind.STAGE, schema.SCHEMA_VERSION, rank
    a["time_ns"], a["hang_timeout_us"], a["generation"] = T0, timeout_us, gen
    return a.view(schema.HEADER)


def run_with(stages: list[tuple[float, int]], j: Job | None = None):
    """Replay with STAGE records of rank R at (seconds after the hang began, timeout µs)."""
    j = j or job()
    model, batches = build_cached(j)
    extra = [(model.hang_start + s * 1e9, stage_row(R, us, n + 1)) for n, (s, us) in enumerate(stages)]
    merged = sorted(batches + extra, key=lambda x: x[0])
    return replay(j, lambda: Engine(EngineConfig()), merged, model), model


def hangs(run):
    return [d for d in run.diagnoses if d.kind is DiagKind.RankNonCommHang]


def since_hang(d, model) -> float:
    return (d.time_ns - T0 - model.hang_start) / 1e9


def test_without_a_stage_the_hang_is_diagnosed_after_T():
    run, model = run_with([])
    hs = hangs(run)
    assert hs and hs[0].level is Level.WARNING and hs[0].ranks == (R,)
    assert 0.9 <= since_hang(hs[0], model) <= 2.0
    assert any(d.level is Level.ERROR for d in hs)


def test_minus_one_disables_hang_diagnosis_while_it_lasts():
    run, _ = run_with([(-0.5, -1)])  # set just before the rank's long "evaluation" began
    assert hangs(run) == [], [d.summary() for d in run.diagnoses]


def test_a_longer_staged_timeout_delays_the_diagnosis_to_it():
    run, model = run_with([(-0.5, 3_000_000)], job(tail_s=12.0))
    hs = hangs(run)
    assert hs, "a real hang inside a staged phase is still a hang"
    first = hs[0]
    assert (
        first.level is Level.WARNING and first.detail["timeout_s"] == 3.0 and first.detail["staged_timeout"]
    )
    assert 2.9 <= since_hang(first, model) <= 4.0
    err = next(d for d in hs if d.level is Level.ERROR)
    assert 8.9 <= since_hang(err, model) <= 10.0  # 3 x the staged 3 s


def test_after_the_stage_ends_the_hang_is_counted_from_its_end():
    run, model = run_with([(-0.5, -1), (4.0, 0)], job(tail_s=10.0))
    hs = hangs(run)
    assert hs, "the rank still does not arrive after its phase: a hang"
    # T after the stage ended (as stamped: the tick before its record arrived, ≤ 0.2 s early), not at once
    assert 4.75 <= since_hang(hs[0], model) <= 6.0
    assert hs[0].detail["waited_s"] >= 4.7  # the real wait is reported
    assert hs[0].detail["timeout_s"] == 1.0


def test_repeats_and_late_older_values_do_not_change_the_stage():
    st = Stages()
    rows = np.concatenate([stage_row(3, -1, 2), stage_row(3, 0, 1), stage_row(3, -1, 2)]).view(schema.STAGE)
    st.feed(rows, np.array([10, 20, 30]) * MS)
    assert st.staged() == {3: -1.0}
    assert st.adjust((3,), 1000 * MS, 0, 50 * MS) is None
    assert st.adjust((4,), 1000 * MS, 7, 50 * MS) == (1000 * MS, 7)  # another rank: untouched
    st.feed(stage_row(3, 0, 3).view(schema.STAGE), np.array([40 * MS]))
    assert st.staged() == {} and st.adjust((3,), 1000 * MS, 0, 50 * MS) == (1000 * MS, 40 * MS)


def test_with_several_culprits_the_unstaged_one_keeps_T():
    st = Stages()
    st.feed(stage_row(3, 60_000_000, 1).view(schema.STAGE), np.array([0]))
    # rank 3 is in a 60 s phase, rank 4 has no stage: their joint hang counts with rank 4's T
    assert st.adjust((3, 4), 1000 * MS, 0, 5000 * MS) == (1000 * MS, 0)
    assert st.adjust((3,), 1000 * MS, 0, 5000 * MS) == (60_000 * MS, 0)
