"""Last words: the stacks of a hang's culprit ranks (and, once, of its victims).

On a hang's first WARNING (RankNonCommHang, RankCommHang, RankLost; a CollectiveMismatch whose
members are still in the op: its minority the culprits, the other side the victims) the master asks the
culprit's node for evidence; this node's ``c4d run`` dumps the stacks of the culprit ranks
that run here, and, once per attempt, of up to ``max_victims`` of the ranks waiting for
them. Dumps run on a worker thread, one at a time (a debugger stops its target while it
reads it), so the master loop does not wait for a WARNING; every later diagnosis of the
same hang (the next count, the ERROR) carries them as ``detail["stacks"]``: ``{"<rank>":
{"role": "culprit"|"victim", "pid": ..., "python": ..., "native": ..., "tools": [...],
"error": ...}}``. An ERROR that comes before the dumps are done waits for them (bounded):
the job is stopped right after it, and its evidence must have them.

A hang seen only in the logs (``c4d run``'s ``--job-hang-interval``: no output for that long)
names no rank: before the job is stopped, ``dump_job`` dumps the job's ranks (registered, else
found by ``RANK``), else its processes, up to ``max_victims``, and the attempt's evidence keeps
them like a diagnosed hang's.

A rank's pid comes from its registration; it is only dumped if that pid is one of this
``c4d run``'s job processes (the pid of a rank on another node means nothing here). Without
registrations (an external master), ranks are found by the ``RANK`` in their environment.
Today the request is local (the master runs in ``c4d run``); with the per-node aggregator
it will arrive from the job's master.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from c4d.run import proctree
from c4d.util import stacks

log = logging.getLogger("c4d.run")

HANG_KINDS = ("RankNonCommHang", "RankCommHang", "RankLost")


def wants_stacks(j: Mapping[str, Any]) -> bool:
    """A hang, or a collective whose members called it differently and are still in it (named
    from their heartbeats, or a stall that followed): each side's stacks say where it called it.
    A disagreement named from records is over (the op completed): nothing to dump."""
    if j.get("kind") in HANG_KINDS:
        return True
    det = j.get("detail") or {}
    return j.get("kind") == "CollectiveMismatch" and (det.get("evidence") == "heartbeats" or "stalled" in det)


def _other_sides(j: Mapping[str, Any], culprits: list[int]) -> list[int]:
    """A mismatch's members outside its culprits (the other side of each op: its victims)."""
    sides = (j.get("detail") or {}).get("sides") or []
    out = [
        int(r)
        for s in sides
        if isinstance(s, Mapping)
        for r in s.get("ranks") or []
        if int(r) not in culprits
    ]
    return sorted(set(out))


def evidence_path(run_dir: str | Path, attempt: int, kind: Any, nodes: list[str]) -> Path:
    """Where an isolation's evidence is written: in ``run_dir/evidence``, named only from parts in
    c4d.record.names' safe form (no separator, no leading dot), the first two nodes and a count: at most
    ~220 characters, under every file system's limit on a name."""
    from c4d.record import names

    parts = [names.clean(str(kind)), *(names.clean(str(n)) for n in nodes[:2])]
    if len(nodes) > 2:
        parts.append(f"{len(nodes) - 2}-more")
    base = Path(run_dir) / "evidence"
    p = base / f"attempt{int(attempt)}-{'-'.join(parts)}.json"
    if p.resolve().parent != base.resolve():  # cannot happen with safe names; never write elsewhere
        raise ValueError(f"evidence path {p} is outside {base}")
    return p


def as_json(d: Any) -> dict[str, Any]:
    """A Diagnosis or its JSON object, as the JSON object."""
    return d.to_json() if hasattr(d, "to_json") else dict(d)


def hang_key(d: Mapping[str, Any]) -> tuple:
    """Which hang a diagnosis is about: every count of one hang has the same key."""
    if d.get("kind") == "RankLost":
        return ("RankLost", tuple(d.get("ranks") or ())[:1])
    return (d.get("kind"), d.get("comm"), d.get("seq"))


def ranks_by_environment(pids: Iterable[int]) -> dict[int, int]:
    """rank → pid for processes whose environment has RANK (the topmost one per rank)."""
    found: dict[int, int] = {}
    for pid in sorted(pids):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")  # noqa: SIM115
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                try:
                    r = int(item[5:])
                except ValueError:
                    break
                found.setdefault(r, pid)  # pids ascending: parents usually first
                break
    return found


