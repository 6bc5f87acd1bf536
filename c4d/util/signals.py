"""SIGTERM/SIGHUP unwind a command like Ctrl-C, and a loop notices them even when the unwinding
was lost.

The handler raises KeyboardInterrupt wherever the signal lands, so ``finally`` blocks kill rank
processes and close files. Landing inside a destructor (pyzmq's ``Frame.__dealloc__``), the
exception is printed and dropped: the command would run on. So each signal is also recorded,
and loops ask :func:`asked` (or call :func:`check`) between two steps.
"""

from __future__ import annotations

import signal

_asked: list[int] = []


def _handler(signum, _frame) -> None:
    _asked.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def raise_on_signals() -> None:
    """Install the handler for SIGTERM and SIGHUP (SIGINT already raises KeyboardInterrupt)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _handler)


def asked() -> bool:
    """Whether a SIGTERM/SIGHUP came, whatever became of its KeyboardInterrupt."""
    return bool(_asked)


def check() -> None:
    """Unwind now if a signal came whose KeyboardInterrupt was lost."""
    if _asked:
        raise KeyboardInterrupt(f"signal {_asked[-1]}")
