"""Validation at the edge: every record is checked against the schema's domains and the job's
bounds before any state of the master sees it.

    wire.decode ─► trace (what arrived, byte for byte) ─► Edge.admit ─► Received, Engine, Metrics

The master and ``c4d analyze`` run the same ``Edge`` on the same records at the same master
times, so a replay drops exactly what the live run dropped. ``admit`` returns the rows that
pass (node and job names rewritten by ``c4d.record.names.clean``) and counts the others by reason;
the reasons are the ``REASONS`` below (Prometheus label values, log classes).

What is checked (vectorised with numpy over a batch; a Python loop runs only per communicator
of a batch, never per record):

* every record: a kind a rank may send (never TICK), a schema version this master reads, a rank in
  ``[0, world)`` where ``world`` is the job's registered world size (the largest
  ``world_size`` of the REGISTER records so far, or the highest registered rank + 1 where a
  launcher gave none; at most ``Limits.max_ranks``). Before any rank has registered, nothing
  but a REGISTER is taken: the shim sends REGISTER first and repeats it every 10 heartbeats.
* times: 0 (unknown) or within ``[t - max_record_age_s - max_clock_skew_s, t +
  max_clock_skew_s]`` of the master time ``t`` the batch is fed at: no negative (≥ 2⁶³) or
  far-future time reaches the clock alignment.
* per kind, every field with a domain: op, dtype, flags, comm event, direction (schema.py's
  enums), ``1 <= comm_nranks <= world``, ``0 <= comm_rank < comm_nranks``, peers and roots,
  seq and counts below 2⁵³, REGISTER thresholds in the ranges the shim itself accepts. The
  reduction operator has no invalid value: NCCL numbers user-defined PreMulSum operators from
  ``ncclNumOps`` upwards (nccl.h: ``ncclMaxRedOp``), and the shim keeps the low byte. A node
  agent's OPPART record passes only when both OP records it unpacks into would (the master's
  engine sees those, never the part: c4d/record/oppart.py, c4d.intake.ingest).
* bounds (state): a new communicator is admitted while the communicators' members add up to
  at most ``min(world × comms_per_rank, max_comm_members)`` and their tables to
  ``max_comm_bytes`` (unset: floors that grow with the ranks registered, never with a claimed
  world size: ``Limits.comm_members``, ``comm_bytes``); when they would not, the least
  recently named ones that no record named for ``evict_silent_s`` make room (a live
  communicator is named by every heartbeat: a one-shot flood of forged ones is gone seconds
  later, and the job's own come in with their next heartbeat); later records must repeat its
  size; PEER records only attach to an admitted one. Distinct node names are capped at ``2 × world + 64``.
  ``expire`` frees communicators that every member destroyed (after ``destroyed_grace_s``,
  so their last slow window is judged) or that no record named for ``comm_idle_s``; the
  master then frees them in the engine and the bookkeeping. Records of a destroyed
  communicator that arrive after it was freed are dropped.

Decisions depend only on the rows in order and the feed times, never on how rows are cut
into batches (the world size is a running maximum over rows; communicators are admitted in
order of first appearance), so a replay that feeds the trace in other slices agrees.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
from collections import Counter, OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from c4d.engine.comm import Comm
from c4d.record import names, oppart, schema
from c4d.record.columns import Columns
from c4d.record.schema import Kind, Op, OpFlag
from c4d.util.ratelog import RateLimitedLog
from c4d.util.sorted_lookup import find_sorted

log = logging.getLogger("c4d.intake.validate")

REASONS: tuple[str, ...] = (
    "ok",
    "bad kind",
    "bad version",
    "no registration yet",
    "bad rank",
    "bad time",
    "bad registration",
    "too many node names",
    "bad op",
    "bad dtype",
    "bad flags",
    "bad comm id",
    "bad comm size",
    "bad comm rank",
    "bad peer",
    "bad seq",
    "bad count",
    "bad result",
    "bad device",
    "bad heartbeat",
    "bad comm event",
    "bad peer record",
    "bad stage",
    "bad summary",
    "bad compute",
    "unknown communicator",
    "communicator size changed",
    "communicator budget",
    "destroyed communicator",
    "job settings changed",
    "rank identity changed",
    "communicator bytes",
    "bad part",
)
_CODE = {r: i for i, r in enumerate(REASONS)}
# what an operator can do when the job's own communicators meet a budget (the log line says it)
_HINT = {
    "communicator budget": " (the job's own? set C4D_MAX_COMM_MEMBERS or C4D_COMMS_PER_RANK higher)",
    "communicator bytes": " (the job's own? set C4D_MAX_COMM_BYTES higher)",
}

MAX_SEQ = 1 << 53  # seq numbers and op counters: exact in float64, 285 years at 1 MHz
MAX_COUNT = 1 << 50  # elements or bytes of one op
MAX_DEVICE = 4096
# a kind this share of a batch or more is checked on every row where it lies rather than on a
# gather of its rows: a check is cheap per contiguous element, a gather of a kind's columns is
# not (node agents' batches are mostly summaries with about a third OP rows)
IN_PLACE_SHARE = 0.25
_TOUCHED_BATCHES = 64  # batches' namings kept apart before they are folded into one (_fold_touched)
MAX_RESULT = 64  # ncclResult_t: 9 values today (nccl_abi.h), room for new ones
NO_OP = 255  # heartbeat pend_op: none
# TICK is the master's own
WIRE_KINDS = (
    Kind.REGISTER, Kind.OP, Kind.HEARTBEAT, Kind.COMM, Kind.PEER, Kind.STAGE, Kind.OPSUM, Kind.OPPART
)  # fmt: skip
_GONE = (int(schema.CommEvent.FINALIZE), int(schema.CommEvent.DESTROY), int(schema.CommEvent.ABORT))
_P2P = int(OpFlag.P2P)
_COMPUTE_GIVEN = int(OpFlag.COMPUTE_GIVEN)
_ALL_FLAGS = sum(int(f) for f in OpFlag)
_TOMBSTONES = 65536  # destroyed communicators remembered after they were freed
_WIRE = np.array([int(k) for k in WIRE_KINDS], np.uint16)
_REGISTER, _OP, _COMM, _PEER = int(Kind.REGISTER), int(Kind.OP), int(Kind.COMM), int(Kind.PEER)
_HEARTBEAT = int(Kind.HEARTBEAT)
# a job's thresholds, set once by its first REGISTER (the engine reads them: EngineConfig.resolve)
_SETTINGS = ("hang_timeout_us", "hang_times", "bw_check_period_s", "heartbeat_ms")
_WITH_COMM = np.array([_OP, int(Kind.HEARTBEAT), _COMM, _PEER, int(Kind.OPSUM), int(Kind.OPPART)], np.uint16)
_COLLECTIVES = [int(o) for o in Op if o not in (Op.Send, Op.Recv)]


def _table(members, field: str, dt: np.dtype) -> np.ndarray:
    """A lookup table over every value of an unsigned field: ``t[values]`` is whether each is one
    of ``members`` (np.isin sorts or hashes the field for every chunk)."""
    t = np.zeros(1 << (8 * dt[field].itemsize), bool)
    t[[int(m) for m in members]] = True
    return t


_IS_WIRE, _IS_WITH_COMM = _table(_WIRE, "kind", schema.HEADER), _table(_WITH_COMM, "kind", schema.HEADER)
_IS_COLLECTIVE = _table(_COLLECTIVES, "op", schema.OPSUM)
_IS_P2P_OP = _table([Op.Send, Op.Recv], "op", schema.OP)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one job may make the master hold (``C4D_<FIELD>`` in the master's environment)."""

    max_ranks: int = 1 << 17
    """C4D_MAX_RANKS: the largest world size accepted (registered world sizes above it are refused)."""
    comms_per_rank: int = 64
    """C4D_COMMS_PER_RANK: live communicators' members may add up to world size x this."""
    max_comm_members: int | None = None
    """C4D_MAX_COMM_MEMBERS: and to at most this many, whatever world size is registered (a
    forged REGISTER can claim C4D_MAX_RANKS; their op rings, ~26 KiB a member, are held to
    C4D_MAX_RING_BYTES by the engine). Unset: ``comm_members`` of the ranks registered."""
    max_clock_skew_s: float = 3600.0
    """C4D_MAX_CLOCK_SKEW_S: a rank's clock may be this far from the master's."""
    max_record_age_s: float = 7 * 86400.0
    """C4D_MAX_RECORD_AGE_S: how old a time in a record may be (an op issued long before it ended)."""
    comm_idle_s: float = 900.0
    """C4D_COMM_IDLE_S: a communicator no record named for this long is freed (a live one
    is named by every heartbeat, a hung one too; keep it above T x C4D_HANG_TIMES)."""
    destroyed_grace_s: float = 30.0
    """C4D_DESTROYED_GRACE_S: a communicator every member destroyed is freed this long after its
    last record (its last slow-detection window is judged first)."""
    max_comm_bytes: int | None = None
    """C4D_MAX_COMM_BYTES: and the tables the master keeps for them (before any op ring: the
    engine's Comm.table_bytes, ~37 KiB for a communicator of one member, +800 bytes a member) to at
    most this many bytes. Unset: ``comm_bytes`` of the ranks registered."""
    evict_silent_s: float = 5.0
    """C4D_EVICT_SILENT_S: when the budget is full, the communicators no record named for this
    long (least recently named first) make room for a new one. A live communicator is named by
    every heartbeat (C4D_HEARTBEAT_MS, 1 s), so only dead or one-shot (forged) ones go."""

    ranks_may_move: bool = False
    """C4D_RANKS_MAY_MOVE=1 (c4d master --ranks-may-move): the job's launcher may restart a rank
    on another node; otherwise a new incarnation of a rank must register on its first node."""

    # The communicator budgets' defaults: a floor that grows with the ranks registered (each
    # counted once: a REGISTER's claimed world size adds nothing), so a job's own state fits
    # however large it is, and what a sender can make the master hold is bounded by the ranks
    # it can register (C4D_MAX_RANKS). Both figures are the old fixed defaults' at 16,384 ranks.
    # Members: 16 communicators a rank (TP 8, PP 4 and DP put a rank in 3).
    COMM_MEMBERS_FLOOR, COMM_MEMBERS_PER_RANK = 1 << 18, 16
    # Bytes: a rank's share of its communicators' tables is 36 KiB / n + 800 bytes for each one
    # of n members it is in: 16 KiB for TP 8, PP 4 and DP (a 16,384-rank job's 6,176 take 255
    # MiB; 65,536 ranks' ~1 GiB, past the 512 MiB floor); 32 KiB leaves twice that. A job of
    # smaller groups needs more (TP 2 and PP 2: ~39 KiB a rank): set C4D_MAX_COMM_BYTES for it.
    COMM_BYTES_FLOOR, COMM_BYTES_PER_RANK = 512 << 20, 32 << 10

    def comm_members(self, registered: int) -> int:
        """What live communicators' members may add up to with ``registered`` ranks registered."""
        if self.max_comm_members is not None:
            return self.max_comm_members
        return max(self.COMM_MEMBERS_FLOOR, self.COMM_MEMBERS_PER_RANK * registered)

    def comm_bytes(self, registered: int) -> int:
        """What their tables may hold with ``registered`` ranks registered (Comm.table_bytes)."""
        if self.max_comm_bytes is not None:
            return self.max_comm_bytes
        return max(self.COMM_BYTES_FLOOR, self.COMM_BYTES_PER_RANK * registered)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Limits:
        """Read C4D_<FIELD> values; a malformed one logs a line and keeps the default."""
        env = dict(os.environ if env is None else env)
        lim = cls()
        changes: dict[str, Any] = {}
        move = env.get("C4D_RANKS_MAY_MOVE", "").strip().lower()
        if move:
            if move not in ("0", "1", "true", "false", "yes", "no"):
                log.warning("c4d: C4D_RANKS_MAY_MOVE=%r is not 0 or 1; using 0", env["C4D_RANKS_MAY_MOVE"])
            changes["ranks_may_move"] = move in ("1", "true", "yes")
        for f in fields(cls):
            var = "C4D_" + f.name.upper()
            if var not in env or f.name == "ranks_may_move":
                continue
            default = getattr(lim, f.name)
            kind = float if isinstance(default, float) else int
            try:
                v = kind(env[var])
                if not v > 0:
                    raise ValueError
            except ValueError:
                if default is None:  # (a budget that grows with the job: comm_members, comm_bytes)
                    default = "the default, more as ranks register"
                log.warning("c4d: %s=%r is not a positive number; using %s", var, env[var], default)
                continue
            changes[f.name] = v
        return replace(lim, **changes)


