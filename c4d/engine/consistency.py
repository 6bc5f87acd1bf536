"""Live consistency: the members of one collective must call it alike.

NCCL checks nothing across ranks: members of a collective (C, k) that call it with a different
op, element count, dtype, root or reduction op hang, or complete with wrong data
(docs/real-nccl.md, section 8). c4d receives every member's OP record of every op, so it
compares them as they arrive, at no cost to the job:

* **Records.** Each chunk's collective rows, already sorted by (communicator, seq, comm rank)
  for the engine (ingest_ops.OpIngest._collectives), are compared op by op with numpy (a min and a max of
  two signature columns per op). An op whose members all sent their rows within the chunk
  and agree leaves nothing behind (the common case); the others are kept in a small sorted
  table keyed by (communicator, seq) holding the first row's signature and how many rows came,
  until every member's row is in. From the first disagreement on, an op's rows are kept
  whole, and the members whose rows came before it are known to have matched the first.
  The verdict is given when the last member's row arrives.
* **Heartbeats.** An op that hangs is never recorded (the OP record is sent once its end is
  known); each member's heartbeat still says which op it is pending in: its op, root or peer,
  element count, dtype and reduction op (``pend_*``; count, dtype and reduction op since
  schema version 2). When every member of a communicator someone waits in is pending at the
  same seq and they disagree, that is the same verdict, from heartbeats, within a heartbeat
  of the last member's arrival: a count or a dtype of another size is what makes NCCL hang
  on every member (docs/real-nccl.md, section 8). The master evaluates when the heartbeat
  that completes the evidence comes, not at its next tick (``PendingWatch``). A member whose
  heartbeat does not know its pending op's dtype (an older shim, an import) leaves only op
  and root compared.
* **Point to point.** A send and its receive (the k-th send from a to b on a communicator
  and b's k-th receive from a: p2p seqs count per communicator, direction and peer) must
  pass the same count and dtype (NCCL's ncclSend/ncclRecv contract). Their OP records are
  paired where the engine pairs them already (p2p_pairs.P2PPairs, records with an end time: the
  others are not compared), which hands over the pairs that differ (``p2p_disagree``), and
  the pending ops of the heartbeats of two members that wait in a send and its receive are
  paired here. A pair that disagrees is a verdict with both
  ranks as suspects: two sides have no majority.

The signature compared: op; count; dtype; the reduction op for reducing ops (NCCL's five
built-in ops by number, any user-created op as "custom": their handles are per communicator);
the root for rooted ops. A verdict names the minority (the members outside the unique largest
group of equal signatures; every member when there is no unique largest), what differs and
each side's values. It is a CollectiveMismatch at WARNING at once, never isolating; a stall of
the communicator that begins within T of it is counted on as the same incident
(Engine.tick).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from c4d.engine.calibration import PRIOR_CAP, localize
from c4d.engine.pool import Pool, budget_from_env
from c4d.engine.types import DiagKind, How, Localization, Target
from c4d.record import schema
from c4d.record.schema import DTYPE_NAMES, DType, Op, OpFlag, op_name
from c4d.util.sorted_lookup import find_sorted

ROOTED = np.zeros(256, bool)
ROOTED[[Op.Broadcast, Op.Reduce, Op.Gather, Op.Scatter]] = True
REDUCING = np.zeros(256, bool)
REDUCING[[Op.AllReduce, Op.Reduce, Op.ReduceScatter]] = True
N_BUILTIN_REDOPS = 5  # ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg; user ops are numbered from here
CUSTOM_REDOP = 254
NO_REDOP = 255
REDOP_NAMES = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg", CUSTOM_REDOP: "custom"}
KEY_SHIFT = 40  # key = communicator index << 40 | seq
KEEP_OPEN_NS = 120_000_000_000  # an op some member never reported is forgotten after this
# open ops held at most (~49 bytes each), the oldest forgotten first: C4D_MAX_OPEN_OPS
MAX_OPEN_OPS = 1 << 22
# rows of disagreeing ops kept for their verdicts (40 bytes each), the oldest ops' first
MAX_BAD_ROWS = 1 << 20
MAX_REPORTED = 16  # verdicts remembered per communicator (for the stall that follows one)
FIELDS = ("op", "count", "dtype", "redop", "root")
_OPEN = ("key", "n", "seen", "first", "count", "sig", "bad")  # the open ops' columns (Consistency)
_P2P = int(OpFlag.P2P)


_OP_ROOT = ~np.uint64(0xFFFF00)  # a signature's op and root (what a heartbeat without a dtype says)


def pending_kinds(op: np.ndarray, dtype: np.ndarray, redop: np.ndarray) -> np.ndarray:
    """A heartbeat's pending op as ``signature`` takes it: op | dtype << 8 | redop << 16."""
    return (
        op.astype(np.int64) | (dtype.astype(np.int64) << 8) | ((redop.astype(np.int64) & 0xFF) << 16)
    ).astype(np.uint64)


