"""Detection quality of the engine on real simulated jobs: the scenario matrix, or a randomized
fault benchmark with calibration of the engine's confidence against outcomes.

    python analysis/evaluate.py                        # the scenario matrix (~10 minutes on 2 cores)
    python analysis/evaluate.py --random 200 --seed 1  # 200 random jobs (about an hour)
    python analysis/evaluate.py --quick                # the CI variant: 6 small random jobs, checked
    python analysis/evaluate.py --random 120 --seed 2 --learn   # measure the bases, write the table
    python analysis/evaluate.py --learn-from s2.jsonl s3.jsonl  # the table from recorded --results
    python analysis/evaluate.py --rescore s1.jsonl     # their calibration under the current table
    python analysis/evaluate.py --quick --agents       # + each job's trace through node agents
    python analysis/evaluate.py --quick --shards 2     # + each job's trace through 2 engine shards

Per diagnosis kind: faults, recall (observable faults found), diagnoses, precision (diagnoses
about an injected fault of that kind), localization (those naming exactly the culprit: the
rank, the link, the node's ranks, the cycle), latency from onset to the first WARNING / ERROR
(hangs) or INFO (slow kinds). Then false alarms on clean jobs, transient faults (a hang that
was only a stall, a slowdown that recovered: never an ERROR, never a blacklist), and
calibration: per confidence bucket, how many diagnoses said it and the share that named the
culprit exactly, or the node it is on where the diagnosis names a node
(c4d/engine/calibration.py). ``--learn`` writes each basis's counts into
c4d/engine/calibration_table.py; learn on one seed, check on another.

A fault is *observable* when its rank reached the fault's step and the job then ran long
enough to see it (T + 1 s for hangs, two check periods + 1 s for slow kinds), and it is not
a transient stall shorter than 1.5 T or a transient slowdown. Thresholds: T = 1 s,
C4D_HANG_TIMES = 3, 1 s check periods (c4d.sim.scenarios.SCENARIO_ENV).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from c4d.engine import calibration_table
from c4d.engine.calibration import confidence, wilson_lower
from c4d.engine.incidents import Incidents
from c4d.engine.types import DiagKind, Diagnosis, How, Level, Localization, Target
from c4d.sim import scenarios

T_S, TIMES, PERIOD_S = 1.0, 3, 1.0
BUCKETS = [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.01)]
TABLE_PATH = Path(__file__).resolve().parents[1] / "c4d/engine/calibration_table.py"
KINDS = list(dict.fromkeys(scenarios.EXPECTED_KIND.values()))


@dataclass
class FaultResult:
    expect: scenarios.Expect
    onset: float | None
    observable: bool
    transient: bool
    found: bool = False
    warn_s: float | None = None
    error_s: float | None = None
    info_s: float | None = None
    errors: int = 0  # ERROR diagnoses about it
    incidents: int = 0  # incidents (c4d.engine.incidents) whose first diagnosis is about it
    blacklisted: bool = False
    effect: float = math.inf  # comm-slow: how much it slows the most affected communicator
    measured: float | None = None  # comm-slow: the slowdown the trace shows (scenarios.measured_slowdown)


@dataclass
class JobResult:
    sc: scenarios.Scenario
    status: int
    seconds: float
    diagnoses: list[dict]
    faults: list[FaultResult]
    labels: list[tuple[int, bool]] = field(default_factory=list)  # per diagnosis: (fault index or -1, exact)
    uptime: str = ""
    healthy_isolated: list[str] = field(default_factory=list)  # blacklisted nodes no fault is on
    on_node: list[bool] = field(default_factory=list)  # per diagnosis: names the node its fault is on


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return ""


def score(o: scenarios.Outcome) -> JobResult:
    """Which diagnosis is about which fault, and whether it named the culprit exactly."""
    sc = o.scenario
    frs = []
    for spec in sc.specs:
        e = sc.expect(spec)
        onset = o.onsets.get(spec)
        f = e.fault
        transient = f.transient
        hang = e.kind in scenarios.HANG_KINDS
        need = T_S + 1.0 if hang else 2 * PERIOD_S + 1.0
        ran = onset is not None and o.end_s is not None and o.end_s - onset >= need
        if hang and onset is not None and o.status == 2:
            ran = True  # stopped on an ERROR: hung for good
        short = (f.secs is not None and f.secs < 1.5 * T_S) or f.until is not None
        effect = scenarios.slow_effect(sc, spec)
        hidden = effect < 1.5  # the faulty link never paces a communicator (see slow_effect)
        frs.append(FaultResult(e, onset, bool(ran) and not short and not hidden, transient, effect=effect,
                               measured=o.slowdowns.get(spec)))  # fmt: skip
    labels, on_node = [], []
    for d in o.diagnoses:
        idx, exact, node = -1, False, False
        for i, fr in enumerate(frs):
            if fr.expect.matches(d):
                idx, exact, node = i, fr.expect.exact(d), fr.expect.on_its_node(d, sc.ranks_per_node)
                break
        labels.append((idx, exact))
        on_node.append(node)
        if idx < 0:
            continue
        fr = frs[idx]
        fr.found = True
        if d["level"] == "ERROR":
            fr.errors += 1
            if any(n in o.blacklist for n in d["nodes"]):
                fr.blacklisted = True
        if fr.onset is not None:
            lat = d["time"] - fr.onset
            key = {"WARNING": "warn_s", "ERROR": "error_s", "INFO": "info_s"}[d["level"]]
            if getattr(fr, key) is None:
                setattr(fr, key, lat)
    for inc in _incidents(o.diagnoses):
        for fr in frs:
            if fr.expect.matches(inc):
                fr.incidents += 1
                break
    faulty = {f"node-{r // sc.ranks_per_node}" for fr in frs for r in fr.expect.ranks}
    healthy = [n for n in o.blacklist if n not in faulty]
    return JobResult(
        sc, o.status, o.seconds, o.diagnoses, frs, labels, healthy_isolated=healthy, on_node=on_node
    )


def _incidents(diagnoses: list[dict]) -> list[dict]:
    """The first diagnosis (as JSON) of each incident c4d.engine.incidents folds the job's stream into."""
    objs = [_diag(d) for d in diagnoses]
    where = {id(x): i for i, x in enumerate(objs)}
    return [diagnoses[where[id(inc.first)]] for inc in Incidents.fold(objs)]


