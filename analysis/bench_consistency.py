"""How soon a collective whose members disagree is named (c4d/engine/consistency.py).

    python analysis/bench_consistency.py [--cases 20] [--hang-cases 8] [--seed 1]

Records. Each case: the factory job of tests/factories.py (tp 2, dp 4, 100 ms heartbeats, 200 ms
ticks, records fed as the master receives them) with one rank's OP record of one DP all-reduce
changed (dtype, count, op or reduction op, in turn, at a random rank and seq). Prints, per case
and as a median and maximum, the master time from the feed of the op's last member record to
the tick that named it, and whether the rank named was the one changed. The engine evaluates at
ticks, so the figure is at most one tick (200 ms here; the master ticks every 0.2 s), well
within one heartbeat period of the job's default 1 s.

Hangs. Each case: the same job with the job's default 1 s heartbeats and a DP all-reduce that
hangs on every member (a stopped link at a random step), one member's heartbeats saying another
count or dtype for it (what a rank that called it so reports, c4d schema 2): the master time
from the last member's arrival at the op to the evaluation that named it, against the heartbeat
period. Fed as c4d.master.master feeds it (``factories.as_master``): ticks every 200 ms, and one more when
the master's pending watch (consistency.PendingWatch) says the heartbeat just fed completed the
evidence, a quarter tick after the last tick at the earliest. Every member's first heartbeat
after it issued the op says so, within one period of the last arrival: the verdict comes within
one heartbeat period and a quarter tick. ``--no-early``: ticks only (the master before its
watch: up to a heartbeat and a tick). ``--agents``: the hang cases' records through a node agent
per node first (c4d/agent/summary.py, forwarded at once: an agent's 0.1 s flush is not counted;
its heartbeat merge may hold a progressing rank's heartbeat of a new pending op for a period).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "tests")]
import factories  # noqa: E402

from c4d.engine import Engine, EngineConfig  # noqa: E402
from c4d.engine.types import DiagKind  # noqa: E402
from c4d.record import schema  # noqa: E402

CHANGES = {
    "dtype": {"dtype": int(schema.DType.int32)},
    "count": {"count": 17},
    "op": {"op": int(schema.Op.Broadcast), "peer": 0},
    "redop": {"redop": 2},
}


def case(job, model, batches, rank: int, seq: int, fields: dict) -> tuple[float | None, bool]:
    out, cid = [], None
    for t, b in batches:
        v, o = b.view(schema.HEADER), b.view(schema.OP)
        m = (
            (v["kind"] == schema.Kind.OP)
            & (o["rank"] == rank)
            & (o["comm_nranks"] == job.dp)
            & (o["seq"] == seq)
        )
        if cid is None and m.any():
            b = b.copy()
            o = b.view(schema.OP)
            i = int(np.flatnonzero(m)[0])
            for k, val in fields.items():
                o[k][i] = val
            cid = int(o["comm_id"][i])
        out.append((t, b))
    last = max(
        t
        for t, b in out
        if ((b.view(schema.HEADER)["kind"] == schema.Kind.OP) & (b.view(schema.OP)["comm_id"] == cid)
            & (b.view(schema.OP)["seq"] == seq)).any()
    )  # fmt: skip
    run = factories.replay(job, lambda: Engine(EngineConfig()), out, model)
    ds = [d for d in run.diagnoses if d.kind is DiagKind.CollectiveMismatch]
    if not ds:
        return None, False
    return (ds[0].time_ns - factories.T0 - last) / 1e6, ds[0].ranks == (rank,)


HANG_CHANGES = {"count": {"pend_count": 17}, "dtype": {"pend_dtype": int(schema.DType.float64)}}


def hang_case(step: int, link: tuple[int, int], k: int, fields: dict) -> tuple[float | None, bool, float]:
    """One hang case: (ms from the last member's arrival to the verdict or None, right rank,
    heartbeat period in ms)."""
    job = factories.Job(tp=2, dp=4, steps=step + 6, ranks_per_node=4, hb_ms=1000.0,
                        faults=[factories.Fault("comm-hang", link=link, step=step)])  # fmt: skip
    model, batches = factories.build(job)
    hung = [o for ops in model.ops for o in ops if o.end == factories.INF and not o.flags & schema.OpFlag.P2P]
    hung = [o for o in hung if len(model.comms[o.comm].members) == job.dp]
    o = min(hung, key=lambda o: (o.issue, o.comm))
    c = model.comms[o.comm]
    rank = c.members[k % len(c.members)]
    out = []
    for t, b in batches:
        v, h = b.view(schema.HEADER), b.view(schema.HEARTBEAT)
        m = (v["kind"] == schema.Kind.HEARTBEAT) & (h["rank"] == rank) & (h["comm_id"] == c.cid)
        m &= h["pend_seq"] == o.seq
        if m.any():
            b = b.copy()
            for f, val in fields.items():
                b.view(schema.HEARTBEAT)[f][m] = val
        out.append((t, b))
    diags, _ = factories.as_master(job, out, agents=AGENTS, early=EARLY)
    ds = [d for d in diags if d.kind is DiagKind.CollectiveMismatch]
    if not ds:
        return None, False, job.hb_ms
    last = model.last_arrival[(o.comm, o.seq)]
    return (ds[0].time_ns - factories.T0 - last) / 1e6, ds[0].ranks == (rank,), job.hb_ms


AGENTS = False  # --agents: each node's records through its own node agent's summariser first
EARLY = True  # --no-early: the master evaluates at its ticks only, not when the pending watch asks


def hangs(n: int, rng: np.random.Generator) -> bool:
    lat, right, missed, hb = [], 0, 0, 0.0
    names = list(HANG_CHANGES)
    links = [(0, 2), (2, 4), (4, 6), (6, 0)]
    for k in range(n):
        what = names[k % len(names)]
        step, link, member = int(rng.integers(2, 8)), links[int(rng.integers(0, 4))], int(rng.integers(0, 4))
        ms, ok, hb = hang_case(step, link, member, HANG_CHANGES[what])
        said = f"named {ms:.0f} ms after the last member arrived" if ms is not None else "not named"
        print(
            f"  hang {what:5s} step {step} link {link[0]}-{link[1]}: {said}" + ("" if ok else " (WRONG RANK)")
        )
        if ms is None:
            missed += 1
        else:
            lat.append(ms)
            right += ok
    if lat:
        med, mx = statistics.median(lat), max(lat)
        print(f"{len(lat)} of {n} hangs named, {right} with the right rank; after the last member's arrival: "
              f"median {med:.0f} ms, max {mx:.0f} ms (heartbeat {hb:.0f} ms, tick 200 ms)")  # fmt: skip
    return not missed and right == len(lat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--hang-cases", type=int, default=8)
    ap.add_argument("--agents", action="store_true", help="the hang cases through node agents (c4d agent)")
    ap.add_argument(
        "--no-early", action="store_true", help="evaluate at ticks only (the master before its pending watch)"
    )
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    job = factories.Job(tp=2, dp=4, steps=12, ranks_per_node=4)
    model, batches = factories.build(job)
    rng = np.random.default_rng(a.seed)
    lat, right, missed = [], 0, 0
    names = list(CHANGES)
    for k in range(a.cases):
        what = names[k % len(names)]
        rank, seq = int(rng.integers(0, job.world)), int(rng.integers(1, job.steps - 2))
        ms, ok = case(job, model, batches, rank, seq, CHANGES[what])
        said = f"named {ms:.0f} ms after the last record" if ms is not None else "not named"
        print(f"  {what:5s} rank {rank} seq {seq}: {said}" + ("" if ok else " (WRONG RANK)"))
        if ms is None:
            missed += 1
        else:
            lat.append(ms)
            right += ok
    if lat:
        print(f"{len(lat)} of {a.cases} named, {right} with the right rank; after the last member's record: "
              f"median {statistics.median(lat):.0f} ms, max {max(lat):.0f} ms (tick {job.tick_ms:.0f} ms, "
              f"heartbeat {job.hb_ms:.0f} ms)")  # fmt: skip
    global AGENTS, EARLY
    AGENTS, EARLY = a.agents, not a.no_early
    ok = hangs(a.hang_cases, rng) if a.hang_cases else True
    return 0 if not missed and right == len(lat) and ok else 1


if __name__ == "__main__":
    sys.exit(main())
