"""The live view is a pure function of a snapshot: render hand-built states without a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from c4d.engine import Engine
from c4d.engine.types import CommSnapshot
from c4d.master.live import LiveState, render
from tests.factories import Job, build_cached, replay


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


def test_pipeline_rows_and_rates_from_the_engine():
    """p2p-only (PP) communicators report transfers done, a rate and transfer times (they used to
    read -1 0 0/0 0/0 0.00), and a running job's rates are positive."""
    j = Job(tp=2, pp=2, dp=2, ranks_per_node=2, steps=30)
    model, batches = build_cached(j)
    snap = replay(j, Engine, batches, model).engine.state()
    pp = [c for c in snap.comms if c.kind == "PP"]
    assert len(pp) == 4
    # 30 steps x (activation + gradient) per stage pair
    assert all(c.p2p_done == 60 and c.ops_per_s > 0 and c.xfer_med_us > 0 and c.busbw_gbs > 0 for c in pp)
    assert all(c.ops_per_s > 0 for c in snap.comms)
    lines = _screen(LiveState("j", 8, 8, 4, 1.0, 0, 0.1, comms=list(snap.comms)), 120, 40)
    row = next(line for line in lines if pp[0].comm in line)
    assert " PP " in row and " 60 " in row and " -1 " not in row


def test_80x24_keeps_the_incidents_and_the_log():
    """In 80x24 every panel fits: incidents are whole lines (cut to the width, never to '...'),
    the log panel shows the newest lines, comm rows are one line each."""
    s = big_state(ranks=16, per_node=4, hung=6)
    s = LiveState(
        **{
            **s.__dict__,
            "diagnoses": [
                "ERROR #2 RankNonCommHang: rank 6 [node-1] 00000000000000ab AllReduce #41 (n=3, 3.2s)",
                "INFO #1 RankCommSlow: rank 9 [node-2] 00000000000000cd Send (4 periods, 4.0s, by arrival)",
            ],
            "log": [f"12:00:0{i} WARNING line {i}" for i in range(8)],
        }
    )
    lines = _screen(s, 80, 24)
    assert len(lines) <= 23, "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "RankNonCommHang: rank 6 [node-1]" in text and "RankCommSlow: rank 9" in text
    assert "line 7" in text and "line 0" not in text  # the tail of the log
    start = next(i for i, line in enumerate(lines) if "communicators" in line)
    comm_rows = [line for line in lines[start + 2 :] if "│ 0000" in line]
    assert comm_rows, text
