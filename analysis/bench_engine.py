"""Engine throughput on a synthetic 256-rank load (tp=8, pp=4, dp=8, 32 nodes).

    python analysis/bench_engine.py [--steps 12] [--ranks-per-node 8] [--quick] [--json]
    python analysis/bench_engine.py --synthetic 1024      # analysis/master_load.py's job instead

The load comes from the record factories in tests/factories.py (the same stream the shim
sends: OP, HEARTBEAT, PEER, REGISTER, COMM, with ±50 ms node skew). It is fed two ways:
as the ranks' own batches (one feed per ZeroMQ message, as received) and coalesced the
way a master loop can feed everything it received in one poll (one feed per 50 ms of
arrivals). Ticks every 200 ms as in c4d.master.master. Each is run on the engine alone and through
the master's ingest path (c4d/intake/ingest.py: edge validation, c4d/intake/validate.py, then the engine).
``--synthetic N`` feeds instead one second of bench_master's synthetic job of N ranks (tp 8,
pp 4: many more communicators per chunk). Prints records/s for each, measured in CPU time of
this process (the machine may be shared);
``--json`` adds them as one JSON object on the last line, ``--quick`` runs 2 steps (CI smoke run).
``--seconds S`` (with ``--synthetic``): S seconds of the job (default 1; longer runs, steadier figures).
``--agents`` (with ``--synthetic``): the job as its node agents forward it, as bench_master sends
it (77% node summaries at 16,384 ranks; the job's own 1F1B p2p rate).
``--steady`` (with ``--synthetic``) ingests the job's start-up batch (every REGISTER and COMM:
creating thousands of communicators, once per job) before the clock starts: the rate a running
job's records are taken at.
``--repeats N`` (default 5) runs each variant N times, interleaved, and reports the median.
The synthetic job's rows come in the order the master receives them (each sender's batch
together, as bench_master sends them).
``--baseline DIR`` measures another checkout (DIR/analysis/bench_engine.py with the same
options, in a subprocess: DIR's c4d) before and after this one, and prints its figures beside
ours ("was ..."): side by side in one run, on the same load of the machine.
``--instructions`` adds instructions per record of the coalesced variants: each run once more in
a process under callgrind, counting only the timed part (instrumentation turned on and off
around it with callgrind_control; the toggling costs under 5 instructions per record of a
``--seconds 0.2`` load). A count, not a time: the same code gives the same figure on any x86-64
host whatever its load. Python under callgrind runs ~50x slower, so the count is taken on
``--instruction-seconds`` of the job (default 0.2). With ``--baseline`` the other checkout's
engine is counted too, on this checkout's load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "tests")]
if len(sys.argv) > 2 and sys.argv[1] == "--instructions-child":
    # the c4d under count, named (an editable install's finder would import its own checkout's)
    sys.path.insert(0, sys.argv[2])
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
import factories  # noqa: E402

from c4d.engine import Engine, EngineConfig  # noqa: E402
from c4d.intake.ingest import Ingest  # noqa: E402
from c4d.intake.validate import Edge  # noqa: E402


def drive(
    batches,
    tick_ns: int,
    coalesce_ns: int | None,
    edge: bool = False,
    steady: bool = False,
    around: Callable[[bool], None] | None = None,
) -> tuple[float, int, int]:
    """``around(True)`` just before the timed part, ``around(False)`` just after it."""
    eng: Any = Engine(EngineConfig())
    if edge:
        eng = Ingest(eng, Edge())
    t0 = factories.T0
    if steady:  # the start-up batch (every REGISTER and COMM) ingested before the clock starts
        eng.feed(batches[0][1], t0)
        eng.tick(t0)
        batches = batches[1:]
    n = sum(len(b) for _, b in batches)
    if coalesce_ns:
        groups: dict[int, list[np.ndarray]] = {}
        for t, b in batches:
            groups.setdefault(int(t // coalesce_ns), []).append(b)
        feeds = [((k + 1) * coalesce_ns, np.concatenate(v)) for k, v in sorted(groups.items())]
    else:
        feeds = batches
    if around:
        around(True)
    start = time.process_time()
    last_tick, next_tick, i = t0, tick_ns, 0
    end = feeds[-1][0] + tick_ns
    diags = 0
    while next_tick <= end:
        while i < len(feeds) and feeds[i][0] <= next_tick:
            eng.feed(feeds[i][1], last_tick)
            i += 1
        last_tick = t0 + next_tick
        diags += len(eng.tick(last_tick))
        next_tick += tick_ns
    dt = time.process_time() - start
    if around:
        around(False)
    return dt, n, len(feeds)


COLLECTED = re.compile(r"Collected : (\d+)")
_COUNTED = {"records_per_s": (50_000_000, False), "records_per_s_edge": (50_000_000, True)}


def _callgrind_toggle(on: bool) -> None:
    """Instrumentation of this process (run under callgrind) on or off; returns once it took."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   check=True, capture_output=True, timeout=600)  # fmt: skip


