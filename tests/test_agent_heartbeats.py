"""A node agent forwards the heartbeats of ranks that stand still and few of progressing ranks
(c4d/agent/heartbeats.py); the master counts a summary as a report from every member. That
the diagnoses stay those of the raw stream is tests/test_agent_summary.py's."""

from __future__ import annotations

import numpy as np

from c4d.agent.heartbeats import HeartbeatMerge, PeerMerge
from c4d.record import schema
from c4d.record.schema import Kind
from tests import hostile as H
from tests.test_agent_untrusted import _job, _opsum

NONE = schema.UINT64_MAX
PERIOD = 200_000_000


def hb(rank: int, cid: int, k: int, n: int, pend: int = NONE, flags: int = 0, dropped: int = 0) -> np.ndarray:
    """Rank ``rank``'s heartbeat on ``cid`` (0: the process) at period ``k``, ``n`` ops done."""
    h = np.zeros(1, schema.HEARTBEAT)
    h["kind"], h["version"], h["rank"] = Kind.HEARTBEAT, schema.SCHEMA_VERSION, rank
    h["time_ns"] = (k + 1) * PERIOD
    h["comm_id"], h["n_issued"], h["n_arrived"], h["n_done"] = cid, n, n, n
    h["last_arrive_ns"] = h["last_done_ns"] = n * 1000
    h["pend_seq"], h["hb_flags"], h["dropped"] = pend, flags, dropped
    return h


def period(k: int, n: int, ranks=(0, 1), comms=(7, 9), **kw) -> np.ndarray:
    """Each rank's process heartbeat, then one per communicator, as the shim writes them."""
    return np.concatenate([hb(g, c, k, n, **kw) for g in ranks for c in (0, *comms)])


def test_a_progressing_ranks_heartbeats_are_forwarded_every_fifth_period():
    m = HeartbeatMerge(every=5)
    kept = [m.keep(period(k, n=10 * k)) for k in range(12)]
    assert kept[0].all()  # the first of each (rank, communicator)
    assert kept[1].all()  # ... and the one after it
    assert [bool(x.all()) for x in kept[2:]] == [False, False, False, False, True] * 2
    assert not any(x.any() for i, x in enumerate(kept[2:]) if i % 5 != 4)


def test_a_rank_that_stands_still_is_forwarded_whole_and_once_more_after():
    m = HeartbeatMerge(every=100)
    for k in range(3):
        m.keep(period(k, n=10 * k))
    assert not m.keep(period(3, n=30)).any()
    # rank 1 stops (computing, or in an op of a communicator the others wait in): every row
    # of it, every period; rank 0 goes on
    for k in range(4, 7):
        rows = np.concatenate([period(k, n=10 * k, ranks=(0,)), period(k, n=30, ranks=(1,))])
        assert rows["rank"][m.keep(rows)].tolist() == [1, 1, 1]
    # rank 1 moves again: the first state after the stop is forwarded, then merged again
    assert m.keep(period(7, n=70)).tolist() == [False] * 3 + [True] * 3
    assert not m.keep(period(8, n=80)).any()


def test_an_op_pending_for_a_whole_period_is_forwarded_while_the_rank_progresses():
    m = HeartbeatMerge(every=100)
    for k in range(3):
        m.keep(period(k, n=10 * k, ranks=(0,)))
    pend = np.concatenate([hb(0, 0, 3, 30, pend=5), hb(0, 7, 3, 30), hb(0, 9, 3, 30, pend=5)])
    assert not m.keep(pend).any()  # pending since this period only
    pend = np.concatenate([hb(0, 0, 4, 40, pend=5), hb(0, 7, 4, 40), hb(0, 9, 4, 40, pend=5)])
    assert m.keep(pend).tolist() == [False, False, True]  # comm 9's op 5 outlasted a period


