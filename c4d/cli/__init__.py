"""c4d: find the rank, node or link that makes an NCCL training job hang or crawl.

The command line is a public contract (docs/cli.md): extend it, don't break it.

Exit status of every command (docs/cli.md): 0 success, nothing found; 1 bad input or an
operational error (usage errors included: one line on stderr); 2 the command worked and
found a problem (a diagnosis at WARNING or above, a failed health check, a job stopped by an
ERROR). ``c4d run`` exits with the supervised job's own status.
"""

from __future__ import annotations

import argparse

from c4d import __version__
from c4d.check.cli import add_parser as add_check
from c4d.cli import analyze, export, serve, simulate
from c4d.cli.export import hex_ids
from c4d.cli_common import EXIT_HELP, HelpFormatter, Parser
from c4d.run.cli import add_parser as add_run

__all__ = ["build_parser", "hex_ids", "main"]


def build_parser() -> argparse.ArgumentParser:
    """``c4d`` and its commands, one family a module (c4d/cli/*.py, c4d/run/cli.py, c4d/check/cli.py);
    each family's ``add_parser`` adds its commands, the options of each and the function it runs."""
    ap = Parser(
        prog="c4d",
        description=(__doc__ or "").split("\n\n")[0] + "\n\n" + EXIT_HELP,
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"c4d {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in (serve, simulate, analyze, export):
        family.add_parser(sub)
    add_run(sub)
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
