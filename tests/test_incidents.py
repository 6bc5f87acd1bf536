"""One verdict per incident: the folding rules (c4d/engine/incidents.py), `c4d analyze`'s summary (one line
per incident) and the master's log policy (opened, ERROR, isolation, end — not every re-count)."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from c4d.engine import DiagKind, Diagnosis, Engine, How, Level, Localization, Target
from c4d.engine.incidents import End, Incidents, incident_key
from c4d.record.trace import TraceWriter
from tests.conftest import c4d_cmd
from tests.factories import T0, Fault, Job, build_cached

S = 1_000_000_000
HANG = Job(
    tp=2,
    pp=2,
    dp=2,
    ranks_per_node=4,
    steps=30,
    hang_times=4,
    tail_s=9.0,
    faults=[Fault("noncomm-hang", rank=6, step=8)],
)


def _loc(ranks, confidence: float) -> Localization:
    """The typed localization every Diagnosis carries (issue 9): a rank found by arrival."""
    return Localization(How.arrival, Target.rank, tuple(ranks), confidence, "test", "test")


def hang(t_s: float, n: int, level=Level.WARNING, ranks=(6,), seq=8, kind=DiagKind.RankNonCommHang, T=1.0):
    return Diagnosis(
        time_ns=int(t_s * S),
        level=level,
        kind=kind,
        comm=0xAB,
        op="AllReduce",
        seq=seq,
        ranks=tuple(ranks),
        nodes=tuple(f"node-{r // 4}" for r in ranks),
        hang_times=n,
        localization=_loc(ranks, 0.9),
        detail={
            "waited_s": n * T,
            "timeout_s": T,
            "localized_by": "arrival",
            "localized": True,
            "confidence": 0.9,
        },
    )


def slow(t_s: float, rank=9, comm=0xCD, window=1.0):
    return Diagnosis(
        time_ns=int(t_s * S),
        level=Level.INFO,
        kind=DiagKind.RankNonCommSlow,
        comm=comm,
        op="AllReduce",
        seq=int(t_s * 10),
        ranks=(rank,),
        nodes=(f"node-{rank // 4}",),
        hang_times=0,
        localization=_loc((rank,), 0.8),
        detail={"window_s": window, "localized_by": "arrival", "confidence": 0.8},
    )


def test_a_hang_counted_to_error_is_one_incident():
    diags = (
        [hang(1 + i, i) for i in range(1, 4)]
        + [hang(4, 4, Level.ERROR)]
        + [hang(4 + i, 4 + i, Level.ERROR) for i in range(1, 16)]
    )
    incs = Incidents.fold(diags, end_ns=int(20.5 * S))
    assert len(incs) == 1
    (i,) = incs
    assert (i.level, i.count, i.reports, i.end) == (Level.ERROR, 19, 19, End.open_at_end)
    assert i.duration_s == 19.0 and i.culprit() == "rank 6" and i.evidence == "arrival"


def test_resolved_superseded_and_slow_folding():
    inc = Incidents()
    events = []
    for d in (hang(1, 1), hang(2, 2)):
        events += inc.observe(d)
    # no report for 1.5 T: it cleared
    events += inc.expire(int(3.6 * S))
    assert [e.change.value for e in events] == ["opened", "ended"] and inc.all[0].end is End.resolved
    # more culprits confirmed on the same op: the same incident, revised (it keeps its number)
    inc.observe(hang(10, 1, ranks=(6,)))
    ev = inc.observe(hang(11, 2, ranks=(4, 5, 6, 7)))
    assert len(inc.all) == 2 and inc.all[1].end is None and [e.change.value for e in ev] == ["revised"]
    assert inc.all[1].culprit() == "ranks 4-7" and inc.all[1].revisions == ["+1.0s: rank 6 -> ranks 4-7"]
    # a slow rank: once per period on two communicators, one incident while it persists
    for t in range(20, 26):
        inc.observe(slow(t, comm=0xCD if t % 2 else 0xEF))
    slow_inc = inc.open[incident_key(slow(20))]
    assert slow_inc.reports == 6 and slow_inc.comms == [f"{0xEF:016x}", f"{0xCD:016x}"]
    assert slow_inc.duration_s == 6.0
    inc.expire(int(27.9 * S))  # < 3 periods since the last report (at 25 s)
    assert slow_inc.end is None
    inc.expire(int(28.1 * S))
    assert slow_inc.end is End.resolved


def test_a_hang_whose_reports_came_late_is_resumed_not_counted_twice():
    """CI run on a loaded host (T = 0.2 s, the master's ticks 0.3-0.4 s apart): one hang's
    re-counts, its count going on (4, 6, ...), were folded into three incidents, each gap over
    1.5 T taken for the hang's end. A report of the same stall (it began when the incident's
    did) resumes the incident; a new stall of the same rank is a new one."""
    inc = Incidents()
    events = []
    for d in (hang(1, 1), hang(2, 2)):
        events += inc.observe(d)
    events += inc.expire(int(3.6 * S))  # the tick came late: taken for the end
    events += inc.observe(hang(4.1, 4))  # the count went on: the same stall
    assert [e.change.value for e in events] == ["opened", "ended", "resumed"]
    assert len(inc.all) == 1 and inc.all[0].end is None and inc.all[0].count == 4
    for t in (5, 6):
        inc.observe(hang(t, t))
    inc.expire(int(9 * S))  # really over
    events = inc.observe(hang(12, 1))  # a new stall of the same rank
    assert [e.change.value for e in events] == ["opened"] and len(inc.all) == 2
    assert inc.all[0].end is End.resolved and inc.all[0].count == 6
    # offline the same: the trace's diagnoses fold into one incident per stall
    late = [hang(1, 1), hang(2, 2), hang(4.1, 4), hang(5, 5), hang(12, 1), hang(13, 2)]
    assert [i.count for i in Incidents.fold(late, end_ns=int(13.5 * S))] == [5, 2]


def test_a_charge_that_moves_between_ops_stays_one_incident():
    """A culprit missing from two ops is charged to the one waited on longest; with clock
    estimates that can flip between evaluations (seen in `c4d demo`: Send #8, AllGather #16,
    Send #8). It is one hung rank: one incident, its count the highest n reached."""
    diags = [
        hang(2, 1, seq=8),
        hang(2.5, 1, seq=16),
        hang(3, 2, seq=8),
        hang(4, 3, Level.ERROR, seq=8),
    ]
    (i,) = Incidents.fold(diags)
    assert (i.level, i.count, i.reports) == (Level.ERROR, 3, 4)
    assert i.where() == f"{0xAB:016x} AllReduce #8 +1" and len(i.sites) == 2


def _hang_trace(path):
    """The master's loop over a factory-built job: records and TICKs into a trace file."""
    model, batches = build_cached(HANG)
    tw = TraceWriter(path, {"created_ns": T0})
    eng = Engine()
    diags = []
    tick, end = int(HANG.tick_ms * 1e6), model.end_time + 1e9
    last, nxt, i = T0, tick, 0
    tw.tick(T0)
    while nxt <= end:
        while i < len(batches) and batches[i][0] <= nxt:
            tw.write(batches[i][1])
            eng.feed(batches[i][1], last)
            i += 1
        last = int(T0 + nxt)
        tw.tick(last)
        diags += eng.tick(last)
        nxt += tick
    tw.close()
    return diags


@pytest.mark.slow
def test_analyze_prints_one_line_per_incident(tmp_path):
    path = tmp_path / "hang.c4d"
    diags = _hang_trace(path)
    assert len(diags) >= 6, "the hang must be re-counted several times for this test to mean anything"
    p = subprocess.run(c4d_cmd("analyze", path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr  # a diagnosis at WARNING or above
    out = p.stdout.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("#  kind"))
    rows = out[head + 1 :]
    expected = Incidents.fold(diags)
    assert len(rows) == len(expected) == 1, p.stdout
    row = rows[0].split()
    assert row[:5] == ["1", "RankNonCommHang", "ERROR", "rank", "6"]
    assert "node-1" in row and "arrival" in row
    assert sum("RankNonCommHang" in line for line in out) == 1  # not the 18-line stream
    # the full stream is still there: --all lists every diagnosis, --json prints every one
    p = subprocess.run(c4d_cmd("analyze", path, "--all"), capture_output=True, text=True, timeout=120)
    assert sum(
        line.startswith(("WARNING RankNonCommHang", "ERROR RankNonCommHang"))
        for line in p.stdout.splitlines()
    ) == len(diags)
    p = subprocess.run(c4d_cmd("analyze", path, "--json"), capture_output=True, text=True, timeout=120)
    assert [json.loads(line)["hang_times"] for line in p.stdout.splitlines()] == [d.hang_times for d in diags]


def test_master_logs_each_incident_at_its_steps_only(caplog, tmp_path):
    """WARNING when it opens, ERROR when it escalates, the blacklist, the end; never n=4, n=5 ..."""
    from c4d.master.master import Master, MasterConfig

    m = Master(MasterConfig(bind=f"ipc://{tmp_path}/m.sock"))  # its sinks fed by hand
    try:
        with caplog.at_level(logging.INFO, logger="c4d"):
            for i in range(1, 13):
                m._emit(hang(i, i, Level.ERROR if i >= 4 else Level.WARNING))
            m._log_events(m.incidents.expire(int(30 * S)))
    finally:
        m.close()
    msgs = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [lvl for lvl, _ in msgs] == ["WARNING", "ERROR", "ERROR"], msgs
    assert "(n=1," in msgs[0][1] and "(n=4," in msgs[1][1] and "resolved" in msgs[2][1]
    assert all("#1 " in m for _, m in msgs)


def test_found_means_warning_or_above():
    from c4d.cli_common import found

    assert found([hang(1, 1)]) and found([slow(1), hang(1, 4, Level.ERROR)])
    assert not found([slow(1), slow(2)]) and not found([])


def _comm_slow(t_s: float, ranks: tuple[int, ...], target: str) -> Diagnosis:
    from c4d.engine.types import How, Localization, Target

    link = ranks if target == "link" else None
    loc = Localization(How.exclusion, Target(target), ranks, 0.5, f"RankCommSlow:x/{target}", "x", link=link)
    return Diagnosis(
        time_ns=int(t_s * S), level=Level.INFO, kind=DiagKind.RankCommSlow, comm=0xAB, op="AllReduce",
        seq=int(t_s), ranks=ranks, nodes=tuple(f"node-{r // 4}" for r in ranks), hang_times=0,
        localization=loc, detail={"window_s": 1.0},
    )  # fmt: skip


def test_an_incident_revised_from_suspects_to_link_to_rank_keeps_its_number():
    """One fault, one incident: as more units are judged the localization moves (suspects 1,7 ->
    link 1-7 -> rank 7); each step is a revision of incident #1, said in its ``revisions``. A
    fault elsewhere opens its own."""
    inc = Incidents()
    changes = []
    for d in (_comm_slow(1, (1, 7), "suspects"), _comm_slow(2, (1, 7), "link"), _comm_slow(3, (7,), "rank"),
              _comm_slow(4, (7,), "rank"), _comm_slow(4, (2, 4), "link")):  # fmt: skip
        changes += [(e.change.value, e.incident.id) for e in inc.observe(d)]
    assert changes == [("opened", 1), ("revised", 1), ("revised", 1), ("opened", 2)]
    first = inc.all[0]
    assert first.culprit() == "rank 7" and first.reports == 4
    assert first.revisions == ["+1.0s: suspects 1,7 -> link 1<->7", "+2.0s: link 1<->7 -> rank 7"]
    assert inc.all[1].culprit() == "link 2<->4"
