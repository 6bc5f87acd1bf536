"""c4d: find the rank, node or link that makes an NCCL training job hang or crawl.

The command line is DESIGN.md's public contract: extend it, don't break it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from c4d import __version__

LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


def _log_level(text: str) -> int:
    try:
        return LOG_LEVELS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"log level must be one of {', '.join(LOG_LEVELS)}") from None


def _setup_logging(level: int) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="c4d %(levelname)s %(message)s", force=True)


def _log_to_console(console, level: int) -> None:
    """In live mode, log through rich so lines print above the live display instead of through it."""
    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s", force=True)


def _positive(kind):
    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return v

    return conv


def _engine_overrides(args) -> dict:
    out = {}
    if getattr(args, "hang_timeout", None):
        out["hang_timeout_us"] = args.hang_timeout
    if getattr(args, "hang_times", None):
        out["hang_times"] = args.hang_times
    return out


def _add_master_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", metavar="FILE", help="write the trace here")
    p.add_argument("--json", action="store_true", help="print every diagnosis as a JSON line on stdout")
    p.add_argument("--live", action="store_true", help="show the live view")
    p.add_argument("--blacklist", metavar="FILE", help="append culprit nodes of localized ERRORs here")
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=logging.WARNING,
        metavar="L",
        help="Info, Warning (default) or Error: filters the human-readable log only",
    )
    p.add_argument(
        "--hang-timeout", type=_positive(int), metavar="US", help="override the job's C4D_HANG_TIMEOUT (µs)"
    )
    p.add_argument("--hang-times", type=_positive(int), metavar="N", help="override the job's C4D_HANG_TIMES")
    p.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT"
    )


# -- commands ---------------------------------------------------------------------------
def cmd_lib(args) -> int:
    from c4d import native

    try:
        print(native.lib_path())
    except native.NativeMissing as e:
        print(f"c4d: {e}", file=sys.stderr)
        return 1
    return 0


def _make_master(args, meta: dict, bind: str):
    from c4d.master import Master, MasterConfig

    cfg = MasterConfig(
        metrics_port=args.metrics_port,
        bind=bind,
        trace=args.trace,
        json_out=args.json,
        blacklist=args.blacklist,
        meta=meta,
        engine_overrides=_engine_overrides(args),
        curve=getattr(args, "curve", None),
        job=getattr(args, "job", None),
    )
    return Master(cfg)


def cmd_master(args) -> int:
    from c4d.curve import CurveKeyError

    _setup_logging(args.log_level)
    _signals_raise()
    try:
        m = _make_master(args, {"command": "master"}, args.bind)
    except (OSError, CurveKeyError) as e:
        print(f"c4d: {e}", file=sys.stderr)
        return 1
    logging.getLogger("c4d").info("master listening on %s", m.endpoint)
    print(f"c4d master listening on {m.endpoint}", file=sys.stderr, flush=True)
    try:
        m.run()
    except KeyboardInterrupt:
        pass
    finally:
        m.close()
    return 0


def cmd_keygen(args) -> int:
    from c4d import curve

    try:
        pub, sec = curve.generate(args.dir)
    except (curve.CurveKeyError, OSError) as e:
        print(f"c4d keygen: {e}", file=sys.stderr)
        return 1
    print(f"wrote {sec} (the master's: c4d master --curve {args.dir})")
    print(f"wrote {pub} (the job's: C4D_CURVE_SERVER_KEY={pub})")
    return 0


def _sim_config(args):
    from c4d import faults
    from c4d.actions.blacklist import read_nodes
    from c4d.sim import SimConfig

    nodes = (args.ranks + args.ranks_per_node - 1) // args.ranks_per_node + args.spare_nodes
    fl = [faults.parse(s, world=args.ranks, nodes=nodes) for s in args.fault]
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
        steps=args.steps,
        faults=fl,
        clock_skew_s=args.clock_skew,
        seed=args.seed,
        spare_nodes=args.spare_nodes,
        exclude_nodes=tuple(exclude),
    )
    cfg.validate()
    return cfg


def _signals_raise() -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so `finally` blocks kill rank processes and close files."""
    import signal

    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def cmd_sim(args) -> int:
    from c4d import faults, sim

    _signals_raise()
    _setup_logging(args.log_level)
    try:
        cfg = _sim_config(args)
    except (faults.FaultSpecError, ValueError) as e:
        print(f"c4d sim: {e}", file=sys.stderr)
        return 64
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
    if not args.master and os.environ.get("C4D_RUN_ID"):
        args.master = os.environ.get("C4D_MASTER_ADDR")  # under `c4d run`: its master, not our own
    try:
        if args.master:
            endpoint = args.master
        else:
            tmp = tempfile.mkdtemp(prefix="c4d-master-")
            master = _make_master(args, meta, f"ipc://{tmp}/master.sock")
            endpoint = None
        view = None
        if args.live and master is not None:
            from c4d.live import LiveView

            view = LiveView(master)
            _log_to_console(view.console, args.log_level)
        try:
            res = sim.run(
                cfg,
                master=master,
                endpoint=endpoint,
                max_seconds=args.max_seconds,
                on_poll=(view.update if view else None),
            )
        finally:
            if view is not None:
                view.close()
    except Exception as e:  # a missing binary, a bind failure: one line, not a traceback
        from c4d.native import NativeMissing

        if isinstance(e, NativeMissing | OSError):
            print(f"c4d sim: {e}", file=sys.stderr)
            return 1
        raise
    finally:
        if master is not None:
            master.close()
        if tmp:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    print(f"c4d sim: {res.reason} ({res.seconds:.1f} s)", file=sys.stderr)
    return res.status


