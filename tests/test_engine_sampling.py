"""The slow judge's bounded sample of each communicator's ops per window (c4d/engine/sampling.py):
bounded, spread over the whole window, the same ops whichever chunks bring them, and the same
verdicts from a sample as from every op."""

from __future__ import annotations

import numpy as np
import pytest
from factories import Fault, Job, run_cached

from c4d.engine import DiagKind
from c4d.engine.sampling import WindowSampler, sampled

P = 10_000_000_000  # a 10 s window, as a large job's


def _window(ops: int, w: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``ops`` ops of one communicator at a steady pace through window ``w``: (last arrival, seq)."""
    rng = np.random.default_rng(seed)
    la = w * P + np.sort(rng.integers(0, P, ops))
    return la, np.arange(w * ops, (w + 1) * ops)


def _select(s: WindowSampler, la, seq, cuts) -> np.ndarray:
    """The rows kept when the rows come in runs cut at ``cuts`` (one communicator, index 0)."""
    kept = []
    for a, z in zip([0, *cuts], [*cuts, len(la)], strict=True):
        got = s.select(la[a:z], seq[a:z], np.array([0]), np.array([0]), np.array([z - a]))
        kept.append(np.arange(a, z) if got is None else a + got[0])
    return np.concatenate(kept)


def _final(s: WindowSampler, la, seq, kept) -> np.ndarray:
    """The rows the judge takes: those kept, through their window's final sample."""
    keep = s.thin(0, seq[kept], la[kept] // P)
    return kept if keep is None else kept[keep]


def test_a_window_past_the_cap_keeps_a_bounded_sample_spread_over_the_whole_window():
    s = WindowSampler(cap=2048)
    s.period_ns = P
    la, seq = _window(5_000, w=2)
    _select(s, la, seq, [100, 2_500])  # the window before: its ops set this one's sample
    la, seq = _window(5_000, w=3, seed=1)
    kept = _select(s, la, seq, [100, 2_500, 4_000])
    assert int(s.shift[0]) == 2  # 5,000 ops: one in 4
    assert 1_000 <= len(kept) <= 1_500 and (_final(s, la, seq, kept) == kept).all()
    late = (la[kept] - 3 * P) >= P // 2  # as many from the window's second half as from its first
    assert abs(late.mean() - 0.5) < 0.05


def test_a_first_window_sampled_sparser_as_it_fills_is_judged_through_its_final_sample():
    """No window before: every op kept until the cap, then one in 2, 4, ... as the rows pass it
    again; the judge's rows are those of the final sample, from the whole window alike."""
    s = WindowSampler(cap=1_000)
    s.period_ns = P
    la, seq = _window(40_000, w=5)
    cuts = list(range(400, 40_000, 400))  # the agents' flushes
    kept = _select(s, la, seq, cuts)
    assert int(s.shift[0]) >= 5  # 40,000 ops: one in 32 at least
    assert len(kept) <= 4_000  # held while the window filled: the cap and half of it per doubling
    final = _final(s, la, seq, kept)
    assert 500 <= len(final) <= 1_000
    assert (final == np.flatnonzero(sampled(seq, int(s.shift[0])))).all()  # the same all through
    late = (la[final] - 5 * P) >= P // 2
    assert abs(late.mean() - 0.5) < 0.06


def test_the_same_ops_are_kept_whichever_chunks_bring_them():
    picks = []
    for cuts in ([], [1], [17, 18, 3_000], list(range(50, 5_000, 50))):
        s = WindowSampler(cap=1_000)
        s.period_ns = P
        la, seq = _window(5_000, w=2)
        _select(s, la, seq, [])
        la, seq = _window(5_000, w=3, seed=1)
        picks.append(seq[_final(s, la, seq, _select(s, la, seq, cuts))].tolist())
    assert all(p == picks[0] for p in picks[1:])


def test_a_window_the_communicator_joined_late_sets_the_next_ones_sample_by_its_pace():
    """A job that started 7.5 s into a 10 s window: the next window's sample from 1,750 ops in
    2.5 s (7,000 a window: one in 8), not from 1,750 (one in 2)."""
    s = WindowSampler(cap=1_000)
    s.period_ns = P
    la, seq = _window(7_000, w=1)
    late = la >= P + 3 * P // 4
    _select(s, la[late], seq[late], [])
    la, seq = _window(7_000, w=2)
    _select(s, la[:100], seq[:100], [])
    assert int(s.shift[0]) == 3


def test_under_the_cap_every_op_is_kept_and_each_communicator_has_its_own_sample():
    s = WindowSampler(cap=2_048)
    s.period_ns = P
    for w in (0, 1):  # the window before sets each one's sample
        la_a, seq_a = _window(1_000, w=w)
        la_b, seq_b = _window(50_000, w=w)
        la, seq = np.concatenate([la_a, la_b]), np.concatenate([seq_a, seq_b])
        got = s.select(la, seq, np.array([4, 9]), np.array([0, 1_000]), np.array([1_000, 51_000]))
    assert got is not None
    rows, counts = got
    assert counts[0] == 1_000 and (rows[:1_000] == np.arange(1_000)).all()  # communicator 4: all
    assert int(s.shift[4]) == 0 and int(s.shift[9]) == 5 and 1_000 < counts[1] <= 2_048  # one in 32
    assert WindowSampler(cap=0).select(la, seq, np.array([0]), np.array([0]), np.array([len(la)])) is None


FAULTS = [Fault("comm-slow", rank=5, step=40, factor=3.0), Fault("noncomm-slow", rank=6, step=40, factor=3.0)]


@pytest.mark.parametrize("fault", [*FAULTS, None], ids=["comm-slow", "noncomm-slow", "clean"])
def test_a_sample_of_one_op_in_eight_or_more_gives_the_verdicts_of_every_op(fault):
    j = Job(tp=2, pp=2, dp=4, ranks_per_node=4, steps=120, skew_ms=50.0, period_s=1,
            faults=[fault] if fault else [])  # fmt: skip
    every = run_cached(j, slow_window_ops=0)
    sampled = run_cached(j, slow_window_ops=8)
    assert int(sampled.engine._pool.sampler.shift.max()) >= 3
    want = {"comm-slow": DiagKind.RankCommSlow, "noncomm-slow": DiagKind.RankNonCommSlow}
    for run in (every, sampled):
        if fault is None:
            assert run.diagnoses == [], [d.summary() for d in run.diagnoses]
        else:
            assert {(d.kind, d.ranks) for d in run.diagnoses} == {(want[fault.kind], (fault.rank,))}

    def first(run):
        return [round(d.time - run.onset_s(), 1) for d in run.diagnoses[:1]]

    assert first(sampled) == first(every)
