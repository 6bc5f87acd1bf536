"""Node agents' parts (OPPART: two members' OP records of one collective in one record): lossless
for what the master reads, refused by the edge unless both records it holds are valid, unpacked
where it lay, and read by the offline tables as the OP records it holds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.engine import Engine, EngineConfig
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.record import oppart, schema, trace
from c4d.record.schema import Kind, Op, OpFlag
from tests import hostile as H

WORLD = 8
GIVEN = int(OpFlag.COMPUTE_GIVEN)
NOT_CARRIED = {"stream": 0, "return_ns": 0, "device": -1}


def _forwarded(t: int, seqs=(0,)) -> np.ndarray:
    """What an agent forwards of a world all-reduce: every rank's OP record, compute given."""
    a = H.allreduces(WORLD, seqs, t)
    a["flags"] |= GIVEN
    a["compute_ns"] = 1_000_000 + a["rank"].astype(np.int64) * 7
    return a


def _carried(a: np.ndarray) -> np.ndarray:
    """``a`` as a part gives it back: every field but those not carried."""
    a = a.copy()
    for f, v in NOT_CARRIED.items():
        a[f] = v
    return a


def _by_rank_seq(a: np.ndarray) -> np.ndarray:
    return a[np.lexsort((a["rank"], a["seq"]))]


def test_a_pair_unpacks_into_the_records_it_holds_field_for_field():
    t = H.now_ns()
    a = _forwarded(t, seqs=(3, 4))
    a["start_ns"][5] = 0  # no device timing on one member
    parts, held = oppart.pack(a)
    assert len(parts) == len(a) // 2 and sorted(held.tolist()) == list(range(len(a)))
    got = oppart.unpack(parts.view(schema.HEADER)).view(schema.OP)
    assert np.array_equal(_by_rank_seq(got), _by_rank_seq(_carried(a)))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # comm rank
            st.integers(0, 2),  # seq
            st.integers(0, 5_000_000_000),  # issue offset (ns): some pairs span more than 2^32
            st.integers(0, 3),  # what differs: nothing, count, group, result
            st.booleans(),  # start known
        ),
        min_size=2,
        max_size=24,
    )
)
def test_packing_then_unpacking_loses_nothing_the_master_reads(rows):
    t = 1_700_000_000 * 10**9
    a = np.zeros(len(rows), schema.OP)
    a["kind"], a["version"], a["time_ns"] = Kind.OP, schema.SCHEMA_VERSION, t
    for i, (cr, seq, off, odd, started) in enumerate(rows):
        a["rank"][i], a["comm_rank"][i], a["seq"][i] = 10 + cr, cr, seq
        a["issue_ns"][i] = t - 6_000_000_000 + off
        a["start_ns"][i] = a["issue_ns"][i] + 1000 if started else 0
        a["end_ns"][i] = a["issue_ns"][i] + 9000
        a["count"][i] = 1024 + (odd == 1)
        a["group_id"][i] = 5 if odd == 2 else 0
        a["result"][i] = 3 if odd == 3 else 0
    a["comm_id"], a["comm_nranks"], a["peer"], a["dtype"], a["op"] = 0xA, 4, -1, 7, Op.AllReduce
    a["bytes"] = a["count"] * 4
    a["flags"] = OpFlag.DEVICE_TIMING | GIVEN
    a["compute_ns"] = np.arange(len(a)) * 1_000_003
    a["stream"], a["return_ns"], a["device"] = 77, t - 1, 2
    parts, held = oppart.pack(a)
    assert len(held) == 2 * len(parts) and len(np.unique(held)) == len(held)
    got = oppart.unpack(parts.view(schema.HEADER)).view(schema.OP)
    assert np.array_equal(_by_rank_seq(got), _by_rank_seq(_carried(a[held])))
    # only records the pack may carry are held, each pair one op's two members
    assert (a["group_id"][held] == 0).all() and (a["result"][held] == 0).all()
    pair = got.reshape(-1, 2)
    assert (pair["seq"][:, 0] == pair["seq"][:, 1]).all()
    assert (pair["comm_rank"][:, 0] != pair["comm_rank"][:, 1]).all()


def test_records_a_part_cannot_carry_go_as_they_came():
    t = H.now_ns()
    for spoil in (
        lambda a: a["flags"].__setitem__(1, a["flags"][1] | OpFlag.IN_GROUP),
        lambda a: a["bytes"].__setitem__(1, 4095),  # not count x the datatype's size
        lambda a: a["dtype"].__setitem__(slice(None), schema.DType.unknown),
        lambda a: a["end_ns"].__setitem__(1, a["issue_ns"][0] + (1 << 32)),  # a span past 2^32 - 2 ns
        lambda a: a["peer"].__setitem__(1, 0),  # another root
    ):
        a = _forwarded(t)[:2]
        spoil(a)
        parts, held = oppart.pack(a)
        assert len(parts) == 0 and len(held) == 0


