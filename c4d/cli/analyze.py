"""``c4d analyze``: replay a trace of any format through the engine and print its incidents (the
table), or every diagnosis as JSON lines. A c4d trace is read and replayed in pieces."""

from __future__ import annotations

import json
import sys

from c4d.cli.common import (
    FORMAT_HELP,
    FORMATS,
    add_command,
    byte_size,
    engine_overrides,
    is_c4d_trace,
    load_for_offline,
    report_damage,
)
from c4d.cli_common import EXIT_BAD, EXIT_FOUND, EXIT_OK, found, positive
from c4d.formats.budget import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS


def add_parser(subparsers) -> None:
    """``analyze``."""
    p = add_command(
        subparsers,
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
        "--hang-timeout", type=positive(int), metavar="US", help="override the job's C4D_HANG_TIMEOUT (µs)"
    )
    p.add_argument("--hang-times", type=positive(int), metavar="N", help="override the job's C4D_HANG_TIMES")
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="analyze a trace that lost records to damage (exit 1 otherwise)",
    )
    p.add_argument(
        "--max-import-bytes",
        type=byte_size,
        metavar="BYTES",
        help="memory an import of another tool's files may fill (suffix K, M, G; default "
        f"{DEFAULT_MAX_BYTES >> 30}G): past it, or a file built to expand past it, it is refused",
    )
    p.add_argument(
        "--max-import-seconds",
        type=positive(float),
        metavar="S",
        help=f"time an import may take (default {DEFAULT_MAX_SECONDS:g}); past it, it is refused",
    )
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args) -> int:
    from c4d.offline import analyze

    if is_c4d_trace(args):
        return _analyze_stream(args)
    raw = load_for_offline(args, frames=False)  # --json needs no DataFrames (nor pandas)
    if raw is None:
        return EXIT_BAD
    if raw.truncated_bytes:
        cut = raw.truncated_bytes
        print(f"c4d analyze: the trace ends in a cut record ({cut} bytes ignored)", file=sys.stderr)
    if raw.skipped:
        print(f"c4d analyze: skipped {raw.skipped} records of unknown kind or version", file=sys.stderr)
    damaged = report_damage(raw)
    if damaged and not args.allow_damaged:
        print(
            "c4d analyze: records were lost to damage; pass --allow-damaged to analyze what was read",
            file=sys.stderr,
        )
        return EXIT_BAD
    from c4d.intake.ingest import Ingest
    from c4d.intake.validate import Edge, Limits

    engine = analyze.make_engine(engine_overrides(args))
    ingest = Ingest(engine, Edge(Limits.from_env()))
    diags = analyze.replay(raw, engine, ingest)
    _report_edge(ingest)
    if args.json:
        return _print_json(diags)
    from c4d.engine.incidents import heard_stamps
    from c4d.record.trace import from_raw

    tr = from_raw(raw)
    s = analyze.summary(tr)
    heard, _ = heard_stamps(raw.raw, int(raw.meta.get("created_ns", 0)))
    return _print_analysis(
        args, diags, s, tr.nodes, len(tr.ops), analyze.end_ns(tr.raw), analyze.start_s(tr.raw), heard
    )


def _analyze_stream(args) -> int:
    """``c4d analyze`` of a c4d trace, read and replayed piece by piece: memory does not grow
    with the file (the summary table's quantiles go approximate past 1 M ops, and say so)."""
    from c4d.intake.ingest import Ingest
    from c4d.intake.validate import Edge, Limits
    from c4d.offline import analyze
    from c4d.record.trace import TraceError, open_stream

    try:
        st = open_stream(args.path)
    except TraceError as e:
        print(f"c4d analyze: {e}", file=sys.stderr)
        return EXIT_BAD
    engine = analyze.make_engine(engine_overrides(args))
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
    if report_damage(st) and not args.allow_damaged:
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
    from c4d.engine.incidents import Incidents, table_lines
    from c4d.util import texttable

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
