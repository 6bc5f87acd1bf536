"""An engine sharded by communicator (docs/engine-shards.md): ``ShardedEngine`` answers what
``Engine`` answers, the same diagnoses, with each communicator's memory and the
per-communicator halves of the engine's steps in one of N shards (``Shard``: in this process,
or each in a process of its own, ``processes=True``), and the rest in one place, the join:
batches held and cut into the same chunks, each chunk's rank-level half (``Ingest.front``) and
its new communicators numbered, the clock, the judges, the diagnoses said.

Per chunk the join publishes the ranks' clock (``RankTable.shared``) with each shard's slice of
the chunk's rows (``route``); every shard ingests its slice with the offsets as the chunk found
them and answers with the clock refinement steps of the collectives it completed and what its
rows said of the ranks (memberships, node summaries' reports); the join applies the steps
together (``reduce.apply_steps``, in communicator order, as one engine does). Per tick each
shard answers with the wait-for graph's views of its communicators anyone waits in
(``wait_view.busy_views``) and its new mismatches, then, given the slow judge's plan, with its
communicators' rows of the windows that may be judged (``slow.take_windows``); the join judges.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import logging
import pickle
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from c4d.engine import hang
from c4d.engine.chunking import Chunker, Feeds
from c4d.engine.comm import Comm
from c4d.engine.comm_index import CommIndex, Numbering
from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.consistency import Consistency, Mismatch, pending_mismatches
from c4d.engine.emission import Emission
from c4d.engine.ingest import CommRows, Ingest
from c4d.engine.own_pace import OwnPace
from c4d.engine.p2p_pairs import P2PPairs
from c4d.engine.pool import Pool
from c4d.engine.ranks import RankTable
from c4d.engine.reduce import Step, apply_steps
from c4d.engine.rows import OP_SPLIT
from c4d.engine.slow import SlowJudge, Taken, WindowPlan, take_windows
from c4d.engine.snapshot import StatePart, engine_snapshot, state_part
from c4d.engine.stage import Stages
from c4d.engine.types import Diagnosis, EngineSnapshot
from c4d.engine.wait_view import WaitView, busy_views, join_peers
from c4d.record import schema
from c4d.util import pickles
from c4d.util.ratelog import RateLimitedLog

log = logging.getLogger("c4d.engine")


def owner(comm_id: np.ndarray, shards: int) -> np.ndarray:
    """Each communicator id's shard in [0, shards): splitmix64 of the id, so ids that come in
    sequence (a launcher's, a test's) spread as evenly as random ones; the same in every
    process and run."""
    x = np.asarray(comm_id, np.uint64).copy()
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(shards)).astype(np.int64)


class ShardGone(RuntimeError):
    """A shard's process died: the sharded engine cannot answer as one engine any more."""


@dataclass
class ChunkAnswer:
    """What a shard's slice of a chunk gave the join."""

    steps: list[Step]  # clock refinement steps, in communicator order
    joined: list[tuple[int, int, int]]  # new memberships: (rank, comm idx, comm rank)
    heard: tuple[np.ndarray, np.ndarray]  # ranks node summaries report for, and when (master ns)
    refined: np.ndarray  # nodes whose one-host communicators gave the clock a zero step
    invalid: dict[str, int] = field(default_factory=dict)  # rows dropped, by reason


