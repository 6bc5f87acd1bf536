"""What a trace becomes: ``report`` (tables and plots: PNGs and one HTML page) and ``export`` (a
table as Parquet, or the timeline for Perfetto)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from c4d.cli.common import (
    FORMAT_HELP,
    FORMATS,
    add_command,
    engine_overrides,
    is_c4d_trace,
    load_for_offline,
    report_damage,
)
from c4d.cli_common import EXIT_BAD, number


def add_parser(subparsers) -> None:
    """``report`` and ``export``."""
    _add_report(subparsers)
    _add_export(subparsers)


def _add_report(subparsers) -> None:
    p = add_command(subparsers, "report", "tables and plots (PNG + one HTML page) of a trace")
    p.add_argument("path", metavar="PATH", help="a trace (any format c4d analyze reads)")
    p.add_argument(
        "-o", "--out", default="c4d-report", metavar="DIR", help="folder for the PNGs and report.html"
    )
    p.add_argument("--format", choices=FORMATS, default=None, help=FORMAT_HELP)
    p.set_defaults(func=cmd_report)


def _add_export(subparsers) -> None:
    p = add_command(
        subparsers,
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
        "--start", type=number(float), metavar="S", help="only records from S seconds after the trace started"
    )
    p.add_argument(
        "--end", type=number(float), metavar="S", help="only records before S seconds after the trace started"
    )
    p.set_defaults(func=cmd_export)


def cmd_report(args) -> int:
    from c4d.offline import report
    from c4d.record.trace import TraceError

    if is_c4d_trace(args):  # read and replayed in pieces: memory does not grow with the trace
        try:
            inp, sp = report.from_stream(args.path, engine_overrides(args))
        except (TraceError, OSError) as e:
            print(f"c4d report: {e}", file=sys.stderr)
            return EXIT_BAD
        report_damage(sp.stream)
    else:
        tr = load_for_offline(args)
        if tr is None:
            return EXIT_BAD
        inp = report.from_trace(tr)
    out = report.write(inp, Path(args.out))
    for name, p in out.items():
        print(f"{name}: {p}")
    return 0


def cmd_export(args) -> int:
    from c4d.offline import analyze
    from c4d.record.trace import TraceError

    out_fmt = args.format if args.format in EXPORT_FORMATS else "parquet"
    if args.format in FORMATS:
        args.input_format = args.format
    select = {"ranks": args.ranks, "comms": args.comms, "start_s": args.start, "end_s": args.end}
    if is_c4d_trace(args):  # read and replayed in pieces: memory does not grow with the trace
        try:
            if out_fmt == "perfetto":
                from c4d.offline import perfetto

                done = perfetto.write(
                    args.path, args.out, analyze.Selection.of(**select), engine_overrides(args)
                )
                print(f"wrote {done['events']:,} events ({done['ops']:,} ops on {done['ranks']} ranks, "
                      f"{done['incidents']} incidents) to {args.out}")  # fmt: skip
                return 0
            sp = analyze.to_parquet(
                args.path, args.out, args.table, overrides=engine_overrides(args), **select
            )
        except (TraceError, OSError, ValueError) as e:
            print(f"c4d export: {e}", file=sys.stderr)
            return EXIT_BAD
        report_damage(sp.stream)
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
    tr = load_for_offline(args)
    if tr is None:
        return EXIT_BAD
    df = analyze.parquet_frame(tr.table(args.table), args.table)
    df.to_parquet(args.out, engine="pyarrow", index=False)
    print(f"wrote {len(df):,} rows of {args.table} to {args.out}")
    return 0


def hex_ids(df):
    """Communicator ids as 16-digit hex strings (c4d.analyze.hex_ids)."""
    from c4d.offline.analyze import hex_ids

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