def cmd_demo(args) -> int:
    from c4d.demo import run_demo

    return run_demo(args)


def cmd_analyze(args) -> int:
    from c4d import analyze
    from c4d.master import make_engine

    tr = _load_for_offline(args)
    if tr is None:
        return 1
    if tr.raw.truncated_bytes:
        cut = tr.raw.truncated_bytes
        print(f"c4d analyze: the trace ends in a cut record ({cut} bytes ignored)", file=sys.stderr)
    if tr.raw.skipped:
        print(f"c4d analyze: skipped {tr.raw.skipped} records of unknown kind or version", file=sys.stderr)
    damaged = _report_damage(tr.raw)
    if damaged and not args.allow_damaged:
        print(
            "c4d analyze: records were lost to damage; pass --allow-damaged to analyze what was read",
            file=sys.stderr,
        )
        return 1
    from c4d.ingest import Ingest
    from c4d.validate import Edge, Limits

    engine = make_engine(_engine_overrides(args))
    ingest = Ingest(engine, Edge(Limits.from_env()))
    diags = analyze.replay(tr.raw, engine, ingest)
    _report_edge(ingest)
    if args.json:
        for d in diags:
            print(json.dumps(d.to_json()))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    s = analyze.summary(tr)
    t = Table(title=f"{args.path}: {len(tr.nodes)} ranks, {len(tr.ops)} ops")
    for c in ["comm", "op", "ranks", "ops", "bytes", "median µs", "p99 µs"]:
        t.add_column(c, justify="left" if c in ("comm", "op") else "right")
    for row in s.itertuples(index=False):
        t.add_row(
            row.comm,
            row.op,
            str(row.ranks),
            str(row.ops),
            f"{row.bytes:,}",
            f"{row.median_us:,.1f}",
            f"{row.p99_us:,.1f}",
        )
    con.print(t)
    for d in diags:
        con.print(d.summary(), markup=False, highlight=False)
    if not diags:
        con.print("no diagnoses")
    return 0


def _report_damage(rt) -> bool:
    """One line per kind of damage found while reading; True when records were lost."""
    if not rt.damaged:
        return False
    where = ", ".join(f"{n} at byte {off}" for off, n in rt.damaged[:5])
    more = f" and {len(rt.damaged) - 5} more" if len(rt.damaged) > 5 else ""
    print(
        f"c4d analyze: skipped {len(rt.damaged)} damaged batch(es), {rt.damaged_bytes} bytes "
        f"(≤ {rt.lost_records} records): {where}{more}; read on from the next intact batch",
        file=sys.stderr,
    )
    return True


def _report_edge(ingest) -> None:
    """What the edge validator dropped and what failed during the replay (as the live master did)."""
    if ingest.edge.rejected:
        top = ", ".join(f"{r}: {n}" for r, n in ingest.edge.rejected.most_common())
        print(
            f"c4d analyze: the edge validator dropped {ingest.edge.dropped} records ({top})", file=sys.stderr
        )
    if ingest.failures:
        top = ", ".join(f"{r}: {n}" for r, n in ingest.failures.most_common())
        print(
            f"c4d analyze: {sum(ingest.failures.values())} batch(es) or tick(s) failed ({top})",
            file=sys.stderr,
        )


def _load_for_offline(args):
    """Load PATH in any supported format; one line on stderr and None when it can't be read."""
    from c4d.formats.to_records import ImportOptions
    from c4d.trace import TraceError, load_any

    over = _engine_overrides(args)
    opts = ImportOptions(**{k: v for k, v in over.items() if k in ("hang_timeout_us", "hang_times")})

    def warn(line: str) -> None:
        print(f"c4d {args.command}: {line}", file=sys.stderr)

    try:
        return load_any(args.path, getattr(args, "format", None), opts=opts, on_warning=warn)
    except (TraceError, OSError, ValueError) as e:
        print(f"c4d {args.command}: {e}", file=sys.stderr)
        return None