def _instructions_child(argv: list[str]) -> int:
    """Under callgrind: one variant's timed part; prints the records it took and whose c4d."""
    _root, key, synthetic, seconds, steady, agents = argv[:6]
    co, edge = _COUNTED[key]
    batches = _synthetic(int(synthetic), float(seconds), agents == "1")
    _dt, n, _feeds = drive(batches, 200_000_000, co, edge, steady=steady == "1", around=_callgrind_toggle)
    import c4d

    print(f"records={n} c4d={Path(c4d.__file__).resolve().parents[1]}")
    return 0


def instructions_per_record(args, key: str, c4d_from: Path | None = None) -> float:
    """One variant's instructions per record, counted by callgrind in a process of its own."""
    import c4d

    root = c4d_from.resolve() if c4d_from else Path(c4d.__file__).resolve().parents[1]  # (this process's)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null",
           sys.executable, str(Path(__file__).resolve()), "--instructions-child",
           str(root), key, str(args.synthetic),
           str(args.instruction_seconds), "1" if args.steady else "0",
           "1" if args.agents else "0"]  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    m, n = COLLECTED.search(p.stderr), re.search(r"records=(\d+)", p.stdout)
    if p.returncode != 0 or not m or not n:
        raise SystemExit(
            f"bench_engine: callgrind run failed ({p.returncode}):\n{p.stdout}{p.stderr[-3000:]}"
        )
    return int(m[1]) / int(n[1])