def _diag(d: dict) -> Diagnosis:
    """A diagnosis back from its JSON (what the sim printed)."""
    lj = d.get("localization") or {}
    loc = Localization(How(lj.get("how", "none")), Target(lj.get("target", "suspects")),
                       tuple(lj.get("ranks") or d["ranks"]), float(lj.get("confidence") or 0.0),
                       str(lj.get("basis", "")), str(lj.get("evidence", "")),
                       tuple(lj["link"]) if lj.get("link") else None)  # type: ignore[arg-type]  # fmt: skip
    return Diagnosis(round(d["time"] * 1e9), Level[d["level"]], DiagKind(d["kind"]),
                     int(d["comm"], 16) if d.get("comm") else None, d.get("op"), d.get("seq"),
                     tuple(d["ranks"]), tuple(d.get("nodes") or ()), int(d.get("hang_times") or 0), loc,
                     d.get("detail") or {})  # fmt: skip


def run_jobs(
    jobs: list[scenarios.Scenario],
    con: Console,
    out: Path | None,
    agents: list[dict] | None = None,
    keep: Path | None = None,
    shards: tuple[int, list[bool]] | None = None,
) -> list[JobResult]:
    """``agents``: a list to append each job's agents-vs-direct comparison to (c4d.agent.replay);
    ``keep``: a folder to keep the trace of each job with a diagnosis about no injected fault in
    (``c4d analyze`` replays it: another engine's verdicts on the same records); ``shards``: (N,
    a list to append to) each job's trace replayed through one engine and through N shards
    (c4d/engine/shards.py), whether the diagnoses are the same, field for field."""
    results = []
    for i, sc in enumerate(jobs):
        up = _uptime()
        with tempfile.TemporaryDirectory(prefix="c4d-eval-") as wd:  # traces kept with --keep-traces only
            o = scenarios.run(sc, Path(wd), timeout=400)
            if agents is not None and o.trace_path and Path(o.trace_path).exists():
                from c4d.agent import replay  # (the agents' check: --agents)

                agents.append(replay.compare(Path(o.trace_path)))
                con.print(replay.job_line(agents[-1]), markup=False, highlight=False)
            if shards is not None and o.trace_path and Path(o.trace_path).exists():
                shards[1].append(_same_through_shards(Path(o.trace_path), shards[0]))
                con.print(f"    through {shards[0]} engine shards: the same diagnoses {shards[1][-1]}",
                          markup=False, highlight=False)  # fmt: skip
            r = score(o)
            if keep is not None and o.trace_path and any(i2 < 0 for i2, _ in r.labels):
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(o.trace_path, keep / f"{i + 1:03d}-{sc.name.replace(':', '_')[:120]}.c4d")
        r.uptime = up
        results.append(r)
        right = sum(1 for i2, ex in r.labels if i2 >= 0 and ex)
        wrong = sum(1 for i2, _ in r.labels if i2 < 0)
        found = sum(f.found for f in r.faults)
        con.print(f"{i + 1:3d}/{len(jobs)} {sc.name[:90]:90s} found {found}/{len(r.faults)} "
                  f"exact {right}/{len(r.labels)} wrong {wrong} {o.seconds:5.1f} s", markup=False,
                  highlight=False)  # fmt: skip
        if out is not None:
            with out.open("a") as fh:
                fh.write(json.dumps(_dump(r)) + "\n")
    return results


