"""What one import may cost: memory and time, and the bounded readers that keep to it.

Other tools' files are untrusted input (docs/untrusted-input.md, "Imports"). Every import runs
under a ``Budget``: ``max_bytes`` of memory for what it holds (rows, columns, records, a pickle's
objects as built and as they would be unshared) and ``max_seconds`` of wall time. Going over
either refuses the import with one line (``BudgetError``); a single hostile file among good
ones (a gzip bomb, a pickle that expands past the budget) is refused and skipped with one
warning. Text is read line by line (``LineReader``): gzip inflates in a stream under a ratio
limit, and a line longer than ``MAX_LINE_BYTES`` is skipped whole without being held.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from c4d.formats.to_records import FormatError
from c4d.record import schema

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_SECONDS = 600.0
MAX_LINE_BYTES = 1 << 20  # an Inspector or nccl-tests line is well under 64 KiB
MAX_GZIP_RATIO = 100  # inflated / compressed; text logs compress 5-20 times
GZIP_RATIO_FREE = 1 << 20  # inflated bytes before the ratio is checked (tiny files)
# In-memory cost of a record an import builds: the OP array, its sorted copy and the stream
RECORD_COST = 3 * schema.RECORD_SIZE
_CHUNK = 1 << 20
_INFLATE = 1 << 16  # inflated per step: the ratio is checked that often


class BudgetError(FormatError):
    """The import went over its memory or time budget; the message is one line."""


class HostileFile(FormatError):
    """One file is built to cost far more than its size (gzip bomb, expanding pickle)."""


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < (1024 if unit == "bytes" else 1023.95) or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass
class Budget:
    """One import's allowance. ``charge`` what stays held until the import ends; ``fits`` checks
    something transient (one dump being loaded) against what is left; ``check_time`` at every
    step that can take long."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_seconds: float = DEFAULT_MAX_SECONDS
    deadline: float = 0.0
    used: int = 0
    _ticks: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if int(self.max_bytes) <= 0:
            raise ValueError(f"max_bytes must be > 0, not {self.max_bytes!r}")
        if not float(self.max_seconds) > 0:
            raise ValueError(f"max_seconds must be > 0, not {self.max_seconds!r}")
        if not self.deadline:
            self.deadline = time.monotonic() + float(self.max_seconds)

    def left(self) -> int:
        return max(0, int(self.max_bytes) - self.used)

    def fits(self, n: int, what: str) -> None:
        if self.used + n > self.max_bytes:
            held = f"{human(self.used)} held, " if self.used else ""
            raise BudgetError(
                f"{what}: {held}{human(n)} more needed: over the import's memory budget of "
                f"{human(self.max_bytes)} (--max-import-bytes)"
            )

    def charge(self, n: int, what: str) -> None:
        self.fits(n, what)
        self.used += n

    def check_time(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise BudgetError(
                f"{what}: the import ran past its time budget of {self.max_seconds:g} s "
                "(--max-import-seconds)"
            )

    def tick(self, what: str, every: int = 4096) -> None:
        """``check_time`` once every ``every`` calls (cheap enough for a per-line loop)."""
        self._ticks += 1
        if self._ticks >= every:
            self._ticks = 0
            self.check_time(what)


def rss_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class LineReader:
    """The lines of a file (plain or gzip, by content), as bytes without the newline, read in
    chunks: memory is one chunk plus one line, whatever the file holds.

    A line over ``max_line`` is dropped whole (never held) and counted in ``too_long`` (first
    at ``first_too_long``). A gzip member inflating to more than ``max_ratio`` times the bytes it
    came from raises ``HostileFile``; the budget's clock is checked at every chunk.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        budget: Budget,
        *,
        max_line: int = MAX_LINE_BYTES,
        max_ratio: float = MAX_GZIP_RATIO,
    ):
        self.path = Path(path)
        self.budget = budget
        self.max_line = max_line
        self.max_ratio = max_ratio
        self.too_long = 0
        self.first_too_long = 0
        self.lines = 0
        self.bytes_in = 0
        self.bytes_out = 0

    def _chunks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            first = f.read(_CHUNK)
            if first[:2] != b"\x1f\x8b":
                while first:
                    self.bytes_in += len(first)
                    self.bytes_out += len(first)
                    self.budget.check_time(str(self.path))
                    yield first
                    first = f.read(_CHUNK)
                return
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = first
            while data:
                while data:
                    before = len(data)
                    try:
                        out = d.decompress(data, _INFLATE)
                    except zlib.error as e:
                        raise FormatError(f"{self.path}: not a readable gzip file ({e})") from None
                    data = d.unconsumed_tail
                    if d.eof:  # the next gzip member (concatenated .gz files) starts here
                        data = d.unused_data + data
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                        if not data.strip(b"\0"):  # padding after the last member, as gzip allows
                            data = b""
                    self.bytes_in += before - len(data)
                    if not out and len(data) >= before:
                        break  # no progress: nothing more this input can give
                    if out:
                        self.bytes_out += len(out)
                        if (
                            self.bytes_out > GZIP_RATIO_FREE
                            and self.bytes_out > self.max_ratio * self.bytes_in
                        ):
                            raise HostileFile(
                                f"{self.path}: gzip inflates over {self.max_ratio:g} times its size "
                                f"({human(self.bytes_in)} to more than {human(self.bytes_out)}): not read"
                            )
                        self.budget.check_time(str(self.path))
                        yield out
                data = f.read(_CHUNK // 4)
            tail = d.flush()
            if tail:
                self.bytes_out += len(tail)
                yield tail

    def __iter__(self) -> Iterator[bytes]:
        buf = b""
        skipping = False
        for chunk in self._chunks():
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    if not skipping:
                        rest = chunk[start:]
                        if len(buf) + len(rest) > self.max_line:
                            self._long()
                            skipping, buf = True, b""
                        else:
                            buf += rest
                    break
                if skipping:
                    skipping = False
                else:
                    piece = chunk[start:nl]
                    if len(buf) + len(piece) > self.max_line:
                        self._long()
                    else:
                        self.lines += 1
                        yield buf + piece if buf else piece
                buf = b""
                start = nl + 1
        if buf and not skipping:
            self.lines += 1
            yield buf

    def _long(self) -> None:
        self.lines += 1
        self.too_long += 1
        self.first_too_long = self.first_too_long or self.lines

    def warning(self) -> str | None:
        """One line for the lines skipped as too long, or None."""
        if not self.too_long:
            return None
        return (
            f"{self.path}: {self.too_long} line(s) over {human(self.max_line)} skipped "
            f"(first at line {self.first_too_long})"
        )