def _synthetic(ranks: int, seconds: float, agents: bool = False) -> list[tuple[int, np.ndarray]]:
    """(job time, batch) of analysis/master_load.py's job: one batch per 50 ms window, its rows
    in the order the master receives them (bench_master sends them so: Load.messages): each
    sender's rows together, in the order it sent them. ``agents``: what its node agents forward
    (one summary per tensor-parallel collective and node), at the job's own 1F1B p2p rate, as
    bench_master sends it."""
    sys.path.insert(0, str(_ROOT / "analysis"))
    from master_load import Load, Shape

    # raw: six times Megatron's p2p rate (the engine's costliest rows are p2p halves), as the
    # figures in docs/performance.md were measured, before the job's default became 1F1B's rate
    shape = Shape(tp=8, pp=min(4, max(1, ranks // 8)), dp=max(1, ranks // 32), pp_every=156 if agents else 25)
    load = Load(shape, factories.T0, agents=agents)
    out = [(0, load.hello())]
    for k in range(0, int(seconds * shape.rate), 25):
        out.append(((k + 25) * shape.period_ns, load.by_sender(k, k + 25)[0]))
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--instructions-child":
        return _instructions_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="2 steps: a smoke run of a few seconds")
    ap.add_argument("--synthetic", type=int, metavar="N", help="bench_master's job of N ranks instead")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    ap.add_argument(
        "--seconds", type=float, default=1.0, help="with --synthetic: seconds of the job (default 1)"
    )
    ap.add_argument("--steady", action="store_true",
                    help="with --synthetic: the job's start-up (registering every rank and communicator, "
                         "once per job) not timed")  # fmt: skip
    ap.add_argument("--agents", action="store_true",
                    help="with --synthetic: the job as its node agents forward it "
                         "(bench_master's stream)")  # fmt: skip
    ap.add_argument(
        "--baseline", metavar="DIR", type=Path, help="another checkout to measure beside this one"
    )
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs of each variant, interleaved; the median is reported (a run of the "
                         "1,024-rank job is 0.3 s of CPU: one alone varies by 20%%)")  # fmt: skip
    ap.add_argument("--instructions", action="store_true",
                    help="with --synthetic: instructions per record too (callgrind; minutes)")  # fmt: skip
    ap.add_argument("--instruction-seconds", type=float, default=0.2, metavar="S",
                    help="seconds of the job the instructions are counted on (default 0.2)")  # fmt: skip
    args = ap.parse_args()
    if (args.instructions or args.agents) and not args.synthetic:
        ap.error("--instructions and --agents need --synthetic")
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        ap.error("--instructions needs valgrind and callgrind_control on the PATH")
    if args.baseline and not (args.baseline / "analysis" / "bench_engine.py").is_file():
        print(f"bench_engine: --baseline {args.baseline}: no analysis/bench_engine.py there", file=sys.stderr)
        return 1
    if args.quick:
        args.steps, args.repeats = 2, 1
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    job = factories.Job(
        tp=8, pp=4, dp=8, ranks_per_node=args.ranks_per_node, steps=args.steps, skew_ms=50.0,
        hang_timeout_us=10_000_000, hang_times=18, period_s=1, hb_ms=1000, flush_ms=10,
    )  # fmt: skip
    t = time.perf_counter()
    if args.synthetic:
        batches = _synthetic(args.synthetic, 0.2 if args.quick else args.seconds, args.agents)
    else:
        _model, batches = factories.build(job)
    n = sum(len(b) for _, b in batches)
    span = (batches[-1][0] - batches[0][0]) / 1e9
    world = args.synthetic or job.world
    print(f"load: {world} ranks, {n} records over {span:.1f} s of job time "
          f"({n / span:,.0f} records/s in the job), built in {time.perf_counter() - t:.1f} s")  # fmt: skip
    variants = [
        ("per message (as received)", None, False, "records_per_s_per_message"),
        ("coalesced per 50 ms poll", 50_000_000, False, "records_per_s"),
        ("per message, edge + engine", None, True, "records_per_s_edge_per_message"),
        # what c4d.master.master does (Ingest.feed_many)
        ("coalesced, edge + engine", 50_000_000, True, "records_per_s_edge"),
    ]
    was: list[dict[str, float]] = []
    if args.baseline:
        was.append(_baseline(args))
    out: dict[str, float] = {}
    runs: dict[str, list[float]] = {key: [] for *_, key in variants}
    for _ in range(args.repeats):  # interleaved: a noisy moment hits every variant alike
        for _label, co, edge, key in variants:
            dt, n, feeds = drive(batches, 200_000_000, co, edge, steady=bool(args.steady and args.synthetic))
            runs[key].append(dt)
    for label, _co, _edge, key in variants:
        dts = sorted(runs[key])
        dt = statistics.median(dts)
        rate, per = n / dt, n / feeds
        out[key] = round(rate)
        spread = f", {n / dts[-1]:,.0f}-{n / dts[0]:,.0f} over {len(dts)} runs" if len(dts) > 1 else ""
        print(
            f"{label:>28}: {rate:>10,.0f} records/s  ({feeds} feeds, {per:.0f} records/feed, "
            f"{dt:.2f} s CPU{spread})"
        )
    if args.baseline:
        was.append(_baseline(args))
        print(f"baseline {args.baseline} (measured before and after):")
        for label, _co, _edge, key in variants:
            lo, hi = sorted(w[key] for w in was)
            print(
                f"{label:>28}: {out[key]:>10,.0f} records/s  was {lo:,.0f}-{hi:,.0f}  ({out[key] / hi:.2f}x)"
            )
        out.update({f"was_{k}": min(w[k] for w in was) for k in was[0]})
    if args.instructions:
        print(f"instructions per record (callgrind, {args.instruction_seconds:g} s of the job):")
        labels = {key: label for label, *_, key in variants}
        for key in _COUNTED:
            ipr = instructions_per_record(args, key)
            out[f"instructions_per_record{key.removeprefix('records_per_s')}"] = round(ipr, 1)
            line = f"{labels[key]:>28}: {ipr:>10,.0f} instructions/record"
            if args.baseline:
                was_i = instructions_per_record(args, key, args.baseline)
                out[f"was_instructions_per_record{key.removeprefix('records_per_s')}"] = round(was_i, 1)
                line += f"  was {was_i:,.0f}  ({ipr / was_i:.2f}x)"
            print(line)
    if args.json:
        print(json.dumps(out))
    return 0


def _baseline(args) -> dict[str, float]:
    """The other checkout's figures for the same options (its own bench, its own c4d)."""
    cmd = [sys.executable, str(args.baseline / "analysis" / "bench_engine.py"), "--json",
           "--steps", str(args.steps), "--ranks-per-node", str(args.ranks_per_node)]  # fmt: skip
    if args.synthetic:
        cmd += ["--synthetic", str(args.synthetic)]
        if args.seconds != 1.0:
            if "--seconds" not in Path(cmd[1]).read_text():
                raise SystemExit(f"bench_engine: --baseline {args.baseline}: its bench has no --seconds")
            cmd += ["--seconds", str(args.seconds)]
    if args.quick:
        cmd.append("--quick")
    for flag in ("--steady", "--agents"):
        if getattr(args, flag[2:]):
            if flag not in Path(cmd[1]).read_text():
                raise SystemExit(f"bench_engine: --baseline {args.baseline}: its bench has no {flag}")
            cmd.append(flag)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(args.baseline)
    # An editable install of c4d (pip install -e, as the README's test command does) puts a
    # finder before sys.path that would import this checkout's c4d in the other's bench: the
    # baseline runs with such finders removed, and says which c4d it measured.
    run = (
        "import runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__.lower()]\n"
        f"sys.argv = {cmd[1:]!r}\n"
        f"try:\n    runpy.run_path({cmd[1]!r}, run_name='__main__')\n"
        "finally:\n    import c4d\n    print('c4d from', c4d.__file__, file=sys.stderr)\n"
    )
    res = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, env=env, check=True)
    where = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    if str(args.baseline.resolve()) not in where:
        raise SystemExit(f"bench_engine: --baseline {args.baseline} measured another c4d ({where})")
    return json.loads(res.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    raise SystemExit(main())
