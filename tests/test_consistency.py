"""Live consistency (c4d/engine/consistency.py): members of one collective that call it with a
different op, count, dtype, root or reduction op are named at once, the minority as culprits,
never isolated; clean jobs give none. Engine cases on the factory stream (tests/factories.py),
one through node agents (c4d/agent/summary.py), and real simnccl jobs for each what=."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import wait_for

from c4d.agent.summary import Summariser
from c4d.engine import Engine, EngineConfig
from c4d.engine.consistency import PendingWatch
from c4d.engine.types import DiagKind, Target
from c4d.record import schema
from tests import factories, one_comm_at_a_time

MS = 1_000_000


def _mutate(batches, rank: int, nranks: int, seq: int, **fields):
    """The stream with ``rank``'s OP record of (its communicator of ``nranks`` members, ``seq``)
    changed; and the feed time of the op's last member record."""
    out, hit = [], None
    for t, b in batches:
        v = b.view(schema.HEADER)
        if hit is None and ((v["kind"] == schema.Kind.OP) & (v["rank"] == rank)).any():
            o = b.view(schema.OP)
            mine = (v["kind"] == schema.Kind.OP) & (o["rank"] == rank) & (o["comm_nranks"] == nranks)
            idx = np.flatnonzero(mine & (o["seq"] == seq) & ((o["flags"] & schema.OpFlag.P2P) == 0))
            if len(idx):
                b = b.copy()
                o = b.view(schema.OP)
                for k, val in fields.items():
                    o[k][idx[0]] = val
                hit = int(o["comm_id"][idx[0]])
        out.append((t, b))
    assert hit is not None
    last = max(t for t, b in out if _has_op(b, hit, seq))
    return out, hit, last


def _has_op(b, cid, seq) -> bool:
    v = b.view(schema.HEADER)
    o = b.view(schema.OP)
    return bool(((v["kind"] == schema.Kind.OP) & (o["comm_id"] == cid) & (o["seq"] == seq)).any())


def _mismatches(run):
    return [d for d in run.diagnoses if d.kind is DiagKind.CollectiveMismatch]


JOB = factories.Job(tp=2, dp=4, steps=10, ranks_per_node=4)


@pytest.mark.parametrize(
    ("fields", "differs"),
    [
        ({"dtype": int(schema.DType.int32)}, ["dtype"]),
        ({"count": 17}, ["count"]),
        ({"op": int(schema.Op.Broadcast), "peer": 0}, ["op"]),
        ({"redop": 2}, ["redop"]),
    ],
    ids=["dtype", "count", "op", "redop"],
)
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_a_disagreeing_member_is_named_at_once(fields, differs, batched, monkeypatch):
    """One rank of a 4-member DP all-reduce calls it differently: one CollectiveMismatch WARNING,
    that rank alone, what differs and both sides' values, at the first tick after the last
    member's record; nothing else, nothing isolated (the job goes on)."""
    if not batched:
        one_comm_at_a_time.use(monkeypatch)
    model, batches = factories.build_cached(JOB)
    bs, cid, last = _mutate(batches, rank=3, nranks=4, seq=5, **fields)
    run = factories.replay(JOB, lambda: Engine(EngineConfig()), bs, model)
    ms = _mismatches(run)
    assert len(ms) == 1, [d.summary() for d in run.diagnoses]
    d = ms[0]
    assert d.level.name == "WARNING" and d.ranks == (3,) and d.comm == cid and d.seq == 5
    assert d.detail["differs"] == differs and d.detail["evidence"] == "records"
    assert d.localization.target is Target.minority and not d.localization.isolates
    sides = d.detail["sides"]
    assert [len(s["ranks"]) for s in sides] == [3, 1] and sides[1]["ranks"] == [3]
    assert (d.time_ns - factories.T0) - last <= JOB.tick_ms * MS  # within one tick of the last arrival
    assert not [x for x in run.diagnoses if x.level.name == "ERROR"]


def test_clean_jobs_have_no_mismatch():
    for job in (JOB, factories.Job(tp=4, pp=2, dp=2, steps=8, ranks_per_node=8, seed=3)):
        run = factories.run_cached(job)
        assert not _mismatches(run), [d.summary() for d in _mismatches(run)]


