"""The engine in a process of its own (c4d.master.engine_process, ``c4d master --engine-process``): the
same diagnoses as the engine in the master's process, for every golden trace and for a live
sim job; a dead engine process is taken over by an engine in the master's process."""

from __future__ import annotations

import gzip
import io
import logging
import os
import pickle
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from c4d.engine import types
from c4d.master.engine_process import EngineProcess, _Answers
from c4d.master.master import Master, MasterConfig
from c4d.offline import analyze
from c4d.record import schema, trace
from c4d.run import proctree
from tests.conftest import c4d_cmd, free_port, metrics_text, wait_for
from tests.golden import make_golden
from tests.masterproc import MasterProc, descendants_named, hang_named_live, replay_killing

GOLDEN = Path(make_golden.__file__).resolve().parent


def _golden(name: str, tmp: Path) -> Path:
    path = tmp / f"{name}.c4d"
    with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", ["comm-hang-link", "noncomm-hang", "comm-slow-rank", "crash", "mismatch"])
def test_an_engine_process_gives_the_in_process_diagnoses(name, tmp_path):
    """Field for field (times, levels, culprits, evidence), in the same order: the answers to
    ticks come late, never different."""
    rt = trace.read_raw(_golden(name, tmp_path))
    here = [d.to_json() for d in analyze.replay(rt, analyze.make_engine())]
    ep = EngineProcess()
    try:
        there = [d.to_json() for d in analyze.replay(rt, ep)]
        assert ep.local is None  # the process answered every call
    finally:
        ep.close()
    assert here, name  # each of these traces has a fault the engine names
    assert there == here


def test_a_dead_engine_process_is_taken_over(tmp_path, caplog):
    """kill -9 of the engine's process mid-replay: one ERROR line, an engine in the master's
    process goes on (started empty) and still names the hang that begins after it took over."""
    rt = trace.read_raw(_golden("noncomm-hang", tmp_path))
    ep = EngineProcess()
    try:
        ep._proc.kill()
        ep._proc.wait(10)
        with caplog.at_level(logging.ERROR, logger="c4d.engine"):
            got = [d.to_json() for d in analyze.replay(rt, ep)]
        assert ep.local is not None
    finally:
        ep.close()
    taken = [r for r in caplog.records if "the engine's process stopped" in r.getMessage()]
    assert len(taken) == 1
    here = [d.to_json() for d in analyze.replay(rt, analyze.make_engine())]
    assert got == here  # killed before any row: the engine taking over saw everything


def test_a_master_with_an_engine_process_hands_out_diagnoses_and_closes_it(tmp_path):
    """Master.settle waits for the ticks the process still owes; close stops the process."""
    m = Master(MasterConfig(bind=f"tcp://127.0.0.1:{free_port()}", engine_process=True, tick_s=0.05))
    proc = m.engine._proc
    try:
        rt = trace.read_raw(_golden("noncomm-hang", tmp_path))
        ticks = (rt.raw["kind"] == trace.schema.Kind.TICK).nonzero()[0].tolist()
        prev, last = 0, int(rt.meta.get("created_ns", 0))
        for i in ticks:
            if i > prev:
                m.ingest.feed(rt.raw[prev:i], last)
            last = int(rt.raw["time_ns"][i])
            m.tick(last)
            prev = i + 1
        m.settle()
        here = [d.to_json() for d in analyze.replay(rt, analyze.make_engine())]
        assert [d.to_json() for d in m.diagnoses] == here and here
    finally:
        m.close()
    assert proc.wait(10) == 0


@pytest.mark.slow
def test_c4d_master_engine_process_names_a_hang_live(tmp_path, libc4d, simtrain):
    """`c4d master --engine-process` with a sim job whose rank 3 stops computing: the JSON line
    names rank 3, and a replay of the master's trace in one process says the same."""
    m = MasterProc(tmp_path, "--engine-process", metrics=False)
    live, replayed = hang_named_live(m)
    assert live and all(d["ranks"] == [3] for d in live)
    assert [d["ranks"] for d in replayed][: len(live)] == [d["ranks"] for d in live]


def test_an_exception_in_the_engine_process_reaches_the_master_counted():
    """A call that raises there (here rows that are not whole records) is counted there and
    handed over with the next answer, as Ingest counts one in-process; the process goes on."""
    ep = EngineProcess()
    try:
        ep.feed(np.zeros(3 * schema.RECORD_SIZE + 5, np.uint8), 1)
        ep.tick(1)  # its answer may come later: drain waits for it
        ep.drain()
        assert ep.failures == {"ingest: ValueError": 1} and ep.failed_records == 3
        assert ep.local is None and ep.state() is not None
    finally:
        ep.close()


def test_the_answers_unpickle_the_engine_types_and_nothing_else(tmp_path):
    """The master reads its engine's answers with an unpickler that resolves c4d.engine.types'
    dataclasses and enums and numpy's arrays only: a pickle naming anything else runs nothing."""
    rt = trace.read_raw(_golden("noncomm-hang", tmp_path))
    eng = analyze.make_engine(split=True)
    diags = analyze.replay(rt, eng)
    answer = (True, (diags, (eng.state(), eng.take_split())), {}, 0)
    back = _Answers(io.BytesIO(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))).load()
    assert [d.to_json() for d in back[1][0]] == [d.to_json() for d in diags] and diags
    for evil in (os.system, subprocess.Popen, analyze.make_engine, types.Diagnosis.to_json):
        with pytest.raises(pickle.UnpicklingError):
            _Answers(io.BytesIO(pickle.dumps(evil))).load()


