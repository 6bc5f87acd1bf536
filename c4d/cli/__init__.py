"""c4d: find the rank, node or link that makes an NCCL training job hang or crawl.

The command line is a public contract (docs/cli.md): extend it, don't break it.

Exit status of every command (docs/cli.md): 0 success, nothing found; 1 bad input or an
operational error (usage errors included: one line on stderr); 2 the command worked and
found a problem (a diagnosis at WARNING or above, a failed health check, a job stopped by an
ERROR). ``c4d run`` exits with the supervised job's own status.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from c4d import __version__, signals
from c4d.cli_common import (
    EXIT_BAD,
    EXIT_FOUND,
    EXIT_HELP,
    EXIT_OK,
    HelpFormatter,
    Parser,
    found,
)

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


def _size(text: str) -> int:
    """``--max-import-bytes``: a byte count, or with a K, M or G suffix (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        v = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 512M or 2G") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def _engine_overrides(args) -> dict:
    out = {}
    if getattr(args, "hang_timeout", None):
        out["hang_timeout_us"] = args.hang_timeout
    if getattr(args, "hang_times", None):
        out["hang_times"] = args.hang_times
    if getattr(args, "expected_busbw", None) is not None:
        out["expected_busbw"] = args.expected_busbw
    return out


def _expected_busbw(path: str):
    """--expected-busbw FILE: read now, so a bad file is one line before anything starts."""
    from c4d.engine.expected import ExpectedBusbw, ExpectedError

    try:
        return ExpectedBusbw.load(path)
    except ExpectedError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_master_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", metavar="FILE", help="write every record and tick here (for c4d analyze/report)"
    )
    p.add_argument(
        "--json", action="store_true", help="print every diagnosis, INFO included, as a JSON line on stdout"
    )
    p.add_argument("--live", action="store_true", help="show the live view, with the log below it")
    p.add_argument("--blacklist", metavar="FILE", help="append culprit nodes of localized ERRORs here")
    p.add_argument(
        "--expected-busbw",
        type=_expected_busbw,
        metavar="FILE",
        help="busbw healthy communicators reach per link class, collective and size (c4d check nccl "
        "--write-expected; default $C4D_EXPECTED_BUSBW): the reference of one slow from its first step",
    )
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=logging.INFO,
        metavar="L",
        help="Info (default: slow kinds too), Warning or Error; filters the human-readable log only "
        "(one line when an incident opens, escalates, isolates a node and ends)",
    )
    p.add_argument(
        "--hang-timeout", type=_positive(int), metavar="US", help="override the job's C4D_HANG_TIMEOUT (µs)"
    )
    p.add_argument("--hang-times", type=_positive(int), metavar="N", help="override the job's C4D_HANG_TIMES")
    p.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT"
    )


def _add_quick(p: argparse.ArgumentParser) -> None:
    from c4d.sim import QUICK_ENV

    shown = " ".join(f"{k}={v}" for k, v in QUICK_ENV.items())
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small thresholds so every fault kind shows within seconds: {shown} "
        "(values already in your environment win)",
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
        status=_status_bind(getattr(args, "status_bind", None)),
    )
    if getattr(args, "engine_process", None):
        cfg.engine_process = True
    if getattr(args, "ranks_may_move", False):  # the job's launcher may restart a rank elsewhere
        from dataclasses import replace

        from c4d.validate import Limits

        cfg.limits = replace(cfg.limits or Limits.from_env(), ranks_may_move=True)
    return Master(cfg)


def _status_bind(value: str | None) -> str | None:
    """``c4d master --status-bind``: an endpoint, ``auto`` (next to --bind) or ``none``."""
    return None if value is None or value.lower() == "none" else value


