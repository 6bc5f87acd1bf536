"""An agent's records are untrusted like a rank's: the edge checks every OPSUM field and the
compute an agent attaches to OP records; the engine drops a summary that claims one host clock
for a communicator the master knows on two nodes."""

from __future__ import annotations

import numpy as np
import pytest

from c4d import schema
from c4d.engine import Engine, EngineConfig
from c4d.ingest import Ingest
from c4d.schema import Kind, Op
from c4d.validate import Edge, Limits
from tests import hostile as H

WORLD = 8
TP = 0xA11  # a 4-member communicator: ranks 0-3 (node-0), or 2-5 (node-0 and node-1)


def _job(t: int, members=range(4)) -> tuple[Engine, Ingest]:
    eng = Engine(EngineConfig())
    ing = Ingest(eng, Edge(Limits()))
    assert ing.feed(H.as_header(H.registers(WORLD, t), H.comm_init(list(members), TP, 4, t)), t)
    ing.tick(t)
    return eng, ing


def _opsum(t: int, n: int = 4, seq: int = 0, last: int = 3, rank: int = 3) -> np.ndarray:
    s = np.zeros(1, schema.OPSUM)
    s["kind"], s["version"], s["rank"], s["time_ns"] = Kind.OPSUM, schema.SCHEMA_VERSION, rank, t
    s["comm_id"], s["seq"], s["bytes"], s["op"] = TP, seq, 4096, Op.AllReduce
    s["last_arrive_ns"], s["transfer_ns"] = t - 1_000_000, 200_000
    s["margin_ns"], s["wait_med_ns"], s["wait_max_ns"] = 1000, 2000, 3000
    s["comm_rank"], s["comm_nranks"] = last, n
    s["compute_ns"] = np.nan
    s["compute_ns"][0, :n] = 5e6
    s["flags"] = schema.OPSF_ENDS_KNOWN
    return s


def test_a_valid_summary_completes_the_op_for_every_member():
    t = H.now_ns()
    eng, ing = _job(t)
    assert ing.feed(H.as_header(_opsum(t)), t) == 1
    ing.tick(t + 1)
    c = eng.comms[eng._comm_index[TP]]
    assert (c.done_eff() == 1).all() and len(c.recent_ops()) == 1
    assert c.recent_ops()["last"][0] == 3 and c.recent_ops()["wait_max"][0] == 3000


@pytest.mark.parametrize(
    ("reason", "spoil"),
    [
        ("bad comm size", lambda s: s["comm_nranks"].__setitem__(0, 9)),  # more than OPSUM_MAX_MEMBERS
        ("bad op", lambda s: s["op"].__setitem__(0, Op.Send)),  # summaries are of collectives
        ("bad summary", lambda s: s["wait_med_ns"].__setitem__(0, -5)),
        ("bad summary", lambda s: s["wait_med_ns"].__setitem__(0, 10**9)),  # above wait_max
        ("bad summary", lambda s: s["compute_ns"].__setitem__((0, 6), 1.0)),  # beyond the members
        ("bad summary", lambda s: s["compute_ns"].__setitem__((0, 1), np.inf)),
        ("bad summary", lambda s: s["compute_ns"].__setitem__((0, 1), -5.0)),  # a member's, negative
        ("bad summary", lambda s: s["compute_ns"].__setitem__((0, 1), 1e15)),  # longer than a record's age
        ("bad summary", lambda s: s["compute_ns"].__setitem__((0, 7), -np.inf)),  # beyond the members
        ("bad summary", lambda s: s["flags"].__setitem__(0, 0x80)),
        ("bad time", lambda s: s["last_arrive_ns"].__setitem__(0, np.uint64(1 << 63))),
        ("bad comm rank", lambda s: s["comm_rank"].__setitem__(0, 4)),
    ],
)
def test_each_bad_field_is_refused_and_counted(reason, spoil):
    t = H.now_ns()
    eng, ing = _job(t)
    s = _opsum(t)
    spoil(s)
    assert ing.feed(H.as_header(s), t) == 0
    assert ing.edge.rejected == {reason: 1}
    ing.tick(t + 1)
    assert eng.comms[eng._comm_index[TP]].done_eff().max() == 0


def test_a_shims_op_record_carries_no_compute_and_an_agents_a_bounded_one():
    t = H.now_ns()
    _eng, ing = _job(t)
    a = H.allreduces(WORLD, [0], t)
    a["compute_ns"][0] = 7  # without OpFlag.COMPUTE_GIVEN: a shim never writes these bytes
    a["flags"][1] |= schema.OpFlag.COMPUTE_GIVEN
    a["compute_ns"][1] = -1  # negative
    ing.feed(H.as_header(a), t)
    assert ing.edge.rejected == {"bad compute": 2}


def test_a_summary_of_a_communicator_on_two_nodes_is_dropped():
    t = H.now_ns()
    eng, ing = _job(t, members=range(2, 6))  # node-0 and node-1 (4 ranks a node)
    assert ing.feed(H.as_header(_opsum(t, rank=5)), t) == 1  # the edge cannot know nodes
    ing.tick(t + 1)
    c = eng.comms[eng._comm_index[TP]]
    assert c.done_eff().max() == 0 and not len(c.recent_ops())
    assert eng.stats["invalid"] == 1
