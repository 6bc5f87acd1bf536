"""Where ``c4d run`` hears diagnoses: its own master, or an external master's JSON lines.

``LocalMaster`` (the default) is a ``c4d.master.master.Master`` hosted in this process, a fresh
one (engine, trace) per attempt, reading from the one ZeroMQ endpoint ``c4d run`` owns for
its whole life (``Endpoint``): the endpoint the job's ranks connect to, ``C4D_MASTER_ADDR``.
It is stepped from the supervisor's loop; diagnoses arrive through the master's
``on_diagnosis`` callback after the ``enrich`` hook added their stacks. This endpoint is the
seam for the per-node aggregator (``c4d agent``, not built yet): it will bind here and
forward to the job's master, and the diagnoses will come back over its channel, in the
same JSON form.

``JsonFollower`` reads the JSON lines an external ``c4d master --json`` writes (``c4d run
--master EP --diagnoses-from FILE``): a file it tails. Both return docs/cli.md's JSON objects.
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
        from c4d.master.collector import Collector

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
        from c4d.master.master import Master, MasterConfig

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


_READ_MAX = 16 << 20  # read per poll; the rest waits for the next
MAX_LINE = 1 << 20  # a diagnosis line of c4d master --json is a few KiB (with stacks, tens)
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _ints(xs: Any, limit: int = 1 << 17) -> list[int]:
    """The ints of a JSON list (bools and everything else dropped), at most ``limit``."""
    if not isinstance(xs, list):
        return []
    return [x for x in xs[:limit] if isinstance(x, int) and not isinstance(x, bool)]


def sanitize(obj: dict[str, Any]) -> dict[str, Any]:
    """A diagnosis read from a file (not from this ``c4d run``'s own master), made as safe as one the
    master's edge let through: node names in c4d.record.names' safe form, those that were not already in it
    listed in ``detail["refused_nodes"]`` (never isolated: they did not come through a master);
    names of kinds, levels, ops and communicators the same; ranks and victims ints only. The rest is
    kept as JSON (written only through json.dumps, which escapes control characters)."""
    from c4d.record import names

    d = dict(obj)
    detail = d.get("detail")
    detail = dict(detail) if isinstance(detail, dict) else {}
    nodes: list[str] = []
    refused: list[str] = []
    raw = d.get("nodes")
    raw_nodes: list[Any] = raw if isinstance(raw, list) else []
    for n in raw_nodes[:64]:
        safe = names.clean(n if isinstance(n, str) else json.dumps(n))
        if not (isinstance(n, str) and names.is_clean(n)) and safe != names.UNKNOWN:
            refused.append(safe)
        nodes.append(safe)
    d["nodes"] = nodes
    if refused:
        detail["refused_nodes"] = refused
    level = d.get("level")
    d["level"] = level if level in _LEVELS else names.clean(str(level))
    for k in ("kind", "op", "comm"):
        v = d.get(k)
        if v is not None and not (k == "comm" and isinstance(v, int) and not isinstance(v, bool)):
            d[k] = names.clean(v if isinstance(v, str) else json.dumps(v))
    if not (isinstance(d.get("seq"), int) and not isinstance(d.get("seq"), bool)):
        d["seq"] = None
    d["ranks"] = _ints(d.get("ranks"))
    if "victims" in detail:
        detail["victims"] = _ints(detail["victims"])
    if "localized" in detail:
        detail["localized"] = detail["localized"] is True
    detail.pop("evidence_file", None)  # c4d run writes it, inside its run directory
    if isinstance(detail.get("stacks"), dict):  # filled in by this node's dumps, never by the file
        detail.pop("stacks")
    d["detail"] = detail
    return d


class JsonFollower:
    """Tails a JSON-lines file of diagnoses; lines that are not JSON objects are skipped (logged once).

    The file is untrusted (anything may write it): each diagnosis goes through ``sanitize``, and a
    line longer than MAX_LINE is dropped whole, never held."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._pos = 0
        self._buf = b""
        self._skipping = False
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
                data = f.read(_READ_MAX)
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        except OSError as e:
            if not self._warned:
                log.warning("c4d run: cannot read %s: %s", self.path, e)
                self._warned = True
            return []
        *lines, rest = (self._buf + data).split(b"\n")
        if self._skipping and lines:  # the rest of a line too long to hold ends here
            lines, self._skipping = lines[1:], False
        if len(rest) > MAX_LINE or self._skipping:
            self._skip_warning()
            rest, self._skipping = b"", True
        self._buf = rest
        out = []
        for line in lines:
            if len(line) > MAX_LINE:
                self._skip_warning()
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict) or "level" not in obj:
                    raise ValueError("not a diagnosis")
            except (ValueError, RecursionError):
                if line.strip() and not self._warned:
                    log.warning("c4d run: skipping a line of %s that is not a diagnosis", self.path)
                    self._warned = True
                continue
            out.append(sanitize(obj))
        return out

    def _skip_warning(self) -> None:
        if not self._warned:
            log.warning("c4d run: skipping a line of %s longer than %d bytes", self.path, MAX_LINE)
            self._warned = True

    def pids(self) -> dict[int, int]:
        return {}

    def final_ranks(self) -> tuple[set[int], set[int]]:
        return set(), set()

    def close(self) -> None:
        pass
