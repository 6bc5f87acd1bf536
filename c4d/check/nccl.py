"""NCCLTest: run nccl-tests binaries (or read a saved output) and hold the result to a bar.

A run passes when it printed a table and its trailer, no element was wrong, no value was out of
bounds, nothing reported a test failure, the binary exited 0, and the trailer's average bus
bandwidth reaches ``--min-busbw`` (when given).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from c4d.check.result import CheckResult, Status
from c4d.formats.nccl_tests import NcclTestsError, NcclTestsRun, parse_text

BINARIES = (
    "all_reduce_perf",
    "all_gather_perf",
    "reduce_scatter_perf",
    "broadcast_perf",
    "reduce_perf",
    "alltoall_perf",
    "sendrecv_perf",
)


class BinaryMissing(RuntimeError):
    """An nccl-tests binary is not on PATH nor in the given folder."""


def find_binary(name: str, tests_dir: str | None = None) -> Path:
    if tests_dir:
        for cand in (Path(tests_dir) / name, Path(tests_dir) / "build" / name):
            if cand.is_file() and os.access(cand, os.X_OK):
                return cand
        raise BinaryMissing(f"{name} not found in {tests_dir} (nor in {tests_dir}/build)")
    found = shutil.which(name)
    if found:
        return Path(found)
    raise BinaryMissing(
        f"{name} not found on PATH: build https://github.com/NVIDIA/nccl-tests and pass "
        "--nccl-tests-dir DIR, or read a saved output with --from FILE"
    )


def default_args(gpus: int, min_bytes: str = "8M", max_bytes: str = "1G") -> list[str]:
    """Sizes that reach bus-bandwidth saturation without taking minutes; every result checked."""
    return [
        "-b",
        min_bytes,
        "-e",
        max_bytes,
        "-f",
        "2",
        "-g",
        str(max(gpus, 1)),
        "-c",
        "1",
        "-w",
        "5",
        "-n",
        "20",
    ]


@dataclass(frozen=True)
class NcclOutcome:
    """One nccl-tests run held against the bar. ``run`` is None when nothing could be parsed."""

    source: str
    run: NcclTestsRun | None
    min_busbw_gbs: float | None
    problems: tuple[str, ...]
    returncode: int | None = None
    command: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return not self.problems

    def name(self) -> str:
        return (self.run.program if self.run and self.run.program else None) or Path(self.source).name

    def to_json(self) -> dict:
        body = self.run.to_dict() if self.run else {"avg_busbw_gbs": None, "rows": [], "wrong_total": None}
        return {
            **body,
            "source": self.source,
            "command": list(self.command) or None,
            "returncode": self.returncode,
            "min_busbw_gbs": self.min_busbw_gbs,
            "problems": list(self.problems),
            "passed": self.passed,
        }

    def result(self) -> CheckResult:
        run = self.run
        value = None
        if run is not None:
            value = {
                "avg_busbw_gbs": run.avg_busbw_gbs,
                "wrong_total": run.wrong_total,
                "sizes": len(run.rows),
            }
        threshold = {"min_busbw_gbs": self.min_busbw_gbs} if self.min_busbw_gbs is not None else None
        if self.passed and run is not None:
            bar = f" >= {self.min_busbw_gbs:g}" if self.min_busbw_gbs is not None else ""
            detail = f"avg bus bandwidth {run.avg_busbw_gbs:g} GB/s{bar}, {len(run.rows)} sizes, 0 wrong"
            return CheckResult("NCCLTest", self.name(), Status.SUCCEED, value, threshold, detail)
        return CheckResult("NCCLTest", self.name(), Status.FAILED, value, threshold, "; ".join(self.problems))


def evaluate(
    source: str,
    run: NcclTestsRun,
    min_busbw_gbs: float | None,
    returncode: int | None = None,
    command: tuple[str, ...] = (),
) -> NcclOutcome:
    problems = []
    if returncode not in (None, 0):
        problems.append(f"exit status {returncode}")
    if run.rows.empty:
        problems.append("no result rows")
    wrong = run.wrong_total
    if wrong:
        bad = run.rows[(run.rows["oop_wrong"].fillna(0) > 0) | (run.rows["ip_wrong"].fillna(0) > 0)]
        sizes = ", ".join(str(s) for s in bad["size"].head(5))
        problems.append(f"{wrong} wrong elements (size {sizes})")
    if run.out_of_bounds:
        problems.append(f"{run.out_of_bounds} out-of-bounds values")
    problems.extend(run.failures[:3])
    if run.avg_busbw_gbs is None:
        problems.append("no '# Avg bus bandwidth' line: the run did not finish")
    elif min_busbw_gbs is not None and run.avg_busbw_gbs < min_busbw_gbs:
        problems.append(f"avg bus bandwidth {run.avg_busbw_gbs:g} GB/s < {min_busbw_gbs:g} GB/s")
    if run.avg_busbw_flag == "FAILED":
        problems.append("nccl-tests flagged the bandwidth FAILED (NCCL_TESTS_MIN_BW)")
    return NcclOutcome(source, run, min_busbw_gbs, tuple(problems), returncode, command)


def from_text(source: str, text: str, min_busbw_gbs: float | None, returncode: int | None = None, command=()):
    """Every run in ``text``; a text with no result at all is one failed outcome."""
    try:
        runs = parse_text(text)
    except NcclTestsError as e:
        problems = [str(e)]
        if returncode not in (None, 0):
            problems.insert(0, f"exit status {returncode}")
        return [NcclOutcome(source, None, min_busbw_gbs, tuple(problems), returncode, tuple(command))]
    return [evaluate(source, r, min_busbw_gbs, returncode, tuple(command)) for r in runs]


def run_binary(
    binary: Path,
    args: list[str],
    timeout_s: float,
    min_busbw_gbs: float | None,
    launcher: list[str] | None = None,
) -> list[NcclOutcome]:
    """Run one binary (optionally under a launcher such as ``mpirun -np 16``) with a deadline."""
    cmd = [*(launcher or []), str(binary), *args]
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        return [NcclOutcome(str(binary), None, min_busbw_gbs, (f"cannot start: {e}",), None, tuple(cmd))]
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
        out, _ = proc.communicate()
        outcomes = from_text(str(binary), out or "", min_busbw_gbs, None, cmd)
        hang = f"no result after {timeout_s:g} s (hung?); killed"
        return [
            NcclOutcome(o.source, o.run, o.min_busbw_gbs, (hang, *o.problems), None, o.command)
            for o in outcomes
        ]
    return from_text(str(binary), out, min_busbw_gbs, proc.returncode, cmd)


def run_tests(
    binaries: list[Path],
    gpus: int,
    min_busbw_gbs: float | None,
    timeout_s: float,
    extra_args: str | None = None,
    launcher: str | None = None,
) -> list[NcclOutcome]:
    """Run each binary (from :func:`find_binary`) in turn with the default or given arguments."""
    args = shlex.split(extra_args) if extra_args else default_args(gpus)
    outcomes = []
    for b in binaries:
        outcomes += run_binary(b, args, timeout_s, min_busbw_gbs, shlex.split(launcher) if launcher else None)
    return outcomes


def rows_table(run: NcclTestsRun):
    """A rich Table of the per-size results."""
    from rich.table import Table

    t = Table(title=f"{run.program or 'nccl-tests'}: per-size results", show_lines=False)
    for col in ("size (B)", "count", "type", "redop"):
        t.add_column(col, justify="right")
    for blk in ("out-of-place", "in-place"):
        t.add_column(f"{blk}\ntime (us)", justify="right")
        t.add_column("busbw\n(GB/s)", justify="right")
        t.add_column("#wrong", justify="right")

    def fmt(v, spec="g"):
        return "-" if v is None or v != v else format(v, spec)

    for r in run.rows.itertuples(index=False):
        t.add_row(
            str(r.size),
            str(r.count),
            str(r.type),
            str(r.redop),
            fmt(r.oop_time_us),
            fmt(r.oop_busbw_gbs, ".2f"),
            fmt(r.oop_wrong, ".0f"),
            fmt(r.ip_time_us),
            fmt(r.ip_busbw_gbs, ".2f"),
            fmt(r.ip_wrong, ".0f"),
        )
    return t
