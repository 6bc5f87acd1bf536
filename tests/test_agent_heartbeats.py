"""A node agent forwards the heartbeats of ranks that stand still and few of progressing ranks
(c4d/agent/heartbeats.py); the master counts a summary as a report from every member. That
the diagnoses stay those of the raw stream is tests/test_agent_summary.py's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.agent.heartbeats import HeartbeatMerge, PeerMerge
from c4d.record import schema
from c4d.record.schema import Kind
from tests import hostile as H
from tests.test_agent_untrusted import _job, _opsum

NONE = schema.UINT64_MAX
PERIOD = 200_000_000
MOVES = ("n_issued", "n_arrived", "n_done", "last_arrive_ns", "last_done_ns")


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


class _Rule:
    """The merge's rule (the module's docstring) row by row, in arrival order: the reference the
    array version is held to."""

    def __init__(self, every: int) -> None:
        self.every, self.s = every, {}

    def keep(self, rows: np.ndarray) -> list[bool]:
        moved, last = {}, {}  # (rank, time) -> progressed; rank -> its batch's previous (arrived, done)
        for h in rows[rows["comm_id"] == 0]:
            g, cur = int(h["rank"]), (int(h["n_arrived"]), int(h["n_done"]))
            sl = self.s.get((0, g))
            if g in last:
                moved[g, int(h["time_ns"])] = cur != last[g]
            else:
                moved[g, int(h["time_ns"])] = sl is not None and sl["seen"] and cur != sl["moves"][1:3]
            last[g] = cur
        out = []
        for h in rows:
            key, t = (int(h["comm_id"]), int(h["rank"])), int(h["time_ns"])
            sl = self.s.setdefault(key, {"moves": (0,) * 5, "pend": 0, "dropped": 0, "skipped": 0,
                                         "time": 0, "forced": False, "seen": False})  # fmt: skip
            mv = tuple(
                int(h[f]) for f in ("n_issued", "n_arrived", "n_done", "last_arrive_ns", "last_done_ns")
            )
            p = moved.get((key[1], t), mv != sl["moves"])
            since = int(h["pend_start_ns"]) or int(h["pend_issue_ns"])
            long = since > 0 and t - since > (t - sl["time"]) // 2
            pend = int(h["pend_seq"])
            stalled = key[0] != 0 and pend != NONE and (pend == sl["pend"] or (sl["seen"] and long))
            stop = not p or stalled
            fwd = (not sl["seen"] or stop or int(h["hb_flags"]) != 0 or int(h["dropped"]) != sl["dropped"]
                   or sl["forced"] or sl["skipped"] + 1 >= self.every)  # fmt: skip
            sl.update(moves=mv, pend=pend, dropped=int(h["dropped"]), time=t, forced=stop or not sl["seen"],
                      skipped=0 if fwd else sl["skipped"] + 1, seen=True)  # fmt: skip
            out.append(fwd)
        return out


_ROW = st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 1), st.integers(0, 1),
                 st.sampled_from([NONE, 0, 1]), st.integers(0, 3), st.integers(0, 19))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 2), st.lists(_ROW, max_size=14)), max_size=12))
def test_the_merge_decides_as_its_rule_row_by_row(every, batches):
    """Random batches (ranks with one or several heartbeats of an instant, communicators and the
    process, counters that move or not, pending ops old and new, flags, drops): the array version
    forwards what the rule applied row by row in arrival order forwards."""
    m, rule = HeartbeatMerge(every), _Rule(every)
    moved = {}
    t = PERIOD
    for step, rows in batches:
        t += step * PERIOD // 2
        b = np.zeros(len(rows), schema.HEARTBEAT)
        b["kind"], b["version"] = Kind.HEARTBEAT, schema.SCHEMA_VERSION
        for i, (g, c, later, move, pend, flags, age) in enumerate(rows):
            n = moved[g, c] = moved.get((g, c), 0) + move
            b[i]["rank"], b[i]["comm_id"], b[i]["time_ns"] = g, (0, 7, 9)[c], t + later * PERIOD // 4
            b[i]["n_issued"] = b[i]["n_arrived"] = b[i]["n_done"] = n
            b[i]["pend_seq"], b[i]["hb_flags"], b[i]["dropped"] = pend, flags == 3, flags == 2
            b[i]["pend_start_ns" if age % 2 else "pend_issue_ns"] = max(0, t - age * PERIOD // 10)
        assert m.keep(b).tolist() == rule.keep(b)
