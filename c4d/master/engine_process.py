"""The master's engine in a process of its own, so that receiving and validating (the master's
loop) and the engine's ingest run on two cores (``c4d master --engine-process``).

It answers the calls the master makes of an in-process ``Engine`` (``feed``, ``free_comms``,
``tick``, ``state``, ``take_split``), in the order they were made, so the engine sees exactly
what an in-process one would and a replay of the trace reproduces its diagnoses. ``feed``,
``free_comms`` and ``tick`` are sent without waiting (rows go as they are, not copied into a
message): the master goes on receiving while the engine evaluates, and a tick's diagnoses are
handed out at a later tick (``drain`` waits for them: ``Master.settle``, its close). A batch
with node agents' summaries goes apart (``Engine.feed_apart``): the summaries read here from
the edge's columns (c4d.engine.summaries; this loop waits half the time, the engine's process
is the bound) and the batch's other rows; the summaries' own rows stay here. ``state``
and ``take_split`` wait for their answer, which comes once the engine has taken everything
sent before. With the metrics on (``split``), each tick's answer carries the engine's state and
OP_SPLIT rows (``take_metrics``), so the metrics never make the master wait. An exception in
the engine's process is counted there and handed to the master with the next answer, as
``Ingest`` counts one in-process.

If the engine's process dies, the master logs one ERROR and goes on with an engine of its
own, started empty (what the dead one knew is lost: open hangs are found again once their
timeout passes again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, deque
from typing import Any

import numpy as np
import zmq

from c4d.engine import types
from c4d.engine.summaries import Summaries
from c4d.record import schema
from c4d.record.columns import Columns
from c4d.util import pickles

log = logging.getLogger("c4d.engine")

FEED, APART, FREE, TICK, STATE, SPLIT, STOP = b"F", b"A", b"X", b"T", b"S", b"P", b"Q"
START_S = 60.0  # the engine's process imports numpy and c4d: seconds on a loaded host
QUEUE_MESSAGES = 16  # each up to a chunk of rows: the queue's memory is this many chunks
_CALLS = {TICK: "tick", STATE: "state", SPLIT: "take_split"}  # the answered calls, as failures name them
POLL_MS = 500  # how often a wait for an answer checks that the process is still alive


class _Answers(pickle.Unpickler):
    """Unpickles the engine's answers only: its result types (c4d.engine.types' dataclasses and
    enums) and numpy arrays; any other global is refused, never imported (the socket is the
    master's own, but nothing read from a socket runs code)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "c4d.engine.types":
            obj = getattr(types, name, None)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        elif pickles.plain(module, name):  # numpy arrays and scalars, sets
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"an answer of the engine's process refers to {module}.{name}: refused")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("an answer of the engine's process uses a persistent id: refused")


class EngineGone(RuntimeError):
    """The engine's process died; the master goes on with an engine of its own."""


def _serve(endpoint: str, overrides: dict[str, Any], split: bool, level: int, shards: int = 1) -> None:
    """The engine's process: take calls in order until STOP or until the master is gone.
    ``C4D_ENGINE_PROFILE=PATH``: the process profiled (cProfile), its statistics written to
    PATH (``{pid}`` in it: the process's id) when it stops: where an engine's process spends
    its time, measured where it runs (analysis/bench_master.py --profile)."""
    path = os.environ.get("C4D_ENGINE_PROFILE", "").strip()
    if not path:
        return _loop(endpoint, overrides, split, level, shards)
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        _loop(endpoint, overrides, split, level, shards)
    finally:
        prof.disable()
        path = path.replace("{pid}", str(os.getpid()))
        try:
            prof.dump_stats(path)
        except OSError as e:  # the engine served all the same; only its profile is lost
            log.error("C4D_ENGINE_PROFILE: the profile could not be written to %s: %s", path, e)


