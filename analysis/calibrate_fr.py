"""How often each Flight Recorder finding is right: the measured share behind fr_match.MEASURED.

    python analysis/calibrate_fr.py                 # 40 random jobs per case, seed 1, + the real dumps
    python analysis/calibrate_fr.py --jobs 100 --seed 7 --json-out fr_calibration.json

Cases, each a small synthetic job written by tests/fr_factory.py (tp x dp ranks, random sizes,
culprit, faulty op and step count), dumped two ways: ``pending`` (as written: the faulty op
outstanding, as NCCL's watchdog dumps) and ``retired`` (every entry marked retired, as torch marks
them once the job caught gloo's timeout):

* ``skip``: one rank leaves out one collective of the last step (culprit: that rank);
* ``missing``: ranks never issue the last step's world all_reduce (culprits: those ranks);
* ``lost``: the same, and the culprit left no dump;
* ``gone``: the job finished cleanly and one rank's dump is missing (nothing is wrong: any finding
  that names a culprit is wrong). It stands for the other cause of a missing dump, one for each
  ``lost-retired`` job (where nothing is pending, the case ``gone`` looks like): with both in the
  mix, "no dump" there means a lost rank half the time;
* ``op`` / ``count`` / ``dtype``: one rank's entry of a collective disagrees with its group's in
  type, element count or dtype (culprit: that rank), the op stalled or not;
* ``slow``: without device timing, one rank issues every op 12-60 ms late, the others jittered by
  up to 4 ms (culprit: that rank);
* ``clean``: the same jitter, no fault (every finding is wrong);

plus the real gloo dumps under tests/data/fr_gloo (MANIFEST.json names each one's culprit).

Each case is imported and replayed as ``c4d analyze`` does. Each basis a job's diagnoses have
counts once for that job: right when every diagnosis with it names exactly the culprits (none for
``gone`` and ``clean``). Per basis (``localization.basis``), the share right and its Wilson lower
bound (z 1.28, as c4d/engine/calibration.py): the counts fr_match.MEASURED keeps. The FR import's own bases
are ``fr-match/rank`` ("match"), ``fr-pending/lost`` ("pending"), ``fr-match/lost`` ("stopped") and
``fr-timing/rank`` ("timing"); the engine's bases on FR imports are listed too (their confidences
are the engine's calibration's).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import fr_factory as f  # noqa: E402

from c4d.engine import Engine, EngineConfig  # noqa: E402
from c4d.engine.calibration import wilson_lower  # noqa: E402
from c4d.formats.detect import load_any  # noqa: E402
from c4d.offline import analyze  # noqa: E402

CASES = ("skip", "missing", "lost", "gone", "op", "count", "dtype", "slow", "clean")
MODES = ("pending", "retired")
FR_BASES = {"fr-match/rank": "match", "fr-pending/lost": "pending", "fr-match/lost": "stopped",
            "fr-timing/rank": "timing"}  # fmt: skip
GLOO = ROOT / "tests" / "data" / "fr_gloo"


def _retire(dumps: dict[int, dict]) -> None:
    for d in dumps.values():
        for e in d["entries"]:
            e["retired"] = True


def _jitter(dumps: dict[int, dict], rng: random.Random, late: int | None, late_ms: float) -> None:
    """Compute noise on every rank's issue times (up to 4 ms an op), ``late`` rank late by ``late_ms``."""
    for r, d in dumps.items():
        for e in d["entries"]:
            extra = rng.uniform(0, 4e6) + (late_ms * 1e6 if r == late else 0)
            e["time_created_ns"] += int(extra)


def _collective_at(dumps: dict[int, dict], rank: int, rng: random.Random) -> dict | None:
    ents = [e for e in dumps[rank]["entries"][-8:] if not e["is_p2p"]]
    return rng.choice(ents) if ents else None