class Evidence:
    def __init__(
        self,
        job_pids: Callable[[], set[int]],
        max_victims: int = 8,
        timeout_s: float = 15.0,
        error_wait_s: float = 20.0,
    ):
        self.job_pids = job_pids
        """Every live process of the current attempt (the launcher's process tree)."""
        self.max_victims = max_victims
        self.timeout_s = timeout_s
        self.error_wait_s = error_wait_s
        # One dump at a time, culprits first: a debugger stops its target while it reads it, and
        # several at once on a busy node would stop ranks long enough to look silent to the engine.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="c4d-stacks")
        self._lock = threading.Lock()
        self._pending: dict[tuple, tuple[dict[str, Any], dict[str, Future]]] = {}
        self._victims_dumped = False

    def new_attempt(self) -> None:
        with self._lock:
            self._pending.clear()
            self._victims_dumped = False

    def collected(self) -> list[dict[str, Any]]:
        """This attempt's hangs whose dumps are complete: the diagnosis that asked, with ``stacks``."""
        with self._lock:
            items = list(self._pending.values())
        out = []
        for j, futs in items:
            if futs and all(f.done() for f in futs.values()):
                out.append({**j, "stacks": {r: f.result() for r, f in futs.items() if not f.cancelled()}})
        return out

    # -- requests ------------------------------------------------------------------------
    def on_diagnosis(self, d: Any, pids: Mapping[int, int] | None = None) -> bool:
        """Dump stacks for a hang's first WARNING/ERROR; True when dumps were started."""
        j = as_json(d)
        if not wants_stacks(j) or j.get("level") not in ("WARNING", "ERROR"):
            return False
        key = hang_key(j)
        with self._lock:
            if key in self._pending:
                return False
            tree = self.job_pids()
            known = {r: p for r, p in (pids or {}).items() if p > 0}
            if not known:
                known = ranks_by_environment(tree)
            culprits = [int(r) for r in j.get("ranks") or []]
            victims: list[int] = []
            if not self._victims_dumped:
                waiting = (j.get("detail") or {}).get("victims") or _other_sides(j, culprits)
                victims = [int(v) for v in waiting if int(v) not in culprits][: self.max_victims]
                self._victims_dumped = bool(victims)
            futs: dict[str, Future] = {}
            for role, ranks in (("culprit", culprits), ("victim", victims)):
                for r in ranks:
                    futs[str(r)] = self._pool.submit(self._one, r, role, known.get(r), tree)
            self._pending[key] = (j, futs)
        log.warning(
            "c4d run: dumping the stacks of %s%s",
            ", ".join(f"rank {r}" for r in culprits) or "no rank",
            f" and of victim ranks {', '.join(map(str, victims))}" if victims else "",
        )
        return True

    def _one(self, rank: int, role: str, pid: int | None, tree: set[int]) -> dict[str, Any]:
        base: dict[str, Any] = {"role": role, "pid": pid}
        if pid is None:
            return {**base, "error": f"rank {rank} has no known process on this node"}
        if pid not in tree or not proctree.alive(pid):
            return {
                **base,
                "error": f"pid {pid} is not a live process of this node's job (another node's rank?)",
            }
        d = stacks.dump(pid, self.timeout_s)
        if d.error:
            log.warning("c4d run: stacks of rank %d (pid %d): %s", rank, pid, d.error)
        return {**base, **d.to_json()}

    def dump_job(
        self, what: Mapping[str, Any], pids: Mapping[int, int] | None, wait_s: float
    ) -> dict[str, Any]:
        """Stacks of a hang that names no rank (``what``: its JSON object): every rank of the job
        that runs here (registered, else found by ``RANK``), else every process of the job, up to
        ``max_victims``; waits up to ``wait_s`` and returns what was dumped by then (an entry
        that was not says so). ``collected`` and the sidecar keep it under ``what``."""
        j = dict(what)
        with self._lock:
            tree = self.job_pids()
            known = {r: p for r, p in (pids or {}).items() if p > 0 and p in tree}
            if not known:
                known = ranks_by_environment(tree)
            futs: dict[str, Future] = {}
            if known:
                for r in sorted(known)[: self.max_victims]:
                    futs[str(r)] = self._pool.submit(self._one, r, "silent", known[r], tree)
            else:  # a job that sets no RANK: its processes, the launched ones first
                for pid in sorted(tree)[: self.max_victims]:
                    futs[f"pid:{pid}"] = self._pool.submit(self._one, -1, "process", pid, tree)
            self._pending[hang_key(j)] = (j, futs)
        log.warning("c4d run: dumping the stacks of the silent job: %s", ", ".join(futs) or "no process left")
        wait(list(futs.values()), timeout=wait_s)
        out = {}
        for k, f in futs.items():
            if f.done() and not f.cancelled():
                out[k] = f.result()
            else:
                f.cancel()
                out[k] = {"role": "silent", "error": f"not dumped within {wait_s:g} s"}
        return out

    # -- results -------------------------------------------------------------------------
    def stacks_for(self, d: Any, wait_s: float = 0.0) -> dict[str, Any] | None:
        """The hang's stacks once every dump finished (waiting up to ``wait_s``), else None."""
        j = as_json(d)
        with self._lock:
            _, futs = self._pending.get(hang_key(j), (None, {}))
        if not futs:
            return None
        if wait_s > 0:
            wait(list(futs.values()), timeout=wait_s)
        if not all(f.done() for f in futs.values()):
            return None
        out = {r: f.result() for r, f in futs.items()}
        return out

    def enrich(self, d: Any) -> Any:
        """The diagnosis with ``detail["stacks"]`` when its hang's dumps are complete.

        An ERROR waits for them (at most ``error_wait_s``): it is what ``c4d run`` acts on,
        it stops the job right after, and every sink (the JSON lines, the live view, the
        isolation's evidence) should carry its stacks. A WARNING never waits.
        """
        j = as_json(d)
        st = self.stacks_for(j, wait_s=self.error_wait_s if j.get("level") == "ERROR" else 0.0)
        if st is None or (j.get("detail") or {}).get("stacks"):
            return d
        if hasattr(d, "to_json"):
            return dataclasses.replace(d, detail={**d.detail, "stacks": st})
        return {**j, "detail": {**(j.get("detail") or {}), "stacks": st}}

    def write_sidecar(self, path: str | Path) -> None:
        """This attempt's hangs with their stacks, for ``c4d report`` beside its trace."""
        data = self.collected()
        if data:
            Path(path).write_text(json.dumps(data, indent=1))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