def route(rows: CommRows, made: list[tuple[int, int, int]], shards: int) -> list[tuple[list, CommRows]]:
    """A chunk's rows of communicators (``Ingest.front``'s) and its new communicators
    (``Numbering.make``'s), each to the shard that owns its communicator (``owner``),
    in their order. Columns of OP rows stay behind (a shard reads its own)."""
    if shards == 1:
        return [(made, rows._replace(cols=None))]

    def cut(cid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows in shard order (stable: each shard's in their order), and where each shard's start."""
        to = owner(cid, shards)
        order = np.argsort(to, kind="stable")
        return order, np.searchsorted(to[order], np.arange(shards + 1))

    comm, hb, ops, peer = (cut(x["comm_id"]) for x in (rows.comm, rows.hb, rows.ops, rows.peer))
    sums = cut(rows.sums.cid)
    by = [schema.take_records(x, o) for x, (o, _) in zip((rows.comm, rows.hb, rows.ops, rows.peer),
                                                          (comm, hb, ops, peer), strict=True)]  # fmt: skip
    extra = rows.extra[ops[0]] if rows.extra is not None else None
    s_all, s_recv = rows.sums.take(sums[0]), rows.sums_recv[sums[0]]
    made_to = owner(np.array([m[0] for m in made], np.uint64), shards).tolist() if made else []
    parts = []
    for s in range(shards):
        (c0, c1), (h0, h1), (o0, o1), (p0, p1), (q0, q1) = (
            b[s : s + 2] for _, b in (comm, hb, ops, peer, sums)
        )
        mine = [m for m, t in zip(made, made_to, strict=True) if t == s]
        ex = extra[o0:o1] if extra is not None else None
        sl = s_all.take(slice(q0, q1))
        part = CommRows(
            by[0][c0:c1], by[1][h0:h1], by[2][o0:o1], None, ex, sl, s_recv[q0:q1], by[3][p0:p1], rows.recv, []
        )
        parts.append((mine, part))
    return parts


class Shard:
    """One shard: its communicators' memory (``Comm``s, the ``Pool``, mismatches, p2p pairs)
    and the per-communicator halves of the engine's steps. Every call takes and gives plain
    values, so it answers the same in the join's process or in its own."""

    def __init__(self, cfg: EngineConfig, split: bool = False, budget_share: float = 1.0) -> None:
        self.cfg = cfg
        self.ranks = RankTable()  # a copy: the join's clock (adopt), its own memberships
        self.ranks.joined = []
        self.comms: dict[int, Comm] = {}
        self.pool = Pool(cfg.slow_window_ops)
        self.pool.share(budget_share)
        self.pairs = P2PPairs()
        self.consistency = Consistency(lambda i: self.comms[i].grank if i in self.comms else None)
        self._invalid_now: dict[str, int] = {}
        self.stats = {"records": 0, "invalid": 0}
        self.index = CommIndex(self.comms, self.pool, self.ranks, split, self._invalid, numbers=False)
        self.ingest = Ingest(cfg, self.ranks, self.index, self.pool, self.pairs, self.consistency,
                             OwnPace(cfg), Stages(), self._invalid, self.stats)  # fmt: skip
        self.pairs.on_disagree = lambda S, R: self.consistency.p2p_disagree(S, R, self.ingest.chunk_recv)

    def _invalid(self, what: str, n: int) -> None:
        self.stats["invalid"] += n
        self._invalid_now[what] = self._invalid_now.get(what, 0) + n

    # -- per chunk ---------------------------------------------------------------------
    def chunk(
        self,
        made: list[tuple[int, int, int]],
        rows: CommRows,
        shared: dict[str, np.ndarray],
        read: list[int],
        registered: int,
    ) -> ChunkAnswer:
        """Its slice of a chunk (``route``), the join's clock as the chunk found it
        (``RankTable.shared``); ``read``: communicators whose PEER rows the slow judge read
        at the last tick (``join_peers``, before any row of theirs comes); ``registered``: the
        ranks registered by the chunk's end (``RankTable.registered``: its share of the
        budgets that grow with them, ``Pool.fit``)."""
        self.pool.fit(registered)
        join_peers(self.comms, read)
        R = self.ranks
        R.adopt(shared)
        R.last_recv[:] = 0
        R.rel_node_refined[:] = False
        self.index.adopt(made)
        self.ingest.chunk_recv = rows.recv
        steps = self.ingest.comms(rows)
        heard = np.flatnonzero(R.last_recv)
        joined, R.joined = R.joined or [], []
        invalid, self._invalid_now = self._invalid_now, {}
        return ChunkAnswer(
            steps,
            joined,
            (heard, R.last_recv[heard].copy()),
            np.flatnonzero(R.rel_node_refined),
            invalid,
        )

    def free(self, cids: list[int]) -> list[int]:
        freed = self.index.free(cids)
        if freed:
            self.consistency.forget(freed)
            self.pairs.forget(freed)
        return freed

    # -- per tick ----------------------------------------------------------------------
    def busy(
        self, now: int, period_ns: int, shared: dict[str, np.ndarray], read: list[int]
    ) -> tuple[dict[int, WaitView], list[Mismatch]]:
        """The views of its communicators anyone waits in, and the mismatches found since the
        last tick (the heartbeats of those communicators checked). ``read``: as ``chunk``'s."""
        join_peers(self.comms, read)
        self.ranks.adopt(shared)
        self.pool.sampler.period_ns = period_ns
        return busy_views(self.comms, self.pool), pending_mismatches(
            self.consistency, self.comms, self.pool, now
        )

    def take(self, plan: WindowPlan, read: list[int]) -> Taken:
        """Its rows of the windows the slow judge's ``plan`` may judge, after the wait-for
        graph's reads of PEER rows (``read``: ``join_peers``)."""
        join_peers(self.comms, read)
        return take_windows(plan, self.comms, self.pool)

    def state(self, now: int, comms_ever: int) -> StatePart:
        return state_part(self.comms, self.pool, self.ranks, now, comms_ever)

    def take_split(self) -> list[tuple[int, np.ndarray]]:
        out = []
        for i, c in self.comms.items():
            if c.split:
                out.append((i, np.concatenate(c.split)))
                c.split = []
        return out

    def drops(self) -> dict[str, int]:
        return self.pool.drops()

    def cpu(self) -> float:
        """CPU seconds of the process it runs in (analysis/bench_shards.py)."""
        return time.process_time()


@dataclass
class CommMeta:
    """What the judges read of a communicator a shard holds (``slow.CommMeta``): kept by the
    join from the numbering and the shards' member changes."""

    idx: int
    id: int
    n: int
    grank: np.ndarray


class ShardedEngine(Feeds):
    """``Engine``'s calls (feed, feed_apart, tick, state, flush, free_comms, drops,
    take_split), with communicators in ``shards`` shards."""

    def __init__(self, cfg: EngineConfig | None = None, split: bool = False, shards: int = 2,
                 processes: bool = False) -> None:  # fmt: skip
        self.cfg = cfg or EngineConfig()
        self.n_shards = max(1, int(shards))
        self.ranks = RankTable()
        self.stages = Stages()
        self._slow = SlowJudge(self.cfg)
        self._now = 0
        self._epoch = [-1]
        self._ratelog = RateLimitedLog(log)
        self.stats = {"records": 0, "invalid": 0, "batches": 0, "ticks": 0}
        self._refused = Pool(0)  # (counts the communicators refused an index)
        self._numbers = Numbering(
            lambda: self._refused.refuse(
                "communicator indices", "C4D_MAX_COMMS_EVER", 1, "new communicator(s)"
            )
        )
        self._front = Ingest(self.cfg, self.ranks, self._numbers, None, None, None, self._slow.own,  # type: ignore[arg-type]
                             self.stages, self._invalid, self.stats)  # fmt: skip
        self._chunks = Chunker()
        self._read: list[int] = []  # communicators whose PEER rows the slow judge read last
        self._out: list[Any] | None = None  # the last chunk sent, its answers not taken yet
        self._steps: list[Step] = []  # its clock steps, taken, not applied yet
        # what the judges read of every communicator (its id, size and members), kept from the
        # numbering and the shards' member changes
        self.metas: dict[int, CommMeta] = {}
        self._emission = Emission(self.cfg, self.ranks, self.stages)
        share = 1.0 / self.n_shards
        if processes:
            self._shards: list[Any] = [ShardProcess(self.cfg, split, share) for _ in range(self.n_shards)]
        else:
            self._shards = [Shard(self.cfg, split, share) for _ in range(self.n_shards)]

    def close(self) -> None:
        for s in self._shards:
            if isinstance(s, ShardProcess):
                s.close()

    # -- input -------------------------------------------------------------------------
    def thresholds(self) -> ResolvedThresholds:
        return self.cfg.resolve(self.ranks.job)

    def _flush(self, whole_chunks: bool = False) -> None:
        """Each chunk: its front here while the shards ingest the chunk before it, then that
        chunk's answers taken (``_receive``), this chunk sent with the clock as one engine
        would have it now, and the chunk before's steps applied while the shards ingest this
        one (``Ingest.chunk``: the same order of steps)."""
        for chunk in self._chunks.cut(whole_chunks):
            rows = self._front.front(chunk)
            if rows is None:
                continue
            made = self._numbers.make(rows.new)
            for cid, i, n in made:
                self.metas[i] = CommMeta(i, cid, n, np.full(n, -1, np.int64))
            self._receive()
            shared, read = self.ranks.shared(), self._read
            self._read = []
            parts = route(rows, made, self.n_shards)
            reg = self.ranks.registered
            out = self._send("chunk", [(m, r, shared, read, reg) for m, r in parts])
            self._settle(receive=False)
            self._out = out

    def _send(self, method: str, args: list[tuple]) -> list[Any]:
        """``method`` of every shard with its arguments: sent to the shards in processes of
        their own (answered later: ``_answers``), called on the others now."""
        out = []
        for s, a in zip(self._shards, args, strict=True):
            if isinstance(s, ShardProcess):
                s.send(method, a)
                out.append(_ASKED)
            else:
                out.append(getattr(s, method)(*a))
        return out

    def _answers(self, sent: list[Any]) -> list[Any]:
        return [s.answer() if a is _ASKED else a for s, a in zip(self._shards, sent, strict=True)]

    def _all(self, method: str, args: list[tuple]) -> list[Any]:
        """``method`` of every shard, answered (every shard at work at once), after the answers
        to the last chunk sent."""
        self._receive()
        return self._answers(self._send(method, args))

    def _receive(self) -> None:
        """The answers to the last chunk sent, taken: what they say of the ranks now, their
        clock steps for ``_settle``."""
        if self._out is None:
            return
        sent, self._out = self._out, None
        R = self.ranks
        steps: list[Step] = []
        for a in self._answers(sent):
            steps += a.steps
            for g, i, cr in a.joined:
                R.member_of(g, i, cr)
                m = self.metas.get(i)
                if m is not None:
                    m.grank[cr] = g
            g, t = a.heard
            if len(g):
                np.maximum.at(R.last_recv, g, t)
            if len(a.refined):
                R.mark_refined(a.refined)
            for what, n in a.invalid.items():
                self._invalid(what, n)
        # every shard's steps in communicator id order, as one engine gives its chunk's
        steps.sort(key=lambda s: s.comm)
        self._steps = steps

    def _settle(self, receive: bool = True) -> None:  # (Feeds._begin_tick: receive)
        """Apply the last chunk's clock steps (``Ingest.settle``), its answers taken first."""
        if receive:
            self._receive()
        steps, self._steps = self._steps, []
        if steps:
            apply_steps(steps, self.ranks, self.cfg.clock_gain)

    def free_comms(self, cids) -> int:
        freed = sorted(i for part in self._all("free", [(list(cids),)] * self.n_shards) for i in part)
        for cid in cids:
            self._numbers.forget(int(cid))
        for i in freed:
            m = self.metas.pop(i, None)
            if m is not None:
                self.ranks.leave(i, m.grank)
        if freed:
            self._emission.forget(freed)
            self._slow.forget(freed)
        return len(freed)

    def drops(self) -> dict[str, int]:
        out = dict(self._refused.drops())
        for d in self._all("drops", [()] * self.n_shards):
            for k, v in d.items():
                out[k] = out.get(k, 0) + v
        return out

    def shard_cpu(self) -> list[float]:
        """Each shard's process's CPU seconds (shards in this process: this process's)."""
        return self._all("cpu", [()] * self.n_shards)

    def take_split(self) -> np.ndarray:
        parts = sorted((p for ps in self._all("take_split", [()] * self.n_shards) for p in ps),
                       key=lambda p: p[0])  # fmt: skip
        return np.concatenate([p for _, p in parts]) if parts else np.empty(0, OP_SPLIT)

    # -- evaluation --------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[Diagnosis]:
        now = int(now_ns)
        self._begin_tick(now)
        th = self.thresholds()
        shared, read = self.ranks.shared(), self._read
        self._read = []
        got = self._all("busy", [(now, th.period_ns, shared, read)] * self.n_shards)
        views: dict[int, WaitView] = {}
        mms: list[Mismatch] = []
        for v, m in got:
            views.update(v)
            mms += m
        views = dict(sorted(views.items()))
        ev = hang.evaluate(self.ranks, views, th, now, self.cfg.likelihoods())
        out = self._emission.hangs(ev.findings, mms, th, now)
        plan = self._slow.plan(self.ranks, th, now, ev.oldest_wait)
        takes = self._all("take", [(plan, list(ev.peers_read))] * self.n_shards)
        for s in self._slow.judge_taken(self.ranks, self.metas, plan, takes):
            out.append(self._emission.slow(s, now))
        self._read = list(self._slow.peers_read)  # (join_peers at the shards' next call)
        return out

    def state(self) -> EngineSnapshot:
        parts = self._all("state", [(self._now, self._numbers.next_idx)] * self.n_shards)
        return engine_snapshot(
            self.ranks, parts, self._slow.slow_ranks, self._emission.active, self.thresholds(), self._now
        )


_ASKED = object()  # (a shard's answer still to come)


def serve(fd: int) -> None:
    """A shard's process (``ShardProcess``): its configuration, then calls in and answers out,
    until the join's end of the socket closes (the join's process ended, however it ended)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a terminal's ^C: the master stops its engine)
    conn = Connection(fd)
    try:
        cfg, split, share = _recv(conn)
    except (EOFError, OSError):
        return
    shard = Shard(cfg, split, share)
    while True:
        try:
            method, args = _recv(conn)
        except (EOFError, OSError):
            return
        try:
            answer = (True, getattr(shard, method)(*args))
        except Exception as e:  # handed to the join, which raises it
            answer = (False, f"{type(e).__name__}: {e}")
        try:
            _send(conn, answer)
        except OSError:  # the join's process is gone
            return


def _send(conn: Connection, obj: Any) -> None:
    """``obj`` pickled with its arrays' bytes apart (pickle protocol 5): each written as it is,
    not copied into the pickle first (a chunk's rows are megabytes)."""
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    conn.send_bytes(len(bufs).to_bytes(4, "little") + head)
    for b in bufs:
        conn.send_bytes(b.raw())


def _recv(conn: Connection) -> Any:
    msg = conn.recv_bytes()
    n = int.from_bytes(msg[:4], "little")
    bufs = [bytearray(conn.recv_bytes()) for _ in range(n)]  # (writable: the arrays are the shard's own)
    return _Messages(io.BytesIO(memoryview(msg)[4:]), buffers=bufs).load()


# the engine's modules whose types the join and its shards send each other
_TYPES = ("c4d.engine.config", "c4d.engine.consistency", "c4d.engine.ingest", "c4d.engine.reduce",
          "c4d.engine.shards", "c4d.engine.slow", "c4d.engine.snapshot", "c4d.engine.summaries",
          "c4d.engine.types", "c4d.engine.wait_view")  # fmt: skip


class _Messages(pickle.Unpickler):
    """Unpickles what the join and its shards send each other only: the engine's own data types
    (dataclasses, named tuples and enums of ``_TYPES``' modules), numpy arrays and a few
    builtins; any other global is refused, never imported (the socket pair is the processes'
    own, but nothing read from a socket runs code)."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _TYPES:
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and (
                dataclasses.is_dataclass(obj)
                or issubclass(obj, enum.Enum)
                or (issubclass(obj, tuple) and hasattr(obj, "_fields"))
                or obj.__name__ == "Summaries"
            ):
                return obj
        elif pickles.plain(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"an engine shard's message refers to {module}.{name}: refused")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("an engine shard's message uses a persistent id: refused")


class ShardProcess:
    """A ``Shard`` in a process of its own: a new interpreter (the join's process may hold
    threads; and no main module is imported again, as multiprocessing's spawn would), on one
    end of a socket pair."""

    def __init__(self, cfg: EngineConfig, split: bool, share: float) -> None:
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        code = "import sys; from c4d.engine.shards import serve; serve(int(sys.argv[1]))"
        self._proc = subprocess.Popen([sys.executable, "-c", code, str(fd)], pass_fds=(fd,))
        theirs.close()
        self._conn = Connection(mine.detach())
        _send(self._conn, (cfg, split, share))

    def _gone(self, e: BaseException) -> ShardGone:
        try:
            code = self._proc.wait(1)
        except subprocess.TimeoutExpired:
            code = None
        return ShardGone(f"an engine shard's process (pid {self._proc.pid}) died: exit code {code}")

    def send(self, method: str, args: tuple) -> None:
        try:
            _send(self._conn, (method, args))
        except OSError as e:
            raise self._gone(e) from e

    def answer(self) -> Any:
        try:
            ok, value = _recv(self._conn)
        except (EOFError, OSError) as e:
            raise self._gone(e) from e
        if not ok:
            raise RuntimeError(f"c4d engine shard failed: {value}")
        return value

    def close(self) -> None:
        self._conn.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