def signature(kinds: np.ndarray, peer: np.ndarray) -> np.ndarray:
    """What the members must agree on besides the count, one uint64 per row: op | dtype << 8 |
    redop << 16 | (root + 1) << 24, the redop only for reducing ops (a user op as CUSTOM_REDOP),
    the root only for rooted ops. ``kinds``: op | dtype << 8 | redop << 16 (OpCols.kinds)."""
    k = kinds.astype(np.uint64)
    op = (k & np.uint64(0xFF)).astype(np.int64)
    red = ((k >> np.uint64(16)) & np.uint64(0xFF)).astype(np.int64)
    red = np.where(REDUCING[op], np.where(red < N_BUILTIN_REDOPS, red, CUSTOM_REDOP), NO_REDOP)
    root = np.where(ROOTED[op], peer.astype(np.int64) + 1, 0)
    base = k & np.uint64(0xFFFF)
    return (
        base
        | (red.astype(np.uint64) << np.uint64(16))
        | (np.maximum(root, 0).astype(np.uint64) << np.uint64(24))
    )


def _unpack(sig: int, count: int | None) -> dict[str, Any]:
    op = sig & 0xFF
    dt = (sig >> 8) & 0xFF
    red = (sig >> 16) & 0xFF
    root = (sig >> 24) - 1
    return {
        "op": op_name(op),
        "count": count,
        "dtype": DType(dt).name if dt in DType._value2member_map_ else f"dtype{dt}",
        "redop": REDOP_NAMES.get(red, f"redop{red}") if red != NO_REDOP else None,
        "root": int(root) if ROOTED[op] else None,
    }


