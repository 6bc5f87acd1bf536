"""The batched collective path (state.reduce_comms: every communicator's complete ops of a chunk
in a few vectorized passes) gives exactly what reducing one communicator at a time gives
(Comm.add_collectives, Comm.add_heartbeats: kept reachable through engine.BATCHED for this
comparison): the same COMPLETED rows, OP_SPLIT rows, clock offsets, communicator state and
diagnoses, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from factories import Fault, Job, build_cached, replay

from c4d import schema
from c4d.engine import Engine, EngineConfig
from c4d.engine import engine as engine_mod
from c4d.engine.state import Comm, Pool

# tp groups on one node, dp groups across nodes (one node in several of them: the waves),
# pipeline stages on other nodes, ±50 ms node clocks, faults that the diagnoses must name
SLOW = Job(
    tp=2, pp=2, dp=4, ranks_per_node=4, steps=60, skew_ms=50.0,
    faults=[Fault("noncomm-slow", rank=3, step=20, factor=3), Fault("comm-slow", rank=6, step=20, factor=3)],
)  # fmt: skip
# ticks every 20 ms: the chunks cut many ops, which complete from the ring (Comm.scatter)
CUT = Job(
    tp=2, pp=2, dp=4, ranks_per_node=4, steps=40, skew_ms=50.0, tick_ms=20.0,
    faults=[Fault("comm-slow", rank=5, step=15, factor=3)],
)  # fmt: skip
HANG = Job(
    tp=2, pp=2, dp=4, ranks_per_node=2, steps=30, skew_ms=50.0, faults=[Fault("comm-hang", rank=5, step=10)]
)


def _run(job: Job, batched: bool, monkeypatch, drop_register: tuple[int, ...] = ()):
    """Replay the job; return its diagnoses (JSON), each communicator's COMPLETED rows in the
    order made, the OP_SPLIT rows and the final clock state."""
    made: dict[int, list[np.ndarray]] = {}
    orig = Comm._completed

    def record(self, out, gaps):
        made.setdefault(self.id, []).append(out.copy())
        orig(self, out, gaps)

    model, batches = build_cached(job)
    if drop_register:  # those ranks' node stays unknown: each is its own clock domain
        keep = lambda b: b[~((b["kind"] == schema.Kind.REGISTER) & np.isin(b["rank"], drop_register))]  # noqa: E731
        batches = [(t, keep(b)) for t, b in batches]
    with monkeypatch.context() as mp:
        mp.setattr(engine_mod, "BATCHED", batched)
        mp.setattr(Comm, "_completed", record)
        run = replay(job, lambda: Engine(EngineConfig(), split=True), batches, model)
    R = run.engine.ranks
    state = {
        k: getattr(R, k).copy()
        for k in ("rel_node", "rel_rank", "anc_node", "anc_rank", "isl_node", "isl_rank")
    }
    for c in run.engine.comms.values():  # what the hang graph and the live view read
        for k, _dt, _f in (*Pool.MEMBER, *Pool.SLOT):
            state[f"{c.id:x}.{k}"] = getattr(c, k).copy()
        state[f"{c.id:x}.counts"] = np.array(
            [c.version, c.incomplete, c.ops_seen, c.p2p_rows, len(c.p2p_done)]
        )
    diags = [json.dumps(d.to_json(), sort_keys=True) for d in run.diagnoses]
    return diags, made, run.engine.take_split(), state


@pytest.mark.parametrize(
    ("job", "drop"),
    [(SLOW, ()), (CUT, ()), (HANG, ()), (SLOW, (1, 6))],
    ids=["slow", "chunks-cut-ops", "hang", "slow-unregistered"],
)
def test_batched_reduction_equals_one_communicator_at_a_time(job, drop, monkeypatch):
    d1, made1, sp1, clk1 = _run(job, False, monkeypatch, drop)
    d2, made2, sp2, clk2 = _run(job, True, monkeypatch, drop)
    assert len(made1) >= 8 and sum(len(o) for v in made1.values() for o in v) > 300  # many ops reduced
    assert sorted(made1) == sorted(made2)
    for c in made1:  # per communicator, in order, bit for bit (NaN included)
        assert [o.tobytes() for o in made1[c]] == [o.tobytes() for o in made2[c]]
    assert len(sp1) > 1000 and sp1.tobytes() == sp2.tobytes()
    assert sorted(clk1) == sorted(clk2)
    for k in clk1:  # clock offsets, every communicator's members, ring tags and counters
        assert clk1[k].tobytes() == clk2[k].tobytes(), k
    assert d1 and d1 == d2


def test_the_load_exercises_clock_refinement_across_nodes(monkeypatch):
    """Guard for the test above: the refinement (what orders the waves) really moves offsets."""
    _, made, _, clk = _run(SLOW, True, monkeypatch)
    assert any(o["aligned"].any() for v in made.values() for o in v)
    rel = clk["rel_node"]
    assert np.ptp(rel) > 10e6  # ±50 ms node clocks, refined (not just the receipt bounds)
