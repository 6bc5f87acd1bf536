"""Issue 3 and 9 acceptance: the scenario matrix and the issue-9 cases on real simulated jobs
(processes, shim, simnccl, ZeroMQ, master, engine). Thresholds: T = 1 s, C4D_HANG_TIMES = 3,
check period 1 s (c4d.sim.scenarios).

Slow kinds' target is two periods from the onset (docs/design.md). The jobs share two cores with
their master, and a window the host takes from the job can hide a slowdown for a period (CI
once named two of them 3.3 and 3.6 s after onset, one window later than their rules, in the
same minute): each run must name it within three periods + 1 s; at most a quarter of the
matrix's slow cases may take longer than two + 1 s (a rule a window slower would move most of
them past it), and their median is within two.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from c4d.engine import EngineConfig
from c4d.sim import scenarios

T = 1.0
TIMES = 3
PERIOD = 1.0
MATRIX = scenarios.matrix(full=False)
# a slow rank in pure data parallel; rank vs link for comm-hang and comm-slow in rings of 4 and
# 8; the issue's rank-7 case; a mismatch deadlock (scenarios.issue9_cases)
ISSUE9 = scenarios.issue9_cases()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, libc4d, simtrain):
    cache: dict[str, scenarios.Outcome] = {}

    def get(sc: scenarios.Scenario) -> scenarios.Outcome:
        if sc.name not in cache:
            cache[sc.name] = scenarios.run(sc, tmp_path_factory.mktemp("scn"))
        return cache[sc.name]

    return get


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("sc", MATRIX + ISSUE9, ids=[s.name for s in MATRIX + ISSUE9])
def test_scenario(sc, outcomes):
    o = outcomes(sc)
    if sc.fault is None:
        assert o.status == 0, o.stderr[-2000:]
        assert o.diagnoses == [], "a clean jittery run must raise nothing"
        return
    said = [(d["level"], d["kind"], d["ranks"]) for d in o.diagnoses]
    assert o.correct, f"expected {sc.expected_kind} naming {sorted(sc.expected_ranks)}; got {said}"
    assert not o.wrong, f"only the injected kind and culprit may be named; got {said}"
    for d in o.correct:
        assert set(d["nodes"]) == sc.expected_nodes
    if sc.expected_kind in scenarios.HANG_KINDS:
        levels = [d["level"] for d in o.correct]
        assert "WARNING" in levels and "ERROR" in levels
        assert levels.index("WARNING") < levels.index("ERROR")
        assert o.status == 2, "the sim stops on the ERROR"
        if sc.expected_kind in scenarios.ISOLATING_KINDS:
            # an ERROR isolates only hardware named at C4D_ISOLATE_CONFIDENCE (detail.isolates): a
            # link nothing tells from its ends names both nodes, sure of neither; never a healthy node
            isolating = [d for d in o.correct if d["level"] == "ERROR" and d["detail"].get("isolates")]
            assert sorted(o.blacklist) == (sorted(sc.expected_nodes) if isolating else [])
            if sc.expected_kind in ("RankNonCommHang", "RankLost"):
                assert isolating, "a rank that stopped or died is named sure enough to isolate"
        else:  # a mismatch is a program bug: every rank of its cycle named, no node taken out
            assert o.blacklist == []
            assert all(d["localization"]["cycle"] for d in o.correct)
        assert o.latency("WARNING") <= T + 1.0
        assert o.latency("ERROR") <= T * TIMES + 1.0
    else:
        assert o.blacklist == [], "INFO findings do not isolate nodes"
        assert o.latency("INFO") <= 3 * PERIOD + 1.0, _when(o)


def _when(o: scenarios.Outcome) -> str:
    """What a latency failure needs to be read: each finding's window and when it was said."""
    return "; ".join(
        f"{d['level']} {d['kind']} {d['ranks']} at +{d['time'] - (o.onset_s or 0):.2f} s"
        f" (window from +{d['detail'].get('window_start_s', 0) - (o.onset_s or 0):.2f} s)"
        for d in o.correct
    )


SLOW = [s for s in MATRIX + ISSUE9 if s.fault and s.expected_kind not in scenarios.HANG_KINDS]


@pytest.mark.serial
@pytest.mark.slow
def test_slow_kinds_are_named_within_two_periods_but_for_a_few(outcomes):
    late = {sc.name: outcomes(sc).latency("INFO") for sc in SLOW}
    assert None not in late.values(), late
    beyond = {k: v for k, v in late.items() if v is not None and v > 2 * PERIOD + 1.0}
    assert len(beyond) <= len(late) // 4, beyond
    assert statistics.median(v for v in late.values() if v is not None) <= 2 * PERIOD, late


