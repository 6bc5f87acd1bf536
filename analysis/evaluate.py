"""Detection quality of the engine on the fault scenario matrix (real simulated jobs).

Prints, per diagnosis kind: scenarios, precision, recall, localization accuracy and
detection latency from fault onset to WARNING and to ERROR (hangs) or to the first
finding (slow kinds), plus the clean runs' false positives.

    python analysis/evaluate.py            # the full matrix (~10 minutes on 2 cores)
    python analysis/evaluate.py --quick    # the CI subset
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from c4d import scenarios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the CI subset of the matrix")
    ap.add_argument("--only", default="", help="run only scenarios whose name contains this")
    args = ap.parse_args()
    con = Console(width=max(Console().width, 120))  # the table's columns, also when piped
    outcomes = []
    t0 = time.time()
    for sc in scenarios.matrix(full=not args.quick):
        if args.only and args.only not in sc.name:
            continue
        with tempfile.TemporaryDirectory(prefix="c4d-scn-") as wd:  # traces are not kept
            o = scenarios.run(sc, Path(wd))
        outcomes.append(o)
        mark = "ok" if (o.correct if sc.fault else not o.diagnoses) and not o.wrong else "MISS"
        con.print(f"{mark:4s} {sc.name:60s} {len(o.correct)} right, {len(o.wrong)} wrong, {o.seconds:5.1f} s",
                  markup=False, highlight=False)  # fmt: skip
    t = Table(title=f"c4d engine on {len(outcomes)} simulated jobs ({time.time() - t0:.0f} s)")
    for c in (
        "kind",
        "runs",
        "precision",
        "recall",
        "localization",
        "→ WARNING (s)",
        "→ ERROR (s)",
        "→ INFO (s)",
    ):
        t.add_column(c, justify="left" if c == "kind" else "right")
    for kind in scenarios.EXPECTED_KIND.values():
        runs = [o for o in outcomes if o.scenario.expected_kind == kind]
        said = [d for o in outcomes for d in o.diagnoses if d["kind"] == kind]
        right = [d for o in runs for d in o.correct]
        detected = [o for o in runs if o.of_kind(kind)]
        localized = [o for o in runs if o.correct]
        precision = len(right) / len(said) if said else float("nan")
        recall = len(detected) / len(runs) if runs else float("nan")
        loc = len(localized) / len(detected) if detected else float("nan")

        def lat(level: str, runs=runs) -> str:
            vals = [v for o in runs if (v := o.latency(level)) is not None]
            return f"{statistics.median(vals):.2f} / {max(vals):.2f}" if vals else "-"

        t.add_row(kind, str(len(runs)), f"{precision:.0%}", f"{recall:.0%}", f"{loc:.0%}", lat("WARNING"),
                  lat("ERROR"), lat("INFO"))  # fmt: skip
    clean = [o for o in outcomes if o.scenario.fault is None]
    fp = sum(len(o.diagnoses) for o in clean)
    con.print(t)
    con.print(f"clean runs: {len(clean)}, diagnoses on them: {fp}")
    con.print("latency columns: median / max seconds from fault onset; thresholds T = 1 s, "
              "C4D_HANG_TIMES = 3, check period 1 s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