def make_case(case: str, mode: str, rng: random.Random, d: Path) -> set[int]:
    """Write one case's dumps into ``d``; returns its culprits."""
    tp = rng.choice((2, 4))
    dp = rng.choice((2, 4))
    world = tp * dp
    steps = rng.randint(6, 12)
    culprit = rng.randrange(world)
    timing = rng.random() < 0.5 and case not in ("slow", "clean")
    job = f.Job(tp=tp, dp=dp, steps=steps, timing=timing)
    culprits: set[int] = {culprit}
    drop: int | None = None
    if case == "skip":
        job.skip = f.Skip(rank=culprit, op_index=rng.choice((0, 1, 3)))
    elif case in ("missing", "lost"):
        job.hang = f.Hang(op_index=4, missing=(culprit,))
        drop = culprit if case == "lost" else None
    elif case == "gone":
        drop, culprits = culprit, set()
    elif case in ("op", "count", "dtype") and rng.random() < 0.5:
        job.hang = f.Hang(op_index=4)  # the op that disagrees stalls (every member waits in it)
    dumps = f.build(job)
    if case in ("op", "count", "dtype"):
        e = _collective_at(dumps, culprit, rng) if not job.hang else dumps[culprit]["entries"][-1]
        assert e is not None
        if case == "op":
            e["profiling_name"] = (
                "nccl:broadcast" if "all_reduce" not in e["profiling_name"] else "nccl:all_gather"
            )
        elif case == "count":
            e["input_sizes"] = [[s[0] * 2, *s[1:]] for s in e["input_sizes"]]
            e["output_sizes"] = [[s[0] * 2, *s[1:]] for s in e["output_sizes"]]
        else:
            e["input_dtypes"] = ["Float"] * len(e["input_dtypes"])
    if case in ("slow", "clean"):
        _jitter(dumps, rng, culprit if case == "slow" else None, rng.uniform(12, 60))
        if case == "clean":
            culprits = set()
    if mode == "retired":
        _retire(dumps)
    if drop is not None:
        del dumps[drop]
    f.write(dumps, d)
    return culprits


def diagnose(d: Path) -> list:
    rt = load_any(d, on_warning=lambda w: None)
    return analyze.replay(rt, Engine(EngineConfig()))


def score(diags: list, culprits: set[int]) -> list[tuple[str, bool]]:
    """(basis, right) once per basis the job's diagnoses have: right when every diagnosis with that
    basis names exactly the culprits (a rank in four groups is not four findings)."""
    right: dict[str, bool] = {}
    for x in diags:
        if x.ranks:
            b = x.localization.basis
            right[b] = right.get(b, True) and set(x.ranks) == culprits
    return list(right.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=40, help="random jobs per case and mode")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_case: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    tmp = Path(tempfile.mkdtemp(prefix="c4d-calibrate-fr-"))
    try:
        runs: list[tuple[str, Path, set[int]]] = []
        for case in CASES:
            for mode in MODES if case != "gone" else ("retired",):  # a clean job's dumps: all done
                for i in range(args.jobs):
                    d = tmp / f"{case}-{mode}-{i}"
                    runs.append((f"{case}-{mode}", d, make_case(case, mode, rng, d)))
        manifest = json.loads((GLOO / "MANIFEST.json").read_text())
        for name, m in sorted(manifest.items()):
            runs.append((f"gloo:{name}", GLOO / name, {int(m["fault"]["rank"])}))
        for label, d, culprits in runs:
            for basis, right in score(diagnose(d), culprits):
                tally[basis][0] += 1
                tally[basis][1] += right
                by_case[basis][label.split("-")[0] if not label.startswith("gloo:") else "gloo"][0] += 1
                by_case[basis][label.split("-")[0] if not label.startswith("gloo:") else "gloo"][1] += right
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"seed": args.seed, "jobs_per_case_and_mode": args.jobs, "bases": {}}
    print(f"{'basis':<44}{'n':>6}{'right':>7}{'share':>7}{'wilson':>8}  cases (n/right)")
    for basis, (n, right) in sorted(tally.items()):
        w = round(wilson_lower(right, n), 2)
        cases = {c: v for c, v in sorted(by_case[basis].items())}
        out["bases"][basis] = {"n": n, "right": right, "share": round(right / n, 3), "wilson": w,
                               "fr_confidence": FR_BASES.get(basis), "cases": cases}  # fmt: skip
        where = ", ".join(f"{c} {v[0]}/{v[1]}" for c, v in cases.items())
        print(f"{basis:<44}{n:>6}{right:>7}{right / n:>7.2f}{w:>8.2f}  {where}")
    measured = {ev: (tally[b][0], tally[b][1]) for b, ev in FR_BASES.items()}
    out["measured"] = measured
    print("\nfr_match.MEASURED (findings, right):", json.dumps(measured))
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