FAULTY = [s for s in MATRIX + ISSUE9 if s.fault]


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("sc", FAULTY, ids=[s.name for s in FAULTY])
def test_offline_replay_gives_the_live_diagnoses(sc, outcomes):
    o = outcomes(sc)
    p = subprocess.run([sys.executable, "-m", "c4d", "analyze", o.trace_path, "--json"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    offline = [json.loads(line) for line in p.stdout.splitlines()]
    assert p.returncode == (2 if any(d["level"] != "INFO" for d in offline) else 0), p.stderr  # docs/cli.md
    assert offline == o.diagnoses


# Pure data parallel with several ranks a node: the ring runs in rank order, so a rank at a
# node's edge has one ring link across nodes and one inside its node. NCCL reports per-peer
# progress for network transfers only (docs/real-nccl.md), and a slowed link inside a node can
# stay faster than the network links that pace the ring (scenarios.slow_effect).
DP_STEPS = scenarios.SLOW_STEPS + 100  # one communicator: a few clean windows are its baseline
DP_EDGE = scenarios.Scenario(12, 3, 1, 1, "comm-slow@rank=11,step=120,factor=3", steps=DP_STEPS)
DP_INNER = scenarios.Scenario(8, 4, 1, 1, "comm-slow@rank=5,step=120,factor=3", steps=DP_STEPS)


@pytest.mark.serial
@pytest.mark.slow
def test_comm_slow_rank_at_a_node_edge_in_pure_data_parallel_is_named_by_its_one_visible_link(outcomes):
    """Rank 11's only network link, 11 -> 0, paces the ring 3x slower; a fault of rank 0 would
    look the same. Every verdict names that link, its ends as the alternatives nothing visible
    tells it from (the sender's own transfer time
    picks it in every op: no window falls back to all twelve ranks as suspects), within two
    check periods, and nothing else is named."""
    assert scenarios.slow_effect(DP_EDGE, DP_EDGE.fault) == pytest.approx(3.0)
    o = outcomes(DP_EDGE)
    said = [(d["level"], d["kind"], d["ranks"], d["localization"]["target"]) for d in o.diagnoses]
    assert o.diagnoses and all(d["kind"] == "RankCommSlow" for d in o.diagnoses), said
    for d in o.diagnoses:
        loc = d["localization"]
        assert sorted(d["ranks"]) == [0, 11] and loc["target"] == "link", said
        assert loc["how"] == "peer-progress" and loc["basis"].endswith("/equivalent"), loc
        assert set(loc["alternatives"]) == {"rank 0", "rank 11"}, loc
        assert d["detail"]["slow_links"] == ["11->0"]
        # the model says 1/3 (the ring's pace); simnccl's own copies and barriers on 2 cores
        # dilute it (0.38-0.39 measured on a quiet host, 0.46 once on a loaded CI host with the
        # verdict right): every verdict has it below the slow line
        assert d["detail"]["ratio"] < EngineConfig().slow_bw_ratio, d["detail"]
    first = min(d["time"] for d in o.diagnoses)
    assert o.onset_s is not None and first - o.onset_s <= 2 * PERIOD + 1.0
    assert o.blacklist == []
    # read off the trace alone: the job's all-reduces slowed past the engine's 2x line
    slowed = o.slowdowns[DP_EDGE.fault]
    assert slowed is not None and 2.0 < slowed < 3.3, slowed


@pytest.mark.serial
@pytest.mark.slow
def test_comm_slow_rank_inside_a_node_that_does_not_slow_the_ring_is_not_reported(outcomes):
    """Rank 5's ring links (4 -> 5, 5 -> 6) stay inside node 1 and, slowed 3x, still move data
    faster than the network links that pace the ring: the job loses nothing, and nothing is
    named (the benchmark counts such a fault unobservable, scenarios.slow_effect)."""
    assert scenarios.slow_effect(DP_INNER, DP_INNER.fault) == 1.0
    o = outcomes(DP_INNER)
    assert o.status == 0 and o.diagnoses == [], [(d["kind"], d["ranks"]) for d in o.diagnoses]
    slowed = o.slowdowns[DP_INNER.fault]  # the trace agrees: the all-reduces took as long as before
    assert slowed is not None and slowed < 1.25, slowed
