"""The job's output: every line kept with a timestamp and the node name, passed through, and
the exit status left alone.

``cmd | tee job.log`` reports tee's exit status, not the job's (the trap ``set -o
pipefail`` exists for). Here the job's pipes are read by threads of this process: each line
goes to the log file as ``<UTC time> <node>:<process> <out|err> <line>`` and, unchanged, to
our own stdout or stderr; the exit status comes from the process's ``wait()``, which no
pipe can touch. The last lines of each attempt are kept for the restart policy (retryable
error patterns) and the time of the latest line for hang detection.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import IO

log = logging.getLogger("c4d.run")


def stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LogCapture:
    """Reads the pipes of an attempt's processes; one instance per ``c4d run``."""

    def __init__(self, path: str | os.PathLike, node: str, passthrough: bool = True, tail_lines: int = 200):
        self.node = node
        self.passthrough = passthrough
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the capture
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self.last_output = time.monotonic()
        """monotonic time of the latest line of the current attempt (or of its start)."""
        self.lines = 0

    def start_attempt(self, header: str) -> None:
        """Forget the previous attempt's tail; write a marker line; restart the silence clock."""
        self.join(1.0)
        with self._lock:
            self._tail.clear()
            self._threads = []
            self.last_output = time.monotonic()
        self.note(header)

    def note(self, text: str) -> None:
        """A line of c4d's own in the log (attempt boundaries, decisions)."""
        self._write(f"{stamp()} {self.node} c4d: {text}\n".encode(errors="replace"))

    def attach(self, stream: IO[bytes], index: int, name: str) -> None:
        """Read ``stream`` (a child's stdout or stderr pipe) until EOF in a thread."""
        out = sys.stdout if name == "out" else sys.stderr
        t = threading.Thread(
            target=self._pump,
            args=(stream, f"{self.node}:{index} {name} ", out),
            daemon=True,
            name=f"c4d-log-{name}",
        )
        t.start()
        self._threads.append(t)

    def _pump(self, stream: IO[bytes], prefix: str, out) -> None:
        pre = prefix.encode(errors="replace")
        try:
            for raw in iter(lambda: stream.readline(1 << 16), b""):
                now = time.monotonic()
                line = raw if raw.endswith(b"\n") else raw + b"\n"
                with self._lock:
                    self.last_output = now
                    self.lines += 1
                    self._tail.append(line.decode(errors="replace").rstrip("\n"))
                self._write(stamp().encode() + b" " + pre + line)
                if self.passthrough:
                    self._pass(out, raw)
        except (OSError, ValueError) as e:  # the pipe went away under us
            log.debug("log pipe %s closed: %s", prefix.strip(), e)
        finally:
            stream.close()

    def _write(self, data: bytes) -> None:
        with self._lock:
            try:
                self._f.write(data)
            except OSError as e:
                log.error("c4d run: cannot write the job log: %s", e)

    @staticmethod
    def _pass(out, raw: bytes) -> None:
        try:
            out.buffer.write(raw)
            out.buffer.flush()
        except (OSError, ValueError, AttributeError):
            pass  # our own stdout closed: keep logging

    def tail(self) -> list[str]:
        with self._lock:
            return list(self._tail)

    def silent_for(self) -> float:
        return time.monotonic() - self.last_output

    def join(self, timeout: float) -> None:
        """Wait (bounded) until the pipes of the current attempt reach EOF."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.join(2.0)
        with self._lock:
            self._f.close()