@dataclass(frozen=True)
class Mismatch:
    """One collective whose members disagree: each member's signature (count None: unknown,
    from heartbeats)."""

    comm: int  # the engine's communicator index
    seq: int
    cranks: tuple[int, ...]  # comm ranks
    granks: tuple[int, ...]  # their global ranks
    sigs: tuple[int, ...]
    counts: tuple[int | None, ...]
    source: str  # "records" or "heartbeats"
    found_ns: int  # master time of the verdict
    sides: list[dict[str, Any]] = field(default_factory=list, compare=False)
    culprits: tuple[int, ...] = ()  # global ranks (the minority; all members on a tie)
    what: tuple[str, ...] = ()
    majority: bool = True
    op: int = 0  # the largest side's op code

    p2p: bool = False  # a send and its receive (sides: the sender first)
    # the communicator's id, set as the verdict is handed over (pending_mismatches): where
    # verdicts are said, the communicators may not be (None: freed before that)
    comm_id: int | None = field(default=None, compare=False)

    @classmethod
    def make(cls, comm: int, seq: int, cranks, granks, sigs, counts, source: str, now: int) -> Mismatch:
        o = np.argsort(np.asarray(cranks), kind="stable")
        cr = tuple(int(cranks[i]) for i in o)
        gr = tuple(int(granks[i]) for i in o)
        sg = tuple(int(sigs[i]) for i in o)
        ct = tuple(None if counts[i] is None else int(counts[i]) for i in o)
        groups: dict[tuple[int, int | None], list[int]] = {}
        for g, s, c in zip(gr, sg, ct, strict=True):
            groups.setdefault((s, c), []).append(g)
        ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        unique_top = len(ranked) == 1 or len(ranked[0][1]) > len(ranked[1][1])
        culprits = sorted(g for _, gs in ranked[1:] for g in gs) if unique_top else sorted(gr)
        sides = [{"ranks": gs, **_unpack(s, c)} for (s, c), gs in ranked]
        what = tuple(f for f in FIELDS if len({str(sd[f]) for sd in sides}) > 1)
        if "op" in what:  # a root or a reduction op is only compared between calls of one op
            what = tuple(f for f in what if f not in ("redop", "root"))
        op = ranked[0][0][0] & 0xFF
        return cls(comm, seq, cr, gr, sg, ct, source, now, sides, tuple(culprits), what, unique_top, op)

    @classmethod
    def pair(cls, comm: int, seq: int, src: tuple[int, int], dst: tuple[int, int], sig_s: int, sig_r: int,
             count_s: int, count_r: int, source: str, now: int) -> Mismatch:  # fmt: skip
        """A send (comm rank, global rank ``src``) and its receive (``dst``) that disagree."""
        sides = [
            {"ranks": [src[1]], **_unpack(sig_s, count_s), "peer": dst[1]},
            {"ranks": [dst[1]], **_unpack(sig_r, count_r), "peer": src[1]},
        ]
        for sd in sides:
            sd.pop("redop", None)
            sd.pop("root", None)
        what = tuple(f for f in ("count", "dtype") if str(sides[0][f]) != str(sides[1][f]))
        cr, gr = (src[0], dst[0]), (src[1], dst[1])
        return cls(comm, seq, cr, gr, (sig_s, sig_r), (count_s, count_r), source, now, sides,
                   tuple(sorted(gr)), what, False, int(Op.Send), True)  # fmt: skip

    def localization(self) -> Localization:
        words = ", ".join(self.what) or "signature"
        if self.p2p:
            a, b = self.granks
            ev = (f"rank {a}'s send #{self.seq} to rank {b} and rank {b}'s receive of it differ in {words} "
                  f"({self.source})")  # fmt: skip
            return localize(DiagKind.CollectiveMismatch, How.match, Target.suspects, self.culprits, ev, 0.3,
                            self.source)  # fmt: skip
        if self.majority:
            ev = (
                f"ranks {_short(self.culprits)} called {self.sides[-1]['op']} #{self.seq} with a different "
                f"{words} than the other {len(self.sides[0]['ranks'])} member(s) ({self.source})"
            )
        else:
            ev = f"the members of #{self.seq} called it with different {words}, no majority ({self.source})"
        target = Target.minority if self.majority else Target.suspects
        prior = PRIOR_CAP if self.majority else 0.3
        return localize(DiagKind.CollectiveMismatch, How.match, target, self.culprits, ev, prior, self.source)

    def detail(self) -> dict[str, Any]:
        d = {"differs": list(self.what), "sides": self.sides, "evidence": self.source}
        d["majority"] = self.majority
        if self.p2p:
            d["p2p"] = True
        return d


def _short(ranks) -> str:
    rs = list(ranks)
    return ",".join(map(str, rs[:8])) + (f" (+{len(rs) - 8})" if len(rs) > 8 else "")