@dataclass
class _Comm:
    n: int
    last_ns: int  # master time of the latest record that named it
    gone: np.ndarray  # per comm rank: its latest COMM event was finalize/destroy/abort


class Edge:
    """The validator and admission control of one job. Called from the master thread only."""

    def __init__(
        self, limits: Limits | None = None, logger: logging.Logger | None = None, who: str = "c4d"
    ) -> None:
        self.limits = limits or Limits()
        self.who = who  # what its log lines say they come from (the master's edge or an agent's)
        self.world = 0
        self.node_names: set[str] = set()
        self._comms: OrderedDict[int, _Comm] = OrderedDict()  # least recently named first (``comms``)
        # communicators named since the order above was last brought up to date: (master times,
        # ids in order of naming) per batch, folded every _TOUCHED_BATCHES batches into one
        # (each id's latest naming) and applied when the order is read
        self._touched: list[tuple[np.ndarray, np.ndarray]] = []
        self._known: tuple[np.ndarray, np.ndarray] | None = None  # sorted ids and sizes of _comms
        self.slots = 0  # members of the admitted communicators, summed
        self.comm_bytes = 0  # what the master's tables hold for them (Comm.table_bytes), summed
        self._evicted: dict[int, None] = {}  # made room for others; freed at the next expire()
        self._ended: dict[int, None] = {}  # communicators a member of which finalized, destroyed or aborted
        self.tombstones: OrderedDict[int, None] = OrderedDict()
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.ratelog = RateLimitedLog(logger or log)
        self._last: tuple[np.ndarray, Columns] | None = None  # the latest batch admitted whole
        # the job's settings, set by its first REGISTER: thresholds, and the world size it claims
        self.settings: np.ndarray | None = None
        self.claim = 0
        # per rank, its incarnation: the first registration's pid and node (pid -1: none yet),
        # whether it said FINAL or was declared lost, and the master time it was last heard at
        self._pid = np.full(0, -1, np.int64)
        self._node = np.zeros(0, schema.REGISTER["node"])
        self._gone = np.zeros(0, bool)
        self._heard = np.zeros(0, np.int64)
        # ranks registered (each counted once, at its first registration): what the
        # communicator budgets grow with (Limits.comm_members, comm_bytes); the rows of the
        # batch being admitted where a rank registered first, in order (``_registered_at``)
        self.registered = 0
        self._fresh: list[int] = []
        self._registered_before = 0

    # -- the batch ----------------------------------------------------------------------
    def admit(self, raw: np.ndarray, recv_ns: int) -> np.ndarray:
        """The rows of ``raw`` (HEADER rows, in arrival order) that may reach the master's state."""
        n = len(raw)
        self._last = None
        if not n:
            return raw
        code = np.zeros(n, np.uint8)
        cols = Columns.of(raw)  # every field below read from contiguous columns, not the 128-byte rows
        kind = cols["kind"]
        lo, hi = self._window(recv_ns)
        _flag(code, ~_IS_WIRE[kind], "bad kind")
        ver = cols["version"]
        _flag(code, (ver < 1) | (ver > schema.SCHEMA_VERSION), "bad version")
        # a heartbeat of schema 1 still in its own layout (inside a current batch: wire.decode
        # upgrades older batches only) would be read in the current one
        _flag(code, (ver < 2) & (kind == _HEARTBEAT), "bad version")
        _flag(code, ~_time_ok(cols["time_ns"], lo, hi), "bad time")

        reg = np.flatnonzero((code == 0) & (kind == _REGISTER))
        world_row = self._world_rows(raw, code, reg)
        rank = cols["rank"].astype(np.int64)
        _flag(code, world_row == 0, "no registration yet")
        _flag(code, (rank < 0) | (rank >= world_row), "bad rank")

        live = np.where(code == 0, kind, np.uint16(0))  # no kind is 0
        present = np.bincount(live, minlength=1 << 16)
        for k, dt, check in _CHECKS:
            if not present[k]:
                continue
            idx = np.flatnonzero(live == k)
            if len(idx) >= IN_PLACE_SHARE * n:
                # every row checked as this kind where it lies (the others' verdicts, read from
                # bytes of another layout, are dropped), no gather
                code[idx] = check(cols.as_kind(dt), world_row, lo, hi)[idx]
            else:
                code[idx] = check(cols.take(idx).as_kind(dt), world_row[idx], lo, hi)
        self._fresh, self._registered_before = [], self.registered
        self._identities(raw, cols, code, int(recv_ns))
        self._admit_comms(raw, cols, code, world_row, int(recv_ns))

        keep = code == 0
        counts = np.bincount(code, minlength=len(REASONS))
        self.accepted += int(counts[0])
        for c in np.flatnonzero(counts[1:]).tolist():
            reason, k = REASONS[c + 1], int(counts[c + 1])
            self.rejected[reason] += k
            hint = _HINT.get(reason, "")
            self.ratelog(reason, "%s: dropped %d record(s): %s%s", self.who, k, reason, hint, n=k)
        if keep.all() and not _renames(raw, np.flatnonzero(kind == _REGISTER)):
            self._last = (raw, cols)
            return raw  # nothing to drop or rewrite (a job's REGISTER names are clean): no copy
        # a copy: names are rewritten in place
        out = schema.take_records(raw, keep) if not keep.all() else raw.copy()
        self._sanitize(out)
        return out

    def expire(self, now_ns: int) -> list[int]:
        """Communicator ids to free at master time ``now_ns`` (forgotten here already)."""
        lim = self.limits
        idle = now_ns - int(lim.comm_idle_s * 1e9)
        grace = now_ns - int(lim.destroyed_grace_s * 1e9)
        out = []
        # the namings not applied yet only make a time later (``_apply_touched``): a communicator
        # that is not due by the times last applied is not due, and the order (least recently
        # named first) is read, and so brought up to date, only when one may be
        comms = self._comms
        self._ended = {cid: None for cid in self._ended if cid in comms}

        def ended_due() -> bool:
            return any(comms[cid].gone.all() and comms[cid].last_ns < grace for cid in self._ended)

        head = next(iter(comms.values()), None)
        if ended_due() or (head is not None and head.last_ns < idle):
            if self._touched:
                self._apply_touched()  # the times and the order exact
            if ended_due():
                for cid, c in comms.items():
                    destroyed = bool(c.gone.all())
                    if c.last_ns < idle or (destroyed and c.last_ns < grace):
                        out.append(cid)
                        if destroyed:
                            self.tombstones[cid] = None
            else:
                # none destroyed: the idle ones lead (least recently named first, master time
                # only grows), so the scan stops at the first that is not (not a scan of every
                # communicator at every tick)
                for cid, c in comms.items():
                    if c.last_ns >= idle:
                        break
                    out.append(cid)
        if out:
            self._known = None
        for cid in out:
            gone = self.comms.pop(cid)
            self.slots -= gone.n
            self.comm_bytes -= Comm.table_bytes(gone.n)
            self._ended.pop(cid, None)
        out += list(self._evicted)  # forgotten here already
        self._evicted = {}
        while len(self.tombstones) > _TOMBSTONES:
            self.tombstones.popitem(last=False)
        return out

    def columns_of(self, rows: np.ndarray) -> Columns | None:
        """The columns the latest ``admit`` read, when it returned ``rows`` (its batch, whole):
        what the master's other readers of the batch can read instead of the rows."""
        last = self._last
        return last[1] if last is not None and last[0] is rows else None

    @property
    def comms(self) -> OrderedDict[int, _Comm]:
        """The admitted communicators, least recently named first (every batch's naming applied)."""
        if self._touched:
            self._apply_touched()
        return self._comms

    def _fold_touched(self) -> None:
        """The batches' namings as one: each communicator's latest (batch, then first appearance
        in it), in naming order. At most one entry per communicator admitted, so the order is
        brought up to date (a Python step per communicator) only when it is read: when one may
        be due to expire, or to make room, not every few batches (24,608 communicators named
        again and again at 65,536 ranks)."""
        t = self._touched
        when = np.concatenate([w for w, _ in t])
        ids = np.concatenate([i for _, i in t])
        _, last = np.unique(ids[::-1], return_index=True)
        last = np.sort(len(ids) - 1 - last)  # each id's latest naming, in naming order
        self._touched = [(when[last], ids[last])]

    def _apply_touched(self) -> None:
        """Move the communicators named since the last call to the end, by their latest naming:
        the order and times one move per communicator per batch gives, in one move per
        communicator (a large job's batch names thousands)."""
        self._fold_touched()
        ((when, ids),) = self._touched
        self._touched = []
        comms = self._comms
        for c_id, r in zip(ids.tolist(), when.tolist(), strict=True):
            c = comms[c_id]
            c.last_ns = max(c.last_ns, r)
            comms.move_to_end(c_id)

    def _ids(self) -> tuple[np.ndarray, np.ndarray]:
        """The admitted communicators' ids (sorted) and sizes, made again after a change."""
        if self._known is None:
            ids = np.fromiter(self._comms.keys(), np.uint64, len(self._comms))
            n = np.fromiter((c.n for c in self._comms.values()), np.int64, len(self._comms))
            o = np.argsort(ids)
            self._known = (ids[o], n[o])
        return self._known

    @property
    def dropped(self) -> int:
        return sum(self.rejected.values())

    # -- pieces -------------------------------------------------------------------------
    def _window(self, recv_ns: int) -> tuple[int, int]:
        if recv_ns <= 0:  # no master time known: only the domain of the type
            return 1, (1 << 63) - 1
        lim = self.limits
        lo = int(recv_ns) - int((lim.max_clock_skew_s + lim.max_record_age_s) * 1e9)
        hi = int(recv_ns) + int(lim.max_clock_skew_s * 1e9)
        return max(lo, 1), min(hi, (1 << 63) - 1)

    def _world_rows(self, raw: np.ndarray, code: np.ndarray, reg: np.ndarray) -> np.ndarray:
        """Per row: the job's world size once the rows before it (and it) were seen."""
        lim = self.limits
        contrib = np.zeros(len(raw), np.int64)
        if len(reg):
            r = raw[reg].view(schema.REGISTER)
            bad = _register_bad(r, lim.max_ranks)
            code[reg[bad]] = _CODE["bad registration"]
            good = reg[~bad]
            r = r[~bad]
            keep = self._job_settings(r, code, good)
            good, r = good[keep], r[keep]
            ws = r["world_size"].astype(np.int64)
            contrib[good] = np.where(ws > 0, ws, r["rank"].astype(np.int64) + 1)
            contrib[good] = np.minimum(contrib[good], lim.max_ranks)
        world = np.maximum.accumulate(np.maximum(contrib, self.world))
        if len(reg):
            self._cap_node_names(raw, code, reg, world)
        self.world = int(world[-1])
        return world

    def _job_settings(self, r: np.ndarray, code: np.ndarray, at: np.ndarray) -> np.ndarray:
        """REGISTER rows (``r``, at rows ``at``) that agree with the job's settings, set by its
        first REGISTER: the thresholds, and the world size it claimed (a later one claiming
        another is refused, and once claimed, a rank at or above it is not the job's)."""
        if not len(r):
            return np.ones(0, bool)
        sett = np.stack([r[f].astype(np.int64) for f in _SETTINGS], axis=1)
        if self.settings is None:
            self.settings = sett[0].copy()
        ok = (sett == self.settings).all(axis=1)
        ws = r["world_size"].astype(np.int64)
        if not self.claim:
            first = np.flatnonzero(ok & (ws > 0))
            if len(first):
                self.claim = int(ws[first[0]])
                since = np.arange(len(r)) >= first[0]
            else:
                since = np.zeros(len(r), bool)
        else:
            since = np.ones(len(r), bool)
        ok &= ~(since & (ws > 0) & (ws != self.claim))
        code[at[~ok]] = _CODE["job settings changed"]
        beyond = ok & since & (ws <= 0) & (r["rank"].astype(np.int64) >= self.claim)
        code[at[beyond]] = _CODE["bad rank"]
        return ok & ~beyond

    def _identities(self, raw: np.ndarray, cols: Columns, code: np.ndarray, recv_ns: int) -> None:
        """A rank is its first registration: a REGISTER naming another pid or node is refused,
        unless it is a new incarnation: a new pid, after the old one said FINAL, was declared
        lost (``lost``) or was silent for three heartbeat periods, on the same node (any node
        with ``Limits.ranks_may_move``). Events in row order, so a FINAL then a REGISTER in one
        batch count as in two."""
        kind = cols["kind"]
        live = code == 0
        rank = cols["rank"].astype(np.int64)
        if live.any():
            self._grow(int(rank[live].max()) + 1)
        reg = np.flatnonzero(live & (kind == _REGISTER))
        hb = np.flatnonzero(live & (kind == _HEARTBEAT))
        fin = hb[(cols.as_kind(schema.HEARTBEAT)["hb_flags"][hb] & schema.HBF_FINAL) != 0] if len(hb) else hb
        if len(reg):
            r = raw[reg].view(schema.REGISTER)
            g = rank[reg]
            same = (self._pid[g] == r["pid"]) & (self._node[g] == r["node"])
            reg = reg[~same]
        if len(reg) or len(fin):
            self._incarnations(raw, rank, live, reg, fin, code, recv_ns)
        heard = rank[code == 0]
        if len(heard):
            self._heard[heard] = recv_ns

    def _incarnations(self, raw, rank, live, reg, fin, code, recv_ns: int) -> None:
        """The REGISTER rows ``reg`` that differ from what their rank registered and the FINAL
        heartbeats ``fin``, in row order (few: a job's restarts, or forgeries)."""
        # whether a row's rank was heard earlier in this batch (at this master time)
        idx = np.flatnonzero(live)
        o = idx[np.argsort(rank[idx], kind="stable")]
        before = np.zeros(len(rank), bool)
        before[o[1:]] = rank[o[1:]] == rank[o[:-1]]
        hb_ms = int(self.settings[3]) if self.settings is not None else 1000
        silent_ns = 3 * hb_ms * 1_000_000
        regs = set(reg.tolist())
        v = raw.view(schema.REGISTER)
        for i in sorted(regs | set(fin.tolist())):
            g = int(rank[i])
            if i not in regs:
                self._gone[g] |= self._pid[g] >= 0  # FINAL: this incarnation exited
                continue
            pid, node = int(v["pid"][i]), v["node"][i]
            if self._pid[g] < 0:
                self._fresh.append(i)
                self.registered += 1
            if self._pid[g] < 0 or (pid == self._pid[g] and node == self._node[g]):
                self._pid[g], self._node[g], self._gone[g] = pid, node, False  # its first registration
                continue
            silent = not before[i] and recv_ns - int(self._heard[g]) >= silent_ns
            gone = bool(self._gone[g]) or silent
            moved = node != self._node[g]
            if pid != self._pid[g] and gone and (not moved or self.limits.ranks_may_move):
                self._pid[g], self._node[g], self._gone[g] = pid, node, False  # a new incarnation
                continue
            code[i] = _CODE["rank identity changed"]

    def _registered_at(self, row: int) -> int:
        """The ranks registered once the rows of the batch up to ``row`` were seen (the
        decisions do not depend on how rows are cut into batches)."""
        return self._registered_before + bisect.bisect_right(self._fresh, row)  # (a list: no array made)

    def lost(self, ranks) -> None:
        """Ranks the engine declared lost (RankLost): a new incarnation of each may register."""
        for g in ranks:
            if 0 <= int(g) < len(self._gone):
                self._gone[int(g)] = self._pid[int(g)] >= 0

    def _grow(self, n: int) -> None:
        have = len(self._pid)
        if n <= have:
            return
        size = max(n, 2 * have, 64)
        self._pid = np.concatenate([self._pid, np.full(size - have, -1, np.int64)])
        self._node = np.concatenate([self._node, np.zeros(size - have, self._node.dtype)])
        self._gone = np.concatenate([self._gone, np.zeros(size - have, bool)])
        self._heard = np.concatenate([self._heard, np.zeros(size - have, np.int64)])

    def _cap_node_names(self, raw: np.ndarray, code: np.ndarray, reg: np.ndarray, world: np.ndarray) -> None:
        reg = reg[code[reg] == 0]
        if not len(reg):
            return
        nodes = raw[reg].view(schema.REGISTER)["node"]
        uniq, first, inv = np.unique(nodes, return_index=True, return_inverse=True)
        for j in np.argsort(first, kind="stable").tolist():
            name = names.clean(bytes(uniq[j]))
            if name in self.node_names:
                continue
            if len(self.node_names) >= 2 * int(world[reg[first[j]]]) + 64:
                code[reg[inv.ravel() == j]] = _CODE["too many node names"]
                continue
            self.node_names.add(name)

    def _admit_comms(
        self, raw: np.ndarray, cols: Columns, code: np.ndarray, world_row: np.ndarray, recv_ns: int
    ) -> None:
        cand, cid, k, cr, nr = _comm_rows(cols, code)
        if not len(cand):
            return
        peer_row, is_comm = k == _PEER, k == _COMM
        # the peer of PEER records, the event of COMM records (-1, 0 elsewhere): few of them
        pr = np.full(len(cand), -1, np.int64)
        if peer_row.any():
            pr[peer_row] = raw.view(schema.PEER)["peer"][cand[peer_row]]
        ev = np.zeros(len(cand), np.int64)
        if is_comm.any():
            ev[is_comm] = raw.view(schema.COMM)["event"][cand[is_comm]]
        uniq, first, inv = schema.unique_runs(cid)
        if self._admit_known(uniq, first, inv, cand, code, recv_ns, peer_row, nr, cr, pr, is_comm, ev):
            return
        order = np.argsort(inv, kind="stable")
        cuts = np.flatnonzero(np.diff(inv[order])) + 1
        groups = np.split(order, cuts)
        lim = self.limits
        for j in np.argsort(first, kind="stable").tolist():
            rows = groups[j]  # positions in cand, in arrival order
            c_id = int(uniq[j])
            if c_id in self.tombstones:
                code[cand[rows]] = _CODE["destroyed communicator"]
                continue
            c = self.comms.get(c_id)
            if c is None:
                sized = rows[~peer_row[rows]]
                if not len(sized):
                    code[cand[rows]] = _CODE["unknown communicator"]
                    continue
                n0, at = int(nr[sized[0]]), int(cand[sized[0]])
                reg = self._registered_at(at)
                budget = min(int(world_row[at]) * lim.comms_per_rank, lim.comm_members(reg))
                room = self._room(n0, budget, lim.comm_bytes(reg), recv_ns)
                if room:
                    code[cand[rows]] = _CODE[room]
                    continue
                c = self.comms[c_id] = _Comm(n=n0, last_ns=recv_ns, gone=np.zeros(n0, bool))
                self._known = None
                self._evicted.pop(c_id, None)  # back before the engine forgot it: keep it there
                self.slots += n0
                self.comm_bytes += Comm.table_bytes(n0)
            changed = ~peer_row[rows] & (nr[rows] != c.n)
            code[cand[rows[changed]]] = _CODE["communicator size changed"]
            out_of = peer_row[rows] & ((cr[rows] >= c.n) | (pr[rows] >= c.n))
            code[cand[rows[out_of]]] = _CODE["bad peer record"]
            ok = rows[~changed & ~out_of]
            if not len(ok):
                continue
            c.last_ns = max(c.last_ns, recv_ns)
            self.comms.move_to_end(c_id)
            for i in ok[is_comm[ok]].tolist():  # lifecycle records: few, in arrival order
                c.gone[cr[i]] = int(ev[i]) in _GONE
                if c.gone[cr[i]]:
                    self._ended[c_id] = None

    def _admit_known(self, uniq, first, inv, cand, code, recv_ns, peer_row, nr, cr, pr, is_comm, ev) -> bool:
        """Every communicator of the chunk known and not destroyed (the steady state): its
        records checked at once. False (nothing done) when one is new or destroyed: the
        per-communicator path creates them in order of appearance (one may evict another)."""
        ids, sizes = self._ids()  # (a destroyed communicator is no longer among them)
        if not len(ids):
            return False
        at, hit = find_sorted(ids, uniq)
        if not hit.all():
            return False
        n_of = sizes[at][inv]
        changed = ~peer_row & (nr != n_of)
        out_of = peer_row & ((cr >= n_of) | (pr >= n_of))
        code[cand[changed]] = _CODE["communicator size changed"]
        code[cand[out_of]] = _CODE["bad peer record"]
        ok = ~changed & ~out_of
        used = np.zeros(len(uniq), bool)
        used[inv[ok]] = True
        named = np.flatnonzero(used)[np.argsort(first[used], kind="stable")]
        if len(named):
            self._touched.append((np.full(len(named), recv_ns, np.int64), uniq[named]))
            if len(self._touched) >= _TOUCHED_BATCHES:
                self._fold_touched()
        comms = self._comms
        for i in np.flatnonzero(ok & is_comm).tolist():  # lifecycle records: few, in arrival order
            c_id = int(uniq[inv[i]])
            comms[c_id].gone[cr[i]] = int(ev[i]) in _GONE
            if int(ev[i]) in _GONE:
                self._ended[c_id] = None
        return True

    def _room(self, n: int, budget: int, most: int, recv_ns: int) -> str:
        """Whether a communicator of ``n`` members fits ``budget`` members and ``most`` bytes of
        tables, evicting communicators silent for ``evict_silent_s``: "" if so, else the reason
        it does not (members, or bytes)."""
        silent = recv_ns - int(self.limits.evict_silent_s * 1e9)
        cost = Comm.table_bytes(n)

        def over() -> str:
            if self.slots + n > budget:
                return "communicator budget"
            return "communicator bytes" if self.comm_bytes + cost > most else ""

        while over() and self.comms:
            cid, c = next(iter(self.comms.items()))
            if c.last_ns > silent:
                break
            del self.comms[cid]
            self._known = None
            self.slots -= c.n
            self.comm_bytes -= Comm.table_bytes(c.n)
            self._evicted[cid] = None
        return over()

    def _sanitize(self, out: np.ndarray) -> None:
        """Node and job names of the REGISTER rows become ``names.clean`` of themselves."""
        reg = np.flatnonzero(out["kind"] == Kind.REGISTER)
        if not len(reg):
            return
        v = out.view(schema.REGISTER)
        for field in _NAMES:
            col = v[field][reg]
            uniq, inv = np.unique(col, return_inverse=True)
            clean = np.array([_clean(bytes(u), field) for u in uniq], dtype=col.dtype)
            v[field][reg] = clean[inv.ravel()]