def cmd_master(args) -> int:
    from c4d.curve import CurveKeyError

    _setup_logging(args.log_level)
    stop = _stop_on_signals()
    try:
        m = _make_master(args, {"command": "master"}, args.bind)
    except CurveKeyError as e:  # --curve KEYDIR: no keys, or a secret key others can read
        print(f"c4d master: {e}", file=sys.stderr)
        return EXIT_BAD
    except (OSError, ValueError) as e:  # zmq errors are OSErrors: a bad or busy endpoint
        print(f"c4d master: cannot bind {args.bind}: {e}", file=sys.stderr)
        return EXIT_BAD
    print(f"c4d master listening on {m.endpoint}", file=sys.stderr, flush=True)
    if m.status is not None:
        print(f"c4d master answers status requests on {m.status.endpoint}", file=sys.stderr, flush=True)
    view = None
    try:
        if args.live:
            from c4d.live import LiveView

            view = LiveView(m, console=_live_console(args), log_level=args.log_level)
            logging.getLogger("c4d").info("master listening on %s", m.endpoint)
        m.run(should_stop=stop, on_step=view.update if view else None)
    except KeyboardInterrupt:
        pass
    finally:
        m.finish()
        if view is not None:
            view.close()
        m.close()
    return EXIT_FOUND if found(m.diagnoses) else EXIT_OK


def cmd_agent(args) -> int:
    from c4d.agent.agent import Agent, AgentConfig

    _setup_logging(args.log_level)
    stop = _stop_on_signals()  # between two steps: a flush in progress completes
    cfg = AgentConfig(master=args.master, bind=args.bind, flush_s=args.flush_ms / 1000, trace=args.trace,
                      job=args.job, agree=args.agree,
                      master_status=None if args.master_status == "none" else args.master_status)  # fmt: skip
    try:
        a = Agent(cfg)
    except (OSError, ValueError) as e:  # zmq errors are OSErrors: a bad or busy endpoint
        print(f"c4d agent: {e}", file=sys.stderr)
        return EXIT_BAD
    print(f"c4d agent listening on {a.endpoint}, forwarding to {args.master}", file=sys.stderr, flush=True)
    try:
        a.run(should_stop=stop)
    except KeyboardInterrupt:
        pass
    finally:
        a.flush()
        a.close()
        st = a.stats
        ss = a.summary.stats
        logging.getLogger("c4d").info(
            "agent: %d record(s) in, %d forwarded (%d ops summarised into %d; %d heartbeats and %d "
            "in-flight peer reports merged), %d dropped",
            ss["in"], st["forwarded"], ss["ops summarised"], ss["summaries"], ss["heartbeats merged"],
            ss["peer reports merged"], st["dropped"],
        )  # fmt: skip
    return EXIT_OK


def cmd_keygen(args) -> int:
    from c4d import curve

    try:
        pub, sec = curve.generate(args.dir)
    except (curve.CurveKeyError, OSError) as e:
        print(f"c4d keygen: {e}", file=sys.stderr)
        return EXIT_BAD
    print(f"wrote {sec} (the master's: c4d master --curve {args.dir})")
    print(f"wrote {pub} (the job's: C4D_CURVE_SERVER_KEY={pub})")
    return EXIT_OK


def _live_console(args):
    """The live view's terminal: stderr when stdout carries --json lines, so they don't mix."""
    from rich.console import Console

    return Console(stderr=True) if args.json else None


def _sim_config(args):
    from c4d import faults
    from c4d.actions.blacklist import read_nodes
    from c4d.sim import QUICK_STEPS, SimConfig, quick_env

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


def _stop_on_signals() -> Callable[[], bool]:
    """SIGINT/SIGTERM/SIGHUP ask a serving loop to stop between two steps (the returned test);
    a second one unwinds at once. An exception raised wherever the signal lands (inside a logging
    handler, the live view's console lock) can leave a lock taken that the shutdown then waits on."""
    import signal

    asked: list[int] = []

    def handler(signum, _frame):
        if asked:
            raise KeyboardInterrupt(f"signal {signum}")
        asked.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    return lambda: bool(asked)


