"""The simulated jobs: ``sim`` (real rank processes on simnccl with the shim preloaded, and their
master) and ``demo`` (a 16-rank sim with a fault, shown live)."""

from __future__ import annotations

import logging
import os
import sys
import tempfile

from c4d.cli.common import (
    add_command,
    add_master_opts,
    add_quick,
    live_console,
    make_master,
    setup_logging,
)
from c4d.cli_common import EXIT_BAD, number, positive
from c4d.util import signals


def add_parser(subparsers) -> None:
    """``sim`` and ``demo``."""
    _add_sim(subparsers)
    _add_demo(subparsers)


def _add_sim(subparsers) -> None:
    p = add_command(
        subparsers,
        "sim",
        "run a simulated job on simnccl with the shim preloaded",
        "A job of real rank processes on simnccl (CPU NCCL) with libc4d.so preloaded, and its "
        "master. Stops when the job finishes, on an ERROR, or at --max-seconds. Nodes are node-0, "
        "node-1, ... with --ranks-per-node ranks each.",
    )
    p.add_argument("--ranks", type=positive(int), default=8, metavar="N", help="ranks (processes) in the job")
    p.add_argument(
        "--ranks-per-node", type=positive(int), default=4, metavar="K", help="ranks per simulated node"
    )
    p.add_argument("--tp", type=positive(int), default=1, metavar="T", help="tensor-parallel group size")
    p.add_argument(
        "--pp", type=positive(int), default=1, metavar="P", help="pipeline stages (dp = N / (T x P))"
    )
    p.add_argument(
        "--steps",
        type=positive(int),
        default=None,
        metavar="S",
        help="training steps (default: 20, or 300 with --quick)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject KIND@rank=R|node=NAME|link=R-S[,dir=fwd|rev][,step=S][,until=U][,secs=X][,factor=F]"
        "[,what=W]; KIND one of noncomm-hang, comm-hang, noncomm-slow, comm-slow, crash, mismatch "
        "(repeatable; docs/cli.md, Fault SPEC)",
    )
    add_quick(p)
    p.add_argument(
        "--master",
        metavar="EP",
        help="send to a running c4d master at EP instead of an in-process one (its verdicts come from its "
        "status endpoint: the job stops on its ERROR)",
    )
    p.add_argument(
        "--master-status",
        metavar="EP",
        help="that master's status endpoint, when it is not the default (c4d master --status-bind)",
    )
    p.add_argument(
        "--agents",
        action="store_true",
        help="each simulated node's ranks send to a node agent (as `c4d agent`) that forwards to the master",
    )
    p.add_argument(
        "--max-seconds",
        type=positive(float),
        default=600.0,
        metavar="S",
        help="stop the job after S seconds",
    )
    p.add_argument(
        "--clock-skew",
        type=number(float, at_least=0),
        default=0.0,
        metavar="SECONDS",
        help="node clocks offset by up to ± this much",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the clock skew and the jitter")
    p.add_argument(
        "--spare-nodes",
        type=number(int, at_least=0),
        default=0,
        metavar="N",
        help="idle nodes a relaunch can use",
    )
    p.add_argument(
        "--exclude-nodes",
        default=os.environ.get("C4D_EXCLUDE_NODES_FILE"),
        metavar="FILE",
        help="lay ranks out on the nodes not listed in FILE (one a line; default $C4D_EXCLUDE_NODES_FILE, "
        "which `c4d run` points at its blacklist)",
    )
    add_master_opts(p)
    p.set_defaults(func=cmd_sim)


def _add_demo(subparsers) -> None:
    p = add_command(
        subparsers,
        "demo",
        "a simulated multi-node job with a fault, shown live",
        "16 ranks on 4 simulated nodes (tp 2 x pp 2 x dp 4) with a fault, shown live, ending in the "
        "diagnosis and the blacklist it would apply. The trace and the blacklist are kept in --out.",
    )
    p.add_argument("--no-live", action="store_true", help="print the log instead of the live view")
    p.add_argument(
        "--fault",
        default=None,
        metavar="SPEC",
        help="the fault to inject, as for c4d sim (default: noncomm-hang@rank=6,step=8)",
    )
    p.add_argument("--out", default="c4d-demo", metavar="DIR", help="keep the trace and the blacklist here")
    add_quick(p)
    p.set_defaults(func=cmd_demo)


def _sim_config(args):
    from c4d.actions.blacklist import read_nodes
    from c4d.sim import faults
    from c4d.sim.sim import QUICK_STEPS, SimConfig, quick_env

    nodes = (args.ranks + args.ranks_per_node - 1) // args.ranks_per_node + args.spare_nodes
    fl = [faults.parse(s, world=args.ranks, nodes=nodes) for s in args.fault]
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else 20)
    exclude: list[str] = []
    if args.exclude_nodes:
        if not os.path.isfile(args.exclude_nodes):
            raise ValueError(f"--exclude-nodes {args.exclude_nodes}: no such file")
        exclude = read_nodes(args.exclude_nodes)
    cfg = SimConfig(
        ranks=args.ranks,
        ranks_per_node=args.ranks_per_node,
        tp=args.tp,
        pp=args.pp,
        steps=steps,
        faults=fl,
        clock_skew_s=args.clock_skew,
        seed=args.seed,
        env=quick_env() if args.quick else {},
        spare_nodes=args.spare_nodes,
        exclude_nodes=tuple(exclude),
    )
    cfg.validate()
    return cfg


