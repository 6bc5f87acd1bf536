"""The scale benches' --quick runs (in the test suite, so in CI): they finish in seconds and end with their
figures as one JSON object on the last stdout line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _last_json(script: str, *args: str) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / "analysis" / script), "--quick", "--json", *args],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_bench_master_quick():
    out = _last_json("bench_master.py")
    assert out["records_per_s"] > 0 and out["records_per_s_agents"] > 0
    assert out["hang_latency_s"] is not None and out["hang_latency_s"] > 0  # the injected hang was found
    assert out["agent_records_per_cpu_s"] > 0
    assert {"ranks_real_time", "ranks_real_time_agents", "master_rss_mib"} <= set(out)
    assert out["sender_nice"] == (-10 if _may_lower_nice() else 0)  # the sender runs ahead where it may


def _may_lower_nice() -> bool:
    """Whether this system lets a process raise its priority (root with CAP_SYS_NICE)."""
    p = subprocess.run([sys.executable, "-c", "import os; os.setpriority(os.PRIO_PROCESS, 0, -10)"],
                       capture_output=True)  # fmt: skip
    return p.returncode == 0 and hasattr(os, "setpriority")


def test_bench_master_sizes():
    """--ranks: capacity at the given sizes through agents, with the master's memory there."""
    out = _last_json("bench_master.py", "--ranks", "64", "--seconds", "0.5")
    (run,) = out["capacity"]
    assert run["ranks"] == 64 and run["agents"] is True
    assert run["records"] > 0 and run["dropped"] == 0
    assert 0 < run["master_rss_mib"] <= run["master_peak_rss_mib"]
    assert run["sender_nice"] == (-10 if _may_lower_nice() else 0)
    assert run["loop_cores_at_job_rate"] > 0 and "engine_cores_at_job_rate" not in run  # one process


def test_bench_master_engine_process_cores():
    """With --engine-process each process's cores at the job's rate: the engine's is one thread,
    so its figure says whether more cores would help. A 64-rank job's engine may spend less than
    a clock tick (10 ms) in half a second: its figure is there, and may be 0.0."""
    out = _last_json("bench_master.py", "--ranks", "64", "--seconds", "0.5", "--engine-process")
    (run,) = out["capacity"]
    assert run["engine_process"] is True and run["engine_peak_rss_mib"] > 0
    assert run["loop_cores_at_job_rate"] > 0 and run["engine_cores_at_job_rate"] >= 0


def test_bench_engine_quick():
    out = _last_json("bench_engine.py")
    assert out["records_per_s"] > 0 and out["records_per_s_edge"] > 0


def test_bench_engine_steady():
    """--steady: the synthetic job's start-up batch is not timed (its records not counted)."""
    full = _last_json("bench_engine.py", "--synthetic", "64")
    steady = _last_json("bench_engine.py", "--synthetic", "64", "--steady")
    assert steady["records_per_s"] > 0 and full["records_per_s"] > 0


def test_the_load_sends_a_flush_in_messages_the_master_takes():
    """An agent splits a flush into messages of at most MAX_BATCH records; the bench's agents
    must too: one 32 KiB-plus message makes libzmq close the connection (the master's
    message limit) and its records never arrive (a 2x paced run lost 1.3 M of them)."""
    analysis = str(ROOT / "analysis")
    sys.path.insert(0, analysis)
    try:
        from master_load import Load, Shape
    finally:
        sys.path.remove(analysis)
    from c4d.agent.agent import MAX_BATCH
    from c4d.master.collector import MAX_MESSAGE_BYTES
    from c4d.record import wire

    def load():  # (a load's window sample is state: each call its own)
        return Load(Shape(tp=8, pp=4, dp=4, rate=1000.0, window_s=10), 1_700_000_000_000_000_000, agents=True)

    rows, _ = load().window(0, 400)  # 400 ms of a node's first window: each TP all-reduce's summary
    msgs, who = (sent := load()).messages(0, 400, MAX_BATCH)
    assert max(len(m) for m in msgs) <= MAX_MESSAGE_BYTES
    got = [wire.decode(m) for m in msgs]
    assert sum(len(g) for g in got) == len(rows) > 16 * MAX_BATCH  # every row, more than one message each
    assert all((sent.node[g["rank"]] == w).all() for g, w in zip(got, who.tolist(), strict=True))