def cmd_report(args) -> int:
    from c4d import report

    tr = _load_for_offline(args)
    if tr is None:
        return 1
    out = report.write(report.from_trace(tr, tr.diagnoses_list()), Path(args.out))
    for name, p in out.items():
        print(f"{name}: {p}")
    return 0


def cmd_export(args) -> int:
    tr = _load_for_offline(args)
    if tr is None:
        return 1
    df = tr.table(args.table)
    if args.table == "diagnoses":
        df = df.assign(detail=df["detail"].map(json.dumps))
    df.to_parquet(args.out, engine="pyarrow", index=False)
    print(f"wrote {len(df):,} rows of {args.table} to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="c4d", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--version", action="version", version=f"c4d {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("lib", help="print the absolute path of libc4d.so (for LD_PRELOAD)")
    p.set_defaults(func=cmd_lib)

    p = sub.add_parser("master", help="collect records from the ranks, diagnose, act")
    p.add_argument("--bind", default=os.environ.get("C4D_MASTER_ADDR", "tcp://127.0.0.1:5555"), metavar="EP")
    p.add_argument(
        "--curve",
        metavar="KEYDIR",
        help="ZeroMQ CURVE: only senders with the public key of KEYDIR (c4d keygen) get in; encrypted",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="serve only this job id (the ranks' C4D_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID); "
        "default: the first job heard",
    )
    _add_master_opts(p)
    p.set_defaults(func=cmd_master)

    p = sub.add_parser("keygen", help="write a CURVE key pair for c4d master --curve (files of mode 0600)")
    p.add_argument("dir", help="key directory (created 0700 when missing)")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("sim", help="run a simulated job on simnccl with the shim preloaded")
    p.add_argument("--ranks", type=_positive(int), default=8)
    p.add_argument("--ranks-per-node", type=_positive(int), default=4)
    p.add_argument("--tp", type=_positive(int), default=1)
    p.add_argument("--pp", type=_positive(int), default=1)
    p.add_argument("--steps", type=_positive(int), default=20)
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND@rank=R|node=NAME|link=R-S[,step=S][,factor=F]",
    )
    p.add_argument("--master", metavar="EP", help="use a running master instead of an in-process one")
    p.add_argument("--max-seconds", type=_positive(float), default=600.0)
    p.add_argument(
        "--clock-skew",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="node clocks offset by up to ± this much",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spare-nodes", type=int, default=0, metavar="N", help="idle nodes a relaunch can use")
    p.add_argument(
        "--exclude-nodes",
        default=os.environ.get("C4D_EXCLUDE_NODES_FILE"),
        metavar="FILE",
        help="lay ranks out on the nodes not listed in FILE (one a line; default $C4D_EXCLUDE_NODES_FILE, "
        "which `c4d run` points at its blacklist)",
    )
    _add_master_opts(p)
    p.set_defaults(func=cmd_sim)

    p = sub.add_parser("demo", help="a simulated multi-node job with a fault, shown live")
    p.add_argument("--no-live", action="store_true", help="print the log instead of the live view")
    p.add_argument("--fault", default=None, metavar="SPEC", help="the fault to inject (default: a hang)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("analyze", help="replay a captured trace through the engine")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--format", choices=["c4d", "fr", "inspector", "nccl-tests"], default=None)
    p.add_argument("--hang-timeout", type=_positive(int), metavar="US")
    p.add_argument("--hang-times", type=_positive(int), metavar="N")
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="analyze a trace that lost records to damage (exit 1 otherwise)",
    )
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("report", help="tables and plots (PNG + one HTML page) of a trace")
    p.add_argument("path")
    p.add_argument("-o", "--out", default="c4d-report", metavar="DIR")
    p.add_argument("--format", choices=["c4d", "fr", "inspector", "nccl-tests"], default=None)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export", help="write a trace's table as Parquet (pyarrow)")
    p.add_argument("path")
    p.add_argument("out")
    p.add_argument(
        "--table",
        default="ops",
        choices=["ops", "registrations", "heartbeats", "comms", "peers", "diagnoses"],
    )
    p.add_argument("--format", choices=["c4d", "fr", "inspector", "nccl-tests"], default=None)
    p.set_defaults(func=cmd_export)

    from c4d.run.cli import add_parser as add_run

    add_run(sub)
    try:
        from c4d.check.cli import add_parser as add_check
    except ImportError:
        pass
    else:
        add_check(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
