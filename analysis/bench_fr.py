"""Flight Recorder analysis speed: torch's ``torchfrtrace`` against c4d's import + engine, side by side,
for several dump shapes.

    python analysis/bench_fr.py                  # every shape below, 256 ranks x 2000 entries
    python analysis/bench_fr.py --shape megatron --ranks 64 --entries 500 --repeat 3
    python analysis/bench_fr.py --mix allreduce --tp 2 --frames 0 --tensors 4 --elem 64x64
    python analysis/bench_fr.py --quick --json   # a smoke run of a few seconds; figures on the last line

Writes the dumps with tests/fr_factory.py (PyTorch's documented layout; a tp x dp job whose
process groups are the world, tp blocks, dp strides and pipeline pairs) into a temporary
directory. The shape of a dump is set by:

  * ``--mix``: the collectives of one step (MIXES: Megatron's tp all_gather/reduce_scatter,
    pipeline send/recv, dp and world all_reduce; all_reduce only; pipeline-heavy p2p;
    broadcast/gather over dp); each step ends with a world all_reduce;
  * ``--tp``: how many process groups (ranks/tp tp groups, tp dp groups, pipeline pairs);
  * ``--entries``, ``--tensors`` and ``--elem``: entries per rank, tensors per entry and their
    shape (input_sizes/output_sizes);
  * ``--frames``: pickled stack frames per entry (0: none, as without TORCH_FR_CPP_STACK or in
    dumps taken on demand without stack traces).

Named presets (``--shape``) cover the combinations reported in docs/performance.md. In every shape two
ranks never issue the last world all_reduce (a hang). Then it runs, each in its own process so
both pay interpreter start-up and their imports:

  (a) ``torchfrtrace DIR -p PREFIX`` (``python -m torch.distributed.flight_recorder.fr_trace`` if the
      script is not on PATH), and
  (b) c4d: ``load_any(DIR)`` + ``analyze.replay`` through the engine — what ``c4d analyze DIR --json``
      runs —

c4d reads the pickles with its native reader (libc4d_frread.so) where it is built; ``C4D_FR_NATIVE=0``
in the environment times the Python reader instead. Both tools are run in turn within each repeat
(and ``--baseline``'s c4d beside them), so the ratios are taken side by side under the same load,
measuring wall time, CPU time (user + sys, with the child's own children) and peak RSS
(``os.wait4``), and checks that each named the two missing ranks (the same culprit on both
sides). Both run from byte-compiled modules: torch's were compiled when pip installed it, and
c4d's (this checkout's, and ``--baseline``'s) are compiled before the first run, as pip does for
an installed package (with PYTHONDONTWRITEBYTECODE set, a checkout would otherwise compile its
sources at every start). c4d's own split (import vs engine replay) is printed too. CPU time is
the steadier figure on a shared machine; the load average is printed with the result. The
ratio is torchfrtrace's wall time over c4d's; ``ratio_min`` the smallest over the shapes (target: >= 10).
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
PHASES = re.compile(r"^c4d phases: import_s=([0-9.]+) replay_s=([0-9.]+)$", re.M)

# (op, group kind) per op of a step; the last is always the world all_reduce the hang stops at
MIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "megatron": (
        ("all_gather", "tp"),
        ("_reduce_scatter_base", "tp"),
        ("p2p", "pp"),
        ("all_reduce", "dp"),
        ("all_reduce", "world"),
    ),
    "allreduce": (("all_reduce", "tp"), ("all_reduce", "dp"), ("all_reduce", "world")),
    "p2p": (("p2p", "pp"), ("p2p", "pp"), ("p2p", "pp"), ("p2p", "pp"), ("all_reduce", "world")),
    "world": (("broadcast", "world"), ("all_gather", "world"), ("all_reduce", "world")),
    "bcast": (
        ("broadcast", "dp"),
        ("all_gather", "dp"),
        ("_reduce_scatter_base", "dp"),
        ("all_reduce", "world"),
    ),
}


def _elem(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 1024x1024") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 1024x1024")
    return dims


# name -> (mix, tp, frames, tensors, elem, timing)
SHAPES: dict[str, tuple[str, int, int, int, tuple[int, ...], bool]] = {
    "megatron, 16 frames": ("megatron", 8, 16, 1, (1024, 1024), True),
    "megatron, no frames": ("megatron", 8, 0, 1, (1024, 1024), True),
    "all_reduce, many groups": ("allreduce", 2, 0, 1, (1024, 1024), True),
    "pipeline p2p": ("p2p", 8, 0, 1, (1024, 1024), True),
    "bcast/gather, 8 tensors": ("bcast", 8, 0, 8, (64, 64, 16), True),
    "one world group, gloo": ("world", 1, 1, 1, (1024, 1024), False),
}
QUICK = ("megatron, 16 frames", "all_reduce, many groups", "one world group, gloo")


def make_dumps(
    directory: Path,
    ranks: int,
    entries: int,
    frames: int,
    missing: tuple[int, ...],
    mix: str = "megatron",
    tp: int = 8,
    tensors: int = 1,
    elem: tuple[int, ...] = (1024, 1024),
    timing: bool = True,
) -> float:
    """Write the dumps; returns seconds taken. A mix whose ops are all in the world group writes a
    pg_config that names that group only (one group of every rank)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fr_factory as f

    if ranks % (2 * tp):
        raise SystemExit(f"--ranks must be a multiple of {2 * tp} (2 x --tp)")
    ops = MIXES[mix]
    steps = max(1, entries // len(ops))
    t = time.perf_counter()
    job = f.Job(
        tp=tp,
        dp=ranks // tp,
        steps=steps,
        frames=frames,
        step_ops=ops,
        tensors=tensors,
        elem=elem,
        timing=timing,
        used_groups_only=all(g == "world" for _, g in ops),
        hang=f.Hang(op_index=len(ops) - 1, missing=missing),
    )
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


def ours_cmd(directory: Path, root: Path | None = None) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-ours", str(directory)]
    return cmd + (["--c4d-root", str(root)] if root else [])


def run_ours(directory: str, root: str | None = None) -> int:
    """The c4d side, in its own process: import and replay, one diagnosis per line (c4d analyze --json).
    ``root``: another checkout's c4d (the before of a change), imported instead of the installed one."""
    if root:  # the editable install's finder would import this checkout's c4d whatever sys.path says
        sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]
    sys.path.insert(0, str(root or ROOT))
    import c4d

    if root and not Path(c4d.__file__).resolve().is_relative_to(Path(root).resolve()):
        raise SystemExit(f"--c4d-root {root}: imported {c4d.__file__} instead")
    from c4d.engine import Engine, EngineConfig
    from c4d.formats.detect import load_any
    from c4d.offline.analyze import replay

    t0 = time.perf_counter()
    rt = load_any(directory, on_warning=lambda w: print(f"warning: {w}", file=sys.stderr))
    t1 = time.perf_counter()
    diags = replay(rt, Engine(EngineConfig()))
    t2 = time.perf_counter()
    for d in diags:
        print(json.dumps(d.to_json()))
    print(f"c4d phases: import_s={t1 - t0:.3f} replay_s={t2 - t1:.3f}", file=sys.stderr)
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


