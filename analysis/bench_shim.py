"""Hot-path cost of libc4d.so: ns the shim adds to an NCCL call, side by side with no shim.

    python analysis/bench_shim.py                  # 200000 calls, 5 interleaved repeats
    python analysis/bench_shim.py --quick          # a few seconds (CI smoke run)
    python analysis/bench_shim.py --json           # figures as one JSON object on the last line
    python analysis/bench_shim.py --baseline OTHER/libc4d.so   # e.g. main's build, side by side

Runs ``c4d-simtrain --bench N`` (1-rank communicators, ncclAllReduce(count=0): simnccl
returns at once, as NCCL does, so what remains is the call itself) plain and with
``LD_PRELOAD``, in three shapes:

  * ``1 thread``: one thread, one communicator;
  * ``8 threads``: 8 threads, each on its own communicator, at the same time (the hot path
    shares the op pool and the ready ring between them: its cost must not grow);
  * ``grouped``: one thread, 8 calls per ncclGroupStart/End (ns per call, the group's
    start/end included).

The figure is the calling thread's own CPU time per call (CLOCK_THREAD_CPUTIME_ID): unlike
wall time it does not count the time other processes, or the shim's agent thread, held the
core, which on a shared 2-core machine is most of the wall time. Wall time is printed too.
Variants run interleaved, so machine noise hits every variant alike; medians are taken.

Variants with the shim:
  * ``full path``: C4D_QUEUE_CAPACITY and C4D_EVENT_POOL large enough that every call takes
    the complete path: 2 pooled events recorded with cudaEventRecord, op slot, ready ring.
  * ``default config``: the shipped defaults. A tight loop issues calls far faster than any
    real NCCL call returns and the agent (which drains every 5 ms) falls behind, so part of
    the calls take the cheaper drop-and-count path; the table says how many.

"Beyond the event records", two ways, both side by side in the same run:
  * ``full path`` against ``without shim, + its event records``: the plain run recording, itself,
    the two events per call the shim records (a different event each time from a pool of
    65536 per thread, as the shim's pool hands them out; one pair per group for grouped ops).
    The difference is the shim's own work. Slightly high: in the shim the agent queries the
    same events meanwhile;
  * ``no events``: C4D_EVENT_POOL=2, so (after the first) ops find the pool empty and record
    none; everything else is the full path. Slightly low (the pool's take is skipped).
The target is < 100 ns added per call beyond the event records (the first, in every shape).

Instructions per call (``--instructions``, on by default where valgrind is installed): the
same variants and shapes, each run under callgrind counting only inside the bench threads'
call loop, at N and 2N calls; the difference over the extra calls is the marginal count per
call, start-up and warm-up cancelled. A count, not a time: the same binaries give the same
figure on any x86-64 host whatever its load, so it is the one to compare across hosts and
runs. (Hardware counters would do too, but containers rarely expose them: ``perf stat -e
instructions`` says "not supported" where they are not.) The default config is left out:
how many calls take its drop path depends on how fast the agent thread runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from c4d.util import native

BENCH = re.compile(r"bench ns_per_call=([0-9.]+) cpu_ns_per_call=([0-9.]+)")
SUMMARY = re.compile(r"(\d+) records sent, (\d+) dropped \(queue full (\d+)")
TARGET_NS = 100.0
THREADS, GROUP = 8, 8


def unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def libzmq() -> str | None:
    import zmq

    found = glob.glob(str(Path(zmq.__file__).resolve().parent.parent / "pyzmq.libs" / "libzmq*.so*"))
    return found[0] if found else None


def run_once(simtrain: Path, args: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall ns per call, CPU ns per call, calls dropped at enqueue) of one bench process."""
    p = subprocess.run([str(simtrain), *args], env=env, capture_output=True, text=True, timeout=600)
    m = BENCH.search(p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"c4d-simtrain {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    s = SUMMARY.search(p.stderr)
    return float(m[1]), float(m[2]), int(s[3]) if s else 0


COLLECTED = re.compile(r"Collected : (\d+)")


def instructions_once(simtrain: Path, args: list[str], env: dict[str, str], out: Path) -> int:
    """Instructions the bench threads executed inside their call loop (callgrind)."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           "--toggle-collect=*BenchThread::calls*", str(simtrain), *args]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    m = COLLECTED.search(p.stderr)
    if p.returncode != 0 or not m:
        raise SystemExit(f"callgrind {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr[-2000:]}")
    return int(m[1])


def instructions_per_call(
    simtrain: Path, shape: list[str], n: int, threads: int, env: dict[str, str]
) -> float:
    """Marginal instructions per call on a bench thread: runs of n and 2n calls per thread (each
    makes its calls twice: warm-up, then measured), the difference over the 2n extra calls."""
    with tempfile.TemporaryDirectory() as d:
        a = instructions_once(simtrain, ["--bench", str(n), *shape], env, Path(d, "a"))
        b = instructions_once(simtrain, ["--bench", str(2 * n), *shape], env, Path(d, "b"))
    return (b - a) / (2 * n * threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000, help="NCCL calls per bench thread")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved runs of each variant")
    ap.add_argument("--baseline", type=Path, help="another libc4d.so, measured side by side (full path)")
    ap.add_argument("--quick", action="store_true", help="10000 calls, 1 repeat: a smoke run")
    ap.add_argument("--json", action="store_true", help="figures as one JSON object, last line")
    ap.add_argument("--instructions", action=argparse.BooleanOptionalAction, default=None,
                    help="instructions per call under callgrind too (default: where valgrind is "
                    "installed, except with --quick)")  # fmt: skip
    ap.add_argument("--instruction-calls", type=int, default=2000, metavar="N",
                    help="calls per bench thread, smaller callgrind run (the other: 2N)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.repeats = 10_000, 1
    if args.instructions is None:
        args.instructions = not args.quick and shutil.which("valgrind") is not None
    elif args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind (callgrind) on the PATH")
    if args.calls < GROUP or args.repeats < 1:
        ap.error(f"--calls must be at least {GROUP} and --repeats at least 1")

    simtrain, lib = native.simtrain_path(), native.lib_path()
    for need in (simtrain, lib):
        if not Path(need).exists():
            print(f"bench_shim: {need} is missing: build native/ first (cmake)", file=sys.stderr)
            return 1
    base = {k: v for k, v in os.environ.items() if not k.startswith("C4D_") and k != "LD_PRELOAD"}
    shim = dict(base, LD_PRELOAD=str(lib), C4D_MASTER_ADDR=unused_endpoint(), RANK="0", WORLD_SIZE="1")
    if z := libzmq():
        shim["C4D_LIBZMQ"] = z
    # Every slot and event of a run fits: nothing takes the drop path.
    pow2 = 1 << (2 * max(args.calls, 2 * args.instruction_calls, 1)).bit_length()  # calls and their warm-up
    full = dict(shim, C4D_QUEUE_CAPACITY=str(min(pow2, 1 << 20)), C4D_EVENT_POOL=str(min(2 * pow2, 1 << 20)))
    no_events = dict(full, C4D_EVENT_POOL="2")  # one op holds both events: the others go without
    variants: dict[str, tuple[dict[str, str], list[str]]] = {
        "without shim": (base, []),
        "without shim, + its event records": (base, ["--bench-events"]),
        "shim, full path": (full, []),
        "shim, no events": (no_events, []),
        "shim, default config": (shim, []),
    }
    if args.baseline:
        variants["baseline, full path"] = (dict(full, LD_PRELOAD=str(args.baseline)), [])
    per_thread = max(GROUP, args.calls // THREADS)  # 8 threads make as many calls as 1: all fit the pool
    shapes = {
        "1 thread": ["--bench", str(args.calls)],
        f"{THREADS} threads": ["--bench", str(per_thread), "--bench-threads", str(THREADS)],
        "grouped": ["--bench", str(args.calls), "--bench-group", str(GROUP)],
    }
    keys = {"1 thread": "", f"{THREADS} threads": f"_{THREADS}_threads", "grouped": "_grouped"}
    # callgrind: (the shape's arguments but --bench, its threads), the same calls per thread
    ishapes = {
        "1 thread": ([], 1),
        f"{THREADS} threads": (["--bench-threads", str(THREADS)], THREADS),
        "grouped": (["--bench-group", str(GROUP)], 1),
    }
    icalls = max(GROUP, args.instruction_calls // GROUP * GROUP)
    instr: dict[tuple[str, str], float] = {}
    if args.instructions:
        for shape, (sargs, nthreads) in ishapes.items():
            for name, (env, extra) in variants.items():
                if name != "shim, default config":
                    instr[shape, name] = instructions_per_call(
                        simtrain, [*sargs, *extra], icalls, nthreads, env
                    )

    wall: dict[tuple[str, str], list[float]] = {(s, v): [] for s in shapes for v in variants}
    cpu: dict[tuple[str, str], list[float]] = {(s, v): [] for s in shapes for v in variants}
    dropped: dict[tuple[str, str], list[int]] = {(s, v): [] for s in shapes for v in variants}
    for _ in range(args.repeats):
        for shape, sargs in shapes.items():
            for name, (env, extra) in variants.items():
                w, c, d = run_once(simtrain, [*sargs, *extra], env)
                wall[shape, name].append(w)
                cpu[shape, name].append(c)
                dropped[shape, name].append(d)

    table = Table(
        title=f"CPU ns per ncclAllReduce(count=0) on the calling thread: median of {args.repeats}; "
        f"{args.calls} calls (1 thread, grouped), {per_thread} per thread ({THREADS} threads)"
    )
    cols = ["shape", "variant", "ns/call", "added", "beyond events", "wall ns/call", "drop path"]
    if instr:
        cols += ["instr/call", "instr added", "instr beyond events"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("shape", "variant") else "right")
    fig: dict[str, float] = {}
    worst = 0.0
    for shape in shapes:
        plain = statistics.median(cpu[shape, "without shim"])
        with_events = statistics.median(cpu[shape, "without shim, + its event records"])
        fig[f"event_records_ns{keys[shape]}"] = round(with_events - plain, 1)
        for name in variants:
            med = statistics.median(cpu[shape, name])
            added = med - plain
            shimmed = name.startswith(("shim", "baseline"))
            beyond = added if name == "shim, no events" else med - with_events
            row = [
                shape,
                name,
                f"{med:.1f}",
                f"{added:.1f}" if name != "without shim" else "",
                f"{beyond:.1f}" if shimmed else "",
                f"{statistics.median(wall[shape, name]):.1f}",
                f"{statistics.median(dropped[shape, name]):.0f}" if shimmed else "",
            ]
            key = keys[shape]
            if instr:
                i = instr.get((shape, name))
                i_plain = instr[shape, "without shim"]
                i_beyond = None
                if i is not None and shimmed:
                    i_beyond = i - (
                        i_plain
                        if name == "shim, no events"
                        else instr[shape, "without shim, + its event records"]
                    )
                row += [
                    f"{i:.0f}" if i is not None else "",
                    f"{i - i_plain:.0f}" if i is not None and name != "without shim" else "",
                    f"{i_beyond:.0f}" if i_beyond is not None else "",
                ]
                if i is not None:
                    slug = {"without shim": "plain", "without shim, + its event records": "plain_with_events",
                            "shim, full path": "full_path", "shim, no events": "no_events",
                            "baseline, full path": "baseline_full_path"}[name]  # fmt: skip
                    fig[f"instructions_per_call_{slug}{key}"] = round(i, 1)
                    if i_beyond is not None:
                        fig[f"instructions_added_{slug}{key}"] = round(i_beyond, 1)
            table.add_row(*row)
            if name == "shim, full path":
                fig[f"ns_per_call_added{key}"] = round(beyond, 1)
                fig[f"ns_per_call_added_with_events{key}"] = round(added, 1)
                fig[f"drop_path_calls{key}"] = statistics.median(dropped[shape, name])
                worst = max(worst, beyond)
            elif name == "shim, no events":
                fig[f"ns_per_call_added_no_events{key}"] = round(beyond, 1)
            elif name == "baseline, full path":
                fig[f"baseline_ns_per_call_added{key}"] = round(beyond, 1)
    Console(width=200 if instr else 150).print(table)
    ok = worst < TARGET_NS
    print(
        f"added per call beyond the event records, worst shape: {worst:.0f} ns "
        f"(target < {TARGET_NS:.0f} ns): {'ok' if ok else 'OVER'}"
    )
    if instr:
        print(
            f"instructions per call (callgrind, {icalls} and {2 * icalls} calls per thread): the shim adds "
            + ", ".join(
                f"{instr[s, 'shim, full path'] - instr[s, 'without shim, + its event records']:.0f} ({s})"
                for s in ishapes
            )
            + " beyond its event records"
        )
    if args.json:
        print(json.dumps(fig))
    return 0 if ok or args.quick else 2


if __name__ == "__main__":
    sys.exit(main())
