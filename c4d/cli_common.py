"""What every c4d command line shares: exit statuses, the parser and help formatter, the option
types for numbers and log levels, and what a run's diagnoses make of its exit status
(docs/cli.md). The top command (the ``c4d.cli`` package) and the families outside it
(``check``, ``demo``, ``run``, ``sim``) import it; it imports none of them, so every command
starts without the others' modules. It stays outside c4d/cli/, whose ``__init__`` loads every
family of the top command: ``python -m c4d.check`` does not."""

from __future__ import annotations

import argparse
import logging
import math

EXIT_OK, EXIT_BAD, EXIT_FOUND = 0, 1, 2


LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


def log_level(text: str) -> int:
    try:
        return LOG_LEVELS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"log level must be one of {', '.join(LOG_LEVELS)}") from None


def number(
    kind: type = int,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    hint: str = "",
):
    """An option's type: a finite ``kind`` (int or float) within the bounds given; anything else
    is argparse's one-line error naming the option. Finite, because nan compares false with every
    bound and would pass them (``--factor nan`` once did); ``hint``: what the bound means."""
    what = "an integer" if kind is int else "a number"
    tail = f" ({hint})" if hint else ""

    def conv(text: str):
        try:
            v = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if at_least is not None and v < at_least:
            rule = f">= {at_least:g}"
        elif above is not None and v <= above:
            rule = f"> {above:g}"
        elif at_most is not None and v > at_most:
            rule = f"<= {at_most:g}"
        else:
            return v
        raise argparse.ArgumentTypeError(f"{text!r} must be {rule}{tail}")

    conv.__name__ = kind.__name__  # (argparse names the type in some of its messages)
    return conv


def positive(kind: type = int):
    """A count or a size that must be > 0."""
    return number(kind, above=0)


port = number(int, at_least=0, at_most=65535, hint="a TCP port; 0: any free one")


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
