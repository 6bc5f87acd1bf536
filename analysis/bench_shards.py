"""The sharded engine's capacity against its shard count (c4d/engine/shards.py), measured.

    python analysis/bench_shards.py [--ranks 16384] [--seconds 3] [--window-s 1] [--shards 1 2 4] [--json]

bench_master's synthetic job (analysis/master_load.py: TP x PP x DP, 500 rounds/s, through node
agents, their window sample on) is fed in this one process, one engine after the other in the
same run (its node summaries read outside the engine's calls, as the master's loop reads them
for an engine in a process of its own), to one ``Engine`` and to ``ShardedEngine`` with N
shards, each shard a process of its own (1 shard: the join and one shard, two processes); each
ticks every 0.2 s of job time. The job's records are made anew for each (the same records: the
load is deterministic), outside the timed calls. For each count:

* ``wall_s`` and ``records_per_s``: the engine's calls (feed, tick) timed on the wall clock,
  every process sharing this host's cores with whatever else runs on it;
* ``join_cpu_s`` (this process: the front, the clock, the judges, sending and receiving) and
  ``shard_cpu_s`` (each shard's own CPU time);
* ``speedup``: records/s over one engine's, as measured here;
* ``free_cores_speedup``: the capacity with a core for each process, bounded: one engine's CPU
  time over the join's plus the busiest shard's (nothing overlapped) and over the larger of the
  two (the join reads a chunk while the shards ingest the one before: all overlapped; the
  tick's two round trips are not);
* ``overhead``: the join's and every shard's CPU time together over one engine's.

Each count's diagnoses are compared with one engine's (``same_diagnoses``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "analysis")]

from master_load import Load, Shape  # noqa: E402

from c4d.engine import Engine, EngineConfig  # noqa: E402
from c4d.engine.chunking import apart  # noqa: E402
from c4d.engine.shards import ShardedEngine  # noqa: E402
from c4d.record import schema  # noqa: E402

FLUSH_ROUNDS = 50  # an agent flushes every 100 ms: 50 rounds at 500 rounds/s
TICK_ROUNDS = 100  # the master ticks every 0.2 s


def one_run(shape: Shape, seconds: float, shards: int) -> dict:
    """Feed the job to an engine of ``shards`` shards (1: ``Engine``), timing its calls."""
    cfg = EngineConfig.from_env()
    eng = Engine(cfg) if shards == 0 else ShardedEngine(cfg, shards=shards, processes=True)
    t0 = 1_000_000_000_000
    load = Load(shape, t0, agents=True)
    wall = cpu = 0.0
    diagnoses = []
    records = 0

    def call(f, *a):
        nonlocal wall, cpu
        w0, c0 = time.perf_counter(), time.process_time()
        out = f(*a)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        return out

    def feed(raw, now: int) -> None:
        # node summaries read outside the engine, as the master's loop reads them for an engine in
        # a process of its own (c4d.master.engine_process: feed_apart)
        rest, sums = apart(raw.view(schema.HEADER))
        call(eng.feed_apart, rest, now, sums, len(raw))

    try:
        cpu0 = eng.shard_cpu() if shards else []
        hello = load.hello()
        hello["time_ns"] = t0
        feed(hello, t0)
        diagnoses += call(eng.tick, t0)
        records += len(hello)
        rounds = int(seconds * shape.rate)
        for k in range(0, rounds, FLUSH_ROUNDS):
            b = min(k + FLUSH_ROUNDS, rounds)
            raw, _ = load.by_sender(k, b)
            now = t0 + b * shape.period_ns
            feed(raw, now)
            records += len(raw)
            if b % TICK_ROUNDS == 0 or b == rounds:
                diagnoses += call(eng.tick, now)
        shard_cpu = [b - a for a, b in zip(cpu0, eng.shard_cpu(), strict=True)] if shards else []
    finally:
        if shards:
            eng.close()
    return {
        "shards": shards,
        "records": records,
        "wall_s": round(wall, 3),
        "records_per_s": round(records / wall) if wall else None,
        "join_cpu_s": round(cpu, 3),
        "shard_cpu_s": [round(x, 3) for x in shard_cpu],
        "diagnoses": [d.to_json() for d in diagnoses],
    }


def run(ranks: int, seconds: float, window_s: int, counts: list[int]) -> dict:
    shape = Shape(dp=max(1, ranks // 32), window_s=window_s)
    runs = {n: one_run(shape, seconds, n) for n in [0, *counts]}
    one = runs[0]
    out: dict = {"ranks": shape.world, "seconds": seconds, "window_s": window_s, "records": one["records"],
                 "job_records_per_s": round(one["records"] / seconds), "shards": {}}  # fmt: skip
    for n, r in runs.items():
        row = {k: v for k, v in r.items() if k not in ("diagnoses", "records")}
        row["same_diagnoses"] = r["diagnoses"] == one["diagnoses"]
        row["speedup"] = round(r["records_per_s"] / one["records_per_s"], 2)
        if n:
            join, busiest = r["join_cpu_s"], max(r["shard_cpu_s"])
            row["free_cores_speedup"] = [round(one["join_cpu_s"] / (join + busiest), 2),
                                         round(one["join_cpu_s"] / max(join, busiest), 2)]  # fmt: skip
            row["overhead"] = round((join + sum(r["shard_cpu_s"])) / one["join_cpu_s"], 2)
        out["shards"][str(n) if n else "engine"] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=3.0, help="job seconds fed (default 3)")
    ap.add_argument("--window-s", type=int, default=1, help="slow-detection window (default 1 s)")
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4],
                    help="shard counts (one Engine is always run beside them)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    args = ap.parse_args()
    counts = sorted({n for n in args.shards if n >= 1})
    logging.getLogger("c4d").setLevel(logging.ERROR)  # the synthetic job's verdicts are not the point
    load0 = os.getloadavg()[0]
    r = run(args.ranks, args.seconds, args.window_s, counts)
    for n, row in r["shards"].items():
        extra = ""
        if "free_cores_speedup" in row:
            fc, ov = row["free_cores_speedup"], row["overhead"]
            extra = (f"  join CPU {row['join_cpu_s']} s, shards {row['shard_cpu_s']} s: "
                     f"{fc[0]}-{fc[1]}x with a core each, overhead {ov}x")  # fmt: skip
        what = "one Engine" if n == "engine" else f"{n} shard(s)"
        print(f"{r['ranks']} ranks, {what}: {row['records_per_s']} records/s ({row['speedup']}x), "
              f"same diagnoses: {row['same_diagnoses']}{extra}")  # fmt: skip
    print(f"{r['records']} records ({r['job_records_per_s']}/s of job); load average before {load0:.2f}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    if args.json:
        print(json.dumps({**r, "loadavg": load0, "cores": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