def test_an_op_pending_since_more_than_half_a_period_is_forwarded_at_once():
    m = HeartbeatMerge(every=100)
    for k in range(3):
        m.keep(period(k, n=10 * k, ranks=(0,), comms=(7,)))
    now = 4 * PERIOD
    fresh, old = hb(0, 7, 3, 30, pend=5), hb(0, 7, 3, 30, pend=6)
    fresh["pend_start_ns"], old["pend_start_ns"] = now - PERIOD // 5, now - 3 * PERIOD // 5
    rows = np.concatenate([hb(0, 0, 3, 30), fresh])
    assert m.keep(rows).tolist() == [False, False]
    m2 = HeartbeatMerge(every=100)
    for k in range(3):
        m2.keep(period(k, n=10 * k, ranks=(0,), comms=(7,)))
    assert m2.keep(np.concatenate([hb(0, 0, 3, 30), old])).tolist() == [False, True]


def test_flags_and_dropped_records_are_always_forwarded():
    m = HeartbeatMerge(every=100)
    for k in range(3):
        m.keep(period(k, n=10 * k, ranks=(0,)))
    assert m.keep(period(3, n=30, ranks=(0,), dropped=4)).all()
    assert not m.keep(period(4, n=40, ranks=(0,), dropped=4)).any()
    assert m.keep(period(5, n=50, ranks=(0,), dropped=4, flags=schema.HBF_FINAL)).all()


def test_without_the_process_heartbeat_a_rows_own_counters_decide():
    m = HeartbeatMerge(every=100)
    for k in range(3):
        m.keep(period(k, n=10 * k, ranks=(0,), comms=(7,)))
    assert m.keep(hb(0, 7, 3, 30)).tolist() == [False]  # moved since its previous
    assert m.keep(hb(0, 7, 4, 30)).tolist() == [True]  # did not


def test_a_forgotten_communicator_starts_over():
    m = HeartbeatMerge(every=100)
    for k in range(3):
        m.keep(period(k, n=10 * k, ranks=(0,)))
    m.forget(7)
    assert m.keep(period(3, n=30, ranks=(0,))).tolist() == [False, True, False]


def peer(rank: int, k: int, seq: int, to: int, done: int = 0) -> np.ndarray:
    p = np.zeros(1, schema.PEER)
    p["kind"], p["version"], p["rank"], p["time_ns"] = (
        Kind.PEER,
        schema.SCHEMA_VERSION,
        rank,
        (k + 1) * PERIOD,
    )
    p["comm_id"], p["seq"], p["comm_rank"], p["peer"], p["done"] = 7, seq, rank, to, done
    p["steps_total"], p["steps_done"] = 8, 3
    return p


def test_an_in_flight_transfer_is_forwarded_once_it_outlasts_a_period():
    m = PeerMerge()
    rows = np.concatenate([peer(0, 0, seq=4, to=1), peer(0, 0, seq=4, to=3), peer(1, 0, seq=4, to=2)])
    assert not m.keep(rows).any()  # in flight at one heartbeat: on its way
    rows = np.concatenate([peer(0, 1, seq=4, to=1), peer(0, 1, seq=5, to=3), peer(1, 1, seq=4, to=2)])
    assert m.keep(rows).tolist() == [True, False, True]  # seq 4 to 3 finished, seq 5 began
    # finished transfers (the slow judge's link evidence) always; a stuck one every period
    rows = np.concatenate([peer(0, 2, seq=5, to=3, done=1), peer(0, 2, seq=4, to=1), peer(1, 2, seq=6, to=2)])
    assert m.keep(rows).tolist() == [True, True, False]


def test_a_summary_is_a_report_from_every_member():
    t = H.now_ns()
    eng, ing = _job(t)
    before = eng.ranks.last_recv.copy()
    assert ing.feed(H.as_header(_opsum(t)), t + 5) == 1  # rank 3 (the last arriver) sent it
    ing.tick(t + 6)
    after = eng.ranks.last_recv
    assert (after[:4] == t + 5).all()  # the communicator's members, ranks 0-3
    assert (after[4:] == before[4:]).all()