class Consistency:
    """Every communicator's open ops' signatures (see module doc) and the verdicts found."""

    def __init__(self, granks: Callable[[int], np.ndarray | None] = lambda i: None) -> None:
        """``granks(i)``: communicator index i's global ranks by comm rank (None: unknown)."""
        self._granks = granks
        self.max_open = budget_from_env("C4D_MAX_OPEN_OPS", MAX_OPEN_OPS)
        e64, eu = np.empty(0, np.int64), np.empty(0, np.uint64)
        # open ops, sorted by key: members, first row's count and signature, rows seen, any
        # disagreement, master time first seen
        self.key, self.n, self.seen, self.first = e64, e64.copy(), e64.copy(), e64.copy()
        self.count, self.sig = eu, eu.copy()
        self.bad = np.empty(0, bool)
        # rows of ops found bad, kept whole from then on: key, comm rank, global rank, count, sig
        self.rows: list[np.ndarray] = []
        self.new: list[Mismatch] = []  # verdicts not yet handed to the engine
        self._named: set[tuple[int, ...]] = set()  # (comm, seq) or (comm, src, dst, seq) named
        self._checked: dict[int, int] = {}  # communicator index -> its version at the last check_pending
        self.stats: Counter[str] = Counter()

    # -- records -------------------------------------------------------------------------
    def feed_sorted(
        self,
        comm: np.ndarray,
        seq: np.ndarray,
        cr: np.ndarray,
        g: np.ndarray,
        count: np.ndarray,
        kinds: np.ndarray,
        peer: np.ndarray,
        heads: np.ndarray,
        n: np.ndarray,
        now: int,
    ) -> None:
        """A chunk's collective rows sorted by (communicator index, seq, comm rank): ``heads``
        each op's first row, ``n`` each op's communicator size; ``kinds`` and ``peer`` as in
        ``signature``, which is computed only for the rows that need it: rows alike in their
        raw fields are alike in it."""
        m = len(seq)
        if not m:
            return
        size = np.diff(np.r_[heads, m])
        raw = kinds | ((peer + 1).astype(np.uint64) << np.uint64(24))
        agree = (np.minimum.reduceat(count, heads) == np.maximum.reduceat(count, heads)) & (
            np.minimum.reduceat(raw, heads) == np.maximum.reduceat(raw, heads)
        )
        sig = raw
        if not agree.all():  # raw fields apart: alike once normalised (a root the op has not)?
            rows = np.repeat(~agree, size)
            sig = raw.copy()
            sig[rows] = signature(kinds[rows], peer[rows])
            d = np.flatnonzero(~agree)
            agree[d] = (np.minimum.reduceat(count, heads) == np.maximum.reduceat(count, heads))[d] & (
                np.minimum.reduceat(sig, heads) == np.maximum.reduceat(sig, heads)
            )[d]
        key = (comm[heads].astype(np.int64) << KEY_SHIFT) | seq[heads].astype(np.int64)
        pos, found = find_sorted(self.key, key)
        plain = agree & ~found & (size >= n)
        if plain.all():  # every op whole and alike: nothing to keep
            return
        self.stats["ops kept"] += int((~plain).sum())
        kept = np.flatnonzero(~plain)
        hsig = np.zeros(len(heads), np.uint64)  # the kept ops' first rows, normalised
        hsig[kept] = signature(kinds[heads[kept]], peer[heads[kept]])
        bad_op = ~agree
        f = np.flatnonzero(found)
        if len(f):
            p = pos[f]
            now_bad = self.bad[p] | ~agree[f] | (self.count[p] != count[heads[f]]) | (self.sig[p] != hsig[f])
            self.bad[p] = now_bad
            self.seen[p] += size[f]
            bad_op[f] = now_bad
        nf = np.flatnonzero(~found & ~(agree & (size >= n)))
        if len(nf):  # new open ops
            keys = np.concatenate([self.key, key[nf]])
            o = np.argsort(keys, kind="stable")
            self.key = keys[o]
            self.n = np.concatenate([self.n, n[nf].astype(np.int64)])[o]
            self.seen = np.concatenate([self.seen, size[nf]])[o]
            self.first = np.concatenate([self.first, np.full(len(nf), now, np.int64)])[o]
            self.count = np.concatenate([self.count, count[heads[nf]]])[o]
            self.sig = np.concatenate([self.sig, hsig[nf]])[o]
            self.bad = np.concatenate([self.bad, ~agree[nf]])[o]
        if bad_op.any():  # their rows, kept whole
            rb = np.repeat(bad_op, size)
            ks = np.repeat(key, size)[rb]
            sb = signature(kinds[rb], peer[rb]).view(np.int64)
            self.rows.append(np.stack([ks, cr[rb], g[rb], count[rb].view(np.int64), sb], 1))
        self._settle(now)
        self._bound()

    def _bound(self) -> None:
        """What a sender makes it hold stays within its budgets: past ``max_open`` open ops the
        oldest are forgotten (as ``expire`` forgets them), past MAX_BAD_ROWS the oldest rows of
        disagreeing ops (counted)."""
        over = len(self.key) - self.max_open
        if over > 0:
            old = np.zeros(len(self.key), bool)
            old[np.argsort(self.first, kind="stable")[:over]] = True
            self.stats["open ops forgotten"] += over
            self._drop_open(old)
        if self.rows and sum(len(r) for r in self.rows) > MAX_BAD_ROWS:
            rows = np.concatenate(self.rows)
            self.stats["disagreeing rows forgotten"] += len(rows) - MAX_BAD_ROWS
            self.rows = [rows[-MAX_BAD_ROWS:]]

    def _drop_open(self, old: np.ndarray) -> None:
        keys = set(self.key[old & self.bad].tolist())
        if keys and self.rows:
            rows = np.concatenate(self.rows)
            keep = ~np.isin(rows[:, 0], list(keys))
            self.rows = [rows[keep]] if keep.any() else []
        self._keep_open(~old)

    def _keep_open(self, keep: np.ndarray) -> None:
        """Only the open ops ``keep`` says, in every column."""
        for a in _OPEN:
            setattr(self, a, getattr(self, a)[keep])

    def _settle(self, now: int) -> None:
        """Open ops every member reported: a verdict where they disagree, forgotten either way."""
        done = self.seen >= self.n
        if not done.any():
            return
        for i in np.flatnonzero(done & self.bad).tolist():
            self._verdict(int(self.key[i]), int(self.n[i]), int(self.count[i]), int(self.sig[i]), now)
        self._keep_open(~done)

    def _verdict(self, key: int, n: int, count0: int, sig0: int, now: int) -> None:
        rows = np.concatenate(self.rows) if self.rows else np.empty((0, 5), np.int64)
        mine = rows[:, 0] == key
        self.rows = [rows[~mine]] if (~mine).any() else []
        r = rows[mine]
        _, first = np.unique(r[:, 1], return_index=True)  # one row per comm rank (a repeat ignored)
        r = r[first]
        comm, seq = key >> KEY_SHIFT, key & ((1 << KEY_SHIFT) - 1)
        if not self._name((comm, seq)):
            return  # named already, from the members' heartbeats while it was pending
        cranks, granks = r[:, 1].tolist(), r[:, 2].tolist()
        sigs = r[:, 4].view(np.uint64).tolist()
        counts: list[int | None] = r[:, 3].view(np.uint64).tolist()
        # the members whose rows came before the first disagreement matched the first row
        earlier = [c for c in range(n) if c not in set(cranks)]
        g_of = self._granks(comm)
        for c in earlier:
            cranks.append(c)
            granks.append(int(g_of[c]) if g_of is not None and c < len(g_of) else -1)
            sigs.append(sig0)
            counts.append(count0)
        self._add(Mismatch.make(comm, seq, cranks, granks, sigs, counts, "records", now))

    def _add(self, mm: Mismatch) -> None:
        self.stats["mismatches"] += 1
        self.new.append(mm)

    def _name(self, key: tuple[int, ...]) -> bool:
        """True the first time ``key`` (an op) gets a verdict: one verdict an op, from records
        or heartbeats, whichever comes first."""
        if key in self._named:
            self.stats["named again"] += 1
            return False
        self._named.add(key)
        if len(self._named) > 8192:
            self._named = set(sorted(self._named)[-4096:])
        return True

    # -- point to point ------------------------------------------------------------------
    def p2p_disagree(self, S: np.ndarray, R: np.ndarray, now: int) -> None:
        """Sends (``S``) and their receives (``R``), paired by p2p_pairs.P2PPairs (P2P_HALF rows:
        ``sig`` = count << 8 | dtype), whose count or dtype differ: a verdict each, once."""
        nored = NO_REDOP << 16
        for comm, src, dst, seq, gs, gr, ss, sr in zip(
            *(
                a.tolist()
                for a in (S["comm"], S["src"], S["dst"], S["seq"], S["g"], R["g"], S["sig"], R["sig"])
            ),
            strict=True,
        ):
            if not self._name((comm, src, dst, seq)):
                continue
            sig_s, sig_r = int(Op.Send) | (ss & 0xFF) << 8 | nored, int(Op.Recv) | (sr & 0xFF) << 8 | nored
            self._add(
                Mismatch.pair(comm, seq, (src, gs), (dst, gr), sig_s, sig_r, ss >> 8, sr >> 8, "records", now)
            )

    # -- heartbeats ----------------------------------------------------------------------
    def check_pending(self, c: Any, now: int) -> None:
        """Communicator ``c`` (comm.Comm) has a member waiting: do its members' heartbeats name
        the same pending collective and disagree on it, or a send and its receive that
        disagree on count or dtype?"""
        v = getattr(c, "version", None)  # bumped by every heartbeat and membership change
        if v is not None:
            if self._checked.get(c.idx) == v:
                return  # nothing it reads changed since the last look
            self._checked[c.idx] = v
        p2p = (c.pend_flags & _P2P) != 0
        if p2p.any():  # (no collective check then: one member is in a p2p op)
            cnt, dt = c.pend_count[p2p], c.pend_dtype[p2p]
            if len(cnt) > 1 and not ((cnt == cnt[0]).all() and (dt == dt[0]).all()):  # else all alike
                self._pending_pairs(c, p2p & c.hb_seen & ~c.gone & (c.grank >= 0), now)
            return
        ps = c.pend_seq
        if ps[0] < 0 or (ps != ps[0]).any():
            return
        # alike in every raw field: alike (the common case, a few comparisons)
        if all((a == a[0]).all() for a in (c.pend_count, c.pend_op, c.pend_peer, c.pend_dtype, c.pend_redop)):
            return
        if not (c.hb_seen & ~c.gone & (c.grank >= 0)).all():
            return
        op = c.pend_op.astype(np.int64)
        if (op >= len(Op)).any():
            return
        k = (c.idx, int(ps[0]))
        if k in self._named:
            return
        dt = c.pend_dtype.astype(np.int64)
        known = bool((dt < len(DTYPE_NAMES)).all())  # count, dtype and redop said (schema 2)
        if known:
            s = signature(pending_kinds(op, dt, c.pend_redop), c.pend_peer)
            cnt = c.pend_count.astype(np.uint64)
            if (s == s[0]).all() and (cnt == cnt[0]).all():
                return
            sigs, counts = s.tolist(), cnt.tolist()
        else:
            s = signature(op.astype(np.uint64), c.pend_peer)
            op_root = s & _OP_ROOT
            if (op_root == op_root[0]).all():
                return
            unknown = np.uint64(int(DType.unknown) << 8) | np.uint64(NO_REDOP << 16)
            sigs, counts = (op_root | unknown).tolist(), [None] * c.n
        self._name(k)
        cranks, granks = list(range(c.n)), c.grank.tolist()
        self._add(Mismatch.make(c.idx, k[1], cranks, granks, sigs, counts, "heartbeats", now))

    def _pending_pairs(self, c: Any, m: np.ndarray, now: int) -> None:
        """Members pending in a send and its receive (rows ``m``) that disagree on count or dtype."""
        op = c.pend_op.astype(np.int64)
        peer = c.pend_peer.astype(np.int64)
        dt = c.pend_dtype.astype(np.int64)
        m = m & (c.pend_seq >= 0) & ((op == Op.Send) | (op == Op.Recv)) & (dt < len(DTYPE_NAMES))
        m &= (peer >= 0) & (peer < c.n)
        idx = np.flatnonzero(m)
        if len(idx) < 2:
            return
        recv = op[idx] == Op.Recv
        src, dst = np.where(recv, peer[idx], idx), np.where(recv, idx, peer[idx])
        key, seq = src * c.n + dst, c.pend_seq[idx]
        o = np.lexsort((recv, seq, key))
        key, seq, recv, idx = key[o], seq[o], recv[o], idx[o]
        i = np.flatnonzero((key[1:] == key[:-1]) & (seq[1:] == seq[:-1]) & ~recv[:-1] & recv[1:])
        cnt = c.pend_count
        for j in i.tolist():
            a, b = int(idx[j]), int(idx[j + 1])
            if cnt[a] == cnt[b] and dt[a] == dt[b]:
                continue
            if not self._name((c.idx, a, b, int(seq[j]))):
                continue
            kinds = (op[[a, b]] | (dt[[a, b]] << 8)).astype(np.uint64)
            sig = signature(kinds, np.full(2, -1, np.int64))
            snd, rcv = (a, int(c.grank[a])), (b, int(c.grank[b]))
            sg, n_s, n_r = sig.tolist(), int(cnt[a]), int(cnt[b])
            self._add(Mismatch.pair(c.idx, int(seq[j]), snd, rcv, sg[0], sg[1], n_s, n_r, "heartbeats", now))

    def take_new(self) -> list[Mismatch]:
        out, self.new = self.new, []
        return out

    def expire(self, now: int) -> None:
        """Forget open ops some member never reported (dropped records, a lost rank)."""
        old = self.first < now - KEEP_OPEN_NS
        if old.any():
            self._drop_open(old)

    def forget(self, comms) -> None:
        """Freed communicators (Engine.free_comms)."""
        gone = np.array(sorted(int(c) for c in comms), np.int64)
        if not len(gone):
            return
        for c in gone.tolist():
            self._checked.pop(c, None)
        drop = np.isin(self.key >> KEY_SHIFT, gone)
        if drop.any():
            self._keep_open(~drop)
        if self.rows:
            rows = np.concatenate(self.rows)
            keep = ~np.isin(rows[:, 0] >> KEY_SHIFT, gone)
            self.rows = [rows[keep]] if keep.any() else []