def test_no_majority_names_every_member_as_suspects():
    """A two-member TP group whose members disagree: no minority, both named as suspects."""
    model, batches = factories.build_cached(JOB)
    bs, _, _ = _mutate(batches, rank=1, nranks=2, seq=4, count=3)
    ms = _mismatches(factories.replay(JOB, lambda: Engine(EngineConfig()), bs, model))
    assert len(ms) == 1 and ms[0].ranks == (0, 1) and ms[0].localization.target is Target.suspects


def test_user_reduction_ops_are_not_compared_by_handle():
    """NCCL numbers user-created reduction ops per communicator: two handles of user ops are
    not a disagreement; a user op against a built-in one is."""
    model, batches = factories.build_cached(JOB)
    bs = [(t, b.copy()) for t, b in batches]
    for _, b in bs:
        v, o = b.view(schema.HEADER), b.view(schema.OP)
        m = (v["kind"] == schema.Kind.OP) & (o["redop"] != 255)
        o["redop"][m] = 5 + (o["rank"][m] % 3)  # every rank its own user op handle
    assert not _mismatches(factories.replay(JOB, lambda: Engine(EngineConfig()), bs, model))
    bs2, _, _ = _mutate(batches, rank=2, nranks=4, seq=3, redop=7)
    assert [
        d.ranks for d in _mismatches(factories.replay(JOB, lambda: Engine(EngineConfig()), bs2, model))
    ] == [(2,)]


