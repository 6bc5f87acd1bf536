"""A node agent sends a busy communicator's window sample (c4d/agent/sample.py): the ops the
master's slow judge would keep, and each flush's last op for progress; through agents that
sample, the master names what it names from every op."""

from __future__ import annotations

import numpy as np
import pytest
from factories import Fault, Job, as_master, build_cached

from c4d.agent.sample import SummarySample
from c4d.agent.summary import Summariser
from c4d.engine import DiagKind
from c4d.engine.sampling import sampled
from c4d.record import schema

P_S = 10
P = P_S * 1_000_000_000


def _flushes(
    sample: SummarySample, ops: int, w: int, per_flush: int = 50, comms: int = 1
) -> list[np.ndarray]:
    """``ops`` ops of each of ``comms`` communicators at a steady pace through window ``w``,
    summarised and picked a flush at a time: what the agent sent, per flush."""
    la = w * P + np.arange(ops) * (P // ops)
    seq = np.arange(w * ops, (w + 1) * ops)
    sent = []
    for a in range(0, ops, per_flush):
        s = np.zeros(comms * len(seq[a : a + per_flush]), schema.OPSUM)
        s["comm_id"] = np.repeat(np.arange(1, comms + 1), len(seq[a : a + per_flush]))
        s["seq"] = np.tile(seq[a : a + per_flush], comms)
        s["last_arrive_ns"] = np.tile(la[a : a + per_flush], comms)
        sent.append(sample.pick(s))
    return sent


def test_a_busy_communicator_sends_its_window_sample_and_each_flushs_last_op():
    sample = SummarySample(cap=2048, period_s=P_S)
    sample.period(None)
    _flushes(sample, 5_000, w=2)  # the window before: its pace sets this one's sample
    sent = _flushes(sample, 5_000, w=3)
    rows = np.concatenate(sent)
    assert (rows["sample_shift"] == 2).all()  # 5,000 ops a window: one in 4
    ins = sampled(rows["seq"], rows["sample_shift"])
    assert 1_000 <= int(ins.sum()) <= 1_500  # what the master keeps for the judge
    every = np.arange(3 * 5_000, 4 * 5_000)
    want = every[sampled(every, 2)]
    assert set(rows["seq"][ins].tolist()) == set(want.tolist())  # the master's own sample's ops
    # each flush's last op goes, in the sample or not: the master's progress is current
    assert [int(f["seq"][-1]) for f in sent] == list(range(3 * 5_000 + 49, 4 * 5_000, 50))
    assert len(rows) <= int(ins.sum()) + len(sent)  # nothing else


def test_under_the_cap_or_with_the_sample_off_every_summary_goes():
    for sample in (SummarySample(cap=2048, period_s=P_S), SummarySample(cap=0, period_s=P_S)):
        sample.period(None)
        _flushes(sample, 1_000, w=2, comms=3)
        rows = np.concatenate(_flushes(sample, 1_000, w=3, comms=3))
        assert len(rows) == 3_000 and (rows["sample_shift"] == 0).all()


def test_each_communicator_has_its_own_sample_and_a_forgotten_ones_index_is_reused():
    sample = SummarySample(cap=100, period_s=P_S)
    sample.period(None)
    busy = _flushes(sample, 1_000, w=1, comms=1)
    assert np.concatenate(busy)["sample_shift"].max() >= 3
    s = np.zeros(10, schema.OPSUM)
    s["comm_id"], s["seq"], s["last_arrive_ns"] = 7, np.arange(10), P + np.arange(10)
    assert len(sample.pick(s)) == 10  # a quiet communicator beside it: every op
    sample.forget([1])
    assert sample.idx == {7: 1} and sample.free == [0]


FAULTS = [
    Fault("comm-slow", rank=5, step=40, factor=3.0),
    Fault("noncomm-slow", rank=6, step=40, factor=3.0),
    Fault("noncomm-hang", rank=6, step=60),
]


@pytest.mark.parametrize("fault", [*FAULTS, None], ids=["comm-slow", "noncomm-slow", "noncomm-hang", "clean"])
def test_through_agents_that_send_a_sample_the_master_names_what_every_op_names(fault):
    """Tensor-parallel pairs inside nodes (their all-reduces summarised by the agents); a cap of 8
    ops a window: the agents send a third of their summaries (one op in 8 or fewer of each, and
    each 0.1 s flush's last), and the master's verdicts and their first times are those of every
    op, straight from the ranks."""
    j = Job(tp=2, pp=2, dp=4, ranks_per_node=4, steps=120, skew_ms=50.0, period_s=1,
            faults=[fault] if fault else [])  # fmt: skip
    _model, batches = build_cached(j)
    every, _ = as_master(j, batches, slow_window_ops=0)
    via, _ = as_master(j, batches, agents=True, summariser={"window_ops": 8}, flush_s=0.1, slow_window_ops=8)

    def verdicts(ds):
        return sorted({(d.kind, d.ranks) for d in ds})

    assert verdicts(via) == verdicts(every), [d.summary() for d in via]
    if fault is None:
        assert every == []
    else:
        want = {"comm-slow": DiagKind.RankCommSlow, "noncomm-slow": DiagKind.RankNonCommSlow,
                "noncomm-hang": DiagKind.RankNonCommHang}  # fmt: skip
        assert want[fault.kind] in {d.kind for d in every}
    # no later than a flush (0.1 s) and a tick behind
    assert [d.time for d in via[:1]] == pytest.approx([d.time for d in every[:1]], abs=0.1 + j.tick_ms / 1e3)


def test_an_agent_sends_fewer_summaries_of_a_busy_communicator():
    """Node 0's records in 0.1 s flushes: with a cap of 8 ops a window, fewer than half the
    summaries go (its tensor-parallel pairs complete 40-odd ops a window)."""
    j = Job(tp=2, pp=2, dp=4, ranks_per_node=4, steps=120, skew_ms=50.0, period_s=1)
    _model, batches = build_cached(j)
    flushes: dict[int, list[np.ndarray]] = {}
    for t, b in batches:
        rows = b.view(schema.HEADER)
        flushes.setdefault(int(t / 100e6), []).append(rows[rows["rank"] < 4])  # (times in ns)
    sent = {}
    for cap in (0, 8):
        s = Summariser(window_ops=cap)
        out = [s.feed(schema.join_records(f, schema.HEADER)) for _, f in sorted(flushes.items())]
        rows = np.concatenate([o for o in out if len(o)])
        sent[cap] = int((rows["kind"] == schema.Kind.OPSUM).sum())
        assert sent[cap] == s.stats["summaries sent"] <= s.stats["summaries"]
    assert sent[8] * 2 < sent[0], sent
