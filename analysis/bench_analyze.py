"""`c4d analyze` of a large c4d trace: records/s and peak memory, at two file sizes.

    python analysis/bench_analyze.py                    # 256 MiB and 1 GiB traces
    python analysis/bench_analyze.py --sizes-mib 64 512
    python analysis/bench_analyze.py --quick --json     # 4 and 16 MiB: a smoke run; figures on the last line
    python analysis/bench_analyze.py --sizes-mib 1024 --report --before main   # c4d report's peak RSS too

The trace is synthetic but valid, and written by the real trace writer (c4d.record.trace.TraceWriter,
format 2 frames, master TICKs every 200 ms): tests/factories.py models a 64-rank job (tp 8,
pp 2, dp 4; OP, HEARTBEAT, PEER, REGISTER and COMM records as the shim sends them, arrival
times and ±50 ms node clock skew as a master sees them) for a base stretch, and that stretch
is repeated, every time and sequence field moved on by the base's span, until the file has
the asked size (registrations and communicator records only once, as in one long run; FINAL
heartbeats only at the end). Then ``c4d analyze TRACE --json`` (and the text report once, on
the largest) runs in a child process, and the bench reports its wall and CPU time, records/s
(records in the file / wall time) and peak RSS (``os.wait4``). Streaming means the peak RSS
does not grow with the file: the two sizes are side by side, and their ratio is printed.
``--report`` also runs ``c4d report`` on the largest and reports its peak RSS (VmHWM, sampled as
tests/hostile_files.py does); ``--before REV`` the same by git revision REV's c4d package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from c4d.record import schema  # noqa: E402
from c4d.record.trace import TraceWriter  # noqa: E402

_SEQ = {
    schema.Kind.OP: ("seq",),
    schema.Kind.PEER: ("seq",),
    schema.Kind.HEARTBEAT: ("n_issued", "n_arrived", "n_done"),
}
_NS = {
    schema.Kind.OP: ("issue_ns", "start_ns", "end_ns", "return_ns"),
    schema.Kind.PEER: ("first_ns", "last_ns"),
    schema.Kind.HEARTBEAT: ("last_arrive_ns", "last_done_ns", "pend_issue_ns", "pend_start_ns"),
}
_ONCE = (schema.Kind.REGISTER, schema.Kind.COMM, schema.Kind.STAGE)


def base_load(steps: int) -> tuple[list[tuple[int, np.ndarray]], int, int]:
    """(arrival ns, batch) of the modelled job, its span in ns, and 1 + its largest sequence number."""
    import factories

    job = factories.Job(
        tp=8, pp=2, dp=4, ranks_per_node=8, steps=steps, skew_ms=50.0,
        hang_timeout_us=10_000_000, hang_times=18, period_s=1, hb_ms=1000, flush_ms=10,
    )  # fmt: skip
    _, batches = factories.build(job)
    span = int(batches[-1][0] - batches[0][0]) + 1_000_000_000
    top = 0
    for _, b in batches:
        for kind, fields in _SEQ.items():
            typed = b[b["kind"] == kind].view(schema.DTYPES[kind])
            for f in fields:
                if len(typed):
                    top = max(top, int(typed[f].max()))
    return [(int(t), b) for t, b in batches], span, top + 1


def shifted(batch: np.ndarray, k: int, span: int, seqs: int, last: bool) -> np.ndarray:
    """Copy ``k`` of a base batch: every time moved on by k spans, every sequence by k x seqs."""
    b = batch.copy()
    if k:
        b = b[~np.isin(b["kind"], [int(x) for x in _ONCE])]
    b["time_ns"] += np.uint64(k * span)
    for kind in _NS:
        sel = np.flatnonzero(b["kind"] == kind)
        if not len(sel):
            continue
        typed = b[sel].view(schema.DTYPES[kind])
        for f in _NS[kind]:
            col = typed[f]
            typed[f] = np.where(col > 0, col + np.uint64(k * span), col)
        for f in _SEQ[kind]:
            typed[f] += np.uint64(k * seqs)
        if kind == schema.Kind.HEARTBEAT:
            ps = typed["pend_seq"]
            typed["pend_seq"] = np.where(ps == schema.UINT64_MAX, ps, ps + np.uint64(k * seqs))
            if not last:
                typed["hb_flags"] &= ~np.uint8(schema.HBF_FINAL)
        b[sel] = typed.view(schema.HEADER)
    return b


def write_trace(path: Path, size_mib: int, steps: int) -> tuple[int, float]:
    """Records written, and seconds taken."""
    t = time.perf_counter()
    batches, span, seqs = base_load(steps)
    import factories

    arrive = factories.T0 + np.array([a for a, _ in batches], dtype=np.int64)  # arrivals are relative
    sizes = np.array([len(b) for _, b in batches])
    base = np.concatenate([b for _, b in batches])
    tiles = max(1, -(-size_mib * 2**20 // base.nbytes))
    w = TraceWriter(path, {"job": "bench-analyze", "created_ns": int(arrive[0])})
    tick = 200_000_000
    next_tick = int(arrive[0]) + tick
    n = 0
    for k in range(tiles):
        tile = shifted(base, k, span, seqs, k == tiles - 1)
        # the batches of this tile (registrations dropped after the first): boundaries recomputed
        keep = np.ones(len(base), bool) if k == 0 else ~np.isin(base["kind"], [int(x) for x in _ONCE])
        ends = np.cumsum(np.add.reduceat(keep, np.r_[0, np.cumsum(sizes)[:-1]]))
        lo = 0
        for a, hi in zip((arrive + k * span).tolist(), ends.tolist(), strict=True):
            while a >= next_tick:
                w.tick(next_tick)
                next_tick += tick
            if hi > lo:
                w.write(tile[lo:hi])
            lo = hi
        n += len(tile)
    w.tick(next_tick)
    w.close()
    return n, time.perf_counter() - t


def run_analyze(trace: Path, json_out: bool) -> dict:
    cmd = [sys.executable, "-m", "c4d", "analyze", str(trace), *(["--json"] if json_out else [])]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 2):
        raise SystemExit(f"c4d analyze failed ({code}):\n{text[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
        "peak_rss_mib": round(ru.ru_maxrss / 1024),
        "exit": code,
        "diagnoses": sum(1 for line in text.splitlines() if line.startswith("{")),
    }


# another checkout's c4d, past the editable install's import redirect (as tests/hostile_files.py)
_BOOT = (
    "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in type(f).__name__ "
    "and 'Redirecting' not in type(f).__name__]; sys.path.insert(0, {src!r}); "
    "runpy.run_module('c4d', run_name='__main__')"
)


def checkout(rev: str, into: Path) -> Path:
    """The c4d package of git revision ``rev`` (the figures before a change), unpacked under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "c4d"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _vm_hwm_kib(pid: int) -> int:
    """A live process's peak resident memory (KiB; as tests/hostile_files.py reads it), 0 once gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_c4d(args: list[str], src: Path = ROOT, timeout: float = 3600.0) -> dict:
    """``c4d ARGS`` in a child (from checkout ``src``): wall and CPU time, and the child's own peak
    RSS (VmHWM sampled every 20 ms: wait4's ru_maxrss would start from this process's size)."""
    env = dict(os.environ, PYTHONPATH=str(src) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    boot = ["-m", "c4d"] if src == ROOT else ["-c", _BOOT.format(src=str(src))]
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, *boot, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=src
        )
        hwm = 0
        while True:
            hwm = max(hwm, _vm_hwm_kib(p.pid))
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t > timeout:
                p.kill()
                _, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 2):
        raise SystemExit(f"c4d {args[0]} failed ({code}):\n{text[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
        "peak_rss_mib": round(hwm / 1024),
        "output": text[-500:],
    }


def _report_figures(path: Path, root: Path, before: str | None) -> dict:
    """`c4d report` of ``path`` by this checkout (and by ``before``): wall, CPU, peak RSS."""
    out: dict[str, dict] = {}
    runs = [("after", ROOT)]  # first: a checkout being edited is read at its start
    if before:
        runs.append((f"before ({before})", checkout(before, root / "before")))
    for name, src in runs:
        r = run_c4d(["report", str(path), "-o", str(root / f"report-{name.split()[0]}")], src=src)
        r.pop("output")
        print(
            f"  c4d report, {name}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
            f"peak RSS {r['peak_rss_mib']} MiB",
            flush=True,
        )
        out[name.split()[0]] = r
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[256, 1024], help="trace sizes to analyze")
    ap.add_argument("--steps", type=int, default=60, help="steps of the modelled job in the repeated stretch")
    ap.add_argument("--dir", type=Path, help="write the traces here (default: a temporary directory)")
    ap.add_argument("--quick", action="store_true", help="4 and 16 MiB: a smoke run")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    ap.add_argument(
        "--report", action="store_true", help="also `c4d report` of the largest trace: peak RSS (VmHWM), time"
    )
    ap.add_argument(
        "--before",
        metavar="REV",
        help="with --report: the same `c4d report` by git revision REV (e.g. the main before a change)",
    )
    ap.add_argument("--trace", type=Path, help="use this trace (kept) instead of writing one per size")
    ap.add_argument("--report-only", action="store_true", help="with --report: no `c4d analyze` runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.steps = [4, 16], 8
    if min(args.sizes_mib) < 1 or args.steps < 2:
        ap.error("sizes must be >= 1 MiB and --steps >= 2")
    tmp = None if args.dir else tempfile.mkdtemp(prefix="c4d-bench-analyze-")
    root = args.dir or Path(tmp or ".")
    root.mkdir(parents=True, exist_ok=True)
    figs: dict[str, dict] = {}
    if args.trace:
        args.sizes_mib = [round(args.trace.stat().st_size / 2**20)]
    try:
        for size in sorted(args.sizes_mib):
            path = args.trace or root / f"bench-{size}mib.c4d"
            if args.trace:
                n = args.trace.stat().st_size // 128  # about: frames and header aside
            else:
                n, _ = write_trace(path, size, args.steps)
            mib = path.stat().st_size / 2**20
            print(f"trace: {mib:.0f} MiB, {n:,} records", flush=True)
            if args.report and args.report_only:
                figs[f"{size}"] = {"file_mib": round(mib), "report": _report_figures(path, root, args.before)}
                continue
            r = run_analyze(path, json_out=True)
            r.update(records=n, file_mib=round(mib), records_per_s=round(n / r["wall_s"]))
            r["records_per_cpu_s"] = round(n / r["cpu_s"])
            print(
                f"  c4d analyze --json: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
                f"{r['records_per_s']:,} records/s, peak RSS {r['peak_rss_mib']} MiB, "
                f"{r['diagnoses']} diagnoses",
                flush=True,
            )
            figs[f"{size}"] = r
            if size == max(args.sizes_mib):
                t = run_analyze(path, json_out=False)
                print(
                    f"  c4d analyze (text report): {t['wall_s']:.1f} s wall, peak RSS {t['peak_rss_mib']} MiB"
                )
                r["text_peak_rss_mib"] = t["peak_rss_mib"]
                if args.report:
                    r["report"] = _report_figures(path, root, args.before)
            if not args.trace:
                path.unlink()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.report and args.report_only:
        print(json.dumps({"load_average": round(os.getloadavg()[0], 1), "sizes": figs}))
        return 0
    small, big = figs[str(min(args.sizes_mib))], figs[str(max(args.sizes_mib))]
    summary = {
        "records_per_s": big["records_per_s"],
        "records_per_cpu_s": big["records_per_cpu_s"],
        "peak_rss_mib": big["peak_rss_mib"],
        "rss_growth": round(big["peak_rss_mib"] / small["peak_rss_mib"], 2),
        "file_growth": round(big["file_mib"] / max(small["file_mib"], 1), 2),
        "load_average": round(os.getloadavg()[0], 1),
        "sizes": figs,
    }
    print(
        f"\n{big['file_mib']} MiB: {big['records_per_s']:,} records/s "
        f"({big['records_per_cpu_s']:,} per CPU s), "
        f"peak RSS {big['peak_rss_mib']} MiB; the file grew {summary['file_growth']}x from "
        f"{small['file_mib']} MiB, peak RSS {summary['rss_growth']}x; load average {summary['load_average']}"
    )
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
