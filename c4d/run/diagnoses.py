"""Where ``c4d run`` hears diagnoses: its own master, or an external master's JSON lines.

``LocalMaster`` (the default) is a ``c4d.master.Master`` hosted in this process, a fresh
one (engine, trace) per attempt, reading from the one ZeroMQ endpoint ``c4d run`` owns for
its whole life (``Endpoint``): the endpoint the job's ranks connect to, ``C4D_MASTER_ADDR``.
It is stepped from the supervisor's loop; diagnoses arrive through the master's
``on_diagnosis`` callback after the ``enrich`` hook added their stacks. This endpoint is the
seam for the per-node aggregator (``c4d agent``, not built yet): it will bind here and
forward to the job's master, and the diagnoses will come back over its channel, in the
same JSON form.

``JsonFollower`` reads the JSON lines an external ``c4d master --json`` writes (``c4d run
--master EP --diagnoses-from FILE``): a file it tails. Both return DESIGN.md's JSON objects.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("c4d.run")


class Endpoint:
    """The ZeroMQ socket the ranks report to, bound once for the whole ``c4d run``."""

    def __init__(self, bind: str):
        from c4d.collector import Collector

        self.collector = Collector(bind)
        self.endpoint = self.collector.endpoint

    def drain(self, seconds: float = 0.2) -> int:
        """Drop what is queued (records of a stopped attempt's ranks); how many batches."""
        n = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            n += len(self.collector.poll(0.02))
        return n

    def close(self) -> None:
        self.collector.close()


class LocalMaster:
    def __init__(
        self,
        bind: str,
        engine_overrides: dict[str, Any],
        trace: str | None,
        meta: dict[str, Any],
        enrich: Callable[[Any], Any] | None,
        on_diagnosis: Callable[[Any], None],
        collector: Any = None,
    ):
        from c4d.master import Master, MasterConfig

        self._got: list[dict[str, Any]] = []

        def collect(d: Any) -> None:
            self._got.append(d.to_json())
            on_diagnosis(d)

        cfg = MasterConfig(bind=bind, trace=trace, meta=meta, engine_overrides=engine_overrides)
        self.master = Master(cfg, on_diagnosis=[collect], enrich=enrich, collector=collector)
        self.endpoint = self.master.endpoint

    def poll(self, timeout_s: float) -> list[dict[str, Any]]:
        self.master.step(timeout_s=timeout_s)
        out, self._got = self._got, []
        return out

    def pids(self) -> dict[int, int]:
        return {r: i.pid for r, i in self.master.received.ranks.items()}

    def final_ranks(self) -> tuple[set[int], set[int]]:
        """(ranks that exited cleanly — FINAL heartbeat —, ranks registered)."""
        ranks = self.master.received.ranks
        return {r for r, i in ranks.items() if i.final}, {r for r, i in ranks.items() if i.node != "?"}

    def close(self) -> None:
        # the last records (final heartbeats) land and are evaluated before the socket goes
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            self.master.step(timeout_s=0.05)
        self.master.close()


class JsonFollower:
    """Tails a JSON-lines file of diagnoses; lines that are not JSON objects are skipped (logged once)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._pos = 0
        self._buf = b""
        self._warned = False
        try:  # only what is written from now on: older diagnoses belong to older attempts
            self._pos = self.path.stat().st_size
        except OSError:
            self._pos = 0

    def poll(self, timeout_s: float) -> list[dict[str, Any]]:
        time.sleep(timeout_s)
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self._pos:
                    self._pos = 0  # truncated or replaced
                f.seek(self._pos)
                data = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        except OSError as e:
            if not self._warned:
                log.warning("c4d run: cannot read %s: %s", self.path, e)
                self._warned = True
            return []
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict) or "level" not in obj:
                    raise ValueError("not a diagnosis")
            except ValueError:
                if line.strip() and not self._warned:
                    log.warning("c4d run: skipping a line of %s that is not a diagnosis", self.path)
                    self._warned = True
                continue
            out.append(obj)
        return out

    def pids(self) -> dict[int, int]:
        return {}

    def final_ranks(self) -> tuple[set[int], set[int]]:
        return set(), set()

    def close(self) -> None:
        pass
