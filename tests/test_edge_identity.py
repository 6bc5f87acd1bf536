"""Issue 41: a rank is its first registration. A later REGISTER of a registered rank naming
another node or pid, or other thresholds, is refused and counted; a restarted rank (a new pid
after the old one said FINAL, was declared lost, or fell silent) registers anew on its node.
Through the real edge and engine (c4d/intake/validate.py, c4d/intake/ingest.py), and through the Master."""

from __future__ import annotations

import io

import numpy as np
import pytest

from c4d.intake.validate import Limits
from c4d.master.master import Master, MasterConfig
from c4d.record import schema
from tests import hostile as H
from tests import test_edge_master as EM
from tests.test_edge_ingest import _job

WORLD = 8
S = 1_000_000_000


def _reg(rank: int, t: int, **change) -> np.ndarray:
    r = H.registers(WORLD, t)[rank : rank + 1].copy()
    for k, v in change.items():
        r[k] = v
    return r


def _final(rank: int, t: int) -> np.ndarray:
    hb = H.heartbeats(WORLD, t, cid=0)[rank : rank + 1].copy()
    hb["comm_rank"], hb["comm_nranks"] = rank, WORLD
    hb["hb_flags"] = schema.HBF_FINAL
    return hb


def test_a_forged_register_changes_neither_a_ranks_node_nor_the_jobs_thresholds():
    t = H.now_ns()
    eng, ing = _job(t)
    node5, job = eng.ranks.node_name(5), dict(eng.ranks.job)
    forged_node = _reg(5, t, node=b"victim-node")  # same pid: a forged node
    forged_pid = _reg(5, t, pid=99999)  # the rank is alive (heard this instant): not a restart
    forged_t = _reg(0, t, hang_timeout_us=3_600_000_000)  # rank 0's thresholds are the job's
    assert ing.feed(H.as_header(forged_node, forged_pid, forged_t), t) == 0
    ing.tick(t + 1)
    assert ing.edge.rejected == {"rank identity changed": 2, "job settings changed": 1}
    assert eng.ranks.node_name(5) == node5 == "node-1" and eng.ranks.job == job
    assert int(eng.ranks.pid[5]) == 1005
    # the rank's own repeat is taken as before
    assert ing.feed(H.as_header(_reg(5, t)), t) == 1


@pytest.mark.parametrize("gone", ["final", "lost", "silent"])
def test_a_restarted_rank_registers_anew_on_its_node(gone):
    t = H.now_ns()
    eng, ing = _job(t)
    when = t
    if gone == "final":
        ing.feed(H.as_header(_final(3, t)), t)
    elif gone == "lost":
        ing.edge.lost([3])  # as Ingest does for a RankLost diagnosis
    else:
        when = t + 3 * 100_000_000  # three of the job's 100 ms heartbeat periods without a record of it
    assert ing.feed(H.as_header(_reg(3, when, pid=7777)), when) == 1
    ing.tick(when + 1)
    assert int(eng.ranks.pid[3]) == 7777 and not ing.edge.rejected
    # the new incarnation is the rank now: the old pid is the forgery
    assert ing.feed(H.as_header(_reg(3, when, pid=1003)), when) == 0
    assert ing.edge.rejected == {"rank identity changed": 1}


def test_a_restarted_rank_on_another_node_needs_the_launchers_word():
    t = H.now_ns()
    for may_move, taken in ((False, 0), (True, 1)):
        eng, ing = _job(t, Limits(ranks_may_move=may_move))
        ing.feed(H.as_header(_final(3, t)), t)
        assert ing.feed(H.as_header(_reg(3, t, pid=7777, node=b"spare-0")), t) == taken
        ing.tick(t + 1)
        assert eng.ranks.node_name(3) == ("spare-0" if may_move else "node-0")


def test_a_new_pid_just_short_of_three_heartbeat_periods_is_refused():
    t = H.now_ns()
    _eng, ing = _job(t)
    when = t + 3 * 100_000_000 - 1
    assert ing.feed(H.as_header(_reg(3, when, pid=7777)), when) == 0
    assert ing.edge.rejected == {"rank identity changed": 1}


def test_the_decisions_do_not_depend_on_how_rows_are_cut_into_batches():
    """A FINAL then the new incarnation's REGISTER in one batch count as in two; a forged node
    between them is refused either way."""
    t = H.now_ns()
    rows = H.as_header(_final(3, t), _reg(3, t, node=b"x"), _reg(3, t, pid=7777), _reg(5, t, pid=1))
    got = []
    for cuts in ([4], [1, 3], [1, 1, 1, 1], [2, 2]):
        _eng, ing = _job(t)
        at = 0
        for n in cuts:
            ing.feed(rows[at : at + n], t)
            at += n
        got.append((dict(ing.edge.rejected), int(ing.edge._pid[3])))
    assert got == [({"rank identity changed": 2}, 7777)] * 4


def test_forged_registers_at_the_master_neither_move_the_blame_nor_delay_the_error(tmp_path):
    """The issue's probe through the Master: a forged REGISTER of the culprit naming another
    node, and one of rank 0 with a one-hour hang timeout, sent while the job runs: the blacklist
    and the diagnosis name the culprit's own node, at the master time they do without them."""
    (tmp_path / "calm").mkdir()
    calm, _ = EM._master(tmp_path / "calm")
    try:
        base = EM._drive(calm)
    finally:
        calm.close()

    def forge(k: int, t: int) -> list[np.ndarray]:
        if k not in (5, 10):
            return []
        r = H.registers(WORLD, t)
        victim = r[EM.CULPRIT : EM.CULPRIT + 1].copy()
        victim["node"] = b"victim-node"
        slow = r[0:1].copy()
        slow["hang_timeout_us"] = 3_600_000_000
        return [H.as_header(victim, slow)]

    bl = tmp_path / "blacklist.txt"
    m = Master(MasterConfig(bind="tcp://127.0.0.1:0", trace=str(tmp_path / "m.c4d"), blacklist=str(bl)),
               out=io.StringIO())  # fmt: skip
    try:
        got = EM._drive(m, forge)
        errors = [d for d in m.diagnoses if d.level.name == "ERROR"]
        refused = m.edge.rejected["rank identity changed"] + m.edge.rejected["job settings changed"]
    finally:
        m.close()
    assert got["first_error_ns"] == base["first_error_ns"] is not None
    assert errors and errors[0].ranks == (EM.CULPRIT,) and errors[0].nodes == (EM.EVIL_CLEAN,)
    assert bl.read_text() == f"{EM.EVIL_CLEAN}\n"
    assert refused == 4