def cmd_sim(args) -> int:
    from c4d.sim import faults, sim

    signals.raise_on_signals()
    setup_logging(args.log_level)
    try:
        cfg = _sim_config(args)
    except (faults.FaultSpecError, ValueError) as e:
        print(f"c4d sim: {e}", file=sys.stderr)
        return EXIT_BAD
    sim_meta = {
        "ranks": cfg.ranks,
        "ranks_per_node": cfg.ranks_per_node,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "steps": cfg.steps,
        "faults": args.fault,
        "clock_skew_s": cfg.clock_skew_s,
        "nodes": cfg.node_names,
    }
    meta = {"command": "sim", "sim": sim_meta}
    master = None
    tmp = None
    status = None
    if not args.master and os.environ.get("C4D_RUN_ID"):
        args.master = os.environ.get("C4D_MASTER_ADDR")  # under `c4d run`: its master, not our own
    elif args.master:  # a running master: its status endpoint tells its verdicts (c4d/master/status.py)
        from c4d.master.status import status_endpoint

        status = args.master_status or status_endpoint(args.master)
        if status is None:
            logging.getLogger("c4d").warning(
                "no status endpoint can be derived from %s (give --master-status): this job stops only "
                "when it ends or at --max-seconds",
                args.master,
            )
    try:
        if args.master:
            endpoint = args.master
        else:
            tmp = tempfile.mkdtemp(prefix="c4d-master-")
            master = make_master(args, meta, f"ipc://{tmp}/master.sock")
            endpoint = None
        view = None
        if args.live and master is not None:
            from c4d.master.live import LiveView

            view = LiveView(master, console=live_console(args), log_level=args.log_level)
        try:
            res = sim.run(
                cfg,
                master=master,
                endpoint=endpoint,
                max_seconds=args.max_seconds,
                on_poll=(view.update if view else None),
                agents=getattr(args, "agents", False),
                status=status,
                interrupted=signals.check,
            )
            if master is not None:
                master.finish()
        finally:
            if view is not None:
                view.close()
    except Exception as e:  # a missing binary, a bind failure: one line, not a traceback
        from c4d.util.native import NativeMissing

        if isinstance(e, NativeMissing | OSError):
            print(f"c4d sim: {e}", file=sys.stderr)
            return EXIT_BAD
        raise
    finally:
        if master is not None:
            master.close()
        if tmp:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    print(f"c4d sim: {res.reason} ({res.seconds:.1f} s)", file=sys.stderr)
    return sim.exit_status(res)


def cmd_demo(args) -> int:
    from c4d.sim.demo import run_demo

    return run_demo(args)