def pending_mismatches(
    consistency: Consistency, comms: dict[int, Any], pool: Pool | None, now: int
) -> list[Mismatch]:
    """A tick's new verdicts, taken where the communicators live: the heartbeats of every
    communicator someone waits in checked (``check_pending``; those ``pool.busy()`` names, in
    its order, else every one of ``comms``: index -> comm.Comm), open ops too old forgotten,
    and every verdict not handed over yet, each with its communicator's id."""
    C = consistency
    if pool is None:
        busy = list(comms)
    else:
        waiting, p2p_waiting = pool.busy()
        busy = np.union1d(waiting, p2p_waiting).tolist()
    for i in busy:
        if i in comms:
            C.check_pending(comms[i], now)
    C.expire(now)
    return [replace(mm, comm_id=comms[mm.comm].id if mm.comm in comms else None) for mm in C.take_new()]


_MEMBER_MAX = 1 << 20  # members of one communicator (comm_nranks beyond this: not watched)


class PendingWatch:
    """When the heartbeat that completes a disagreement's evidence arrives: the master's cue to
    evaluate then, not at its next tick (``Consistency.check_pending`` names it at that
    evaluation, from the engine's state).

    Fed every admitted batch in arrival order, before any tick. Per communicator it keeps each
    member's latest pending collective seq (from its heartbeats) and, for the highest seq any
    member is pending at, how many members are pending there, the first one's signature, whether
    a later one differed and whether one has arrived (the engine looks at a communicator where a
    member waits). ``due`` becomes true when a batch brings a communicator to every member
    pending at one seq, one arrived and not all alike; once per (communicator, seq). The work
    is a few numpy passes over a batch's collective heartbeats: nothing per communicator, and
    nothing for other rows. A heartbeat that says no dtype (schema 1) is compared on op and root
    only, as the engine does; a member pending in a p2p op has no collective seq."""

    _COMM = ("n", "base", "top", "cnt", "rsig", "rcount", "rknown", "bad", "started", "fired")

    def __init__(self) -> None:
        self.ids = np.empty(0, np.uint64)  # watched communicator ids, sorted; per-comm arrays beside
        self.n, self.base = np.empty(0, np.int64), np.empty(0, np.int64)
        self.top, self.cnt = np.empty(0, np.int64), np.empty(0, np.int64)
        self.rsig, self.rcount = np.empty(0, np.uint64), np.empty(0, np.uint64)
        self.rknown, self.bad, self.started = np.empty(0, bool), np.empty(0, bool), np.empty(0, bool)
        self.fired = np.empty(0, np.int64)  # the seq it last fired for
        self.mseq = np.empty(0, np.int64)  # per member slot: its latest pending collective seq, -1 none
        self.due = False
        self.fires = 0

    def feed(self, rows: np.ndarray, cols: Any = None) -> bool:
        """Admitted HEADER rows (``cols``: their columns, c4d.record.columns, when the caller has them);
        True when a disagreement's evidence just completed (``due`` stays set until taken)."""
        src = cols if cols is not None and len(cols) == len(rows) else rows
        hb = np.flatnonzero(src["kind"] == schema.Kind.HEARTBEAT)
        if not len(hb):
            return False
        h = src.as_kind(schema.HEARTBEAT).take(hb) if src is cols else rows[hb].view(schema.HEARTBEAT)
        cid, cr, nr = h["comm_id"], h["comm_rank"].astype(np.int64), h["comm_nranks"].astype(np.int64)
        ok = np.flatnonzero((cid != 0) & (nr >= 2) & (nr <= _MEMBER_MAX) & (cr >= 0) & (cr < nr))
        if not len(ok):
            return False
        # each member's latest row of the batch (a member moves on: its older rows say less)
        k = np.lexsort((ok, cr[ok], cid[ok]))
        o = ok[k]
        last = np.r_[(cid[o][1:] != cid[o][:-1]) | (cr[o][1:] != cr[o][:-1]), True]
        r = np.sort(o[last])  # arrival order
        cid, cr, nr = cid[r], cr[r], nr[r]
        ci = self._index(cid, nr)
        fits = nr == self.n[ci]  # (a communicator's size is its first row's)
        r, cid, cr, ci = r[fits], cid[fits], cr[fits], ci[fits]
        if not len(r):
            return False
        op = h["pend_op"][r].astype(np.int64)
        coll = (
            (h["pend_seq"][r] != schema.UINT64_MAX) & ((h["pend_flags"][r] & _P2P) == 0) & (op < int(Op.Send))
        )
        s = np.where(coll, h["pend_seq"][r].astype(np.int64), -1)
        slot = self.base[ci] + cr
        old = self.mseq[slot]
        self.mseq[slot] = s
        order = np.argsort(ci, kind="stable")
        sc = ci[order]
        heads = np.r_[0, np.flatnonzero(sc[1:] != sc[:-1]) + 1]
        touched = sc[heads]
        new_top = np.maximum.reduceat(s[order], heads)
        top0 = self.top[touched]
        raised_at = new_top > top0
        rc = touched[raised_at]  # communicators whose highest pending seq moved up: counted afresh
        self.top[rc], self.cnt[rc] = new_top[raised_at], 0
        self.bad[rc] = self.started[rc] = False
        T = self.top[ci]
        left = (T >= 0) & (old == T) & (s != T)  # at the top seq before, no longer (finished it)
        joined = (T >= 0) & (s == T) & (old != T)
        np.subtract.at(self.cnt, ci[left], 1)
        np.add.at(self.cnt, ci[joined], 1)
        at = np.flatnonzero((T >= 0) & (s == T))
        if len(at):
            dt = h["pend_dtype"][r[at]].astype(np.int64)
            sig = signature(pending_kinds(op[at], dt, h["pend_redop"][r[at]]), h["pend_peer"][r[at]])
            count = h["pend_count"][r[at]].astype(np.uint64)
            known = dt < len(DTYPE_NAMES)
            # a communicator raised now takes its first row at the new top as the reference
            ca = ci[at]
            fresh_c, first = np.unique(ca, return_index=True)
            fresh = np.isin(fresh_c, rc)
            f, fi = fresh_c[fresh], first[fresh]
            self.rsig[f], self.rcount[f], self.rknown[f] = sig[fi], count[fi], known[fi]
            both = known & self.rknown[ca]
            differ = ((sig & _OP_ROOT) != (self.rsig[ca] & _OP_ROOT)) | (
                both & ((sig != self.rsig[ca]) | (count != self.rcount[ca]))
            )
            self.bad[ca[differ]] = True
            self.started[ca[h["pend_start_ns"][r[at]] > 0]] = True
        t = touched
        fire = (self.cnt[t] == self.n[t]) & self.bad[t] & self.started[t] & (self.fired[t] != self.top[t])
        if fire.any():
            self.fired[t[fire]] = self.top[t[fire]]
            self.fires += int(fire.sum())
            self.due = True
            return True
        return False

    def take(self) -> bool:
        """``due``, cleared (the master evaluates now)."""
        due, self.due = self.due, False
        return due

    def _index(self, cid: np.ndarray, nr: np.ndarray) -> np.ndarray:
        """Each row's communicator index, watching the new ones (sized by their first row)."""
        pos = np.searchsorted(self.ids, cid)
        known = pos < len(self.ids)
        known[known] = self.ids[pos[known]] == cid[known]
        if not known.all():
            new, first = np.unique(cid[~known], return_index=True)
            n = nr[~known][first]
            base = len(self.mseq) + np.r_[0, np.cumsum(n)[:-1]]
            self.mseq = np.concatenate([self.mseq, np.full(int(n.sum()), -1, np.int64)])
            ids = np.concatenate([self.ids, new])
            o = np.argsort(ids, kind="stable")
            self.ids = ids[o]
            z = len(new)
            add = {
                "n": n,
                "base": base,
                "top": np.full(z, -1, np.int64),
                "cnt": np.zeros(z, np.int64),
                "rsig": np.zeros(z, np.uint64),
                "rcount": np.zeros(z, np.uint64),
                "rknown": np.zeros(z, bool),
                "bad": np.zeros(z, bool),
                "started": np.zeros(z, bool),
                "fired": np.full(z, -1, np.int64),
            }
            for a in self._COMM:
                setattr(self, a, np.concatenate([getattr(self, a), add[a].astype(getattr(self, a).dtype)])[o])
            pos = np.searchsorted(self.ids, cid)
        return pos

    def forget(self, cids) -> None:
        """Freed communicators (the edge's expiry); their member slots are compacted away once
        they are most of the table."""
        gone = np.isin(self.ids, np.asarray(list(cids), np.uint64))
        if not gone.any():
            return
        keep = ~gone
        for a in ("ids", *self._COMM):
            setattr(self, a, getattr(self, a)[keep])
        live = int(self.n.sum())
        if len(self.mseq) > 2 * live + 1024:
            runs = zip(self.base.tolist(), self.n.tolist(), strict=True)
            idx = np.concatenate([np.arange(b, b + m) for b, m in runs] or [np.empty(0, np.int64)])
            self.mseq = self.mseq[idx]
            self.base = np.r_[0, np.cumsum(self.n)[:-1]].astype(np.int64)