def cmd_sim(args) -> int:
    from c4d import faults, sim

    signals.raise_on_signals()
    _setup_logging(args.log_level)
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
    elif args.master:  # a running master: its status endpoint tells its verdicts (c4d/status.py)
        from c4d.status import status_endpoint

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
            master = _make_master(args, meta, f"ipc://{tmp}/master.sock")
            endpoint = None
        view = None
        if args.live and master is not None:
            from c4d.live import LiveView

            view = LiveView(master, console=_live_console(args), log_level=args.log_level)
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
        from c4d.native import NativeMissing

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
    from c4d.demo import run_demo

    return run_demo(args)


def cmd_analyze(args) -> int:
    from c4d import analyze

    if _is_c4d_trace(args):
        return _analyze_stream(args)
    raw = _load_for_offline(args, frames=False)  # --json needs no DataFrames (nor pandas)
    if raw is None:
        return EXIT_BAD
    if raw.truncated_bytes:
        cut = raw.truncated_bytes
        print(f"c4d analyze: the trace ends in a cut record ({cut} bytes ignored)", file=sys.stderr)
    if raw.skipped:
        print(f"c4d analyze: skipped {raw.skipped} records of unknown kind or version", file=sys.stderr)
    damaged = _report_damage(raw)
    if damaged and not args.allow_damaged:
        print(
            "c4d analyze: records were lost to damage; pass --allow-damaged to analyze what was read",
            file=sys.stderr,
        )
        return EXIT_BAD
    from c4d.ingest import Ingest
    from c4d.validate import Edge, Limits

    engine = analyze.make_engine(_engine_overrides(args))
    ingest = Ingest(engine, Edge(Limits.from_env()))
    diags = analyze.replay(raw, engine, ingest)
    _report_edge(ingest)
    if args.json:
        return _print_json(diags)
    from c4d.incidents import heard_stamps
    from c4d.trace import from_raw

    tr = from_raw(raw)
    s = analyze.summary(tr)
    heard, _ = heard_stamps(raw.raw, int(raw.meta.get("created_ns", 0)))
    return _print_analysis(
        args, diags, s, tr.nodes, len(tr.ops), analyze.end_ns(tr.raw), analyze.start_s(tr.raw), heard
    )


def _is_c4d_trace(args) -> bool:
    """PATH is a c4d trace file (by --format or its magic): analyzed as a stream."""
    from c4d.analyze import is_c4d

    fmt = getattr(args, "input_format", None) or getattr(args, "format", None)
    return is_c4d(args.path, fmt if fmt in FORMATS else None)


def _analyze_stream(args) -> int:
    """``c4d analyze`` of a c4d trace, read and replayed piece by piece: memory does not grow
    with the file (the summary table's quantiles go approximate past 1 M ops, and say so)."""
    from c4d import analyze
    from c4d.ingest import Ingest
    from c4d.trace import TraceError, open_stream
    from c4d.validate import Edge, Limits

    try:
        st = open_stream(args.path)
    except TraceError as e:
        print(f"c4d analyze: {e}", file=sys.stderr)
        return EXIT_BAD
    engine = analyze.make_engine(_engine_overrides(args))
    ingest = Ingest(engine, Edge(Limits.from_env()))
    summ = analyze.StreamSummary()

    def pieces():
        for raw in st.chunks():
            if not args.json:  # the text report's table
                summ.add(raw)
            yield raw

    try:
        diags = analyze.replay_chunks(pieces(), engine, int(st.meta.get("created_ns", 0)), ingest)
    except TraceError as e:
        print(f"c4d analyze: {e}", file=sys.stderr)
        return EXIT_BAD
    if st.truncated_bytes:
        print(
            f"c4d analyze: the trace ends in a cut record ({st.truncated_bytes} bytes ignored)",
            file=sys.stderr,
        )
    if st.skipped:
        print(f"c4d analyze: skipped {st.skipped} records of unknown kind or version", file=sys.stderr)
    if _report_damage(st) and not args.allow_damaged:
        print(
            "c4d analyze: records were lost to damage; pass --allow-damaged to analyze what was read",
            file=sys.stderr,
        )
        return EXIT_BAD
    _report_edge(ingest)
    if args.json:
        return _print_json(diags)
    created = st.meta.get("created_ns")
    status = _print_analysis(
        args,
        diags,
        summ.frame(),
        summ.nodes,
        summ.n_ops,
        summ.end_ns,
        int(created) / 1e9 if created else None,
        summ.heard_ns,
    )
    if summ.approximate:
        print(
            f"(median and p99 from a log histogram, within 2%: more than {summ.keep:,} ops)", file=sys.stderr
        )
    return status


