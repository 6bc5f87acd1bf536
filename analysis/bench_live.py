"""How long one live-view frame takes for a 1,024-rank job, against the master's 250 ms refresh budget.

The master renders between ingestion steps at most 4 times a second; this measures the
share of the master's time that rendering takes (ingestion gets the rest).

    python analysis/bench_live.py
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from c4d.master.live import render
from tests.test_live_render import big_state


def main() -> int:
    state = big_state(1024)
    times = []
    for _ in range(30):
        con = Console(file=io.StringIO(), width=120, height=40, color_system="truecolor")
        t0 = time.perf_counter()
        con.print(render(state, 120, 40))
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(
        f"1,024 ranks, 40 communicators: {med * 1e3:.1f} ms per frame (median of {len(times)}), "
        f"max {max(times) * 1e3:.1f} ms"
    )
    print(f"at 4 Hz that is {med * 4:.1%} of the master thread; ingestion keeps {1 - med * 4:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
