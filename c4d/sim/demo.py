"""`c4d demo`: the main job on a fresh machine.

A simulated 4-node job (16 ranks, tp 2 × pp 2 × dp 4) on simnccl with libc4d.so
preloaded in every rank. Part-way through, a rank's GPU stream stops making progress
(a hung kernel: the classic RankNonCommHang), or whatever ``--fault`` says. The live view
shows the job, the master diagnoses the culprit, raises WARNING then ERROR, and blacklists
its node. Thresholds are scaled down (``DEMO_ENV``: 2 s × 3, 2 s slow windows; ``--quick``:
``c4d.sim.sim.QUICK_ENV``) so every fault kind shows within seconds. The trace and the blacklist
are kept in ``--out`` (default ``./c4d-demo``, which .gitignore lists) for ``c4d analyze`` /
``c4d report``, and nothing is written anywhere else but temporary folders it removes: the
demo says where at its start, and points ``c4d report`` into that folder too.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c4d.master.master import Master, MasterConfig
from c4d.sim import faults, sim

DEFAULT_FAULT = "noncomm-hang@rank=6,step=8"
DEMO_ENV = {
    **sim.QUICK_ENV,
    "C4D_HANG_TIMEOUT": "2000000",
    "C4D_HANG_TIMES": "3",
    "C4D_CONN_BW_CHECK_PERIOD": "2",
    "C4D_HEARTBEAT_MS": "400",
}


def run_demo(args) -> int:
    con = Console(stderr=False)
    spec = args.fault or DEFAULT_FAULT
    base = sim.QUICK_ENV if args.quick else DEMO_ENV
    env = sim.quick_env(base)
    shown_env = {**base, **{k: os.environ[k] for k in base if k in os.environ}}
    cfg = sim.SimConfig(
        ranks=16, ranks_per_node=4, tp=2, pp=2, steps=sim.QUICK_STEPS, clock_skew_s=0.02, env=env
    )
    try:
        cfg.faults = [faults.parse(spec, world=cfg.ranks, nodes=cfg.nodes)]
    except faults.FaultSpecError as e:
        print(f"c4d demo: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"c4d demo: cannot create --out {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    blacklist = out / "blacklist.txt"
    trace_path = out / "demo.c4d"
    blacklist.unlink(missing_ok=True)  # this run's blacklist only
    sock = Path(tempfile.mkdtemp(prefix="c4d-demo-"))  # a short path for the ipc socket
    con.rule("[bold]c4d demo")
    con.print(
        f"16 ranks on 4 simulated nodes (tp 2 × pp 2 × dp 4), libc4d.so preloaded in every rank.\n"
        f"Injected fault: [bold]{spec}[/]. Thresholds: C4D_HANG_TIMEOUT={shown_env['C4D_HANG_TIMEOUT']} µs, "
        f"C4D_HANG_TIMES={shown_env['C4D_HANG_TIMES']}, "
        f"C4D_CONN_BW_CHECK_PERIOD={shown_env['C4D_CONN_BW_CHECK_PERIOD']} s.\n"
        f"The trace and the blacklist are kept in {out.resolve()}/",
        soft_wrap=True,
    )
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="c4d %(levelname)s %(message)s", force=True
    )
    try:
        master = Master(
            MasterConfig(
                bind=f"ipc://{sock}/master.sock",
                trace=str(trace_path),
                blacklist=str(blacklist),
                meta={"command": "demo", "fault": spec},
            )
        )
    except OSError as e:
        print(f"c4d demo: {e}", file=sys.stderr)
        shutil.rmtree(sock, ignore_errors=True)
        return 1
    view = None
    if not args.no_live:
        from c4d.master.live import LiveView

        view = LiveView(master, console=con, log_level=logging.INFO)
    try:
        res = sim.run(cfg, master=master, max_seconds=120, on_poll=view.update if view else None)
        master.finish()
    finally:
        if view is not None:
            view.close()
        master.close()
        shutil.rmtree(sock, ignore_errors=True)
    _print_outcome(con, master, res, blacklist, trace_path)

    return sim.exit_status(res)


def _print_outcome(con: Console, master: Master, res, blacklist: Path, trace_path: Path) -> None:
    from c4d.engine.incidents import table_lines

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
    con.rule("[bold]diagnosis")
    incidents = master.incidents.all
    if not incidents:
        con.print("no diagnoses")
    else:
        con.print(f"{len(incidents)} incident(s) from {len(master.diagnoses)} diagnoses:")
        for line in table_lines(incidents, master.started_ns / 1e9):
            con.print(line, markup=False, highlight=False, soft_wrap=True)
    bl = blacklist.read_text().split() if blacklist.exists() else []
    con.print(
        f"blacklist it would apply: [bold]{', '.join(bl) if bl else '(none)'}[/] ({blacklist})",
        soft_wrap=True,
    )
    con.print(
        f"trace: {trace_path}  (next: c4d analyze {trace_path}; c4d report {trace_path} -o "
        f"{trace_path.parent / 'report'})",
        soft_wrap=True,
    )
    con.print(f"c4d sim: {res.reason} after {res.seconds:.1f} s")
