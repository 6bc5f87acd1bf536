"""How well the engine's work divides by communicator: the ceiling of an engine sharded N ways.

    python analysis/bench_shards.py [--ranks 16384] [--seconds 3] [--window-s 1] [--shards 1 2 4] [--json]

bench_master's synthetic job (analysis/master_load.py: TP x PP x DP, 500 rounds/s, through node
agents) is fed in this one process to one engine and, side by side in the same run, to N engines
that each get what c4d/engine/shard.py routes to one shard (its communicators' records, and
every record that names none); each engine ticks every 0.2 s of job time. The CPU time of each
(``time.process_time`` around its calls: other load on the host does not count) gives:

* ``speedup``: one engine's CPU time over the busiest shard's — the capacity N shards would
  have over one if each had a core of its own and the joining cost nothing;
* ``overhead``: the shards' CPU time together over one engine's (what routing rank-level
  records to every shard and N engines' fixed costs add);
* ``route_cpu_s``: the routing itself (c4d.engine.shard.split), which a sharded master pays once.

This is an upper bound, not the sharded engine: each shard here judges only its own
communicators and refines clocks from them alone (docs/engine-shards.md says what the joined
judges and clock need). Its diagnoses are not compared: the job has no fault.
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

from c4d.engine import shard  # noqa: E402
from c4d.offline.analyze import make_engine  # noqa: E402

FLUSH_ROUNDS = 50  # an agent flushes every 100 ms: 50 rounds at 500 rounds/s
TICK_ROUNDS = 100  # the master ticks every 0.2 s


def run(ranks: int, seconds: float, window_s: int, counts: list[int]) -> dict:
    shape = Shape(dp=max(1, ranks // 32), window_s=window_s)
    t0 = time.time_ns()
    load = Load(shape, t0, agents=True)
    engines = {n: [make_engine() for _ in range(n)] for n in counts}
    cpu = {n: [0.0] * n for n in counts}
    rows_in = {n: [0] * n for n in counts}
    route = {n: 0.0 for n in counts}
    made = 0.0

    def feed(raw, now: int) -> None:
        nonlocal made
        for n in counts:
            c0 = time.process_time()
            parts = shard.split(raw, n) if n > 1 else [raw]
            route[n] += time.process_time() - c0
            for s, (e, part) in enumerate(zip(engines[n], parts, strict=True)):
                c0 = time.process_time()
                if len(part):
                    e.feed(part, now)
                cpu[n][s] += time.process_time() - c0
                rows_in[n][s] += len(part)

    def tick(now: int) -> int:
        found = 0
        for n in counts:
            for s, e in enumerate(engines[n]):
                c0 = time.process_time()
                found += len(e.tick(now))
                cpu[n][s] += time.process_time() - c0
        return found

    hello = load.hello()
    hello["time_ns"] = t0
    feed(hello, t0)
    tick(t0)
    rounds = int(seconds * shape.rate)
    records = len(hello)
    diagnoses = 0
    for k in range(0, rounds, FLUSH_ROUNDS):
        b = min(k + FLUSH_ROUNDS, rounds)
        c0 = time.process_time()
        raw, _ = load.by_sender(k, b)
        made += time.process_time() - c0
        now = t0 + b * shape.period_ns
        feed(raw, now)
        records += len(raw)
        if b % TICK_ROUNDS == 0 or b == rounds:
            diagnoses += tick(now)
    one = sum(cpu[counts[0]]) if counts[0] == 1 else None
    out: dict = {
        "ranks": shape.world,
        "seconds": seconds,
        "window_s": window_s,
        "records": records,
        "job_records_per_s": round(records / seconds),
        "make_cpu_s": round(made, 2),
        "diagnoses": diagnoses,
        "shards": {},
    }
    for n in counts:
        busiest = max(cpu[n])
        row = {
            "cpu_s": [round(x, 3) for x in cpu[n]],
            "rows": rows_in[n],
            "route_cpu_s": round(route[n], 3),
            "busiest_records_per_cpu_s": round(records / busiest) if busiest else None,
        }
        if one:
            row["speedup"] = round(one / busiest, 2)
            row["overhead"] = round(sum(cpu[n]) / one, 2)
        out["shards"][str(n)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=3.0, help="job seconds fed (default 3)")
    ap.add_argument("--window-s", type=int, default=1, help="slow-detection window (default 1 s)")
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4], help="shard counts (1 first)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    args = ap.parse_args()
    counts = sorted(set(args.shards) | {1})
    logging.getLogger("c4d").setLevel(logging.ERROR)  # the synthetic job's verdicts are not the point
    r = run(args.ranks, args.seconds, args.window_s, counts)
    load = os.getloadavg()
    for n, row in r["shards"].items():
        extra = f"  speedup {row['speedup']}x  overhead {row['overhead']}x" if "speedup" in row else ""
        cpus, route = row["cpu_s"], row["route_cpu_s"]
        print(f"{r['ranks']} ranks, {n} shard(s): CPU s per shard {cpus}  route {route} s{extra}")
    print(f"{r['records']} records ({r['job_records_per_s']}/s of job); load average {load[0]:.2f}")
    if args.json:
        print(json.dumps({**r, "loadavg": load[0], "cores": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
