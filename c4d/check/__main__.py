"""``python -m c4d.check boot ...``: the ``c4d check`` command without the top-level CLI."""

from __future__ import annotations

import sys

from c4d.check.cli import add_parser
from c4d.cli_common import HelpFormatter, Parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["check"]:
        argv.insert(0, "check")
    parser = Parser(prog="c4d", formatter_class=HelpFormatter)
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
