"""The live view is a pure function of a snapshot: render hand-built states without a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from c4d.engine.types import CommSnapshot
from c4d.live import LiveState, render


def big_state(ranks: int = 1024, per_node: int = 8, hung: int = 77) -> LiveState:
    states = {r: "computing" for r in range(ranks)}
    states.update({r: "waiting" for r in range(0, ranks, 3)})
    states[hung] = "hung"
    comms = [
        CommSnapshot(f"{i:016x}", "DP" if i % 2 else "TP", 64, 1000 + i, 50.0, 10, 90, 200, 900, 12.5)
        for i in range(40)
    ]
    return LiveState(
        job="big",
        ranks_registered=ranks,
        ranks_expected=ranks,
        nodes=ranks // per_node,
        records_per_s=25000,
        dropped=0,
        since_last_record_s=0.2,
        rank_nodes={r: f"node-{r // per_node}" for r in range(ranks)},
        rank_states=states,
        comms=comms,
        diagnoses=[f"ERROR RankNonCommHang: rank {hung} [node-{hung // per_node}] comm 00ab AllReduce #41"],
    )


def _screen(state: LiveState, width: int = 120, height: int = 40) -> list[str]:
    buf = io.StringIO()
    con = Console(file=buf, width=width, height=height, color_system=None, legacy_windows=False)
    con.print(render(state, width, height))
    return buf.getvalue().rstrip("\n").splitlines()


def test_1024_ranks_fit_a_120x40_terminal():
    lines = _screen(big_state())
    assert len(lines) <= 40, len(lines)
    assert max(len(line) for line in lines) <= 120
    grid = "".join(lines)
    assert grid.count("H") >= 1 and "RankNonCommHang: rank 77" in grid


def test_the_hung_rank_is_in_its_node_group():
    lines = _screen(big_state(ranks=64, per_node=8, hung=13))
    start = next(i for i, line in enumerate(lines) if "ranks by node" in line)
    groups = lines[start + 1].strip("│ ").split()
    assert groups[1][13 - 8] == "H" and all("H" not in g for i, g in enumerate(groups) if i != 1)