_NAMES = ("node", "job")  # the REGISTER fields the edge rewrites (names.clean)


@functools.lru_cache(maxsize=4096)  # a job's few names, cleaned once (a flood of others only misses)
def _clean(name: bytes, field: str) -> bytes:
    return names.clean(name).encode()[: schema.REGISTER[field].itemsize]


def _renames(raw: np.ndarray, reg: np.ndarray) -> bool:
    """Whether ``_sanitize`` would rewrite a name of the REGISTER rows ``reg`` of ``raw``: a
    job's own names are clean already, so its REGISTER records need no copy of their batch."""
    if not len(reg):
        return False
    v = raw[reg].view(schema.REGISTER)
    return any(_clean(bytes(u), field) != bytes(u) for field in _NAMES for u in np.unique(v[field]))


# -- domain checks, one function per kind: rows in, reason code per row out ---------------
def _comm_rows(cols: Columns, code: np.ndarray) -> tuple[np.ndarray, ...]:
    """The rows that name a communicator and have no reason yet (process heartbeats, comm id 0,
    name none): their index, comm id, kind, comm rank and comm size (-1 for PEER records, which
    carry none). The fields sit at other offsets per kind."""
    kind = cols["kind"]
    cid_all = cols.as_kind(schema.OP)["comm_id"]  # comm_id is the first body field of all four kinds
    cand = np.flatnonzero((code == 0) & _IS_WITH_COMM[kind] & (cid_all != 0))
    k = kind[cand]
    nr = np.full(len(cand), -1, np.int64)
    cr = np.empty(len(cand), np.int64)
    for kk, dt, _check in _CHECKS:
        m = k == kk
        if m.all():  # (a batch of one kind)
            v = cols.as_kind(dt)
            cr[:] = v["comm_rank"][cand]
            if kk != _PEER:
                nr[:] = v["comm_nranks"][cand]
            break
        if m.any():
            v, rows = cols.as_kind(dt), cand[m]
            cr[m] = v["comm_rank"][rows]
            if kk != _PEER:
                nr[m] = v["comm_nranks"][rows]
    return cand, cid_all[cand], k, cr, nr