def _loop(endpoint: str, overrides: dict[str, Any], split: bool, level: int, shards: int = 1) -> None:
    from c4d.engine import make_engine
    from c4d.util import heap

    # the engine's own log lines (records it drops) on the master's stderr, as the master's
    logging.basicConfig(level=level, stream=sys.stderr, format="c4d %(levelname)s %(message)s")
    heap.keep_freed_blocks()
    heap.collect_rarely()
    from c4d.engine.shards import ShardGone

    engine = make_engine(overrides, split=split, shards=shards)
    try:
        _calls(engine, endpoint, split)
    except ShardGone as e:  # the engine's process ends: the master goes on with an engine of its own
        log.error("%s", e)
        sys.exit(3)
    finally:
        close = getattr(engine, "close", None)  # (a sharded engine's shard processes)
        if close is not None:
            close()


def _calls(engine: Any, endpoint: str, split: bool) -> None:
    """Take the master's calls in order until STOP or until the master is gone. A shard of a
    sharded engine that died (ShardGone) ends them: what the engine knew is incomplete."""
    from c4d.engine.shards import ShardGone

    failures: Counter[str] = Counter()
    failed_records = 0
    ctx = zmq.Context(1)
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, QUEUE_MESSAGES)  # (ZeroMQ's 1,000 queued here: GiBs of rows)
    sock.connect(endpoint)
    sock.send(b"ready")
    parent = os.getppid()
    try:
        while True:
            while not sock.poll(POLL_MS):
                if os.getppid() != parent:  # the master is gone (killed): so is its engine
                    return
            frames = sock.recv_multipart(copy=False)  # the rows are read where ZeroMQ put them
            head = frames[0].bytes
            op, arg = head[:1], int.from_bytes(head[1:9], "little", signed=True)
            if op == FEED:  # a batch without node summaries (those with come APART)
                try:
                    engine.feed(np.frombuffer(frames[1].buffer, schema.HEADER), arg)
                except ShardGone:
                    raise
                except Exception as e:  # as Ingest counts it in-process: the master hears of it
                    failures[f"ingest: {type(e).__name__}"] += 1
                    failed_records += len(frames[1].buffer) // schema.RECORD_SIZE
            elif op == APART:  # a batch's node summaries read, and its other rows
                n = int.from_bytes(frames[1].bytes, "little")
                try:
                    rest = np.frombuffer(frames[2].buffer, schema.HEADER)
                    sums = Summaries.from_frames([f.buffer for f in frames[3:]], n)
                    if sums is None:
                        raise ValueError("a batch's summaries that do not fit together")
                    engine.feed_apart(rest, arg, sums, n)
                except ShardGone:
                    raise
                except Exception as e:
                    failures[f"ingest: {type(e).__name__}"] += 1
                    failed_records += n
            elif op == FREE:
                try:
                    engine.free_comms(np.frombuffer(frames[1].buffer, np.uint64).tolist())
                except ShardGone:
                    raise
                except Exception as e:
                    failures[f"free: {type(e).__name__}"] += 1
            elif op in (TICK, STATE, SPLIT):
                try:
                    if op == TICK:  # with what the metrics read, when the master has them
                        out: Any = list(engine.tick(arg))
                        drops = engine.drops()  # the byte budgets' refusals (c4d_records_rejected)
                        out = (out, (engine.state(), engine.take_split()) if split else None, drops)
                    elif op == STATE:
                        out = engine.state()
                    else:
                        out = engine.take_split()
                    answer = (True, out, dict(failures), failed_records)
                except ShardGone:
                    raise
                except Exception as e:
                    answer = (False, f"{type(e).__name__}: {e}", dict(failures), failed_records)
                failures.clear()
                failed_records = 0
                sock.send(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
            elif op == STOP:
                break
    finally:
        sock.close(0)
        ctx.term()


class EngineProcess:
    """An ``Engine`` in a process of its own (see the module's docstring)."""

    def __init__(self, overrides: dict[str, Any] | None = None, split: bool = False, shards: int = 1) -> None:
        """``shards``: the engine's communicators over this many shards, each a process of its
        own (c4d/engine/shards.py); 1: one engine."""
        self.overrides, self.split = dict(overrides or {}), split
        self.failures: Counter[str] = Counter()  # the engine process's own, as the master heard them
        self.failed_records = 0
        self._drops: dict[str, int] = {}  # what the engine's byte budgets refused, as of its last tick
        self.local: Any = None  # the in-process engine taken up when the process died
        self._asked: deque[tuple[bytes, int]] = deque()  # the calls still to be answered, in order
        self._ready: list[Any] = []  # diagnoses of ticks answered, not handed out yet
        self._metrics: list[tuple[Any, Any]] = []  # (state, split) of ticks answered (split=True)
        self._dir = tempfile.mkdtemp(prefix="c4d-engine-")
        endpoint = f"ipc://{os.path.join(self._dir, 'engine')}"
        self._ctx = zmq.Context(1)
        self._sock = self._ctx.socket(zmq.PAIR)
        self._sock.setsockopt(zmq.LINGER, 0)
        # polls queued for the engine (each up to 1,000 messages): beyond, the master waits for it
        self._sock.setsockopt(zmq.SNDHWM, QUEUE_MESSAGES)
        self._sock.bind(endpoint)
        # a new interpreter, not a fork: the master has threads (ZeroMQ's, the metrics server's)
        level = logging.getLogger("c4d").getEffectiveLevel()
        conf = json.dumps(
            [self.overrides, split, level, max(1, int(shards))]
        )  # (the engine's overrides: numbers)
        self._proc = subprocess.Popen([sys.executable, "-m", "c4d.master.engine_process", endpoint, conf])
        try:
            self._wait(START_S)  # "ready": the engine is built
        except EngineGone:
            self._take_over("did not start")

    @property
    def pid(self) -> int | None:
        """The engine's process; None once an engine in this process took over."""
        return self._proc.pid if self.local is None else None

    # -- the Engine's calls ---------------------------------------------------------------
    def feed(self, raw: np.ndarray, recv_ns: int, cols: Columns | None = None) -> None:
        """The rows go with their node summaries read (c4d.engine.summaries: from the edge's
        columns, ``cols``): this loop waits half the time, the engine's process is the bound."""
        if self.local is not None:
            return self.local.feed(raw, recv_ns, cols)
        raw = np.ascontiguousarray(raw)
        sums = None
        t = int(recv_ns).to_bytes(8, "little", signed=True)
        try:
            if raw.dtype == schema.HEADER:  # (other rows: the engine says what is wrong with them)
                rest, sums = Summaries.apart(raw, cols)
            if sums is not None and len(sums):  # the summaries' own rows stay here
                n = len(raw).to_bytes(8, "little")
                self._send([APART + t, n, rest, *sums.frames()], copy=False)
            else:
                self._send([FEED + t, raw], copy=False)
        except (EngineGone, zmq.ZMQError) as e:
            return self._take_over(str(e)).feed(raw, recv_ns, summaries=sums)

    def free_comms(self, cids) -> int:
        if self.local is None:
            try:
                self._send([FREE, np.asarray(list(cids), np.uint64).tobytes()])
                return len(cids)
            except (EngineGone, zmq.ZMQError) as e:
                self._take_over(str(e))
        return self.local.free_comms(cids)

    def tick(self, now_ns: int) -> list[Any]:
        """Ask for a tick at ``now_ns`` without waiting for it; the diagnoses of the ticks the
        engine has answered so far (so the master's loop goes on receiving while the engine
        evaluates: it hands them out at its next tick, ``tick_s`` later at most)."""
        if self.local is not None:
            return self._local_ticks() + list(self.local.tick(now_ns))
        asked = False
        try:
            self._send([TICK + int(now_ns).to_bytes(8, "little", signed=True)])
            self._asked.append((TICK, now_ns))
            asked = True
            while self._asked and self._sock.poll(0):
                self._answer()
        except (EngineGone, zmq.ZMQError) as e:  # this tick too, if it was not asked yet
            local = self._take_over(str(e))
            return self._local_ticks() + ([] if asked else list(local.tick(now_ns)))
        out, self._ready = self._ready, []
        return out

    def drain(self) -> list[Any]:
        """Wait for every tick asked; their diagnoses (the master's last tick, its close)."""
        try:
            while self._asked:
                self._answer(block=True)
        except (EngineGone, zmq.ZMQError) as e:
            self._take_over(str(e))
            return self._local_ticks()
        out, self._ready = self._ready, []
        return out

    def state(self) -> Any:
        return self._call(STATE, "state")

    def take_split(self) -> Any:
        return self._call(SPLIT, "take_split")

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(STOP, zmq.NOBLOCK)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._sock.close(0)
        self._ctx.destroy(linger=0)  # term() waits for every socket of the context to close
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the wire -------------------------------------------------------------------------
    def _call(self, op: bytes, name: str) -> Any:
        """Ask and wait for the answer (the ticks asked before are answered first)."""
        if self.local is None:
            try:
                self._send([op])
                self._asked.append((op, 0))
                while True:
                    kind, out = self._answer(block=True)
                    if kind == op:
                        return out
            except (EngineGone, zmq.ZMQError) as e:
                self._take_over(str(e))
        return getattr(self.local, name)()

    def _answer(self, block: bool = False) -> tuple[bytes, Any]:
        """Take the next answer (in the order asked): a tick's diagnoses go to ``_ready``."""
        kind = self._asked[0][0]
        raw = self._wait(None) if block else self._sock.recv()
        self._asked.popleft()
        ok, out, failures, failed = _Answers(io.BytesIO(raw)).load()
        self.failures.update(failures)
        self.failed_records += failed
        if not ok:
            self.failures[f"{_CALLS[kind]}: {out.split(':', 1)[0]}"] += 1
            log.error("the engine's process failed a %s: %s", _CALLS[kind], out)
            out = ([], None) if kind == TICK else None
        if kind == TICK:
            diags, metrics, *rest = out
            if rest:
                self._drops = dict(rest[0])
            self._ready.extend(diags)
            if metrics is not None:
                self._metrics.append(metrics)
            return kind, diags
        return kind, out

    def drops(self) -> dict[str, int]:
        """What the engine's byte budgets refused, by reason: as of the process's last answered
        tick, or the in-process engine's once it took over."""
        return self.local.drops() if self.local is not None else dict(self._drops)

    def take_metrics(self) -> tuple[Any, Any]:
        """What the metrics read at a tick, without waiting for the engine: its latest state and
        the OP_SPLIT rows of the ticks answered since the last call (None, None: none answered).
        An engine taking over answers at once."""
        if self.local is not None:
            return self.local.state(), self.local.take_split()
        got, self._metrics = self._metrics, []
        if not got:
            return None, None
        splits = [sp for _, sp in got if sp is not None and len(sp)]
        return got[-1][0], (schema.join_records(splits) if splits else None)

    def _local_ticks(self) -> list[Any]:
        """The ticks asked of the dead process, evaluated by the engine taking over."""
        asked, self._asked = list(self._asked), deque()
        out, self._ready = self._ready, []
        for kind, now_ns in asked:
            if kind == TICK:
                out += list(self.local.tick(now_ns))
        return out

    def _send(self, frames: list[Any], copy: bool = True) -> None:
        """Send when the process lives (rows sent to a dead one would be lost unseen); wait
        while it is behind by ``SNDHWM`` messages (the master's loop slows to its pace)."""
        while True:
            if self._proc.poll() is not None:
                raise EngineGone(f"exited with code {self._proc.returncode}")
            try:
                self._sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
                return
            except zmq.Again:
                self._sock.poll(POLL_MS, zmq.POLLOUT)

    def _wait(self, limit_s: float | None) -> bytes:
        """The next answer; EngineGone when the process dies (or ``limit_s`` passes) first."""
        waited = 0.0
        while not self._sock.poll(POLL_MS):
            waited += POLL_MS / 1000
            if self._proc.poll() is not None:
                raise EngineGone(f"exited with code {self._proc.returncode}")
            if limit_s is not None and waited >= limit_s:
                raise EngineGone(f"no answer in {limit_s:g} s")
        return self._sock.recv()

    def _take_over(self, why: str) -> Any:
        from c4d.engine import make_engine

        if self.local is not None:  # (once: one ERROR line, one engine taking over)
            return self.local
        log.error(
            "the engine's process stopped (%s): the master goes on with an engine of its own, started empty",
            why,
        )
        if self._proc.poll() is None:
            self._proc.kill()
        self.local = make_engine(self.overrides, split=self.split)
        return self.local


if __name__ == "__main__":
    _serve(sys.argv[1], *json.loads(sys.argv[2]))
