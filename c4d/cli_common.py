"""What every c4d command line shares: exit statuses, the parser and help formatter, and
what a run's diagnoses make of its exit status (docs/cli.md). The top command (the ``c4d.cli``
package) and the families outside it (``check``, ``demo``, ``run``, ``sim``) import it; it imports
none of them, so every command starts without the others' modules. It stays outside c4d/cli/,
whose ``__init__`` loads every family of the top command: ``python -m c4d.check`` does not."""

from __future__ import annotations

import argparse

EXIT_OK, EXIT_BAD, EXIT_FOUND = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors, exit status 1, and a hint instead of the usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_BAD, f"{self.prog}: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default (unless it has none, or says it already); keeps the
    description's paragraphs."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(
            super(HelpFormatter, self)._fill_text(p, width, indent) for p in text.split("\n\n")
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "%(default)" in text or "default" in text or d is None or d is False or d == []:
            return text
        if d is argparse.SUPPRESS:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


def found(diagnoses) -> bool:
    """Whether a run raised anything at WARNING or above (exit status 2)."""
    return any(d.level.name in ("WARNING", "ERROR") for d in diagnoses)


EXIT_HELP = (
    "exit status: 0 ok, nothing found; 1 bad input or operational error; "
    "2 found a problem (a diagnosis at WARNING or above, a failed check)"
)