def _flag(code: np.ndarray, bad: np.ndarray, reason: str) -> None:
    """Give ``reason`` to the rows that are ``bad`` and have no reason yet (the first one wins)."""
    code[bad & (code == 0)] = _CODE[reason]


def _rows_all(ok: np.ndarray) -> np.ndarray:
    """``ok.all(axis=1)`` for rows of 8 flags: one word each (a reduction along short rows is slow)."""
    if ok.shape[1] == 8 and ok.flags.c_contiguous:
        return np.equal(ok.view(np.uint64).ravel(), np.uint64(0x0101010101010101))
    return np.asarray(ok.all(axis=1))


def _time_ok(t: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """0 (not known) or within [lo, hi]: one unsigned subtraction wraps what is below lo past hi,
    and 0 to 2**64 - lo (the field, strided through whole records, is read once)."""
    u = t - np.uint64(lo)
    ok = u <= np.uint64(hi - lo)
    ok |= u == np.uint64(-lo % (1 << 64))
    return ok


def _register_bad(r: np.ndarray, max_ranks: int) -> np.ndarray:
    ws = r["world_size"].astype(np.int64)
    rank = r["rank"].astype(np.int64)
    ok = (ws >= -1) & (ws <= max_ranks) & (rank >= 0) & (rank < max_ranks) & ((ws <= 0) | (rank < ws))
    ok &= (r["hang_timeout_us"] >= 1) & (r["hang_timeout_us"] <= np.uint64(1 << 50))
    ok &= (r["hang_times"] >= 1) & (r["hang_times"] <= 1_000_000)
    ok &= (r["bw_check_period_s"] >= 1) & (r["bw_check_period_s"] <= 86400)
    ok &= (r["heartbeat_ms"] >= 1) & (r["heartbeat_ms"] <= 86_400_000)
    ok &= (r["log_level"] < len(schema.LOG_LEVELS)) & (r["stats_output"] <= 1) & (r["device_timing"] <= 1)
    ok &= (
        (r["pid"] >= 0) & (r["local_rank"] >= -1) & (r["cuda_device"] >= -1) & (r["cuda_device"] < MAX_DEVICE)
    )
    return ~ok


def _comm_fields(code: np.ndarray, a: Columns, world: np.ndarray) -> None:
    nr = a["comm_nranks"].astype(np.int64)
    _flag(code, a["comm_id"] == 0, "bad comm id")
    _flag(code, (nr < 1) | (nr > world), "bad comm size")
    _flag(code, (a["comm_rank"] < 0) | (a["comm_rank"] >= nr), "bad comm rank")


def _check_op(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    code = np.zeros(len(a), np.uint8)
    op = a["op"]
    _flag(code, op >= len(Op), "bad op")
    dt = a["dtype"]  # unknown (255): what importers write where the source does not log it
    _flag(code, (dt >= len(schema.DTYPE_NAMES)) & (dt != schema.DType.unknown), "bad dtype")
    flags = a["flags"].astype(np.int64)
    p2p = (flags & _P2P) != 0
    _flag(code, ((flags & ~_ALL_FLAGS) != 0) | (p2p != _IS_P2P_OP[op]), "bad flags")
    _comm_fields(code, a, world)
    nr = a["comm_nranks"].astype(np.int64)
    peer = a["peer"].astype(np.int64)
    in_comm = (peer >= 0) & (peer < nr)
    _flag(code, np.where(p2p, ~in_comm, ~(in_comm | (peer == -1))), "bad peer")
    _flag(code, a["seq"] >= MAX_SEQ, "bad seq")
    _flag(code, (a["count"] > MAX_COUNT) | (a["bytes"] > MAX_COUNT), "bad count")
    _flag(code, (a["result"] < 0) | (a["result"] >= MAX_RESULT), "bad result")
    _flag(code, (a["device"] < -1) | (a["device"] >= MAX_DEVICE), "bad device")
    t_ok = np.ones(len(a), bool)
    for f in ("issue_ns", "start_ns", "end_ns", "return_ns"):
        t_ok &= _time_ok(a[f], lo, hi)
    _flag(code, ~t_ok, "bad time")
    # 0 from a shim; a node agent's running compute sum (COMPUTE_GIVEN) is at most the job's age
    cmp = a["compute_ns"]
    given = (flags & _COMPUTE_GIVEN) != 0
    _flag(code, np.where(given, (cmp < 0) | (cmp > hi - lo), cmp != 0), "bad compute")
    return code


def _check_heartbeat(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    code = np.zeros(len(a), np.uint8)
    proc = a["comm_id"] == 0  # the process: comm_rank = rank, comm_nranks = world size (-1 unknown)
    comm = np.zeros(len(a), np.uint8)
    _comm_fields(comm, a, world)
    code[~proc] = comm[~proc]
    nr = np.where(proc, world, a["comm_nranks"].astype(np.int64))
    pp = a["pend_peer"].astype(np.int64)
    bad = (a["hb_flags"] & ~np.uint16(schema.HBF_FINAL)) != 0
    bad |= (a["pend_op"] >= len(Op)) & (a["pend_op"] != NO_OP)
    bad |= (pp < -1) | (pp >= nr)
    bad |= (a["pend_seq"] >= MAX_SEQ) & (a["pend_seq"] != schema.UINT64_MAX)
    for f in ("n_issued", "n_arrived", "n_done", "dropped", "sent"):
        bad |= a[f] >= MAX_SEQ
    bad |= (a["pend_flags"].astype(np.int64) & ~_ALL_FLAGS) != 0
    pdt = a["pend_dtype"]  # version 2: the pending op's dtype (255 none or unknown) and count
    bad |= (pdt >= len(schema.DTYPE_NAMES)) & (pdt != schema.DType.unknown)
    bad |= a["pend_count"] > MAX_COUNT
    _flag(code, bad, "bad heartbeat")
    _flag(code, (a["device"] < -1) | (a["device"] >= MAX_DEVICE), "bad device")
    t_ok = np.ones(len(a), bool)
    for f in ("last_arrive_ns", "last_done_ns", "pend_issue_ns", "pend_start_ns"):
        t_ok &= _time_ok(a[f], lo, hi)
    _flag(code, ~t_ok, "bad time")
    return code


def _check_comm(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    code = np.zeros(len(a), np.uint8)
    _comm_fields(code, a, world)
    ev = a["event"]
    _flag(code, (ev < min(schema.CommEvent)) | (ev > max(schema.CommEvent)), "bad comm event")
    _flag(code, (a["result"] < 0) | (a["result"] >= MAX_RESULT), "bad result")
    _flag(code, (a["device"] < -1) | (a["device"] >= MAX_DEVICE), "bad device")
    return code


def _check_peer(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    code = np.zeros(len(a), np.uint8)
    _flag(code, a["comm_id"] == 0, "bad comm id")
    bad = (a["comm_rank"] < 0) | (a["comm_rank"] >= world) | (a["peer"] < 0) | (a["peer"] >= world)
    bad |= (a["direction"] > 1) | (a["done"] > 1) | (a["op"] >= len(Op)) | (a["seq"] >= MAX_SEQ)
    bad |= (a["bytes_done"] > MAX_COUNT) | (a["wire_ns"] > MAX_COUNT)
    _flag(code, bad, "bad peer record")
    _flag(code, ~(_time_ok(a["first_ns"], lo, hi) & _time_ok(a["last_ns"], lo, hi)), "bad time")
    return code


def _check_stage(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """c4d.hang_timeout: -1 disables, 0 ends the stage, else a timeout in µs; generations count up."""
    code = np.zeros(len(a), np.uint8)
    us = a["hang_timeout_us"]
    _flag(code, (us < -1) | (us > MAX_COUNT) | (a["generation"] >= MAX_SEQ), "bad stage")
    return code


def _check_opsum(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """A node agent's summary of one node-local collective (c4d/agent): as untrusted as a rank's
    records. Its members are at most OPSUM_MAX_MEMBERS; durations are bounded like record ages;
    the unused compute slots are NaN."""
    code = np.zeros(len(a), np.uint8)
    _comm_fields(code, a, world)
    nr = a["comm_nranks"].astype(np.int64)
    _flag(code, nr > schema.OPSUM_MAX_MEMBERS, "bad comm size")
    _flag(code, ~_IS_COLLECTIVE[a["op"]], "bad op")
    _flag(code, a["seq"] >= MAX_SEQ, "bad seq")
    _flag(code, a["bytes"] > MAX_COUNT, "bad count")
    span = hi - lo
    bad = (a["flags"] & ~np.uint8(schema.OPSF_ENDS_KNOWN)) != 0
    bad |= a["sample_shift"] > schema.OPSUM_MAX_SHIFT
    bad |= np.abs(a["transfer_ns"]) > span
    for f in ("margin_ns", "wait_med_ns", "wait_max_ns"):
        bad |= (a[f] < 0) | (a[f] > span)
    bad |= a["wait_med_ns"] > a["wait_max_ns"]
    g = a["compute_ns"]
    used = np.arange(schema.OPSUM_MAX_MEMBERS)[None, :] < nr[:, None]
    # a used slot: NaN (unknown) or within [0, span] (an infinity is neither); an unused: NaN
    ok = np.isnan(g) | (used & (g >= 0) & (g <= span))
    bad |= ~_rows_all(ok)
    _flag(code, bad, "bad summary")
    _flag(code, ~_time_ok(a["last_arrive_ns"], lo, hi), "bad time")
    return code


def _check_oppart(a: Columns, world: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """A node agent's two members' OP records of one collective (c4d/record/oppart.py): admitted
    only when both OP records it unpacks into pass the OP record's checks, name two members of
    the communicator, and are what the agent packs (a collective outside any group, with a known
    datatype): the engine never sees the part itself."""
    rows = a.rows()
    code = np.zeros(len(a), np.uint8)
    for m in range(schema.OPPART_MEMBERS):
        got = _check_op(Columns.of(oppart.members(rows, m)), world, lo, hi)
        code = np.where(code != 0, code, got)
    r1 = a["rank1"].astype(np.int64)
    _flag(code, (r1 < 0) | (r1 >= world), "bad rank")
    bad = (r1 == a["rank"]) | (a["comm_rank1"] == a["comm_rank"])
    bad |= (a["flags"] & np.uint8(int(OpFlag.IN_GROUP))) != 0
    bad |= a["dtype"] >= len(schema.DTYPE_SIZE)
    _flag(code, bad | ~_IS_COLLECTIVE[a["op"]], "bad part")
    return code


_CHECKS = (
    (int(Kind.OP), schema.OP, _check_op),
    (int(Kind.HEARTBEAT), schema.HEARTBEAT, _check_heartbeat),
    (int(Kind.COMM), schema.COMM, _check_comm),
    (int(Kind.PEER), schema.PEER, _check_peer),
    (int(Kind.STAGE), schema.STAGE, _check_stage),
    (int(Kind.OPSUM), schema.OPSUM, _check_opsum),
    (int(Kind.OPPART), schema.OPPART, _check_oppart),
)
