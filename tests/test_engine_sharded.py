"""An engine sharded by communicator gives one engine's diagnoses (c4d/engine/shards.py,
docs/engine-shards.md: the proof of equivalence): every golden trace and jobs of every fault
kind, direct and through node agents, replayed through ``Engine`` and through ``ShardedEngine``
with 1, 2 and 3 shards (3: a shard that holds few or none of a job's communicators), the
diagnoses compared field for field and the live view's state at the end; shards in processes
of their own give the same; a shard that dies is said, not hidden."""

from __future__ import annotations

import functools
import gzip
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.engine import Engine, EngineConfig, chunking
from c4d.engine.shards import ShardedEngine, ShardGone
from c4d.intake.ingest import Ingest
from c4d.master.engine_process import EngineProcess
from c4d.master.master import MAX_AUTO_SHARDS, MasterConfig, engine_shards, engine_shards_from_env
from c4d.offline import analyze
from c4d.record import schema, trace
from tests.conftest import wait_for
from tests.factories import Fault, Job, as_master, build_cached, replay
from tests.golden import make_golden
from tests.masterproc import MasterProc, descendants_named, hang_named_live, replay_killing

GOLDEN = Path(make_golden.__file__).resolve().parent
NAMES = sorted(p.name.removesuffix(".expected.json") for p in GOLDEN.glob("*.expected.json"))


def _golden(name: str, tmp_path: Path) -> trace.RawTrace:
    path = tmp_path / f"{name}.c4d"
    with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    return trace.read_raw(path)


T0 = 1_000_000_000_000


@functools.cache
def _golden_rows(name: str) -> np.ndarray:
    """A golden trace's records, its TICKs left out (read once for every example)."""
    with tempfile.TemporaryDirectory() as d:
        rt = _golden(name, Path(d))
    return rt.raw[rt.raw["kind"] != schema.Kind.TICK]


def _json(ds) -> list[dict]:
    return [d.to_json() for d in ds]


def _replay(rt: trace.RawTrace, eng) -> list[dict]:
    """``analyze.replay``, which counts an engine's exception and goes on: none may happen."""
    ingest = Ingest(eng)
    out = _json(analyze.replay(rt, eng, ingest))
    assert not ingest.failures, ingest.failures
    return out


@pytest.mark.parametrize("chunk", [chunking.CHUNK, 100])
@pytest.mark.parametrize("name", NAMES)
def test_a_golden_trace_through_shards_gives_one_engines_diagnoses(name, chunk, tmp_path, monkeypatch):
    """(``chunk`` 100 rows: a tick's records in several chunks, each sent to the shards while
    the join reads the next, its clock steps applied after: one engine's order.)"""
    monkeypatch.setattr(chunking, "CHUNK", chunk)
    rt = _golden(name, tmp_path)
    cfg = EngineConfig.from_env()
    one = Engine(cfg)
    want = _replay(rt, one)
    assert one._index.late == 0  # every communicator numbered at its chunk's start (new_in)
    for k in (1, 2, 3):
        eng = ShardedEngine(cfg, shards=k)
        assert _replay(rt, eng) == want, f"{name} through {k} shard(s)"
        assert eng.state() == one.state(), f"{name}: the live view through {k} shard(s)"
        assert eng.stats == one.stats


def _job(shape: str, *faults: Fault, **kw) -> Job:
    shapes = {
        "tp2pp2dp4": dict(tp=2, pp=2, dp=4, ranks_per_node=4),
        "tp4dp4": dict(tp=4, pp=1, dp=4, ranks_per_node=8),
        "dp8": dict(tp=1, pp=1, dp=8, ranks_per_node=2),
    }
    return Job(**{**shapes[shape], "steps": 120, **kw}, faults=list(faults))