def bench_shape(name: str, d: Path, shape: tuple, args: argparse.Namespace, missing: tuple[int, ...]) -> dict:
    """Dumps of one shape into ``d``, then both tools ``args.repeat`` times: the figures."""
    mix, tp, frames, tensors, elem, timing = shape
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    # in a child process: a parent grown by building the dumps would inflate the measured children's
    # peak RSS (a forked child starts with its parent's pages)
    sizes = ["--ranks", str(args.ranks), "--entries", str(args.entries), "--frames", str(frames)]
    sizes += ["--mix", mix, "--tp", str(tp), "--tensors", str(tensors), "--elem", "x".join(map(str, elem))]
    sizes += [] if timing else ["--no-timing"]
    made = subprocess.run(
        [sys.executable, __file__, "--make-dumps", str(d), *sizes], check=True, capture_output=True, text=True
    )
    gen_s = float(made.stdout.strip().splitlines()[-1])
    size = sum(f.stat().st_size for f in d.iterdir() if f.name.startswith(PREFIX))
    print(
        f"[{name}] {args.ranks} ranks x {args.entries} entries, mix {mix}, tp {tp}, {frames} frames/entry, "
        f"{tensors} x {elem} tensors/entry{'' if timing else ', no timing'}: {size / 2**20:.0f} MiB, "
        f"written in {gen_s:.1f} s",
        flush=True,
    )
    results = {}
    tools = [("c4d", ours_cmd(d), ours_found)]
    if args.baseline:
        tools.append(("c4d-before", ours_cmd(d, args.baseline), ours_found))
    if not args.skip_torch:
        tools.insert(0, ("torchfrtrace", torch_cmd(d), torch_found))
    phases: dict[str, list[tuple[float, float]]] = {}
    for i in range(args.repeat):
        for tool, cmd, found_fn in tools:  # interleaved: noise hits both alike
            out = d.parent / f"{d.name}.{tool}.{i}.out"
            w, cpu, r, status = _run(cmd, out)
            text = out.read_text(errors="replace")
            out.unlink()
            if tool != "torchfrtrace" and (m := PHASES.search(text)):
                phases.setdefault(tool, []).append((float(m[1]), float(m[2])))
            res = results.setdefault(tool, {"wall": [], "cpu": [], "rss": [], "found": set(), "exit": 0})
            res["wall"].append(w)
            res["cpu"].append(cpu)
            res["rss"].append(r)
            res["found"] = found_fn(text)
            res["exit"] = status
            print(
                f"  {tool}: run {i + 1}: {w:.2f} s wall, {cpu:.2f} s CPU, {r:.0f} MiB, exit {status}",
                flush=True,
            )
    fig: dict = {
        "mix": mix,
        "tp": tp,
        "frames": frames,
        "tensors": tensors,
        "elem": list(elem),
        "timing": timing,
        "dump_mib": round(size / 2**20, 1),
    }
    for tool, r in results.items():
        fig[tool] = {
            "wall_s": round(statistics.median(r["wall"]), 3),
            "cpu_s": round(statistics.median(r["cpu"]), 3),
            "peak_rss_mib": round(statistics.median(r["rss"])),
            "exit": r["exit"],
            "found": sorted(r["found"]),
            "named_the_culprit": set(r["found"]) == set(missing),
        }
    for tool, ph in phases.items():
        fig[tool]["import_s"] = round(statistics.median(p[0] for p in ph), 3)
        fig[tool]["replay_s"] = round(statistics.median(p[1] for p in ph), 3)
    if "torchfrtrace" in fig:
        t, o = fig["torchfrtrace"], fig["c4d"]
        fig["ratio"] = round(t["wall_s"] / o["wall_s"], 2)
        fig["cpu_ratio"] = round(t["cpu_s"] / o["cpu_s"], 2)
        fig["memory_ratio"] = round(t["peak_rss_mib"] / o["peak_rss_mib"], 2)
        fig["same_culprit"] = t["named_the_culprit"] and o["named_the_culprit"]
        if "c4d-before" in fig:
            b = fig["c4d-before"]
            fig["ratio_before"] = round(t["wall_s"] / b["wall_s"], 2)
            fig["cpu_ratio_before"] = round(t["cpu_s"] / b["cpu_s"], 2)
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--entries", type=int, default=2000, help="entries per rank (the FR buffer size)")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="a named shape (repeatable)")
    ap.add_argument("--mix", choices=sorted(MIXES), help="a custom shape: the collectives of a step")
    ap.add_argument("--tp", type=int, help="custom shape: tp size (sets the number of process groups)")
    ap.add_argument("--frames", type=int, help="custom shape: stack frames per entry")
    ap.add_argument("--tensors", type=int, help="custom shape: tensors per entry")
    ap.add_argument("--elem", type=_elem, help="custom shape: tensor shape, e.g. 1024x1024")
    ap.add_argument(
        "--no-timing",
        action="store_true",
        help="custom shape: no start times or durations (gloo, or timing off)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool; the median is reported")
    ap.add_argument("--dir", type=Path, help="write the dumps here (default: a temporary directory)")
    ap.add_argument("--skip-torch", action="store_true", help="time c4d only")
    ap.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of an earlier c4d (e.g. git archive REV c4d | tar -x -C DIR), timed beside this one",
    )
    ap.add_argument("--quick", action="store_true", help="16 ranks x 200 entries, two shapes: a smoke run")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    ap.add_argument("--json-out", type=Path, help="save the figures as JSON")
    ap.add_argument("--run-ours", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--c4d-root", help=argparse.SUPPRESS)
    ap.add_argument("--make-dumps", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_ours:
        return run_ours(args.run_ours, args.c4d_root)
    if args.quick:
        args.ranks, args.entries = 16, 200
    missing = (37 % args.ranks, (args.ranks - 55) % args.ranks)
    custom = any(x is not None for x in (args.mix, args.tp, args.frames, args.tensors, args.elem))
    custom = custom or args.no_timing
    if args.make_dumps:
        d = SHAPES["megatron, 16 frames"]
        print(
            make_dumps(
                Path(args.make_dumps),
                args.ranks,
                args.entries,
                d[2] if args.frames is None else args.frames,
                missing,
                mix=args.mix or d[0],
                tp=args.tp or d[1],
                tensors=args.tensors or d[3],
                elem=args.elem or d[4],
                timing=not args.no_timing,
            )
        )
        return 0
    if custom:
        base = SHAPES["megatron, no frames"]
        shapes = {
            "custom": (
                args.mix or base[0],
                args.tp or base[1],
                base[2] if args.frames is None else args.frames,
                args.tensors or base[3],
                args.elem or base[4],
                not args.no_timing,
            )
        }
    else:
        names = args.shape or (list(QUICK) if args.quick else list(SHAPES))
        shapes = {n: SHAPES[n] for n in names}
    for name, (_, tp, frames, tensors, _, _) in shapes.items():
        if tp < 1 or frames < 0 or tensors < 1 or args.ranks % (2 * tp) or args.entries < 1:
            ap.error(
                f"shape {name!r}: --ranks must be a multiple of 2 x tp ({2 * tp}); tp, tensors, entries >= 1"
            )
    tmp = None
    if args.dir:
        root = args.dir
        root.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="c4d-bench-fr-")
        root = Path(tmp)
    for r in (ROOT, *([args.baseline] if args.baseline else [])):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(r) / "c4d")], check=True)
    try:
        figs = {
            name: bench_shape(name, root / f"shape{i}", shape, args, missing)
            for i, (name, shape) in enumerate(shapes.items())
        }
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    nan = float("nan")
    cols = f"{'MiB':>6}{'torch s':>9}{'c4d s':>8}{'import':>8}{'engine':>8}{'ratio':>7}{'CPU ratio':>10}"
    before = f"{'before s':>9}{'ratio':>7}{'CPU ratio':>10}" if args.baseline else ""
    print(f"{'shape':<26}{cols}{before}  same culprit")
    for name, f in figs.items():
        o, t, b = f["c4d"], f.get("torchfrtrace"), f.get("c4d-before")
        line = (
            f"{name:<26}{f['dump_mib']:>6.0f}{(t['wall_s'] if t else nan):>9.2f}{o['wall_s']:>8.2f}"
            f"{o.get('import_s', nan):>8.2f}{o.get('replay_s', nan):>8.2f}"
            f"{f.get('ratio', nan):>7.1f}{f.get('cpu_ratio', nan):>10.1f}"
        )
        if b:
            line += f"{b['wall_s']:>9.2f}{f.get('ratio_before', nan):>7.1f}"
            line += f"{f.get('cpu_ratio_before', nan):>10.1f}"
        print(f"{line}  {'yes' if f.get('same_culprit', o['named_the_culprit']) else 'NO'}")
    summary: dict = {
        "ranks": args.ranks,
        "entries": args.entries,
        "missing": sorted(missing),
        "load_average": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
        "shapes": figs,
    }
    if not args.skip_torch:
        summary["ratio_min"] = min(f["ratio"] for f in figs.values())
        summary["cpu_ratio_min"] = min(f["cpu_ratio"] for f in figs.values())
        summary["same_culprit"] = all(f["same_culprit"] for f in figs.values())
        if args.baseline:
            summary["ratio_min_before"] = min(f["ratio_before"] for f in figs.values())
            summary["cpu_ratio_min_before"] = min(f["cpu_ratio_before"] for f in figs.values())
        print(
            f"\nratio_min {summary['ratio_min']:.1f}x wall ({summary['cpu_ratio_min']:.1f}x CPU), "
            "same culprit on every shape: "
            f"{'yes' if summary['same_culprit'] else 'NO'} (target: >= 10x); load average "
            f"{summary['load_average']} on {summary['cpus']} CPUs"
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary))
    ok = all(f.get("same_culprit", f["c4d"]["named_the_culprit"]) for f in figs.values())
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
