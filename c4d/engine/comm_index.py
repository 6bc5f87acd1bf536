"""The engine's communicators by id: made when a record first names one (indices never
reused, as many as C4D_MAX_COMMS_EVER allows), looked up for a chunk's rows, their members
kept as records name them, forgotten when freed.

Rows naming a bad id, rank or size, an unknown communicator or one of another size are
dropped and counted here (``invalid``); PEER records carry no size and only attach to a
communicator some other record announced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from c4d.engine.comm import Comm
from c4d.engine.pool import MAX_COMMS_EVER, Pool, budget_from_env
from c4d.engine.ranks import RankTable
from c4d.engine.rows import MAX_NRANKS, OpCols, take
from c4d.engine.summaries import Summaries
from c4d.record import schema
from c4d.util.sorted_lookup import find_sorted


class Numbering:
    """Communicator ids -> indices: handed out in order, never reused, as many as
    C4D_MAX_COMMS_EVER allows (what each ever admitted costs stays bounded). The one engine's
    ``CommIndex`` numbers with it; an engine sharded by communicator numbers in its front, for
    every shard (c4d/engine/shards.py)."""

    def __init__(self, refuse: Callable[[], None]) -> None:
        """``refuse``: counts a communicator refused for want of an index."""
        self.index: dict[int, int] = {}  # comm id -> index (changed by number and forget only)
        self._ids: np.ndarray | None = None  # its ids sorted (``known``), made again after a change
        self.next_idx = 0
        self._max = budget_from_env("C4D_MAX_COMMS_EVER", MAX_COMMS_EVER)
        self._refuse = refuse

    def number(self, cid: int, n: int, idx: int | None = None) -> int | None:
        """Communicator ``cid`` of ``n`` members gets the next index (or ``idx``, handed out
        elsewhere); None for a size out of range or no index left."""
        if not 1 <= n <= MAX_NRANKS:
            return None
        if idx is None:
            if self.next_idx >= self._max:
                self._refuse()
                return None
            idx = self.next_idx
        self.index[cid] = idx
        self._ids = None
        self.next_idx = max(self.next_idx, idx + 1)
        return idx

    def forget(self, cid: int) -> int | None:
        """Communicator ``cid``'s index taken back (None: it had none)."""
        self._ids = None
        return self.index.pop(cid, None)

    def known(self, ids: np.ndarray) -> np.ndarray:
        """Which of the ids have an index: one lookup of them all (a chunk names thousands of
        runs of ids; a set lookup each was 2% of the engine at 16,384 ranks)."""
        if self._ids is None:
            self._ids = np.array(sorted(self.index), np.uint64)
        return find_sorted(self._ids, ids)[1]

    def make(self, new: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """Number the communicators a chunk names first (``new_in``: (id, size), in the order
        the chunk's kinds would make them), before any of its rows is ingested, so that an
        engine sharded by communicator numbers them as one engine does. Returns (id, index,
        size) of those numbered."""
        out = []
        for cid, n in new:
            if cid not in self.index:
                i = self.number(cid, n)
                if i is not None:
                    out.append((cid, i, n))
        return out


class CommIndex:
    def __init__(
        self,
        comms: dict[int, Comm],
        pool: Pool,
        ranks: RankTable,
        split: bool,
        invalid: Callable[[str, int], None],
        numbers: bool = True,
    ) -> None:
        """``comms``: the engine's communicators by index (kept here, in creation order);
        ``split``: each keeps its completed ops' OP_SPLIT rows; ``invalid``: counts dropped rows;
        ``numbers``: it numbers communicators a row names first (an engine shard's does not: its
        front numbered every one the chunk names, ``adopt``)."""
        self.comms = comms
        refuse = lambda: pool.refuse("communicator indices", "C4D_MAX_COMMS_EVER", 1, "new communicator(s)")  # noqa: E731
        self.numbering = Numbering(refuse)
        self.index = self.numbering.index  # comm id -> index
        self._lk: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the same, sorted arrays (lookup)
        self._pool, self._ranks, self._split, self._invalid = pool, ranks, split, invalid
        self._numbers = numbers
        self.late = 0  # communicators a kind's rows made, not ``make`` at the chunk's start

    @property
    def next_idx(self) -> int:
        return self.numbering.next_idx

    def comm(self, cid: int, n: int) -> Comm | None:
        i = self.index.get(cid)
        if i is None:
            if not self._numbers or self._new(cid, n) is None:
                return None
            self.late += 1
            i = self.index[cid]
        c = self.comms[i]
        return c if c.n == n else None

    def _new(self, cid: int, n: int) -> Comm | None:
        i = self.numbering.number(cid, n)
        return None if i is None else self._at(cid, i, n)

    def _at(self, cid: int, i: int, n: int) -> Comm:
        c = Comm(i, cid, n, self._pool)
        if self._split:
            c.split = []
        self.comms[i] = c
        self._lk = None
        return c

    def make(self, new: list[tuple[int, int]]) -> None:
        """Make the communicators a chunk names first (``Numbering.make``), before any of its
        rows is ingested."""
        made = list(self.numbering.make(new))
        if len(made) > 1:
            self._pool.reserve([(n, Comm.slots(n)) for _, _, n in made])
        for cid, i, n in made:
            self._at(cid, i, n)

    def adopt(self, made: list[tuple[int, int, int]]) -> None:
        """Make communicators numbered elsewhere (``Numbering.make``'s (id, index, size))."""
        for cid, i, n in made:
            if cid not in self.index and self.numbering.number(cid, n, i) is not None:
                self._at(cid, i, n)

    def known(self, ids: np.ndarray) -> np.ndarray:
        return self.numbering.known(ids)

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index and size of each known communicator id (-1, -1 unknown)."""
        if self._lk is None:
            known = sorted(self.index.items())
            self._lk = (
                np.array([k for k, _ in known], np.uint64),
                np.array([i for _, i in known], np.int64),
                np.array([self.comms[i].n for _, i in known], np.int64),
            )
        lk_ids, lk_idx, lk_n = self._lk
        if not len(lk_ids):
            return np.full(len(ids), -1, np.int64), np.full(len(ids), -1, np.int64)
        pos, hit = find_sorted(lk_ids, ids)
        return np.where(hit, lk_idx[pos], -1), np.where(hit, lk_n[pos], -1)

    def by_comm(
        self, rows: np.ndarray, what: str, extra: np.ndarray | None = None
    ) -> Iterator[tuple[Comm, np.ndarray, np.ndarray]]:
        """Yield (comm, its rows, the matching slice of ``extra``) in comm-id order, rows kept in order."""
        rows, extra, spans = self._slices(rows, what, extra)
        for c, h, t in spans:
            yield c, rows[h:t], extra[h:t]

    def _slices(
        self, rows: np.ndarray, what: str, extra: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[Comm, int, int]]]:
        """The valid rows sorted by comm id (stable: each communicator's in arrival order), the
        matching ``extra``, and each communicator's (comm, first row, end row), in comm-id order.

        PEER records carry no communicator size: they only attach to a communicator some
        other record already announced.
        """
        if extra is None:
            extra = np.zeros(len(rows), np.int8)
        sized = "comm_nranks" in (rows.dtype.names or ())
        ok = (rows["comm_id"] != 0) & (rows["comm_rank"] >= 0)
        if sized:
            nr = rows["comm_nranks"]
            ok &= (nr >= 1) & (nr <= MAX_NRANKS) & (rows["comm_rank"] < nr)
        if not ok.all():
            self._invalid(f"a bad comm id/rank/size in {what} records", int((~ok).sum()))
            rows, extra = take(rows, ok), extra[ok]
        if not len(rows):
            return rows, extra, []
        order = np.argsort(rows["comm_id"], kind="stable")
        rows, extra = take(rows, order), extra[order]
        cid = rows["comm_id"]
        heads = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
        tails = np.r_[heads[1:], len(rows)]
        ids = cid[heads]
        idx, n = self.lookup(ids)
        if sized:
            nr = rows["comm_nranks"]
            lo, hi = np.minimum.reduceat(nr, heads), np.maximum.reduceat(nr, heads)
            for k in np.flatnonzero(idx < 0).tolist():  # new communicators (in comm-id order)
                c = self.comm(int(ids[k]), int(nr[heads[k]]))
                idx[k], n[k] = (c.idx, c.n) if c is not None else (-1, -1)
            good = (idx >= 0) & (lo == n) & (hi == n)
        else:
            good = (idx >= 0) & (np.maximum.reduceat(rows["comm_rank"], heads) < n)
        bad_rows = not good.all()
        for k in np.flatnonzero(~good).tolist():
            n_bad = int(tails[k] - heads[k])
            self._invalid(f"an unknown communicator or a changed size in {what} records", n_bad)
        comms = self.comms
        spans = [
            (comms[i], h, t)
            for i, h, t in zip(idx[good].tolist(), heads[good].tolist(), tails[good].tolist(), strict=True)
        ]
        if bad_rows:  # keep the good ones' rows only
            idx = np.concatenate([np.arange(h, t) for _, h, t in spans]) if spans else np.empty(0, np.int64)
            rows, extra = take(rows, idx), extra[idx]
            cut = np.cumsum([0] + [t - h for _, h, t in spans]).tolist()
            spans = [(c, cut[k], cut[k + 1]) for k, (c, _, _) in enumerate(spans)]
        return rows, extra, spans

    def groups(
        self, rows: np.ndarray, what: str, extra: np.ndarray | None = None, cols: OpCols | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Comm]]:
        """What ``_slices`` finds, rows not reordered: the valid rows in arrival order, the
        matching ``extra``, each row's group and each group's communicator (groups in comm-id
        order). A copy of a chunk's OP rows sorted by communicator (a gather of whole records in
        no order the cache likes) is a pass the chunk can do without: the collective and p2p
        paths sort their own rows again. ``cols``: OP rows' columns."""
        if extra is None:
            extra = np.zeros(len(rows), np.int8)
        sized = "comm_nranks" in (rows.dtype.names or ())
        cr = rows["comm_rank"] if cols is None else cols.comm_rank
        cid = rows["comm_id"] if cols is None else cols.cid
        ok = (cid != 0) & (cr >= 0)
        if sized:
            nr = rows["comm_nranks"] if cols is None else cols.nranks
            ok &= (nr >= 1) & (nr <= MAX_NRANKS) & (cr < nr)
        if not ok.all():
            self._invalid(f"a bad comm id/rank/size in {what} records", int((~ok).sum()))
            rows, extra = take(rows, ok), extra[ok]
            cols = None if cols is None else cols.take(ok)
        if not len(rows):
            return rows, extra, np.empty(0, np.int64), []
        ids, first, ci = schema.unique_runs(rows["comm_id"] if cols is None else cols.cid)
        idx, n = self.lookup(ids)
        if sized:
            nr = rows["comm_nranks"].astype(np.int64) if cols is None else cols.nranks
            for k in np.flatnonzero(idx < 0).tolist():  # new communicators (in comm-id order)
                c = self.comm(int(ids[k]), int(nr[first[k]]))
                idx[k], n[k] = (c.idx, c.n) if c is not None else (-1, -1)
            changed = np.bincount(ci[nr != n[ci]], minlength=len(ids)) > 0  # a row of another size
            good = (idx >= 0) & ~changed
        else:
            top = np.full(len(ids), -1, np.int64)
            np.maximum.at(top, ci, rows["comm_rank"].astype(np.int64))
            good = (idx >= 0) & (top < n)
        if not good.all():
            count = np.bincount(ci, minlength=len(ids))
            for k in np.flatnonzero(~good).tolist():
                self._invalid(f"an unknown communicator or a changed size in {what} records", int(count[k]))
            keep = good[ci]
            rows, extra = take(rows, keep), extra[keep]
            ci = (np.cumsum(good) - 1)[ci[keep]]
            idx = idx[good]
        comms = self.comms
        return rows, extra, ci, [comms[i] for i in idx.tolist()]

    def member(self, c: Comm, cr: np.ndarray, g: np.ndarray) -> None:
        new = c.grank[cr] != g
        if new.any():
            c.version += 1
            for a, b in zip(cr[new].tolist(), g[new].tolist(), strict=True):
                c.grank[a] = b
                self._ranks.member_of(b, c.idx, a)

    def members(
        self, rows: np.ndarray, ci: np.ndarray, groups: list[Comm], cols: OpCols | None = None
    ) -> np.ndarray:
        """``member`` for the rows of every communicator at once (as ``groups`` gives
        them: ``ci`` each row's group); returns each row's member's Pool index. ``cols``: the
        rows' columns when they are OP rows."""
        mbase = np.array([c.mbase for c in groups], np.int64)
        cr = rows["comm_rank"].astype(np.int64) if cols is None else cols.comm_rank
        member = mbase[ci] + cr
        g = rows["rank"].astype(np.int64) if cols is None else cols.rank
        new = self._pool.member["grank"][member] != g
        if new.any():
            rows_new = np.flatnonzero(new)
            for i in rows_new[np.argsort(ci[rows_new], kind="stable")].tolist():  # communicator order
                c = groups[ci[i]]
                a, b = int(cr[i]), int(g[i])
                c.grank[a] = b
                self._ranks.member_of(b, c.idx, a)
            for k in np.unique(ci[new]).tolist():
                groups[k].version += 1
        return member

    def free(self, cids) -> list[int]:
        """Forget communicators by id: their index, their ranges of the pool and every rank's
        membership of them. Returns the indices of those that were known."""
        freed = []
        for cid in cids:
            i = self.numbering.forget(int(cid))
            self._lk = None
            if i is None:
                continue
            c = self.comms.pop(i)
            self._pool.detach(c)
            freed.append(i)
            self._ranks.leave(i, c.grank)
        return freed


def new_in(
    known: Callable[[np.ndarray], np.ndarray],
    comm: np.ndarray,
    hb: np.ndarray,
    ops: np.ndarray,
    sums: Summaries,
) -> list[tuple[int, int]]:
    """The communicators a chunk's rows name that ``known`` (ids: a mask of those known) does
    not know, as (id, size), in the order its kinds' ingest would make them (COMM, HEARTBEAT,
    OP, node summaries; each kind's in id order): the size of each one's first valid row
    (``CommIndex._slices``, ``groups``; a node summary's first in seq order, as
    ``SummaryIngest`` sorts them). A size out of range makes none (``CommIndex.comm``)."""
    named = [x["comm_id"] for x in (comm, hb, ops) if len(x)] + ([sums.cid] if len(sums) else [])
    if not named:
        return []
    # most chunks name no new communicator: the ids at the heads of their runs (a rank's and an
    # agent's rows name communicators in runs), checked first, before any sort of every row
    heads = np.concatenate([c[np.r_[True, c[1:] != c[:-1]]] for c in named])
    if ((heads == 0) | known(heads)).all():
        return []
    out: list[tuple[int, int]] = []
    seen: set[int] = set()

    def add(cid: np.ndarray, nr: np.ndarray, cr: np.ndarray, top: int) -> None:
        ok = (cid != 0) & (cr >= 0) & (nr >= 1) & (nr <= top) & (cr < nr)
        if not ok.any():
            return
        ids, first = np.unique(cid[ok], return_index=True)
        new = ~known(ids)
        for i, n in zip(ids[new].tolist(), nr[ok][first][new].tolist(), strict=True):
            if i not in seen:
                seen.add(i)
                if 1 <= n <= MAX_NRANKS:
                    out.append((i, n))

    for rows in (comm, hb, ops):
        if len(rows):
            add(
                rows["comm_id"],
                rows["comm_nranks"].astype(np.int64),
                rows["comm_rank"].astype(np.int64),
                MAX_NRANKS,
            )
    if len(sums):
        o = np.lexsort((sums.seq, sums.cid))
        add(sums.cid[o], sums.comm_nranks[o].astype(np.int64), sums.comm_rank[o].astype(np.int64),
            schema.OPSUM_MAX_MEMBERS)  # fmt: skip
    return out
