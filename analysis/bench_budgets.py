"""A large job's state through the master's edge and engine, under the budgets that grow with
the ranks registered and under the old fixed defaults.

    python analysis/bench_budgets.py [--ranks 65536] [--pp 4] [--tp-rings] [--json]
    python analysis/bench_budgets.py --kept-seconds 21 --ranks 8192 --window-s 10 [--direct]

A synthetic TP x PP x DP job (analysis/master_load.py: TP 8, DP = ranks / (8 x PP)) sends every
rank's REGISTER and every communicator member's COMM init through ``Ingest`` (``Edge`` + one
``Engine``), as the master takes them, in batches of 1,023 records at one master time; then one
all-reduce of every DP group (``--tp-rings``: and of every TP group) arrives in two halves
around a tick, so the op spans two chunks and the group's op ring is made. Each variant runs
in a process of its own (its peak RSS is its own): ``grown`` (the defaults now) and ``fixed``
(C4D_MAX_COMM_BYTES 512 MiB, C4D_MAX_COMM_MEMBERS 2^18, C4D_MAX_RING_BYTES 512 MiB,
C4D_MAX_KEPT_BYTES 3 GiB: the defaults before). Reported: communicators offered and admitted,
the edge's refusals by reason, rings made, held and let go, the engine's budgets, peak RSS.

``--kept-seconds S``: instead, the job's rounds through node agents (master_load's agents
mode, their window sample on; ``--direct``: as its ranks send them) for S seconds of job time
at ``--window-s`` windows, ticking every 0.2 s; reported: the most the engine kept for the
slow judge at a tick (Pool.recount), per rank, against the kept budget.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "analysis")]

import numpy as np  # noqa: E402
from master_load import Load, Shape  # noqa: E402

from c4d.engine import Engine, EngineConfig  # noqa: E402
from c4d.intake.ingest import Ingest  # noqa: E402
from c4d.intake.validate import Edge, Limits  # noqa: E402
from c4d.record.schema import Op  # noqa: E402

BATCH = 1023  # records a batch (a message of the shim's or an agent's holds at most 1,023)
FIXED = {"C4D_MAX_RING_BYTES": "512M", "C4D_MAX_KEPT_BYTES": "3G",
         "C4D_MAX_COMM_BYTES": str(512 << 20), "C4D_MAX_COMM_MEMBERS": str(1 << 18)}  # fmt: skip
MIB = 1 << 20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)


def _feed(ing: Ingest, raw: np.ndarray, t: int) -> None:
    for i in range(0, len(raw), BATCH):
        ing.feed(raw[i : i + BATCH], t)


def _job(shape: Shape, t: int, agents: bool = False) -> tuple[Load, Engine, Ingest]:
    """The job's load, and an edge and engine (their limits from the environment, as the master
    reads them) that took every REGISTER and COMM init of it at master time ``t``."""
    load = Load(shape, t, agents=agents)
    eng = Engine(EngineConfig.from_env())
    ing = Ingest(eng, Edge(Limits.from_env()))
    _feed(ing, load.hello(), t)  # (stamped ``t``: the load's start)
    ing.tick(t)
    return load, eng, ing


def state(ranks: int, pp: int, tp_rings: bool) -> dict:
    """One variant (its limits from the environment, as the master reads them)."""
    shape = Shape(pp=pp, dp=max(1, ranks // (8 * pp)))
    t = 1_000_000_000_000_000_000
    load, eng, ing = _job(shape, t)
    offered = {"tp": shape.world // shape.tp, "pp": shape.world // shape.pp, "dp": shape.tp * shape.pp}
    ids = {"tp": load.tp_id, "pp": load.pp_id, "dp": load.dp_id}
    admitted = {k: len(set(v.tolist()) & set(ing.edge.comms)) for k, v in ids.items()}
    # one all-reduce of each DP group (and TP group) in two halves around a tick: its ring made
    groups = [("dp", load.dp_id, load.d, shape.dp)]
    if tp_rings:
        groups.append(("tp", load.tp_id, load.t, shape.tp))
    g = np.arange(shape.world)
    for half in (0, 1):
        for _, cid, cr, n in groups:
            mine = g[(cr < n // 2) if half == 0 else (cr >= n // 2)]
            ops = load._ops(mine, cid[mine], cr[mine], n, 0, Op.AllReduce, t + 300, t + 800, -1, t)
            ops["time_ns"] = t
            _feed(ing, ops, t)
        ing.tick(t + 1)
    pool = eng._pool
    rings = sum(c._ring is not None for c in eng.comms.values())
    return {
        "ranks": shape.world,
        "layout": f"TP {shape.tp} x PP {shape.pp} x DP {shape.dp}",
        "registered": {"edge": ing.edge.registered, "engine": eng.ranks.registered},
        "comms_offered": offered,
        "comms_admitted": admitted,
        "edge_refused": dict(ing.edge.rejected),
        "comm_bytes_mib": round(ing.edge.comm_bytes / MIB, 1),
        "comm_members": ing.edge.slots,
        "budgets_mib": {
            "comm": round(ing.edge.limits.comm_bytes(ing.edge.registered) / MIB),
            "ring": round(pool.budget["ring"] / MIB),
            "kept": round(pool.kept_budget / MIB),
        },
        "comm_members_budget": ing.edge.limits.comm_members(ing.edge.registered),
        "rings_wanted": sum(shape.world // n for _, _, _, n in groups),
        "rings_made": rings,
        "rings_let_go": int(pool.evicted["ring"]),
        "ring_rows_refused": int(pool.dropped["ring bytes"]),
        "ring_held_mib": round(pool.held["ring"] / MIB, 1),
        "incomplete_ops": sum(c.incomplete for c in eng.comms.values()),
        "peak_rss_mib": round(peak_rss_mib()),
    }


def kept(ranks: int, pp: int, seconds: float, window_s: int, direct: bool = False) -> dict:
    """The job's rounds through node agents (``direct``: from its ranks): the most the engine
    kept for the slow judge."""
    shape = Shape(pp=pp, dp=max(1, ranks // (8 * pp)), window_s=window_s)
    t0 = 1_000_000_000_000_000_000
    load, eng, ing = _job(shape, t0, agents=not direct)
    pool = eng._pool
    most, at, records = 0, 0.0, 0
    rounds = int(seconds * shape.rate)
    for k in range(0, rounds, 50):  # an agent's flush: 0.1 s; a tick every 0.2 s
        b = min(k + 50, rounds)
        raw, _ = load.by_sender(k, b)
        now = t0 + b * shape.period_ns
        _feed(ing, raw, now)
        records += len(raw)
        if b % 100 == 0 or b == rounds:
            ing.tick(now)
            pool.recount()
            if pool.kept > most:
                most, at = pool.kept, b / shape.rate
    return {
        "ranks": shape.world,
        "seconds": seconds,
        "window_s": window_s,
        "through": "ranks" if direct else "agents",
        "records": records,
        "kept_peak_mib": round(most / MIB, 1),
        "kept_peak_at_s": at,
        "kept_per_rank_kib": round(most / shape.world / 1024, 1),
        "kept_budget_mib": round(pool.kept_budget / MIB),
        "kept_refused": int(pool.dropped["kept bytes"]),
        "peak_rss_mib": round(peak_rss_mib()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=65536)
    ap.add_argument("--pp", type=int, default=4, help="pipeline stages (TP is 8; DP the rest)")
    ap.add_argument("--tp-rings", action="store_true", help="make every TP group's ring too")
    ap.add_argument("--kept-seconds", type=float, default=0.0, help="job seconds of rounds (the kept rows)")
    ap.add_argument("--window-s", type=int, default=10, help="slow-detection window (with --kept-seconds)")
    ap.add_argument("--direct", action="store_true", help="with --kept-seconds: from the ranks, no agents")
    ap.add_argument("--variant", choices=("grown", "fixed"), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    args = ap.parse_args()
    logging.getLogger("c4d").setLevel(logging.ERROR)
    if args.kept_seconds:
        r = kept(args.ranks, args.pp, args.kept_seconds, args.window_s, args.direct)
        print(f"{r['ranks']} ranks, {r['seconds']} s of {r['window_s']} s windows through {r['through']}: "
              f"kept at most {r['kept_peak_mib']} MiB ({r['kept_per_rank_kib']} KiB a rank, "
              f"at {r['kept_peak_at_s']} s) "
              f"of a {r['kept_budget_mib']} MiB budget; refused {r['kept_refused']} rows; "
              f"peak RSS {r['peak_rss_mib']} MiB")  # fmt: skip
        if args.json:
            print(json.dumps(r))
        return 0
    if args.variant:
        print(json.dumps(state(args.ranks, args.pp, args.tp_rings)))
        return 0
    out = {}
    for variant in ("fixed", "grown"):
        env = {k: v for k, v in os.environ.items() if k not in FIXED}
        if variant == "fixed":
            env.update(FIXED)
        cmd = [sys.executable, __file__, "--variant", variant, "--ranks", str(args.ranks)]
        cmd += ["--pp", str(args.pp)] + (["--tp-rings"] if args.tp_rings else [])
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        r = out[variant] = json.loads(p.stdout.strip().splitlines()[-1])
        adm, off, b = r["comms_admitted"], r["comms_offered"], r["budgets_mib"]
        print(f"{variant}: {r['ranks']} ranks ({r['layout']}), registered {r['registered']}: communicators "
              f"admitted {sum(adm.values())} of {sum(off.values())} {adm}, "
              f"refused {r['edge_refused'] or 'none'}; tables {r['comm_bytes_mib']} MiB of {b['comm']}, "
              f"members {r['comm_members']} of {r['comm_members_budget']}; "
              f"rings made {r['rings_made']} of {r['rings_wanted']}, let go {r['rings_let_go']}, "
              f"rows refused {r['ring_rows_refused']}, held {r['ring_held_mib']} MiB of {b['ring']}; "
              f"kept budget {b['kept']} MiB; "
              f"peak RSS {r['peak_rss_mib']} MiB")  # fmt: skip
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
