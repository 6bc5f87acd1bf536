"""`c4d demo`: the main job on a fresh machine.

A simulated 4-node job (16 ranks, tp 2 × pp 2 × dp 4) on simnccl with libc4d.so
preloaded in every rank. Part-way through, a rank's GPU stream stops making progress
(a hung kernel: the classic RankNonCommHang). The live view shows the job, the master
diagnoses the culprit, raises WARNING then ERROR, and blacklists its node.
Thresholds are scaled down (2 s × 3) so the demo takes well under a minute.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c4d import faults, sim
from c4d.master import Master, MasterConfig

DEFAULT_FAULT = "noncomm-hang@rank=6,step=8"


def run_demo(args) -> int:
    con = Console(stderr=False)
    spec = args.fault or DEFAULT_FAULT
    cfg = sim.SimConfig(
        ranks=16,
        ranks_per_node=4,
        tp=2,
        pp=2,
        steps=40,
        clock_skew_s=0.02,
        env={"C4D_HANG_TIMEOUT": "2000000", "C4D_HANG_TIMES": "3"},
    )
    try:
        cfg.faults = [faults.parse(spec, world=cfg.ranks, nodes=cfg.nodes)]
    except faults.FaultSpecError as e:
        print(f"c4d demo: {e}", file=sys.stderr)
        return 64
    tmp = Path(tempfile.mkdtemp(prefix="c4d-demo-"))
    blacklist = tmp / "blacklist.txt"
    trace_path = tmp / "demo.c4d"
    con.rule("[bold]c4d demo")
    con.print(
        f"16 ranks on 4 simulated nodes (tp 2 × pp 2 × dp 4), libc4d.so preloaded in every rank.\n"
        f"Injected fault: [bold]{spec}[/]. Thresholds: C4D_HANG_TIMEOUT=2 s, C4D_HANG_TIMES=3."
    )
    logging.basicConfig(
        level=logging.WARNING if args.no_live else logging.ERROR,
        stream=sys.stderr,
        format="c4d %(levelname)s %(message)s",
        force=True,
    )
    master = Master(
        MasterConfig(
            bind=f"ipc://{tmp}/master.sock",
            trace=str(trace_path),
            blacklist=str(blacklist),
            meta={"command": "demo", "fault": spec},
        )
    )
    view = None
    if not args.no_live:
        from c4d.live import LiveView

        view = LiveView(master, console=con)
    try:
        res = sim.run(cfg, master=master, max_seconds=120, on_poll=view.update if view else None)
    finally:
        if view is not None:
            view.close()
        master.close()
    _print_outcome(con, master, res, blacklist, trace_path)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if res.status in (sim.EXIT_FINISHED, sim.EXIT_ERROR) else res.status


def _print_outcome(con: Console, master: Master, res, blacklist: Path, trace_path: Path) -> None:
    rec = master.received
    t = Table(title=f"what the master received: {rec.records:,} records from {len(rec.ranks)} ranks")
    for col in ("rank", "node", "records", "ops", "comms", "dropped", "clean exit"):
        t.add_column(col, justify="right")
    for r in sorted(rec.ranks):
        i = rec.ranks[r]
        t.add_row(
            str(r),
            i.node,
            f"{i.records:,}",
            f"{i.ops:,}",
            str(len(i.comms)),
            str(i.dropped),
            "yes" if i.final else "no",
        )
    con.print(t)
    ct = Table(title=f"{len(rec.comms)} communicators")
    for col in ("comm", "ranks", "ops", "bytes", "last seq"):
        ct.add_column(col, justify="right")
    for cid, c in sorted(rec.comms.items()):
        ct.add_row(f"{cid:016x}", str(c.nranks or len(c.ranks)), f"{c.ops:,}", f"{c.bytes:,}", str(c.max_seq))
    con.print(ct)
    con.rule("[bold]diagnosis")
    if not master.diagnoses:
        con.print("no diagnoses")
    shown = sorted(master.diagnoses, key=lambda d: (-d.level, d.time))
    for d in shown[:8]:
        con.print(d.summary(), markup=False, highlight=False)
    bl = blacklist.read_text().split() if blacklist.exists() else []
    con.print(f"blacklist it would apply: [bold]{', '.join(bl) if bl else '(none)'}[/]")
    con.print(f"c4d sim: {res.reason} after {res.seconds:.1f} s")
