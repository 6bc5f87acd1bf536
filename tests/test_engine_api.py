"""The engine's contract: JSON shape, determinism (live vs replay slicing), bad input, config."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from factories import T0, Fault, Job, build_cached, replay

from c4d.engine import DiagKind, Engine, EngineConfig, Level
from c4d.engine.config import DEFAULT_HANG_TIMEOUT_US
from c4d.record import schema

HANG = Job(
    tp=2, pp=2, dp=4, ranks_per_node=4, steps=30, skew_ms=50.0, faults=[Fault("noncomm-hang", rank=6, step=8)]
)
SLOW = Job(
    tp=2, pp=1, dp=4, ranks_per_node=2, steps=90, skew_ms=50.0,
    faults=[Fault("noncomm-slow", rank=3, step=30, factor=3), Fault("comm-slow", rank=6, step=30, factor=3)],
)  # fmt: skip


def lines(diags) -> list[str]:
    return [json.dumps(d.to_json(), sort_keys=True) for d in diags]


@pytest.mark.parametrize("j", [HANG, SLOW], ids=["hang", "slow"])
def test_same_input_twice_gives_identical_json(j):
    model, batches = build_cached(j)
    a = replay(j, Engine, batches, model).diagnoses
    b = replay(j, Engine, batches, model).diagnoses
    assert a and lines(a) == lines(b)


@pytest.mark.parametrize("j", [HANG, SLOW], ids=["hang", "slow"])
def test_replay_slicing_does_not_change_the_diagnoses(j):
    """Live feeds one message at a time; `c4d analyze` feeds everything between two ticks at once."""
    model, batches = build_cached(j)
    live = replay(j, Engine, batches, model).diagnoses
    # regroup: one feed per tick interval, as analyze.replay does between TICK records
    tick = int(j.tick_ms * 1e6)
    groups: dict[int, list[np.ndarray]] = {}
    for t, b in batches:
        groups.setdefault(int(np.ceil(t / tick)), []).append(b)
    coarse = [(k * tick, np.concatenate(v)) for k, v in sorted(groups.items())]
    offline = replay(j, Engine, coarse, model).diagnoses
    assert lines(live) == lines(offline)
    kinds = {d.kind for d in live}
    assert kinds <= {DiagKind.RankNonCommHang, DiagKind.RankNonCommSlow, DiagKind.RankCommSlow}


def test_json_object_is_designs_shape():
    model, batches = build_cached(HANG)
    d = replay(HANG, Engine, batches, model).diagnoses[0]
    obj = json.loads(d.json_line())
    assert list(obj) == [
        "time",
        "level",
        "kind",
        "comm",
        "op",
        "seq",
        "ranks",
        "nodes",
        "hang_times",
        "detail",
        "localization",
    ]
    assert obj["level"] == "WARNING" and obj["kind"] == "RankNonCommHang"
    assert obj["ranks"] == [6] and obj["nodes"] == ["node-1"] and obj["hang_times"] == 1
    assert isinstance(obj["time"], float) and abs(obj["time"] - d.time_ns / 1e9) < 1e-6
    assert len(obj["comm"]) == 16 and int(obj["comm"], 16) == d.comm
    det = obj["detail"]
    for key in ("localized_by", "localized", "confidence", "suspects", "missing", "waited_s", "victims"):
        assert key in det, key
    loc = obj["localization"]
    assert loc["how"] == det["localized_by"] == "arrival" and loc["target"] == "rank" and loc["ranks"] == [6]
    assert loc["confidence"] == det["confidence"] and 0 <= loc["confidence"] <= 1
    assert loc["basis"].startswith("RankNonCommHang:arrival/rank") and loc["evidence"]
    assert "RankNonCommHang" in d.summary() and "rank 6" in d.summary()


def test_levels_and_kinds_are_documented_enums():
    assert Level.INFO < Level.WARNING < Level.ERROR
    assert {k.value for k in DiagKind} == {
        "RankNonCommHang", "RankCommHang", "RankNonCommSlow", "RankCommSlow", "RankLost",
        "CollectiveMismatch",
    }  # fmt: skip


def test_bad_input_is_dropped_and_counted_not_raised(caplog):
    eng = Engine()
    caplog.set_level(logging.WARNING, logger="c4d.engine")
    raw = np.zeros(6, schema.HEADER)
    raw["kind"] = [99, int(schema.Kind.OP), int(schema.Kind.OP), int(schema.Kind.HEARTBEAT), 2, 3]
    raw["version"] = [1, 1, 7, 1, 1, 1]  # a newer schema version
    raw["rank"] = [0, -5, 1, 2, 3, 4]
    op = raw.view(schema.OP)
    op["comm_id"][4] = 42
    op["comm_nranks"][4] = 4
    op["comm_rank"][4] = 9  # out of range
    hb = raw.view(schema.HEARTBEAT)
    hb["comm_id"][5] = 43
    hb["comm_nranks"][5] = 0  # no such size
    hb["comm_id"][3] = 44
    hb["comm_nranks"][3] = 2
    hb["comm_rank"][3] = 1
    eng.feed(raw, T0)
    eng.feed(np.zeros((2, 3), np.uint8), T0)  # not records at all
    eng.feed(np.zeros(0, schema.HEADER), T0)
    assert eng.tick(T0 + 10**9) == []
    assert eng.stats["invalid"] == 7
    assert len(eng.comms) == 1  # only the valid heartbeat created its communicator
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs and all("dropped" in m and "\n" not in m for m in msgs)
    # a changed communicator size is refused too
    hb["comm_nranks"][3] = 3
    eng.feed(raw[3:4], T0)
    eng.tick(T0 + 2 * 10**9)
    assert eng.stats["invalid"] == 8
    eng.state()  # and the live view still renders


def test_thresholds_come_from_registration_then_overrides():
    model, batches = build_cached(HANG)
    run = replay(HANG, Engine, batches, model)
    th = run.engine.thresholds()
    assert th.hang_timeout_ns == HANG.hang_timeout_us * 1000 and th.hang_times == HANG.hang_times
    assert th.heartbeat_ns == int(HANG.hb_ms * 1e6) and th.period_ns == HANG.period_s * 10**9
    assert Engine().thresholds().hang_timeout_ns == DEFAULT_HANG_TIMEOUT_US * 1000
    assert Engine(EngineConfig(hang_times=5)).thresholds().hang_times == 5


def test_slow_thresholds_from_env(caplog):
    cfg = EngineConfig.from_env(
        {"C4D_SLOW_MIN_OPS": "9", "C4D_SLOW_BW_RATIO": "0.3", "C4D_SLOW_LAST_FRAC": "x"}
    )
    assert cfg.slow_min_ops == 9 and cfg.slow_bw_ratio == 0.3
    assert cfg.slow_last_frac == EngineConfig().slow_last_frac  # malformed: default kept, one line logged
    assert any("C4D_SLOW_LAST_FRAC" in r.getMessage() for r in caplog.records)
    assert EngineConfig.from_env({}, hang_times=4).hang_times == 4


def test_state_lists_lost_ranks_and_comm_stats():
    j = Job(tp=2, pp=1, dp=4, ranks_per_node=2, steps=30, faults=[Fault("crash", rank=3, step=12)])
    model, batches = build_cached(j)
    run = replay(j, Engine, batches, model)
    snap = run.engine.state()
    assert snap.rank_states[3].value == "lost"
    assert [d.kind for d in snap.active] == [DiagKind.RankLost]
    tp = [c for c in snap.comms if c.kind == "TP"]
    dp = [c for c in snap.comms if c.kind == "DP"]
    assert len(tp) == 4 and len(dp) == 2
    assert all(c.busbw_gbs > 0 and c.xfer_med_us > 0 for c in tp + dp)
    # every communicator stalled after the crash: ops/s is over the last 5 s of master time
    assert all(c.ops_per_s == 0 for c in tp + dp)
    assert all(c.last_done_seq >= 0 for c in tp)


def test_c4d_analyze_replay_of_a_trace_gives_the_live_diagnoses(tmp_path):
    """The master's loop (trace + feed per message + TICK) vs c4d.analyze.replay of the file."""
    from c4d.offline.analyze import replay as analyze_replay
    from c4d.record.trace import TraceWriter, read_raw

    j = HANG
    model, batches = build_cached(j)
    path = tmp_path / "t.c4d"
    tw = TraceWriter(path, {})
    eng = Engine()
    live: list = []
    tick, end = int(j.tick_ms * 1e6), model.end_time + 1e9
    last, nxt, i = T0, tick, 0
    tw.tick(T0)
    live += eng.tick(T0)
    while nxt <= end:
        while i < len(batches) and batches[i][0] <= nxt:
            tw.write(batches[i][1])
            eng.feed(batches[i][1], last)
            i += 1
        last = int(T0 + nxt)
        tw.tick(last)
        live += eng.tick(last)
        nxt += tick
    tw.close()
    offline = analyze_replay(read_raw(path), Engine())
    assert live and lines(live) == lines(offline)


def test_snapshot_of_a_pipeline_communicator_reads_its_transfers():
    """The live view's row of a p2p-only communicator: its measured transfers' median time and
    bandwidth (Comm.p2p_recent), and how many it finished."""
    j = Job(tp=1, pp=2, dp=2, ranks_per_node=2, steps=20, skew_ms=5.0)
    model, batches = build_cached(j)
    eng = replay(j, Engine, batches, model).engine
    pp = [c for c in eng.state().comms if c.kind == "PP"]
    assert pp, [c.kind for c in eng.state().comms]
    for c in pp:
        assert c.p2p_done > 0 and c.xfer_med_us > 0 and c.xfer_p99_us >= c.xfer_med_us
        # bandwidth = bytes / transfer time: the stages' messages (factories.Job.pp_bytes)
        assert c.busbw_gbs * c.xfer_med_us * 1e3 == pytest.approx(j.pp_bytes, rel=0.05)
