"""c4d.intake.received: the master's running totals, taken for whole batches at once, equal what the
record-by-record bookkeeping they replaced gives (kept here as the reference)."""

from __future__ import annotations

import dataclasses

import numpy as np
from factories import Job, build

from c4d.intake.received import CommInfo, RankInfo, Received
from c4d.record import names, schema


class _Reference:
    """The record-by-record bookkeeping (main before 2026-11-25), on plain objects."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankInfo] = {}
        self.comms: dict[int, CommInfo] = {}
        self.records = 0
        self.world_size = 0

    def _rank(self, r: int) -> RankInfo:
        return self.ranks.setdefault(r, RankInfo(rank=r))

    def _comm(self, c: int) -> CommInfo:
        return self.comms.setdefault(c, CommInfo(comm_id=c))

    def add(self, raw: np.ndarray, recv_ns: int) -> None:
        k = schema.by_kind(raw)
        self.records += len(raw)
        ranks, counts = np.unique(raw["rank"], return_counts=True)
        for r, n in zip(ranks.tolist(), counts.tolist(), strict=True):
            info = self._rank(r)
            info.records += n
            info.last_seen_ns = recv_ns
        for rec in k[schema.Kind.REGISTER]:
            info = self._rank(int(rec["rank"]))
            info.node = names.clean(bytes(rec["node"]))
            info.pid = int(rec["pid"])
            self.world_size = max(self.world_size, int(rec["world_size"]))
        for rec in k[schema.Kind.COMM]:
            c = self._comm(int(rec["comm_id"]))
            c.nranks = int(rec["comm_nranks"])
            c.parent_id = int(rec["parent_id"]) or c.parent_id
            c.ranks.add(int(rec["rank"]))
            self._rank(int(rec["rank"])).comms.add(c.comm_id)
        ops = k[schema.Kind.OP]
        if len(ops):
            cids, inv = np.unique(ops["comm_id"], return_inverse=True)
            for i, cid in enumerate(cids.tolist()):
                sel = ops[inv == i]
                c = self._comm(cid)
                c.ops += len(sel)
                c.bytes += int(sel["bytes"].sum())
                coll = sel[(sel["flags"] & schema.OpFlag.P2P) == 0]
                if len(coll):
                    c.max_seq = max(c.max_seq, int(coll["seq"].max()))
                c.nranks = c.nranks or int(sel["comm_nranks"][0])
                c.ranks.update(np.unique(sel["rank"]).tolist())
            r_ids, r_counts = np.unique(ops["rank"], return_counts=True)
            for r, n in zip(r_ids.tolist(), r_counts.tolist(), strict=True):
                self._rank(r).ops += n
        for rec in k[schema.Kind.HEARTBEAT]:
            info = self._rank(int(rec["rank"]))
            info.dropped = max(info.dropped, int(rec["dropped"]))
            info.sent = max(info.sent, int(rec["sent"]))
            if int(rec["hb_flags"]) & schema.HBF_FINAL:
                info.final = True
            if int(rec["comm_id"]):
                c = self._comm(int(rec["comm_id"]))
                c.nranks = c.nranks or int(rec["comm_nranks"])
                c.ranks.add(int(rec["rank"]))
                info.comms.add(c.comm_id)

    def forget(self, cids: list[int]) -> None:
        for cid in cids:
            c = self.comms.pop(int(cid), None)
            for r in c.ranks if c is not None else ():
                if r in self.ranks:
                    self.ranks[r].comms.discard(c.comm_id)


def _state(r: Received | _Reference) -> tuple:
    return (
        r.records,
        r.world_size,
        {k: dataclasses.asdict(v) for k, v in r.ranks.items()},
        {k: dataclasses.asdict(v) for k, v in r.comms.items()},
    )


def test_whole_batches_give_what_record_by_record_gave():
    job = Job(tp=4, pp=2, dp=2, ranks_per_node=4, steps=3, skew_ms=5.0, hang_timeout_us=10_000_000,
              hang_times=3, period_s=1, hb_ms=200, flush_ms=10)  # fmt: skip
    _model, batches = build(job)
    rng = np.random.default_rng(7)
    raw = np.concatenate([b for _, b in batches])
    hb = np.flatnonzero(raw["kind"] == schema.Kind.HEARTBEAT)
    as_hb = raw.view(schema.HEARTBEAT)  # the same bytes; only the heartbeat rows are written
    as_hb["dropped"][hb] = rng.integers(0, 5, len(hb))  # something to take the max of
    as_hb["sent"][hb] = rng.integers(0, 1000, len(hb))
    final = hb[rng.random(len(hb)) < 0.05]
    as_hb["hb_flags"][final] |= schema.HBF_FINAL
    kinds = set(np.unique(raw["kind"]).tolist())
    assert {schema.Kind.REGISTER, schema.Kind.COMM, schema.Kind.OP, schema.Kind.HEARTBEAT} <= kinds
    from c4d.record.columns import Columns

    new, ref, by_cols = Received(), _Reference(), Received()
    cuts = np.sort(rng.choice(len(raw), 40, replace=False))
    for i, part in enumerate(np.split(raw, cuts)):
        new.add(part, 123)
        ref.add(part, 123)
        by_cols.add(part, 123, Columns.of(part))  # the batch's columns, as the edge hands them on
        if i == 20:  # freed communicators come back as new: their members are counted again
            gone = sorted(new.comms)[:2]
            for r in (new, ref, by_cols):
                r.forget(gone)
            assert _state(new) == _state(ref) == _state(by_cols)
    assert _state(new) == _state(ref) == _state(by_cols)
    assert any(c.max_seq >= 0 for c in new.comms.values()) and any(i.final for i in new.ranks.values())


def test_membership_search_of_keys_in_runs_is_np_isin():
    """received._in_sorted searches a run of equal keys once: the same answers as np.isin (a
    key of -1, a communicator not known yet, is never in)."""
    from c4d.intake.received import _in_sorted

    rng = np.random.default_rng(0)
    for _ in range(300):
        known = np.unique(rng.integers(0, 200, int(rng.integers(0, 50))))
        keys = rng.integers(-1, 200, int(rng.integers(0, 300)))
        if rng.random() < 0.6:
            keys = np.repeat(keys, rng.integers(1, 6, len(keys)))
        assert (_in_sorted(keys, known) == (np.isin(keys, known) & (keys >= 0))).all()


def test_register_repeats_are_taken_when_they_change_something():
    """The shim repeats REGISTER every 10 heartbeats; a repeat that says what is known is
    skipped, one with a new pid, node or world size is taken (a restarted rank, a moved pod)."""
    job = Job(tp=4, pp=2, dp=1, ranks_per_node=4, steps=2, hang_timeout_us=10_000_000, hang_times=3,
              period_s=1, hb_ms=200, flush_ms=10)  # fmt: skip
    _model, batches = build(job)
    raw = np.concatenate([b for _, b in batches])
    reg = raw[raw["kind"] == schema.Kind.REGISTER].copy()
    again = reg.copy()  # the same again
    moved = reg.copy().view(schema.REGISTER)
    moved["pid"][1] += 7
    moved["node"][2] = b"node-after-restart"
    moved["world_size"][3] += 8
    new, ref = Received(), _Reference()
    for part in (raw, again, moved.view(schema.HEADER), again):
        new.add(part, 5)
        ref.add(part, 5)
        assert _state(new) == _state(ref)
    r1, r2 = int(moved["rank"][1]), int(moved["rank"][2])
    assert new.ranks[r1].pid == int(reg.view(schema.REGISTER)["pid"][1])  # the repeat after the move
    assert new.ranks[r2].node == names.clean(bytes(reg.view(schema.REGISTER)["node"][2]))
    assert new.world_size == int(moved["world_size"][3])


def test_comm_records_taken_per_communicator_give_what_one_by_one_gave():
    """A job's start: COMM records of many communicators and ranks in one batch, some naming a
    parent, some repeating a member, a size that changes: the same members, sizes, parents and
    order of communicators as the record-by-record reference."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 200))
        com = np.zeros(n, schema.COMM)
        com["kind"], com["version"] = schema.Kind.COMM, schema.SCHEMA_VERSION
        com["rank"] = rng.integers(0, 40, n)
        com["comm_id"] = rng.choice(np.array([7, 1 << 63, 3, 12345678901234], np.uint64), n)
        com["comm_nranks"] = rng.integers(1, 9, n)
        com["parent_id"] = np.where(rng.random(n) < 0.2, rng.integers(1, 1 << 40, n), 0)
        raw = com.view(schema.HEADER)
        new, ref = Received(), _Reference()
        cuts = np.sort(rng.choice(np.arange(1, n), min(n - 1, 2), replace=False)) if n > 1 else []
        for part in np.split(raw, cuts):
            new.add(part, 5)
            ref.add(part, 5)
        assert _state(new) == _state(ref)
        assert list(new.comms) == list(ref.comms)  # first named, first listed


def test_a_communicator_whose_members_were_all_counted_takes_no_others():
    """Once a communicator's size worth of members are counted (a job's steady state: its
    records are not searched for new members any more), a record naming another rank in it (a
    forgery or a bug: the edge checks the communicator rank, not who holds it) adds none; a
    communicator with members not yet heard from still counts each as it comes."""

    def ops(cid: int, n: int, ranks: list[int]) -> np.ndarray:
        r = np.zeros(len(ranks), schema.OP)
        r["kind"], r["version"], r["rank"] = schema.Kind.OP, schema.SCHEMA_VERSION, ranks
        r["comm_id"], r["comm_nranks"], r["comm_rank"] = cid, n, np.arange(len(ranks)) % n
        return r.view(schema.HEADER)

    got = Received()
    got.add(ops(0xA, 2, [0, 1]), 5)
    got.add(ops(0xB, 4, [0, 1]), 5)
    got.add(ops(0xA, 2, [5, 0]), 5)
    got.add(ops(0xB, 4, [2, 6]), 5)
    assert got.comms[0xA].ranks == {0, 1}
    assert got.comms[0xB].ranks == {0, 1, 2, 6}
    assert got.comms[0xA].ops == 4 and got.ranks[5].ops == 1  # (counted all the same)