def _dump(r: JobResult) -> dict:
    return {
        "scenario": r.sc.name,
        "status": r.status,
        "seconds": r.seconds,
        "uptime": r.uptime,
        "faults": [{k: getattr(f, k) for k in FAULT_FIELDS} | {"spec": f.expect.spec, "kind": f.expect.kind}
                   for f in r.faults],
        "diagnoses": [
            {"level": d["level"], "kind": d["kind"], "ranks": d["ranks"], "fault": i, "exact": ex,
             "on_node": nd,
             "basis": _loc(d).get("basis"), "confidence": _loc(d).get("confidence"),
             "target": _loc(d).get("target"), "alternatives": _loc(d).get("alternatives") or []}
            for d, (i, ex), nd in zip(r.diagnoses, r.labels, r.on_node, strict=True)
        ],
    }  # fmt: skip


FAULT_FIELDS = (
    "onset",
    "observable",
    "transient",
    "found",
    "warn_s",
    "error_s",
    "info_s",
    "errors",
    "blacklisted",
    "measured",
)


def _loc(d: dict) -> dict:
    return d.get("localization") or {}


def _final_exact(r: JobResult, i: int, equivalents: bool = False) -> bool:
    """Is the last diagnosis about fault ``i`` exact (its incident's final verdict), or the node
    it is on where nothing tells that node's ranks apart (``equivalents``: or does it list the
    fault among what nothing observable tells from the one it names)?"""
    last = [k for k, lab in enumerate(r.labels) if lab[0] == i]
    if not last:
        return False
    k = last[-1]
    return (
        r.labels[k][1]
        or r.on_node[k]
        or (equivalents and r.faults[i].expect.among_equivalents(r.diagnoses[k]))
    )


def _med_max(vals: list[float]) -> str:
    return f"{statistics.median(vals):.2f} / {max(vals):.2f}" if vals else "-"