JOBS = {
    "comm-slow-rank": _job("tp2pp2dp4", Fault("comm-slow", rank=5, step=40, factor=3.0)),
    "comm-slow-link": _job("dp8", Fault("comm-slow", link=(3, 4), step=40, factor=3.0)),
    "noncomm-slow": _job("tp4dp4", Fault("noncomm-slow", rank=6, step=40, factor=3.0)),
    "comm-hang": _job("tp4dp4", Fault("comm-hang", rank=9, step=30), steps=60),
    "noncomm-hang": _job("tp2pp2dp4", Fault("noncomm-hang", rank=3, step=30), steps=60),
    "crash": _job("tp2pp2dp4", Fault("crash", rank=12, step=30), steps=60),
    "clean-skewed": _job("tp4dp4", skew_ms=50.0, steps=80),
}


@pytest.mark.parametrize("chunk", [chunking.CHUNK, 100])
@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_job_through_shards_gives_one_engines_diagnoses(name, chunk, monkeypatch):
    monkeypatch.setattr(chunking, "CHUNK", chunk)
    job = JOBS[name]
    model, batches = build_cached(job)
    one = replay(job, lambda: Engine(EngineConfig(hang_timeout_us=job.hang_timeout_us)), batches, model)
    assert one.diagnoses or name.startswith("clean"), "the fault gave no diagnosis to compare"
    for k in (2, 3):
        eng = ShardedEngine(EngineConfig(hang_timeout_us=job.hang_timeout_us), shards=k)
        got = replay(job, lambda eng=eng: eng, batches, model)
        assert _json(got.diagnoses) == _json(one.diagnoses), f"{name} through {k} shards"
        assert eng.state() == one.engine.state()


@pytest.mark.parametrize("name", ["comm-slow-rank", "noncomm-hang", "clean-skewed"])
def test_node_agents_summaries_through_shards_give_one_engines_diagnoses(name):
    """Node-local communicators come as agents' summaries (OPSUM): kept by their shard, their
    members' reports and the clock's zero steps handed to the join."""
    job = JOBS[name]
    _, batches = build_cached(job)
    want, _ = as_master(job, batches, agents=True, hang_timeout_us=job.hang_timeout_us)
    assert want or name.startswith("clean")
    got, _ = as_master(job, batches, agents=True, hang_timeout_us=job.hang_timeout_us,
                       engine_factory=lambda cfg: ShardedEngine(cfg, shards=2))  # fmt: skip
    assert _json(got) == _json(want)


def test_shards_in_processes_of_their_own_give_the_same(tmp_path):
    rt = _golden("comm-slow-rank", tmp_path)
    cfg = EngineConfig.from_env()
    want = _replay(rt, Engine(cfg))
    eng = ShardedEngine(cfg, shards=2, processes=True)
    try:
        assert _replay(rt, eng) == want
    finally:
        eng.close()


def test_a_shard_process_that_dies_is_said_at_the_next_call(tmp_path):
    rt = _golden("clean", tmp_path)
    eng = ShardedEngine(EngineConfig.from_env(), shards=2, processes=True)
    try:
        eng.feed(rt.raw[:1000], 1)
        eng.tick(2)
        victim = eng._shards[1]._proc  # (the test kills one shard's process)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        with pytest.raises(ShardGone, match=r"shard's process .* died"):
            eng.feed(rt.raw[1000:2000], 3)
            eng.tick(4)
    finally:
        eng.close()


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=0, max_size=64 * 128), st.integers(0, 2**32 - 1))
def test_damaged_records_through_shards_are_dropped_and_counted_as_one_engine_counts(junk, seed):
    """A golden job's rows with damaged records among them (random bytes, and real records with
    random fields: kinds, ranks, sizes, communicators) through one engine and through 3 shards:
    nothing raised, the same counts of rows taken and dropped, the same diagnoses."""
    rng = np.random.default_rng(seed)
    rows = _golden_rows("comm-slow-rank")[:4000].copy()
    n = len(junk) // schema.RECORD_SIZE
    bad = np.frombuffer(junk[: n * schema.RECORD_SIZE], schema.HEADER).copy()
    hit = rng.choice(len(rows), size=min(40, len(rows)), replace=False)
    body = rows.view(np.uint8).reshape(len(rows), schema.RECORD_SIZE)
    at = rng.integers(0, schema.RECORD_SIZE, len(hit))
    body[hit, at] = rng.integers(0, 256, len(hit), dtype=np.uint8)
    mixed = np.concatenate([rows[:2000], bad, rows[2000:]])
    out = []
    for eng in (Engine(EngineConfig()), ShardedEngine(EngineConfig(), shards=3)):
        ds = []
        for k, part in enumerate(np.array_split(mixed, 8)):
            eng.feed(part, T0 + k * 200_000_000)
            ds += eng.tick(T0 + (k + 1) * 200_000_000)
        out.append((_json(ds), dict(eng.stats), eng.drops()))
    assert out[0] == out[1]