def _print_json(diags) -> int:
    for d in diags:
        print(json.dumps(d.to_json()))
    return EXIT_FOUND if found(diags) else EXIT_OK


def _print_analysis(args, diags, s, nodes_of: dict, n_ops: int, end_ns, start_s, heard_ns=None) -> int:
    """The text report: the ops summary table, then one line per incident."""
    from c4d import texttable
    from c4d.incidents import Incidents, table_lines

    status = EXIT_FOUND if found(diags) else EXIT_OK
    nodes, comms = len(set(nodes_of.values())), s["comm"].nunique()
    print(f"{args.path}: {len(nodes_of)} ranks on {nodes} nodes, {n_ops:,} ops on {comms} communicators")
    cols = ["comm", "op", "ranks", "ops", "bytes", "median µs", "p99 µs"]
    rows = [
        [r.comm, r.op, r.ranks, r.ops, f"{r.bytes:,}", f"{r.median_us:,.1f}", f"{r.p99_us:,.1f}"]
        for r in s.itertuples(index=False)
    ]
    for line in texttable.lines(cols, rows, right=cols[2:]):
        print(line)
    if args.all:
        print(f"every diagnosis ({len(diags)}):")
        for d in diags:
            print(d.summary())
    incidents = Incidents.fold(diags, end_ns, heard_ns)
    if not incidents:
        print("no diagnoses")
        return status
    print(
        f"{len(incidents)} incident(s) from {len(diags)} diagnoses; first seen since the trace started "
        "(--all lists every diagnosis, --json prints the full stream):"
    )
    for line in table_lines(incidents, start_s):
        print(line)
    return status


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


def _load_for_offline(args, frames: bool = True):
    """Load PATH in any supported format (an AnalyzedTrace, or its RawTrace when not ``frames``);
    one line on stderr and None when it can't be read."""
    from c4d.analyze import load, load_raw
    from c4d.formats.to_records import ImportOptions
    from c4d.trace import TraceError

    over = _engine_overrides(args)
    opts = ImportOptions(**{k: v for k, v in over.items() if k in ("hang_timeout_us", "hang_times")})
    budget = {  # an import's budget (c4d analyze --max-import-bytes/--max-import-seconds)
        k: getattr(args, a)
        for k, a in (("max_bytes", "max_import_bytes"), ("max_seconds", "max_import_seconds"))
        if getattr(args, a, None) is not None
    }

    def warn(line: str) -> None:
        print(f"c4d {args.command}: {line}", file=sys.stderr)

    try:
        if not frames:
            return load_raw(args.path, getattr(args, "format", None), opts=opts, on_warning=warn, **budget)
        return load(
            args.path, getattr(args, "format", None), opts=opts, on_warning=warn, overrides=over, **budget
        )
    except (TraceError, OSError, ValueError) as e:
        print(f"c4d {args.command}: {e}", file=sys.stderr)
        return None


def cmd_report(args) -> int:
    from c4d import report
    from c4d.trace import TraceError

    if _is_c4d_trace(args):  # read and replayed in pieces: memory does not grow with the trace
        try:
            inp, sp = report.from_stream(args.path, _engine_overrides(args))
        except (TraceError, OSError) as e:
            print(f"c4d report: {e}", file=sys.stderr)
            return EXIT_BAD
        _report_damage(sp.stream)
    else:
        tr = _load_for_offline(args)
        if tr is None:
            return EXIT_BAD
        inp = report.from_trace(tr)
    out = report.write(inp, Path(args.out))
    for name, p in out.items():
        print(f"{name}: {p}")
    return 0