def test_unpacking_puts_the_records_where_the_part_lay():
    t = H.now_ns()
    parts, _ = oppart.pack(_forwarded(t)[:2])
    hb = H.heartbeats(2, t)
    raw = H.as_header(hb[:1], parts, hb[1:])
    out = oppart.unpack(raw)
    assert out["kind"].tolist() == [Kind.HEARTBEAT, Kind.OP, Kind.OP, Kind.HEARTBEAT]
    assert out.view(schema.OP)["rank"][1:3].tolist() == [0, 1]
    assert oppart.unpack(H.as_header(hb)) is not None and len(oppart.unpack(H.as_header(hb))) == 2


def _job(t: int) -> tuple[Engine, Ingest]:
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge(Limits()))
    assert ing.feed(H.as_header(H.registers(WORLD, t), H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)), t)
    ing.tick(t)
    return eng, ing


def test_the_engine_gets_from_parts_what_it_gets_from_the_records():
    t = H.now_ns()
    a = _forwarded(t, seqs=range(3))
    parts, held = oppart.pack(a)
    assert len(held) == len(a)
    done = []
    for rows in (a, parts):
        eng, ing = _job(t)
        assert ing.feed(H.as_header(rows), t) == len(a)  # the parts' records reached the engine
        ing.tick(t + 1)
        c = eng.comms[eng._comm_index[H.WORLD_COMM]]
        done.append((c.done_eff().tolist(), c.recent_ops().tolist()))
    assert done[0] == done[1] and done[0][0] == [3] * WORLD


def _late_end(p: np.ndarray) -> None:
    p["base_ns"] = p["time_ns"] + np.uint64(int(Limits().max_clock_skew_s * 1e9) - 1_000_000_000)
    p["off"][0, 1, 3] = 0xFFFFFFFF  # 4.3 s after it


def _part(t: int) -> np.ndarray:
    parts, _ = oppart.pack(_forwarded(t)[:2])
    assert len(parts) == 1
    return parts


@pytest.mark.parametrize(
    ("reason", "spoil"),
    [
        ("bad rank", lambda p: p["rank1"].__setitem__(0, WORLD)),
        ("bad part", lambda p: p["rank1"].__setitem__(0, p["rank"][0])),  # one member twice
        ("bad part", lambda p: p["comm_rank1"].__setitem__(0, p["comm_rank"][0])),
        ("bad comm rank", lambda p: p["comm_rank1"].__setitem__(0, WORLD)),
        ("bad part", lambda p: p["dtype"].__setitem__(0, schema.DType.unknown)),  # its bytes unknown
        ("bad part", lambda p: p["flags"].__setitem__(0, p["flags"][0] | OpFlag.IN_GROUP)),
        ("bad flags", lambda p: p["op"].__setitem__(0, Op.Send)),  # a part is of a collective
        ("bad time", lambda p: p["base_ns"].__setitem__(0, np.uint64(1 << 63))),
        ("bad time", lambda p: _late_end(p)),  # past the master's clock skew bound
        ("bad compute", lambda p: p["compute_ns"].__setitem__((0, 1), -1)),
        ("bad count", lambda p: p["count"].__setitem__(0, 1 << 60)),
    ],
)
def test_each_bad_part_is_refused_and_counted(reason, spoil):
    t = H.now_ns()
    eng, ing = _job(t)
    p = _part(t)
    spoil(p)
    assert ing.feed(H.as_header(p), t) == 0
    assert ing.edge.rejected == {reason: 1}
    ing.tick(t + 1)
    assert eng.comms[eng._comm_index[H.WORLD_COMM]].done_eff().max() == 0


def test_the_offline_tables_read_a_part_as_its_records(tmp_path):
    t = H.now_ns()
    path = tmp_path / "parts.c4d"
    w = trace.TraceWriter(path, {"created_ns": t})
    w.write(H.as_header(H.registers(WORLD, t), H.comm_init(range(WORLD), H.WORLD_COMM, WORLD, t)))
    w.write(H.as_header(_part(t)))
    w.close()
    rt = trace.read_raw(path)
    assert (rt.raw["kind"] == Kind.OPPART).sum() == 1  # the trace keeps what arrived
    ops = trace.load(path).ops
    assert sorted(ops["rank"].tolist()) == [0, 1] and set(ops["op_name"]) == {"AllReduce"}