def _through_agents(job, batches):
    """Each node's records through its own summariser, then the engine (as c4d agent does)."""
    eng = Engine(EngineConfig())
    agents: dict[int, Summariser] = {}
    out, tick, next_tick, last_tick = [], job.tick_ms * MS, job.tick_ms * MS, factories.T0
    bi = 0
    end = max(t for t, _ in batches) + 4 * tick
    while next_tick <= end:
        while bi < len(batches) and batches[bi][0] <= next_tick:
            b = batches[bi][1].view(schema.HEADER)
            for n in np.unique(b["rank"] // job.ranks_per_node).tolist():
                s = agents.setdefault(n, Summariser())
                fwd = s.feed(b[b["rank"] // job.ranks_per_node == n])
                if len(fwd):
                    eng.feed(fwd, last_tick)
            bi += 1
        last_tick = int(factories.T0 + next_tick)
        out += eng.tick(last_tick)
        next_tick += tick
    return out, agents


def test_a_mismatch_inside_a_node_is_forwarded_not_summarised():
    """A node-local TP group of 4 (one agent summarises it): a member that disagrees makes the
    agent forward every member's record of that op, and the master names it; the clean job
    through the same agents: nothing."""
    job = factories.Job(tp=4, dp=2, steps=8, ranks_per_node=4)
    _, batches = factories.build_cached(job)
    out, agents = _through_agents(job, batches)
    assert sum(a.stats["summaries"] for a in agents.values()) > 0  # the TP ops were summarised
    assert not [d for d in out if d.kind is DiagKind.CollectiveMismatch]
    bs, cid, _ = _mutate(batches, rank=5, nranks=4, seq=6, dtype=int(schema.DType.bfloat16))
    out, agents = _through_agents(job, bs)
    ms = [d for d in out if d.kind is DiagKind.CollectiveMismatch]
    assert [(d.ranks, d.comm, d.seq, d.detail["differs"]) for d in ms] == [((5,), cid, 6, ["dtype"])]
    assert sum(a.stats["ops with disagreeing members"] for a in agents.values()) == 1


# -- ops that hang on every member: heartbeats ---------------------------------------------

HANG_JOB = factories.Job(
    tp=2, dp=4, steps=12, ranks_per_node=4, faults=[factories.Fault("comm-hang", link=(2, 4), step=5)]
)


def hung_op(model, size: int):
    """(comm index, seq, members, last member's arrival) of the first collective of a
    communicator of ``size`` members that never ended on any member."""
    hung = [o for ops in model.ops for o in ops if o.end == factories.INF and not o.flags & schema.OpFlag.P2P]
    hung = [o for o in hung if len(model.comms[o.comm].members) == size]
    o = min(hung, key=lambda o: (o.issue, o.comm))
    return o.comm, o.seq, model.comms[o.comm].members, model.last_arrival[(o.comm, o.seq)]


def with_pending(batches, cid: int, seq: int, rank: int, **fields):
    """The stream with ``rank``'s heartbeats pending in (``cid``, ``seq``) changed: what it
    says of its pending op when it called it differently."""
    out = []
    for t, b in batches:
        v, h = b.view(schema.HEADER), b.view(schema.HEARTBEAT)
        m = (
            (v["kind"] == schema.Kind.HEARTBEAT)
            & (h["rank"] == rank)
            & (h["comm_id"] == cid)
            & (h["pend_seq"] == seq)
        )
        if m.any():
            b = b.copy()
            h = b.view(schema.HEARTBEAT)
            for k, val in fields.items():
                h[k][m] = val
        out.append((t, b))
    return out


@pytest.mark.parametrize(
    ("fields", "differs"),
    [({"pend_count": 17}, ["count"]), ({"pend_dtype": int(schema.DType.float64)}, ["dtype"])],
    ids=["count", "dtype"],
)
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_an_op_that_hangs_everywhere_is_named_from_heartbeats(fields, differs, batched, monkeypatch):
    """Every member of a DP all-reduce arrives and waits (no OP record ever comes); one calls it
    with another count or dtype (its heartbeats say so): a CollectiveMismatch at WARNING from
    heartbeats within one heartbeat and a tick of the last member's arrival, that rank alone,
    both sides' values; the stall then counted on as the same incident up to ERROR, never a
    hardware verdict, nothing isolated."""
    if not batched:
        one_comm_at_a_time.use(monkeypatch)
    model, batches = factories.build_cached(HANG_JOB)
    ci, seq, members, last = hung_op(model, 4)
    cid = model.comms[ci].cid
    bad = members[3]
    run = factories.replay(
        HANG_JOB, lambda: Engine(EngineConfig()), with_pending(batches, cid, seq, bad, **fields), model
    )
    ms = _mismatches(run)
    assert ms and {d.kind for d in run.diagnoses} == {DiagKind.CollectiveMismatch}, [
        d.summary() for d in run.diagnoses
    ]
    d = ms[0]
    assert d.level.name == "WARNING" and d.ranks == (bad,) and d.comm == cid and d.seq == seq
    assert d.detail["differs"] == differs and d.detail["evidence"] == "heartbeats"
    sides = d.detail["sides"]
    assert [s["ranks"] for s in sides] == [sorted(members[:3]), [bad]]
    f = differs[0]
    want = {"count": 17, "dtype": "float64"}[f]
    assert sides[1][f] == want and sides[0][f] != want
    assert (d.time_ns - factories.T0) - last <= (HANG_JOB.hb_ms + HANG_JOB.tick_ms) * MS
    assert all(x.ranks == (bad,) for x in ms) and ms[-1].level.name == "ERROR"  # one incident
    assert not any(x.localization.isolates for x in run.diagnoses)
    # the same stream without the change: a hang, no mismatch
    assert not _mismatches(factories.run_cached(HANG_JOB))


def test_a_pending_op_of_unknown_size_compares_op_and_root_only():
    """A member whose heartbeat cannot say its pending op's dtype (schema 1, an import: 255)
    leaves count and dtype uncompared: the plain hang, no mismatch."""
    model, batches = factories.build_cached(HANG_JOB)
    ci, seq, members, _ = hung_op(model, 4)
    bs = with_pending(batches, model.comms[ci].cid, seq, members[1], pend_count=17, pend_dtype=255)
    assert not _mismatches(factories.replay(HANG_JOB, lambda: Engine(EngineConfig()), bs, model))


def test_the_new_fields_reach_the_master_through_agents():
    """The node agents' heartbeat merge forwards the pending op's count whole: the same verdict."""
    model, batches = factories.build_cached(HANG_JOB)
    ci, seq, members, _ = hung_op(model, 4)
    cid = model.comms[ci].cid
    out, _ = _through_agents(HANG_JOB, with_pending(batches, cid, seq, members[2], pend_count=99))
    ms = [d for d in out if d.kind is DiagKind.CollectiveMismatch]
    assert ms and ms[0].ranks == (members[2],) and ms[0].detail["evidence"] == "heartbeats"
    assert ms[0].detail["sides"][1]["count"] == 99


HB_JOBS = [
    factories.Job(tp=2, dp=4, steps=step + 6, ranks_per_node=4, hb_ms=1000.0,
                  faults=[factories.Fault("comm-hang", link=link, step=step)])
    for step, link in [(2, (6, 0)), (3, (2, 4))]
]  # fmt: skip


@pytest.mark.parametrize("job", HB_JOBS, ids=[f"step{j.faults[0].step}" for j in HB_JOBS])
def test_a_pending_disagreement_is_named_within_one_heartbeat_of_the_last_arrival(job):
    """The job's default 1 s heartbeats and 0.2 s ticks: a DP all-reduce hangs on every member,
    one of which called it with another count (its heartbeats say so). The master evaluates when
    the heartbeat that completes the evidence comes (its pending watch), so the verdict comes
    within one heartbeat period of the last member's arrival, and a quarter tick more at most
    (the watch's tick waits that long after the last tick). Evaluating at ticks only, it came a
    heartbeat and up to a tick after. The clean stream never asks for an evaluation."""
    model, batches = factories.build_cached(job)
    ci, seq, members, last = hung_op(model, 4)
    cid = model.comms[ci].cid
    worst = worst_ticks = 0.0
    for bad in members:
        diags, watch = factories.as_master(job, with_pending(batches, cid, seq, bad, pend_count=17))
        ms = [d for d in diags if d.kind is DiagKind.CollectiveMismatch]
        assert ms and ms[0].ranks == (bad,) and ms[0].detail["evidence"] == "heartbeats"
        assert watch.fires == 1
        late = (ms[0].time_ns - factories.T0) - last
        assert 0 < late <= (job.hb_ms + job.tick_ms / 4) * MS, late / MS
        worst = max(worst, late)
        ticks_only, _ = factories.as_master(
            job, with_pending(batches, cid, seq, bad, pend_count=17), early=False
        )
        t2 = next(d.time_ns for d in ticks_only if d.kind is DiagKind.CollectiveMismatch)
        assert t2 >= ms[0].time_ns
        worst_ticks = max(worst_ticks, t2 - factories.T0 - last)
    assert worst_ticks > job.hb_ms * MS  # (what the watch's evaluation saves here)
    clean, watch = factories.as_master(job, batches)
    assert watch.fires == 0 and not [d for d in clean if d.kind is DiagKind.CollectiveMismatch]


def test_the_pending_watch_asks_only_when_the_evidence_is_complete():
    """PendingWatch on hand-made heartbeats of one 3-member communicator: nothing while a member
    has not reported the seq, nothing when all agree, once when the last one completes a
    disagreement (not again for the same op), and a member that moved on (finished it) leaves
    the op incomplete."""
    w = PendingWatch()

    def hb(cr: int, seq: int, count: int = 8, start: int = 1):
        a = np.zeros(1, schema.HEARTBEAT)
        a["kind"], a["version"], a["rank"] = schema.Kind.HEARTBEAT, schema.SCHEMA_VERSION, cr
        a["comm_id"], a["comm_rank"], a["comm_nranks"] = 77, cr, 3
        a["pend_seq"], a["pend_op"], a["pend_count"] = seq, int(schema.Op.AllReduce), count
        a["pend_dtype"], a["pend_redop"], a["pend_peer"], a["pend_start_ns"] = 7, 0, -1, start
        return a.view(schema.HEADER)

    assert not w.feed(hb(0, 4)) and not w.feed(hb(1, 4))
    assert not w.feed(hb(2, 4))  # all alike
    assert not w.feed(hb(0, 5)) and not w.feed(hb(1, 5, count=9))  # member 2 not in it yet
    assert w.feed(hb(2, 5)) and w.take() and not w.due
    assert not w.feed(hb(2, 5)) and w.fires == 1  # the same op: once
    assert not w.feed(hb(0, 6)) and not w.feed(hb(1, 6, count=9))
    nothing = hb(0, 0)
    nothing.view(schema.HEARTBEAT)["pend_seq"] = schema.UINT64_MAX
    assert not w.feed(nothing)  # member 0 finished 6
    assert not w.feed(hb(2, 6)) and w.fires == 1
    both = np.concatenate([hb(0, 7), hb(1, 7), hb(2, 7, count=3)])
    assert w.feed(both) and w.fires == 2  # one batch completing it
    w.forget([77])
    assert not len(w.ids)


# -- point to point --------------------------------------------------------------------------

PP_JOB = factories.Job(tp=1, pp=2, dp=2, steps=8, ranks_per_node=4)


def test_a_send_and_its_receive_of_different_size_are_named():
    """A pipeline send and its receive whose counts (or dtypes) differ: a CollectiveMismatch
    naming both ranks as suspects (two sides, no majority), from their OP records; the clean
    job: none."""
    model, batches = factories.build_cached(PP_JOB)
    assert not _mismatches(factories.replay(PP_JOB, lambda: Engine(EngineConfig()), batches, model))
    for field, val, differs in (("count", 3, ["count"]), ("dtype", int(schema.DType.bfloat16), ["dtype"])):
        out, hit = [], None
        for t, b in batches:
            v, o = b.view(schema.HEADER), b.view(schema.OP)
            m = (v["kind"] == schema.Kind.OP) & (o["op"] == schema.Op.Recv) & (o["seq"] == 3)
            if hit is None and m.any():
                b = b.copy()
                o = b.view(schema.OP)
                i = int(np.flatnonzero(m)[0])
                o[field][i] = val
                hit = (int(o["rank"][i]), int(o["comm_id"][i]), int(o["peer"][i]))
            out.append((t, b))
        assert hit is not None
        ms = _mismatches(factories.replay(PP_JOB, lambda: Engine(EngineConfig()), out, model))
        assert len(ms) == 1, [d.summary() for d in ms]
        d = ms[0]
        assert d.detail["p2p"] and d.detail["differs"] == differs and d.detail["evidence"] == "records"
        assert d.comm == hit[1] and d.seq == 3 and hit[0] in d.ranks and len(d.ranks) == 2
        assert d.localization.target is Target.suspects and not d.localization.isolates
        assert [s["op"] for s in d.detail["sides"]] == ["Send", "Recv"]


def test_a_send_and_its_receive_pending_with_different_counts_are_named():
    """Both ends of a pipeline transfer wait (a hung link); the receiver's heartbeat says another
    count than the sender's: named from heartbeats, both ranks as suspects, and the stall
    counted on as the same incident."""
    job = factories.Job(
        tp=1,
        pp=2,
        dp=2,
        steps=10,
        ranks_per_node=2,
        faults=[factories.Fault("comm-hang", link=(0, 1), step=4)],  # the pipeline link of ranks 0 and 1
    )
    model, batches = factories.build_cached(job)
    hung = [o for ops in model.ops for o in ops if o.end == factories.INF and o.op == schema.Op.Recv]
    o = min(hung, key=lambda o: o.issue)
    c = model.comms[o.comm]
    r = c.members[o.crank]
    bs = with_pending(batches, c.cid, o.seq, r, pend_count=5)
    run = factories.replay(job, lambda: Engine(EngineConfig()), bs, model)
    ms = _mismatches(run)
    assert ms and {x.kind for x in run.diagnoses} == {DiagKind.CollectiveMismatch}, run.kinds()
    assert ms[-1].level.name == "ERROR" and all(x.ranks == ms[0].ranks for x in ms)  # the stall: one incident
    d = ms[0]
    assert d.detail["p2p"] and d.detail["differs"] == ["count"] and d.detail["evidence"] == "heartbeats"
    assert set(d.ranks) == {r, c.members[o.peer]} and d.level.name == "WARNING"


# -- real simnccl jobs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "evidence", "stalls"),
    [
        ("op", "heartbeats", True),
        ("root", "heartbeats", True),
        ("count", "records", False),
        ("dtype", "records", False),
        ("count-hang", "heartbeats", True),
        ("dtype-hang", "heartbeats", True),
    ],
)
@pytest.mark.slow
def test_sim_mismatch_is_named_at_once(what, evidence, stalls, tmp_path):
    """c4d sim with mismatch@rank=2,what=W: the rank named before T (hang count 0), from the
    records of an op NCCL completes with wrong data or the heartbeats of one it hangs in; a
    stall counted on as the same incident up to ERROR; nothing isolated, nothing else named."""
    p = subprocess.run(
        [sys.executable, "-m", "c4d", "sim", "--quick", "--ranks", "4", "--ranks-per-node", "2",
         "--steps", "12", "--fault", f"mismatch@rank=2,what={what},step=3", "--json", "--max-seconds", "60"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    ds = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 2, p.stderr[-2000:]
    assert ds and {d["kind"] for d in ds} == {"CollectiveMismatch"}, ds
    first = ds[0]
    assert first["level"] == "WARNING" and first["hang_times"] == 0 and first["ranks"] == [2]
    field = what.removesuffix("-hang")
    assert first["detail"]["differs"] == [field] and first["detail"]["evidence"] == evidence
    if what.endswith("-hang"):  # every member hangs in it: its size from the heartbeats
        sides = first["detail"]["sides"]
        assert sides[1]["ranks"] == [2] and sides[1][field] != sides[0][field]
        assert {s[field] for s in sides} == ({1, 4} if field == "count" else {"float32", "float64"})
    assert all(d["ranks"] == [2] for d in ds)  # one incident
    assert not any(d["detail"].get("isolates") for d in ds)
    assert ("ERROR" in {d["level"] for d in ds}) == stalls
    assert p.stderr.count("CollectiveMismatch: rank 2") >= 1 and "#2 " not in p.stderr


@pytest.mark.skipif(
    not shutil.which("gdb") and not shutil.which("eu-stack"), reason="no gdb or eu-stack here"
)
def test_a_mismatch_its_members_hang_in_keeps_each_sides_stacks(tmp_path):
    """c4d run's evidence (c4d/run/evidence.py) for a CollectiveMismatch named from heartbeats:
    the minority's stacks as the culprit's, the other side's as victims', each waiting in the
    op; one named from records (the op completed) dumps nothing."""
    from c4d.run.evidence import Evidence, ranks_by_environment
    from c4d.run.proctree import descendants

    out = tmp_path / "diagnoses.jsonl"
    cmd = [sys.executable, "-m", "c4d", "sim", "--ranks", "4", "--ranks-per-node", "2", "--steps", "12",
           "--fault", "mismatch@rank=2,what=count-hang,step=3", "--hang-timeout", "60000000", "--json",
           "--max-seconds", "120"]  # fmt: skip
    with out.open("w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
    ev = Evidence(lambda: set(descendants([p.pid])))
    try:

        def first():
            lines = [json.loads(ln) for ln in out.read_text().splitlines() if ln.startswith("{")]
            return next((d for d in lines if d["kind"] == "CollectiveMismatch"), None)

        d = wait_for(first, 90, "the CollectiveMismatch WARNING")  # every member is in the op by then
        assert d["detail"]["evidence"] == "heartbeats" and d["ranks"] == [2]
        assert not ev.on_diagnosis({**d, "detail": {**d["detail"], "evidence": "records"}})
        pids = ranks_by_environment(descendants([p.pid]))
        assert ev.on_diagnosis(d, pids)
        st = ev.stacks_for(d, wait_s=90)
        assert st is not None and set(st) == {"0", "1", "2", "3"}, st
        assert st["2"]["role"] == "culprit" and {st[r]["role"] for r in "013"} == {"victim"}
        for r in "0123":
            assert "cudaStreamSynchronize" in (st[r].get("native") or ""), (r, st[r])
        assert ev.enrich({**d, "level": "ERROR"})["detail"]["stacks"] == st
    finally:
        ev.close()
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


@pytest.mark.slow
def test_a_mismatch_at_the_first_step_of_a_pipeline_names_no_link(tmp_path):
    """Rank 9 skips a collective at step 0 of a 4-stage pipeline: the stages before it wait in
    groups {send activations, recv gradients} whose sends their peers already received. A
    transfer the receiver finished cannot be what stopped: the wait follows the group's other
    op to the peer, and on to the mismatch (no RankCommHang on node-0, whose ranks merely wait)."""
    p = subprocess.run(
        [sys.executable, "-m", "c4d", "sim", "--ranks", "16", "--ranks-per-node", "8", "--tp", "2",
         "--pp", "4", "--steps", "100", "--fault", "mismatch@rank=9,step=0", "--json", "--max-seconds", "8"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "C4D_HANG_TIMEOUT": "1000000", "C4D_HANG_TIMES": "3"},
    )  # fmt: skip
    ds = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert ds, p.stderr[-2000:]
    assert {d["kind"] for d in ds} == {"CollectiveMismatch"}, [(d["kind"], d["ranks"]) for d in ds]
    assert all(9 in d["ranks"] for d in ds)
    assert "ERROR" in {d["level"] for d in ds}