def cmd_export(args) -> int:
    from c4d import analyze
    from c4d.trace import TraceError

    out_fmt = args.format if args.format in EXPORT_FORMATS else "parquet"
    if args.format in FORMATS:
        args.input_format = args.format
    select = {"ranks": args.ranks, "comms": args.comms, "start_s": args.start, "end_s": args.end}
    if _is_c4d_trace(args):  # read and replayed in pieces: memory does not grow with the trace
        try:
            if out_fmt == "perfetto":
                from c4d import perfetto

                done = perfetto.write(
                    args.path, args.out, analyze.Selection.of(**select), _engine_overrides(args)
                )
                print(f"wrote {done['events']:,} events ({done['ops']:,} ops on {done['ranks']} ranks, "
                      f"{done['incidents']} incidents) to {args.out}")  # fmt: skip
                return 0
            sp = analyze.to_parquet(
                args.path, args.out, args.table, overrides=_engine_overrides(args), **select
            )
        except (TraceError, OSError, ValueError) as e:
            print(f"c4d export: {e}", file=sys.stderr)
            return EXIT_BAD
        _report_damage(sp.stream)
        late = (
            f" ({sp.join.expired:,} without a split: their op did not complete in time)"
            if sp.join.expired
            else ""
        )
        print(f"wrote {sp.rows_written:,} rows of {args.table} to {args.out}{late}")
        return 0
    if out_fmt == "perfetto" or any(v is not None for v in select.values()):
        print("c4d export: --format perfetto and the selections need a c4d trace (or a directory of them)",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD
    args.format = args.input_format
    tr = _load_for_offline(args)
    if tr is None:
        return EXIT_BAD
    df = analyze.parquet_frame(tr.table(args.table), args.table)
    df.to_parquet(args.out, engine="pyarrow", index=False)
    print(f"wrote {len(df):,} rows of {args.table} to {args.out}")
    return 0


def hex_ids(df):
    """Communicator ids as 16-digit hex strings (c4d.analyze.hex_ids)."""
    from c4d.analyze import hex_ids

    return hex_ids(df)


EXPORT_FORMATS = ["parquet", "perfetto"]


def _rank_list(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rank list like 0-3,7: {text!r}") from None
    return out


def _comm_list(text: str) -> list[int]:
    try:
        return [int(c.strip(), 16) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not communicator ids (hex, comma-separated): {text!r}") from None


FORMATS = ["c4d", "fr", "inspector", "nccl-tests"]
FORMAT_HELP = (
    "c4d trace, Flight Recorder dumps, NCCL Inspector JSON lines, nccl-tests text (default: detected)"
)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="c4d",
        description=(__doc__ or "").split("\n\n")[0] + "\n\n" + EXIT_HELP,
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"c4d {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, desc: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=(desc or help) + "\n\n" + EXIT_HELP, formatter_class=HelpFormatter
        )

    p = add("lib", "print the absolute path of libc4d.so (for LD_PRELOAD)")
    p.set_defaults(func=cmd_lib)

    p = add(
        "master",
        "collect records from the ranks, diagnose, act",
        "One per job: collects every rank's records over ZeroMQ, diagnoses, logs one line per "
        "incident, writes the trace and the blacklist. Exits 2 if it diagnosed anything at WARNING "
        "or above.",
    )
    p.add_argument(
        "--bind",
        default=os.environ.get("C4D_MASTER_ADDR", "tcp://127.0.0.1:5555"),
        metavar="EP",
        help="ZeroMQ endpoint to listen on; tcp://0.0.0.0:5555 accepts ranks on other hosts "
        "(default: $C4D_MASTER_ADDR, else tcp://127.0.0.1:5555, this host only)",
    )
    p.add_argument(
        "--engine-process",
        action="store_true",
        default=None,
        help="run the diagnosis engine in a process of its own: receiving and validating and the "
        "engine take two cores (jobs of thousands of ranks; diagnoses reach the log a tick later; "
        "default: $C4D_MASTER_ENGINE_PROCESS)",
    )
    p.add_argument(
        "--curve",
        metavar="KEYDIR",
        help="ZeroMQ CURVE: only senders holding the public key in KEYDIR (c4d keygen) get in; "
        "encrypted (docs/reliability.md)",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="serve only this job id (the ranks' C4D_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID); "
        "default: the first job heard",
    )
    p.add_argument(
        "--ranks-may-move",
        action="store_true",
        help="the job's launcher may restart a rank on another node (default: a restarted rank must "
        "register on its first node; $C4D_RANKS_MAY_MOVE=1; docs/reliability.md)",
    )
    p.add_argument(
        "--status-bind",
        default="auto",
        metavar="EP",
        help="answer status requests (c4d sim --master learns the verdicts there) on EP; auto: the port "
        "below --bind's (ipc: PATH.status); none: nowhere (default: auto)",
    )
    _add_master_opts(p)
    p.set_defaults(func=cmd_master)

    p = add(
        "keygen",
        "write a CURVE key pair for c4d master --curve",
        "Writes DIR/master.key_secret (the master's) and DIR/master.key (the job's, for "
        "C4D_CURVE_SERVER_KEY), both mode 0600, DIR 0700; never overwrites a key.",
    )
    p.add_argument("dir", metavar="DIR", help="key directory (created when missing)")
    p.set_defaults(func=cmd_keygen)

    p = add(
        "sim",
        "run a simulated job on simnccl with the shim preloaded",
        "A job of real rank processes on simnccl (CPU NCCL) with libc4d.so preloaded, and its "
        "master. Stops when the job finishes, on an ERROR, or at --max-seconds. Nodes are node-0, "
        "node-1, ... with --ranks-per-node ranks each.",
    )
    p.add_argument(
        "--ranks", type=_positive(int), default=8, metavar="N", help="ranks (processes) in the job"
    )
    p.add_argument(
        "--ranks-per-node", type=_positive(int), default=4, metavar="K", help="ranks per simulated node"
    )
    p.add_argument("--tp", type=_positive(int), default=1, metavar="T", help="tensor-parallel group size")
    p.add_argument(
        "--pp", type=_positive(int), default=1, metavar="P", help="pipeline stages (dp = N / (T x P))"
    )
    p.add_argument(
        "--steps",
        type=_positive(int),
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
    _add_quick(p)
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
        type=_positive(float),
        default=600.0,
        metavar="S",
        help="stop the job after S seconds",
    )
    p.add_argument(
        "--clock-skew",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="node clocks offset by up to ± this much",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the clock skew and the jitter")
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

    p = add(
        "agent",
        "per-node aggregator: the node's ranks send here, it summarises and forwards to the master",
        "One per node, for jobs that `c4d run` does not launch (c4d run hosts one itself): point the "
        "ranks' C4D_MASTER_ADDR at --bind. Collectives of communicators that live on this node reach "
        "the master as one summary each; everything else is forwarded (docs/deploy.md). Runs until "
        "SIGINT/SIGTERM; exit 0, or 1 when an endpoint is bad.",
    )
    p.add_argument("--master", required=True, metavar="EP", help="the master's endpoint (c4d master --bind)")
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5556",
        metavar="EP",
        help="endpoint the node's ranks send to (their C4D_MASTER_ADDR)",
    )
    p.add_argument(
        "--trace", metavar="FILE", help="keep the node's full stream in this trace (c4d analyze reads it)"
    )
    p.add_argument(
        "--flush-ms", type=_positive(int), default=100, metavar="MS", help="forward to the master this often"
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="serve only this job id, refusing any other from the first message (default: $C4D_JOB_ID, "
        "$TORCHELASTIC_RUN_ID or $SLURM_JOB_ID; none: the first job --agree ranks register with)",
    )
    p.add_argument(
        "--agree",
        type=_positive(int),
        default=2,
        metavar="N",
        help="with no job named: ranks that must register with one job before it is served (default 2; "
        "$C4D_AGENT_AGREE)",
    )
    p.add_argument(
        "--master-status",
        default="auto",
        metavar="EP",
        help="the master's status endpoint, asked which job it serves: a job it refuses is not forwarded "
        "(auto: the port below --master's, as c4d master --status-bind auto; none: not asked)",
    )
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=logging.INFO,
        metavar="L",
        help="Debug, Info, Warning or Error",
    )
    p.set_defaults(func=cmd_agent)

    p = add(
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
    _add_quick(p)
    p.set_defaults(func=cmd_demo)

    p = add(
        "analyze",
        "replay a captured trace through the engine",
        "Replays PATH through the diagnosis engine and prints one line per incident (kind, level "
        "reached, culprit, where, when, how long, evidence). --json prints every diagnosis, --all "
        "every diagnosis line too.",
    )
    p.add_argument(
        "path",
        metavar="PATH",
        help="a c4d trace, a Flight Recorder dump directory, Inspector or nccl-tests output",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="every diagnosis as a JSON line (the full stream) instead of the table",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also print every diagnosis, one line each, before the incident table",
    )
    p.add_argument("--format", choices=FORMATS, default=None, help=FORMAT_HELP)
    p.add_argument(
        "--hang-timeout", type=_positive(int), metavar="US", help="override the job's C4D_HANG_TIMEOUT (µs)"
    )
    p.add_argument("--hang-times", type=_positive(int), metavar="N", help="override the job's C4D_HANG_TIMES")
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="analyze a trace that lost records to damage (exit 1 otherwise)",
    )
    from c4d.formats.budget import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS

    p.add_argument(
        "--max-import-bytes",
        type=_size,
        metavar="BYTES",
        help="memory an import of another tool's files may fill (suffix K, M, G; default "
        f"{DEFAULT_MAX_BYTES >> 30}G): past it, or a file built to expand past it, it is refused",
    )
    p.add_argument(
        "--max-import-seconds",
        type=_positive(float),
        metavar="S",
        help=f"time an import may take (default {DEFAULT_MAX_SECONDS:g}); past it, it is refused",
    )
    p.set_defaults(func=cmd_analyze)

    p = add("report", "tables and plots (PNG + one HTML page) of a trace")
    p.add_argument("path", metavar="PATH", help="a trace (any format c4d analyze reads)")
    p.add_argument(
        "-o", "--out", default="c4d-report", metavar="DIR", help="folder for the PNGs and report.html"
    )
    p.add_argument("--format", choices=FORMATS, default=None, help=FORMAT_HELP)
    p.set_defaults(func=cmd_report)

    p = add(
        "export",
        "write a trace's table as Parquet (pyarrow), or its timeline for Perfetto",
        "Writes one table of a trace as Parquet; communicator ids are 16-digit hex strings, as in "
        "the logs and the JSON. --format perfetto writes a timeline (Chrome trace-event JSON, gzip "
        "when OUT ends in .gz) that ui.perfetto.dev opens: per rank its ops, wait and transfer "
        "apart, and the incidents as markers. A c4d trace or a directory of node traces is read "
        "in pieces, in memory that does not grow with it.",
    )
    p.add_argument(
        "path", metavar="PATH", help="a trace (any format c4d analyze reads), or a directory of traces"
    )
    p.add_argument("out", metavar="OUT", help="the file to write")
    p.add_argument(
        "--table",
        default="ops",
        choices=["ops", "registrations", "heartbeats", "comms", "peers", "diagnoses"],
        help="which table",
    )
    p.add_argument(
        "--format",
        choices=EXPORT_FORMATS + FORMATS,
        default=None,
        help="what to write: parquet (default) or perfetto; or, as before, how to read PATH ("
        + FORMAT_HELP
        + ")",
    )
    p.add_argument("--input-format", choices=FORMATS, default=None, help=FORMAT_HELP)
    p.add_argument("--ranks", type=_rank_list, metavar="LIST", help="only these global ranks (0-3,7)")
    p.add_argument(
        "--comms", type=_comm_list, metavar="IDS", help="only these communicators (hex ids, comma-separated)"
    )
    p.add_argument(
        "--start", type=float, metavar="S", help="only records from S seconds after the trace started"
    )
    p.add_argument(
        "--end", type=float, metavar="S", help="only records before S seconds after the trace started"
    )
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