def report(results: list[JobResult], con: Console, title: str) -> dict:
    t = Table(title=title)
    cols = ["kind", "faults", "observable", "recall", "diagnoses", "precision", "localization", "+ node",
            "final exact", "incidents/fault", "→ WARNING (s)", "→ ERROR (s)", "→ INFO (s)"]  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c == "kind" else "right")
    summary: dict = {"kinds": {}}
    eq: list[str] = []
    for kind in KINDS:
        frs = [f for r in results for f in r.faults if f.expect.kind == kind]
        obs = [f for f in frs if f.observable]
        said = [
            (d, lab)
            for r in results
            for d, lab in zip(r.diagnoses, r.labels, strict=True)
            if d["kind"] == kind
        ]
        about = [lab for _, lab in said if lab[0] >= 0]
        exact = [lab for lab in about if lab[1]]
        node = [1 for r in results for d, lab, nd in zip(r.diagnoses, r.labels, r.on_node, strict=True)
                if d["kind"] == kind and lab[0] >= 0 and (lab[1] or nd)]  # fmt: skip
        recall = sum(f.found for f in obs) / len(obs) if obs else math.nan
        precision = len(about) / len(said) if said else math.nan
        loc = len(exact) / len(about) if about else math.nan
        loc_node = len(node) / len(about) if about else math.nan
        # per fault found: is the last diagnosis about it exact (its incident's final verdict)
        ends = [(r, i) for r in results for i, f in enumerate(r.faults) if f.found and f.expect.kind == kind]
        final = [_final_exact(r, i) for r, i in ends]
        fin = sum(final) / len(final) if final else math.nan
        # the same, counting one that lists the fault among the hypotheses nothing observable
        # tells from the one it names (its basis says so: "/equivalent")
        equiv = [_final_exact(r, i, True) for r, i in ends]
        fin_eq = sum(equiv) / len(equiv) if equiv else math.nan
        if equiv:
            eq.append(f"{kind} {sum(equiv)}/{len(equiv)}")
        found = [f for f in frs if f.found]
        per = sum(f.incidents for f in found) / len(found) if found else math.nan
        t.add_row(kind, str(len(frs)), str(len(obs)), _pct(recall), str(len(said)), _pct(precision),
                  _pct(loc), _pct(loc_node), _pct(fin), "-" if math.isnan(per) else f"{per:.2f}",
                  _med_max([f.warn_s for f in obs if f.warn_s is not None]),
                  _med_max([f.error_s for f in obs if f.error_s is not None]),
                  _med_max([f.info_s for f in obs if f.info_s is not None]))  # fmt: skip
        summary["kinds"][kind] = dict(faults=len(frs), observable=len(obs), recall=recall,
                                      diagnoses=len(said), precision=precision, localization=loc,
                                      localization_node=loc_node, final_exact=fin,
                                      incidents_per_fault=per,
                                      final_exact_or_equivalent=fin_eq)  # fmt: skip
    con.print(t)
    con.print("final verdict exact, or the fault listed among what nothing observable tells from it: "
              + "; ".join(eq))  # fmt: skip
    rows = []
    for kind in ("RankNonCommSlow", "RankCommSlow"):
        for lo, hi in ((1.5, 2.0), (2.0, 4.0), (4.0, math.inf)):
            fs = [f for r in results for f in r.faults if f.observable and f.expect.kind == kind
                  and lo <= min(f.expect.fault.factor or 0, f.effect) < hi]  # fmt: skip
            if fs:
                rows.append(f"{kind} ×{lo:g}–{hi:g}: {sum(f.found for f in fs)}/{len(fs)}")
    hidden = sum(1 for r in results for f in r.faults if f.effect < 1.5)
    con.print("slow recall by factor (comm-slow: its effect on the slowest communicator it touches): "
              + "; ".join(rows))  # fmt: skip
    con.print(f"comm faults on links that pace no communicator (not counted as observable): {hidden}")
    # The same comm slowdowns by what the job measured (simnccl's host work included): the
    # engine's line is 1 / C4D_SLOW_BW_RATIO = 2x, so below it a miss is the contract.
    cs = [f for r in results for f in r.faults if f.observable and f.measured is not None]
    line = [f"measured ×{lo:g}–{hi:g}: {sum(f.found for f in fs)}/{len(fs)}"
            for lo, hi in ((0.0, 1.5), (1.5, 2.0), (2.0, 2.5), (2.5, math.inf))
            if (fs := [f for f in cs if lo <= (f.measured or 0.0) < hi])]  # fmt: skip
    past = [f for f in cs if (f.measured or 0.0) >= 2.0]
    summary["comm_slow_past_line"] = dict(found=sum(f.found for f in past), of=len(past))
    con.print("RankCommSlow recall by the slowdown measured on the trace (line: 2×): " + "; ".join(line))
    clean = [r for r in results if not r.faults]
    fa = sum(len(r.diagnoses) for r in clean)
    fa_jobs = sum(1 for r in clean if r.diagnoses)
    con.print(f"clean jobs: {len(clean)}, with a diagnosis: {fa_jobs}, diagnoses on them: {fa}")
    unrelated = sum(1 for r in results if r.faults for i, _ in r.labels if i < 0)
    con.print(f"diagnoses about no injected fault, in faulty jobs: {unrelated}")
    trans = [f for r in results for f in r.faults if f.transient]
    bad = [f for f in trans if f.errors or f.blacklisted]
    con.print(f"transient faults: {len(trans)}, found: {sum(f.found for f in trans)}, "
              f"ERROR or blacklist on one: {len(bad)}")  # fmt: skip
    healthy = [n for r in results for n in r.healthy_isolated]
    con.print(f"healthy nodes isolated (blacklisted, no injected fault on them): {len(healthy)}"
              + (f" ({', '.join(f'{r.sc.name}: {n}' for r in results for n in r.healthy_isolated)})"
                 if healthy else ""))  # fmt: skip
    summary["healthy_isolated"] = len(healthy)
    mism = [f for r in results for f in r.faults if f.expect.kind == "CollectiveMismatch"]
    con.print(f"mismatch faults blacklisted: {sum(f.blacklisted for f in mism)} of {len(mism)}")
    labs = [(d.get("localization", {}).get("confidence", 0.0), lab[0] >= 0 and (lab[1] or nd))
            for r in results
            for d, lab, nd in zip(r.diagnoses, r.labels, r.on_node, strict=True)]  # fmt: skip
    summary["calibration"] = calibration(labs, con)
    summary.update(clean_jobs=len(clean), false_alarms=fa, unrelated=unrelated, transient_bad=len(bad),
                   mismatch_blacklisted=sum(f.blacklisted for f in mism))  # fmt: skip
    return summary