@pytest.mark.slow
def test_the_engine_process_ends_with_a_killed_master(tmp_path):
    """kill -9 of `c4d master --engine-process`: its engine's process does not outlive it."""
    m = MasterProc(tmp_path, "--engine-process", metrics=False)
    kids = proctree.children_map().get(m.proc.pid, [])
    assert kids, "the master has an engine process"
    m.stop(signal.SIGKILL)
    wait_for(lambda: not any(proctree.alive(k) for k in kids), 30, "the engine's process to exit")


def test_c4d_master_engine_process_from_the_environment(monkeypatch):
    """C4D_MASTER_ENGINE_PROCESS=1 turns it on for every master (c4d run's too); 0 or unset: off."""
    monkeypatch.setenv("C4D_MASTER_ENGINE_PROCESS", "1")
    assert MasterConfig().engine_process is True
    monkeypatch.setenv("C4D_MASTER_ENGINE_PROCESS", "0")
    assert MasterConfig().engine_process is False
    monkeypatch.delenv("C4D_MASTER_ENGINE_PROCESS")
    assert MasterConfig().engine_process is False


def test_metrics_come_from_the_engine_process_answers(tmp_path, libc4d, simtrain):
    """`c4d sim --metrics-port` with C4D_MASTER_ENGINE_PROCESS=1: the waits, transfers and bus
    bandwidths of observed collectives and the ranks' states reach Prometheus from the engine's
    process (each tick's answer carries them; the master does not wait for it)."""
    port = free_port()
    env = dict(os.environ, C4D_MASTER_ENGINE_PROCESS="1")
    proc = subprocess.Popen(
        [*c4d_cmd("sim", "--ranks", 4, "--ranks-per-node", 2, "--steps", 100000, "--max-seconds", 60,
                  "--metrics-port", port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        want = ("c4d_transfer_seconds_count", "c4d_busbw_gbs{", "c4d_ranks{")
        body = wait_for(lambda: metrics_text(port, *want), 60, "metrics with collectives", interval=0.3)
        assert "c4d_wait_seconds_bucket" in body
        assert descendants_named(proc.pid, "c4d.master.engine_process")  # the engine did run in a process
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err


def test_an_engine_process_dying_mid_run_is_taken_over_once(tmp_path, caplog):
    """Killed between two ticks: one ERROR line (however many calls find it dead), and the rows
    fed after it reach the engine taking over."""
    rt = trace.read_raw(_golden("noncomm-hang", tmp_path))
    ep = EngineProcess()
    try:
        with caplog.at_level(logging.ERROR, logger="c4d.engine"):
            replay_killing(ep, rt, lambda: (ep._proc.kill(), ep._proc.wait(10)))
        assert ep.local is not None
        assert ep.local.stats["records"] > 0  # the rows after the kill reached the engine taking over
    finally:
        ep.close()
    assert len([r for r in caplog.records if "the engine's process stopped" in r.getMessage()]) == 1


def test_ingest_counts_the_engine_process_failures_as_its_own():
    """Ingest.tick / Ingest.settle take what the engine's process failed at into the failures
    the master reports (c4d_ingest_failures), as an exception in-process is counted."""
    from c4d.intake.ingest import Ingest

    ep = EngineProcess()
    try:
        ing = Ingest(ep)
        ep.feed(np.zeros(3 * schema.RECORD_SIZE + 5, np.uint8), 1)
        ing.tick(1)
        ing.settle()
        assert ing.failures == {"ingest: ValueError": 1} and ing.failed_records == 3
        assert not ep.failures and ep.failed_records == 0  # handed over once
    finally:
        ep.close()


def test_an_engine_process_profiles_itself_when_asked(tmp_path, monkeypatch):
    """C4D_ENGINE_PROFILE: the engine's process writes its cProfile statistics when it stops
    (``{pid}`` its id), and they hold the engine's ticks; the diagnoses are the same."""
    import pstats

    monkeypatch.setenv("C4D_ENGINE_PROFILE", str(tmp_path / "engine-{pid}.prof"))
    rt = trace.read_raw(_golden("noncomm-hang", tmp_path))
    ep = EngineProcess()
    try:
        pid = ep.pid
        got = [d.to_json() for d in analyze.replay(rt, ep)]
    finally:
        ep.close()
    prof = tmp_path / f"engine-{pid}.prof"
    assert prof.exists()
    names = {name for (_f, _l, name) in pstats.Stats(str(prof)).stats}  # type: ignore[attr-defined]
    assert {"tick", "feed"} <= names
    monkeypatch.delenv("C4D_ENGINE_PROFILE")
    assert got == [d.to_json() for d in analyze.replay(rt, analyze.make_engine())]


def test_the_engine_process_budgets_refusals_reach_the_masters_counts(monkeypatch):
    """What the engine's byte budgets refuse in its own process (here: communicators past
    C4D_MAX_COMMS_EVER) is counted with the edge's refusals (c4d_records_rejected), as in process."""
    from c4d.intake.ingest import Ingest
    from c4d.intake.validate import Edge
    from tests import flood
    from tests import hostile as H

    monkeypatch.setenv("C4D_MAX_COMMS_EVER", "40")  # the engine's process inherits it
    t = H.now_ns()
    ep = EngineProcess()
    try:
        ing = Ingest(ep, Edge())
        assert ing.feed(flood.register(0, 1 << 10, t).view(schema.HEADER), t)
        ing.feed(flood.new_comm_ops(0, 0x7000_0000, 100, t).view(schema.HEADER), t)
        ing.tick(t)
        ing.settle()  # the first tick's answer
        ing.tick(t + 1)
        assert ing.edge.rejected["communicator indices"] >= 60
    finally:
        ep.close()