# -- in the master: c4d master --engine-shards ----------------------------------------------
def _shard_pids(pid: int) -> list[int]:
    return descendants_named(pid, "c4d.engine.shards")


def test_an_engine_process_with_shards_gives_one_engines_diagnoses(tmp_path):
    """The engine's process hosts the join, its shards are processes of their own; the
    answers are one engine's, field for field, in order."""
    rt = _golden("comm-hang-link", tmp_path)
    here = _replay(rt, analyze.make_engine())
    ep = EngineProcess(shards=2)
    try:
        wait_for(lambda: len(_shard_pids(ep._proc.pid)) == 2, 60, "two shard processes")
        there = [d.to_json() for d in analyze.replay(rt, ep)]
        assert ep.local is None  # the process answered every call
    finally:
        ep.close()
    assert here and there == here


def test_a_shard_killed_under_the_engine_process_is_taken_over_once(tmp_path, caplog):
    """kill -9 of one shard mid-run: the engine's process says so and ends (exit 3: what it knew
    is incomplete), and the master's own engine takes over, with one ERROR line."""
    rt = _golden("noncomm-hang", tmp_path)
    ep = EngineProcess(shards=2)
    try:
        pids = wait_for(lambda: _shard_pids(ep._proc.pid) if len(_shard_pids(ep._proc.pid)) == 2 else None,
                        60, "two shard processes")  # fmt: skip
        with caplog.at_level(logging.ERROR, logger="c4d.engine"):
            replay_killing(ep, rt, lambda: os.kill(pids[0], signal.SIGKILL))
        assert ep.local is not None
        assert ep._proc.wait(10) == 3
    finally:
        ep.close()
    assert len([r for r in caplog.records if "the engine's process stopped" in r.getMessage()]) == 1


@pytest.mark.slow
def test_c4d_master_engine_shards_names_a_hang_live(tmp_path, libc4d, simtrain):
    """`c4d master --engine-shards 2` with a sim job whose rank 3 stops computing: the JSON line
    names rank 3 (the engine ran with two shard processes), and a replay of the master's trace
    in one engine gives the same diagnoses."""
    m = MasterProc(tmp_path, "--engine-shards", 2, metrics=False)
    try:
        wait_for(lambda: len(_shard_pids(m.proc.pid)) == 2, 60, "two shard processes")
    except BaseException:
        m.stop(signal.SIGKILL)
        raise
    live, replayed = hang_named_live(m)
    assert live and all(d["ranks"] == [3] for d in live)
    assert [d["ranks"] for d in replayed][: len(live)] == [d["ranks"] for d in live]


def test_engine_shards_from_the_command_line_and_the_environment(monkeypatch, caplog):
    from c4d.cli import build_parser

    def shards(text: str):
        return build_parser().parse_args(["master", "--engine-shards", text]).engine_shards

    assert engine_shards(0, cores=2) == 1 and engine_shards(0, cores=5) == 3
    assert engine_shards(0, cores=64) == MAX_AUTO_SHARDS and engine_shards(3, cores=2) == 3
    assert engine_shards_from_env({"C4D_ENGINE_SHARDS": "auto"}) == 0
    assert engine_shards_from_env({"C4D_ENGINE_SHARDS": "3"}) == 3
    with caplog.at_level(logging.WARNING, logger="c4d"):
        assert engine_shards_from_env({"C4D_ENGINE_SHARDS": "two"}) == 0
    assert "C4D_ENGINE_SHARDS" in caplog.text
    assert shards("2") == 2
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):  # (the parser's one-line error, exit status 1)
            shards(bad)
    monkeypatch.setenv("C4D_ENGINE_SHARDS", "2")
    assert MasterConfig().engine_shards == 2