def calibration(labs: list[tuple[float, bool]], con: Console) -> list[dict]:
    """Per confidence bucket: how many diagnoses said it and the share exactly right."""
    ct = Table(title="calibration: every diagnosis, by its confidence")
    for c in ("confidence", "diagnoses", "mean confidence", "exactly right", "right (90% lower bound)"):
        ct.add_column(c, justify="right")
    out = []
    for lo, hi in BUCKETS:
        b = [(c, ok) for c, ok in labs if lo <= c < hi]
        if not b:
            continue
        mean_c = sum(c for c, _ in b) / len(b)
        right = sum(ok for _, ok in b)
        ct.add_row(f"{lo:.1f}–{min(hi, 1.0):.1f}", str(len(b)), f"{mean_c:.2f}", _pct(right / len(b)),
                   _pct(wilson_lower(right, len(b))))  # fmt: skip
        out.append({"lo": lo, "hi": hi, "n": len(b), "mean": mean_c, "right": right / len(b)})
    con.print(ct)
    return out


def rescore(rows: list[dict], con: Console) -> list[dict]:
    """The calibration of a --results file under the current table. A confidence is a function
    of the basis and the table only (no decision reads it), so a table learned on other seeds
    can be checked on recorded jobs; bases the table lacks keep the confidence they were given."""
    labs = []
    for job in rows:
        for d in job["diagnoses"]:
            b, c = d.get("basis"), d.get("confidence") or 0.0
            conf = confidence(b, c) if b else c
            labs.append((conf, _right(d)))
    return calibration(labs, con)


def _right(d: dict) -> bool:
    """A dumped diagnosis names its fault's culprit exactly, or the node it is on where that is
    what the diagnosis claims (a node verdict: its ranks cannot be told apart)."""
    return d["fault"] >= 0 and (d["exact"] or bool(d.get("on_node")))


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.0%}"


def learn(
    results_or_rows: list[dict], path: Path = TABLE_PATH, keep: dict[str, tuple[int, int]] | None = None
) -> dict[str, tuple[int, int]]:
    """Per basis: (diagnoses, exactly right), from dumped job results; write the table module.
    A basis these jobs never produced keeps its counts from ``keep`` (the table before): a rare
    one would otherwise fall back to the uncalibrated cap, however often it was wrong."""
    counts: dict[str, list[int]] = {k: list(v) for k, v in (keep or {}).items()}
    fresh: set[str] = set()
    for job in results_or_rows:
        for d in job["diagnoses"]:
            if not d.get("basis"):
                continue
            if d["basis"] not in fresh:
                fresh.add(d["basis"])
                counts[d["basis"]] = [0, 0]
            c = counts[d["basis"]]
            c[0] += 1
            c[1] += int(_right(d))
    table = {k: (v[0], v[1]) for k, v in sorted(counts.items())}
    body = "\n".join(f"    {json.dumps(k)}: {v!r}," for k, v in table.items())
    path.write_text(
        '"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.\n\n'
        "Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);\n"
        'do not edit by hand.\n"""\n\n'
        f"TABLE: dict[str, tuple[int, int]] = {{\n{body}\n}}\n"
    )
    return table


