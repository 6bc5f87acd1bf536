"""Flight Recorder analysis speed: torch's ``torchfrtrace`` against c4d's import + engine, side by side.

    python analysis/bench_fr.py                  # 256 ranks x 2000 entries, a hang with 2 ranks missing
    python analysis/bench_fr.py --ranks 64 --entries 500 --repeat 3

Writes the dumps with tests/fr_factory.py (PyTorch's documented layout: a tp/dp/pp job with
all_gather, reduce_scatter, send/recv, all_reduce over 4 kinds of process group; 16 stack frames
per entry, shared as torch's pickler shares them) into a temporary directory, then runs, each in
its own process so both pay interpreter start-up and their imports:

  (a) ``torchfrtrace DIR -p PREFIX`` (``python -m torch.distributed.flight_recorder.fr_trace`` if the
      script is not on PATH), and
  (b) c4d: ``load_any(DIR)`` + ``analyze.replay`` through the engine — what ``c4d analyze DIR --json``
      runs —

measuring wall time, CPU time (user + sys, with the child's own children) and peak RSS
(``os.wait4``), and checks that each named the two missing ranks. CPU time is the steadier figure
on a shared machine; the load average is printed with the result. Prints a table with the
ratios; ``--json-out`` saves the numbers.
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "nccl_trace_rank_"


def make_dumps(directory: Path, ranks: int, entries: int, frames: int, missing: tuple[int, ...]) -> float:
    """Write the dumps; returns seconds taken."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fr_factory as f

    tp = 8 if ranks % 16 == 0 else 2
    if ranks % (2 * tp):
        raise SystemExit(f"--ranks must be a multiple of {2 * tp}")
    steps = max(1, entries // len(f.STEP_OPS))
    t = time.perf_counter()
    job = f.Job(tp=tp, dp=ranks // tp, steps=steps, frames=frames, hang=f.Hang(op_index=4, missing=missing))
    f.write(f.build(job), directory, prefix=PREFIX)
    return time.perf_counter() - t


def _run(
    cmd: list[str], out_path: Path, env: dict[str, str] | None = None
) -> tuple[float, float, float, int]:
    """Wall s, CPU s (user + sys, its children included), peak RSS (MiB) and exit status of ``cmd``."""
    with open(out_path, "wb") as out:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, p.returncode


def torch_cmd(directory: Path) -> list[str]:
    exe = shutil.which("torchfrtrace")
    base = [exe] if exe else [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
    return [*base, str(directory), "-p", PREFIX]


def ours_cmd(directory: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--run-ours", str(directory)]


def run_ours(directory: str) -> int:
    """The c4d side, in its own process: import and replay, one diagnosis per line (c4d analyze --json)."""
    sys.path.insert(0, str(ROOT))
    from c4d.analyze import replay
    from c4d.engine import Engine, EngineConfig
    from c4d.formats.detect import load_any

    rt = load_any(directory, on_warning=lambda w: print(f"warning: {w}", file=sys.stderr))
    for d in replay(rt, Engine(EngineConfig())):
        print(json.dumps(d.to_json()))
    return 0


def torch_found(text: str) -> set[int]:
    m = re.search(r"missing ranks: \{([\d, ]*)\}", text)
    return {int(x) for x in m.group(1).split(",") if x.strip()} if m else set()


def ours_found(text: str) -> set[int]:
    found: set[int] = set()
    for line in text.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d["kind"] == "RankNonCommHang" and d["level"] == "ERROR":
                found |= set(d["ranks"])
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--entries", type=int, default=2000, help="entries per rank (the FR buffer size)")
    ap.add_argument("--frames", type=int, default=16, help="stack frames per entry")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool; the median is reported")
    ap.add_argument("--dir", type=Path, help="write the dumps here (default: a temporary directory)")
    ap.add_argument("--skip-torch", action="store_true", help="time c4d only")
    ap.add_argument("--json-out", type=Path, help="save the numbers as JSON")
    ap.add_argument("--run-ours", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--make-dumps", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_ours:
        return run_ours(args.run_ours)
    missing = (37 % args.ranks, (args.ranks - 55) % args.ranks)
    if args.make_dumps:
        print(make_dumps(Path(args.make_dumps), args.ranks, args.entries, args.frames, missing))
        return 0
    tmp = None
    if args.dir:
        d = args.dir
        d.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="c4d-bench-fr-")
        d = Path(tmp)
    try:
        # in a child process: a parent grown by building the dumps would inflate the measured children's
        # peak RSS (a forked child starts with its parent's pages)
        sizes = ["--ranks", str(args.ranks), "--entries", str(args.entries), "--frames", str(args.frames)]
        made = subprocess.run(
            [sys.executable, __file__, "--make-dumps", str(d), *sizes],
            check=True,
            capture_output=True,
            text=True,
        )
        gen_s = float(made.stdout.strip().splitlines()[-1])
        size = sum(f.stat().st_size for f in d.iterdir() if f.name.startswith(PREFIX))
        print(
            f"dumps: {args.ranks} ranks x {args.entries} entries, {args.frames} frames/entry, "
            f"{size / 2**20:.0f} MiB, written in {gen_s:.1f} s; "
            f"ranks {sorted(missing)} miss the last all_reduce",
            flush=True,
        )
        results = {}
        tools = [("c4d (import + engine)", ours_cmd(d), ours_found)]
        if not args.skip_torch:
            tools.insert(0, ("torchfrtrace", torch_cmd(d), torch_found))
        for name, cmd, found_fn in tools:
            walls, cpus, rss, found, status = [], [], [], set(), 0
            for i in range(args.repeat):
                out = d.parent / f"{d.name}.{name.split()[0]}.{i}.out"
                w, cpu, r, status = _run(cmd, out)
                text = out.read_text(errors="replace")
                found = found_fn(text)
                out.unlink()
                walls.append(w)
                cpus.append(cpu)
                rss.append(r)
                print(
                    f"  {name}: run {i + 1}: {w:.2f} s wall, {cpu:.2f} s CPU, {r:.0f} MiB, exit {status}",
                    flush=True,
                )
            results[name] = {
                "wall_s": statistics.median(walls),
                "cpu_s": statistics.median(cpus),
                "peak_rss_mib": statistics.median(rss),
                "exit": status,
                "found": sorted(found),
                "cmd": " ".join(cmd),
            }
        print()
        print(f"{'tool':<24}{'wall s':>9}{'CPU s':>9}{'peak RSS MiB':>14}  named the missing ranks")
        for name, r in results.items():
            ok = "yes" if set(r["found"]) == set(missing) else f"no ({r['found']})"
            print(f"{name:<24}{r['wall_s']:>9.2f}{r['cpu_s']:>9.2f}{r['peak_rss_mib']:>14.0f}  {ok}")
        summary: dict = {
            "ranks": args.ranks,
            "entries": args.entries,
            "frames": args.frames,
            "dump_mib": round(size / 2**20, 1),
            "missing": sorted(missing),
            "cpus": os.cpu_count(),
            "results": results,
        }
        if "torchfrtrace" in results:
            t, o = results["torchfrtrace"], results["c4d (import + engine)"]
            summary["speedup"] = t["wall_s"] / o["wall_s"]
            summary["cpu_ratio"] = t["cpu_s"] / o["cpu_s"]
            summary["memory_ratio"] = t["peak_rss_mib"] / o["peak_rss_mib"]
            print(
                f"\nc4d is {summary['speedup']:.1f}x faster in wall time "
                f"({summary['cpu_ratio']:.1f}x less CPU) "
                f"and uses {summary['memory_ratio']:.1f}x less memory (target: >= 10x faster); "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
            )
        if args.json_out:
            args.json_out.write_text(json.dumps(summary, indent=2) + "\n")
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
