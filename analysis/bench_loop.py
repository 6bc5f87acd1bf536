"""The master's loop alone: what it costs per record, the job's senders and engine aside.

``bench_master`` measures the loop among the processes that share a host with it (the job's
sender, the engine's process); where the host is full, the loop's CPU time includes waiting
on the others. Here the loop's own per-batch work runs alone on batches made ahead: the edge,
the live view's counters, the pending-op watch and the reading of node summaries for the
engine (what ``Master.step`` does with a poll, through a real ``Master``; the engine is one
that takes the rows and does nothing, and the trace is off). Each batch is what a poll
hands the loop: node agents' messages of a TP x PP x DP job (analysis/master_load.py), the
senders interleaved, joined. The job's first seconds are skipped (the agents' window sample
learns its pace) and the first half of the batches is fed untimed (every communicator and
rank heard from once): what is timed is the steady state. ``--baseline DIR`` measures another
checkout's c4d before and after this one's, each in a process of its own.

    python analysis/bench_loop.py --ranks 16384 65536 --baseline ../main-before
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# the c4d measured: this checkout's, or (``--code``, what ``--baseline`` runs) another's; an
# editable install's finder, ahead of sys.path, would import its own checkout's
_HERE = Path(__file__).resolve().parent
_CODE = sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv else str(_HERE.parent)
sys.path.insert(0, _CODE)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
sys.path.insert(0, str(_HERE))

from master_load import Load, Shape  # noqa: E402

import c4d  # noqa: E402
from c4d.agent.agent import MAX_BATCH as MAX_ROWS  # noqa: E402  (an agent's flush, split in messages)
from c4d.engine.summaries import Summaries  # noqa: E402
from c4d.master.master import Master, MasterConfig  # noqa: E402
from c4d.record import schema, wire  # noqa: E402
from c4d.util.ratelog import RateLimitedLog  # noqa: E402


class _Engine:
    """What the loop does for an engine in a process of its own before it sends (the node
    summaries apart from the other rows), and nothing after."""

    def feed(self, raw, recv_ns, cols=None, summaries=None) -> None:
        Summaries.apart(raw, cols, summaries)

    def tick(self, now_ns: int) -> list:
        return []

    def free_comms(self, cids) -> int:
        return len(cids)

    def close(self) -> None:
        pass


class _Polls:
    """A collector that hands the loop the batches made ahead, one a poll."""

    endpoint = "inproc://bench-loop"
    job = "bench"

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.at = 0
        self.ratelog = RateLimitedLog(logging.getLogger("bench"))
        self.messages = self.records = self.bad_messages = 0

    def serve(self, job) -> None:
        pass

    def poll(self, timeout_s: float) -> list[np.ndarray]:
        if self.at >= len(self.batches):
            return []
        raw = self.batches[self.at]
        self.at += 1
        self.records += len(raw)
        return [raw]

    def close(self) -> None:
        pass


def _batches(
    ranks: int, seconds: float, per_poll: int, from_s: float
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """The job's hello and ``seconds`` of its agents' messages from its second ``from_s``,
    joined ``per_poll`` at a time (the senders interleaved, as a poll finds them); the job's
    records per second."""
    shape = Shape(dp=max(1, ranks // (8 * 4)), window_s=10)
    t0 = time.time_ns()
    load = Load(shape, t0, agents=True)
    hello = load.hello()
    k0, k1 = int(from_s * shape.rate), int((from_s + seconds) * shape.rate)
    flush = max(1, int(0.2 * shape.rate))  # the agents' 200 ms at this job's heartbeat
    for k in range(0, k0 - flush, flush):  # the agents' window sample learns the job's pace
        load._tp_sample(k, k + flush)
    load.messages(max(0, k0 - flush), k0, MAX_ROWS)  # and their heartbeat merge its ranks
    msgs: list[np.ndarray] = []
    for k in range(k0, k1, flush):
        enc, _who = load.messages(k, min(k + flush, k1), MAX_ROWS)
        rng = np.random.default_rng(k)
        msgs.extend(wire.decode(enc[i]) for i in rng.permutation(len(enc)))
    n = sum(map(len, msgs))
    polls = [schema.join_records(msgs[i : i + per_poll], schema.HEADER)
             for i in range(0, len(msgs), per_poll)]  # fmt: skip
    return polls, hello, int(n / seconds)


def _master(polls: _Polls) -> Master:
    m = Master(MasterConfig(tick_s=3600.0), collector=polls)  # type: ignore[arg-type]
    if hasattr(m.engine, "close"):
        m.engine.close()
    m.engine = m.ingest.engine = _Engine()
    return m


def _loop(batches: list[np.ndarray], hello: np.ndarray) -> float:
    """CPU seconds of the loop's steps over the second half of ``batches``, after the job's
    hello and the first half."""
    polls = _Polls()
    m = _master(polls)
    t = time.time_ns()
    hello = hello.copy()
    hello["time_ns"] = t
    m.ingest.feed(hello, m._last_tick_ns)
    polls.batches = batches
    half = len(batches) // 2
    while polls.at < half:  # the first half untimed: every (communicator, rank) heard from once
        m.step(timeout_s=0)
    c0 = time.process_time()
    while polls.at < len(polls.batches):
        m.step(timeout_s=0)
    cpu = time.process_time() - c0
    assert m.edge.rejected == {} and not m.ingest.failures, (m.edge.rejected, m.ingest.failures)
    return cpu


def run(ranks: int, seconds: float, per_poll: int, repeats: int, from_s: float) -> dict:
    polls, hello, job_rate = _batches(ranks, seconds, per_poll, from_s)
    t = time.time_ns()
    for p in polls:  # stamped now: the edge's window of record times
        p["time_ns"] = t
    n = sum(map(len, polls[len(polls) // 2 :]))  # (what _loop times)
    out: dict = {"ranks": ranks, "records": n, "job_records_per_s": job_rate, "polls": len(polls)}
    cpu = min(_loop(polls, hello) for _ in range(repeats))
    out["c4d"] = str(Path(c4d.__file__).resolve().parent.parent)
    out["loop_us_per_record"] = round(cpu / n * 1e6, 3)
    out["loop_cores_at_job_rate"] = round(cpu / n * job_rate, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[16384])
    ap.add_argument("--seconds", type=float, default=4.0, help="job seconds of records (default 4)")
    ap.add_argument("--per-poll", type=int, default=256, help="agents' messages a batch (a poll's, joined)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    ap.add_argument("--from-s", type=float, default=12.0,
                    help="the job's second its records start at (default 12: past the first slow "
                         "window, whose sample sends every summary)")  # fmt: skip
    ap.add_argument("--baseline", metavar="DIR", type=Path, help="another checkout's c4d, measured beside")
    ap.add_argument("--code", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = []
    for r in a.ranks:
        if a.baseline:  # before and after this one's, in a process of its own
            res.append(_baseline(a, r))
        res.append(run(r, a.seconds, a.per_poll, a.repeats, a.from_s))
        if a.baseline:
            res.append(_baseline(a, r))
    for r in res:
        line = (f"{r['ranks']:>6} ranks, {r['records']:,} records in {r['polls']} polls (the job: "
                f"{r['job_records_per_s']:,}/s), {r['c4d']}: loop {r['loop_us_per_record']} us a record "
                f"({r['loop_cores_at_job_rate']} cores at the job's rate)")  # fmt: skip
        print(line)
    if a.json:
        print(json.dumps(res))


def _baseline(a: argparse.Namespace, ranks: int) -> dict:
    cmd = [sys.executable, __file__, "--code", str(a.baseline.resolve()), "--ranks", str(ranks),
           "--seconds", str(a.seconds), "--per-poll", str(a.per_poll), "--repeats", str(a.repeats),
           "--from-s", str(a.from_s), "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])[0]


if __name__ == "__main__":
    main()