def _same_through_shards(path: Path, n: int) -> bool:
    """A trace's diagnoses replayed through one engine and through ``n`` engine shards, each a
    process of its own: the same, field for field?"""
    from c4d.engine import EngineConfig
    from c4d.engine.shards import ShardedEngine
    from c4d.offline import analyze
    from c4d.record import trace

    rt = trace.read_raw(path)
    one = [d.to_json() for d in analyze.replay(rt, analyze.make_engine())]
    eng = ShardedEngine(EngineConfig.from_env(), shards=n, processes=True)
    try:
        return [d.to_json() for d in analyze.replay(rt, eng)] == one
    finally:
        eng.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--random", type=int, metavar="N", help="N randomly drawn jobs instead of the matrix")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-ranks", type=int, default=64)
    ap.add_argument(
        "--quick", action="store_true", help="CI: 6 random jobs of at most 16 ranks, with --check"
    )
    ap.add_argument("--check", action="store_true",
                    help="exit 2 when a transient fault got an ERROR or a blacklist, a mismatch was "
                         "blacklisted, or a clean job an ERROR")  # fmt: skip
    ap.add_argument("--results", type=Path, help="append one JSON line per job here")
    ap.add_argument("--learn", action="store_true", help="write the calibration table from these jobs")
    ap.add_argument("--learn-from", type=Path, nargs="+", metavar="RESULTS",
                    help="write the calibration table from --results files (pool several seeds)")  # fmt: skip
    ap.add_argument("--rescore", type=Path, nargs="+", metavar="RESULTS",
                    help="print the calibration of --results files under the current table")  # fmt: skip
    ap.add_argument("--agents", action="store_true",
                    help="also replay each job's trace through an agent per node and compare the "
                    "incidents' final culprits with the direct replay's "
                    "(with --check: a job where they differ fails)")  # fmt: skip
    ap.add_argument("--shards", type=int, metavar="N",
                    help="also replay each job's trace through one engine and through N engine shards "
                    "(c4d master --engine-shards) and compare the diagnoses, field for field "
                    "(with --check: a job where they differ fails)")  # fmt: skip
    ap.add_argument(
        "--keep-traces",
        type=Path,
        metavar="DIR",
        help="keep the trace of each job with a diagnosis about no injected fault here",
    )
    ap.add_argument("--only", default="", help="only the jobs (matrix or random) whose name contains this")
    args = ap.parse_args()
    con = Console(width=max(Console().width, 140))
    if args.rescore:
        rows = [json.loads(ln) for f in args.rescore for ln in f.read_text().splitlines() if ln.strip()]
        rescore(rows, con)
        return 0
    if args.learn_from:
        rows = [json.loads(ln) for f in args.learn_from for ln in f.read_text().splitlines() if ln.strip()]
        table = learn(rows, keep=calibration_table.TABLE)
        con.print(f"wrote {len(table)} bases to {TABLE_PATH}")
        return 0
    t0 = time.time()
    up0 = _uptime()
    if args.quick:
        args.random, args.max_ranks, args.check = 6, 16, True
    if args.random:
        drawn = scenarios.random_jobs(args.random, args.seed, args.max_ranks)
        jobs = [sc for sc in drawn if args.only in sc.name]
        title = f"c4d engine on {len(jobs)} random jobs, seed {args.seed}"
        if args.only:
            title += f" (of {len(drawn)}: '{args.only}')"
    else:
        jobs = [sc for sc in scenarios.matrix(full=True) if args.only in sc.name]
        title = f"c4d engine on the scenario matrix ({len(jobs)} jobs)"
    agents: list[dict] | None = [] if args.agents else None
    shards: tuple[int, list[bool]] | None = (args.shards, []) if args.shards else None
    results = run_jobs(jobs, con, args.results, agents, args.keep_traces, shards)
    summary = report(results, con, f"{title} ({time.time() - t0:.0f} s)")
    con.print(f"uptime before: {up0}")
    con.print(f"uptime after:  {_uptime()}")
    con.print(f"thresholds: T = {T_S:g} s, C4D_HANG_TIMES = {TIMES}, check period {PERIOD_S:g} s; latency "
              "columns: median / max seconds from the fault's onset")  # fmt: skip
    if args.learn:
        table = learn([_dump(r) for r in results], keep=calibration_table.TABLE)
        con.print(f"wrote {len(table)} bases to {TABLE_PATH}")
    differ = 0
    if agents is not None:
        from c4d.agent import replay

        differ = sum(not a["same"] for a in agents)
        con.print(replay.summary_line(agents), markup=False, highlight=False)
    if shards is not None:
        same = sum(shards[1])
        differ += len(shards[1]) - same
        con.print(f"through {shards[0]} engine shards: the same diagnoses as one engine in {same} of "
                  f"{len(shards[1])} jobs", markup=False, highlight=False)  # fmt: skip
    if args.check:
        clean_errors = sum(1 for r in results if not r.faults for d in r.diagnoses if d["level"] == "ERROR")
        bad = summary["transient_bad"] + summary["mismatch_blacklisted"] + clean_errors + differ
        if bad:
            con.print(f"check failed: {bad} transient ERRORs / mismatch blacklists / ERRORs on clean jobs"
                      " / jobs whose agents named other final culprits")  # fmt: skip
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
