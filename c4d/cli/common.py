"""What the top command's families share: option types and the master's options, the logging
set-up, the master a command runs, and the offline commands' loading of any trace format.

What every c4d command line shares, the sibling families (``check``, ``run``, ``sim``) included,
is in c4d/cli_common.py (exit statuses, the parser, the help formatter): it stays below this
package so that those families start without the top command's modules."""

from __future__ import annotations

import argparse
import logging
import sys

from c4d.cli_common import EXIT_HELP, HelpFormatter, log_level, port, positive


def setup_logging(level: int) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="c4d %(levelname)s %(message)s", force=True)


def byte_size(text: str) -> int:
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


def engine_overrides(args) -> dict:
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


def add_master_opts(p: argparse.ArgumentParser) -> None:
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
        type=log_level,
        default=logging.INFO,
        metavar="L",
        help="Info (default: slow kinds too), Warning or Error; filters the human-readable log only "
        "(one line when an incident opens, escalates, isolates a node and ends)",
    )
    p.add_argument(
        "--hang-timeout", type=positive(int), metavar="US", help="override the job's C4D_HANG_TIMEOUT (µs)"
    )
    p.add_argument("--hang-times", type=positive(int), metavar="N", help="override the job's C4D_HANG_TIMES")
    p.add_argument(
        "--metrics-port", type=port, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT"
    )


def add_quick(p: argparse.ArgumentParser) -> None:
    from c4d.sim.sim import QUICK_ENV

    shown = " ".join(f"{k}={v}" for k, v in QUICK_ENV.items())
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small thresholds so every fault kind shows within seconds: {shown} "
        "(values already in your environment win)",
    )


def make_master(args, meta: dict, bind: str):
    from c4d.master.master import Master, MasterConfig

    cfg = MasterConfig(
        metrics_port=args.metrics_port,
        bind=bind,
        trace=args.trace,
        json_out=args.json,
        blacklist=args.blacklist,
        meta=meta,
        engine_overrides=engine_overrides(args),
        curve=getattr(args, "curve", None),
        job=getattr(args, "job", None),
        status=_status_bind(getattr(args, "status_bind", None)),
    )
    if getattr(args, "engine_process", None):
        cfg.engine_process = True
    if getattr(args, "receiver_process", None):
        cfg.receiver_process = True
    if getattr(args, "engine_shards", None):
        cfg.engine_shards = args.engine_shards
        if args.engine_shards > 1:
            cfg.engine_process = True
    if getattr(args, "ranks_may_move", False):  # the job's launcher may restart a rank elsewhere
        from dataclasses import replace

        from c4d.intake.validate import Limits

        cfg.limits = replace(cfg.limits or Limits.from_env(), ranks_may_move=True)
    return Master(cfg)


def _status_bind(value: str | None) -> str | None:
    """``c4d master --status-bind``: an endpoint, ``auto`` (next to --bind) or ``none``."""
    return None if value is None or value.lower() == "none" else value


def live_console(args):
    """The live view's terminal: stderr when stdout carries --json lines, so they don't mix."""
    from rich.console import Console

    return Console(stderr=True) if args.json else None


def is_c4d_trace(args) -> bool:
    """PATH is a c4d trace file (by --format or its magic): analyzed as a stream."""
    from c4d.offline.analyze import is_c4d

    fmt = getattr(args, "input_format", None) or getattr(args, "format", None)
    return is_c4d(args.path, fmt if fmt in FORMATS else None)


def report_damage(rt) -> bool:
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


def load_for_offline(args, frames: bool = True):
    """Load PATH in any supported format (an AnalyzedTrace, or its RawTrace when not ``frames``);
    one line on stderr and None when it can't be read."""
    from c4d.formats.to_records import ImportOptions
    from c4d.offline.analyze import load, load_raw
    from c4d.record.trace import TraceError

    over = engine_overrides(args)
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


FORMATS = ["c4d", "fr", "inspector", "nccl-tests"]
FORMAT_HELP = (
    "c4d trace, Flight Recorder dumps, NCCL Inspector JSON lines, nccl-tests text (default: detected)"
)


def add_command(subparsers, name: str, help: str, desc: str | None = None) -> argparse.ArgumentParser:
    """A subcommand whose description (``desc``, else ``help``) ends with the exit statuses."""
    return subparsers.add_parser(
        name, help=help, description=(desc or help) + "\n\n" + EXIT_HELP, formatter_class=HelpFormatter
    )
