"""An agent's records are untrusted like a rank's: the edge checks every OPSUM field and the
compute an agent attaches to OP records; the engine drops a summary that claims one host clock
for a communicator the master knows on two nodes."""

from __future__ import annotations

import numpy as np
import pytest

from c4d.engine import Engine, EngineConfig
from c4d.engine.sampling import sampled
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.record import schema
from c4d.record.schema import Kind, Op
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


def test_a_summary_outside_its_agents_sample_is_progress_only():
    """An agent that samples a busy communicator's ops (c4d/agent/sample.py) sends each flush's
    last op for progress: it completes the op for every member, the slow judge does not keep it."""
    t = H.now_ns()
    shift = next(k for k in range(1, 8) if not sampled(np.array([5]), k)[0])
    for k, kept in ((shift, 0), (0, 1)):
        eng, ing = _job(t)
        s = _opsum(t, seq=5)
        s["sample_shift"] = k
        assert ing.feed(H.as_header(s), t) == 1
        ing.tick(t + 1)
        c = eng.comms[eng._comm_index[TP]]
        assert (c.done_eff() == 6).all() and len(c.recent_ops()) == kept


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
        ("bad summary", lambda s: s["sample_shift"].__setitem__(0, schema.OPSUM_MAX_SHIFT + 1)),
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


# -- issue 41: one job per agent, named ------------------------------------------------------
def _agent_and_upstream(tmp_path, **cfg):
    """An Agent in this process, forwarding to a PULL socket the test reads."""
    import zmq

    from c4d.agent.agent import Agent, AgentConfig

    ctx = zmq.Context.instance()
    up = ctx.socket(zmq.PULL)
    port = up.bind_to_random_port("tcp://127.0.0.1")
    cfg.setdefault("master_status", None)  # the PULL socket is no master: nobody to ask
    a = Agent(
        AgentConfig(
            master=f"tcp://127.0.0.1:{port}", bind=f"ipc://{tmp_path}/agent.sock", flush_s=0.05, **cfg
        )
    )
    return a, up


def _sender(endpoint: str, job: str | None):
    import zmq

    s = zmq.Context.instance().socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 1000)
    if job is not None:
        s.setsockopt(zmq.METADATA, f"X-C4D-Job:{job}".encode())
    s.connect(endpoint)
    return s


def _register(rank: int, job: str, t: int) -> bytes:
    from c4d.record import wire
    from tests import flood

    return wire.encode(flood.register(rank, 8, t, job=job.encode(), pid=100 + rank).view(schema.HEADER), rank)


def _forwarded(a, up, until) -> np.ndarray:
    """Step the agent until ``until(rows forwarded so far)``; those rows."""
    import zmq

    from c4d.record import wire
    from tests.conftest import wait_for

    got: list[np.ndarray] = []

    def step():
        a.step(0.02)
        while True:
            try:
                got.append(np.array(wire.decode(up.recv(zmq.NOBLOCK))))
            except zmq.Again:
                break
        rows = schema.join_records(got, schema.HEADER) if got else np.zeros(0, schema.HEADER)
        return until(rows), rows

    (rows,) = wait_for(
        lambda: (lambda ok, rows: (rows,) if ok else None)(*step()), 30, "the agent to forward"
    )
    return rows


def _jobs_of(rows: np.ndarray) -> set[str]:
    reg = rows[rows["kind"] == Kind.REGISTER].view(schema.REGISTER)
    return {bytes(j).rstrip(b"\0").decode() for j in reg["job"]}


def test_one_forged_register_no_longer_squats_an_agent(tmp_path, caplog):
    """The issue's probe: a REGISTER of job `squat` sent before the real ranks fixed the agent's
    job for good. With no job named, the agent serves the job 2 ranks register with."""
    import logging

    caplog.set_level(logging.INFO)
    a, up = _agent_and_upstream(tmp_path)
    t = H.now_ns()
    squat, real = _sender(a.endpoint, "squat"), _sender(a.endpoint, "real")
    try:
        squat.send(_register(0, "squat", t))
        a.step(0.2)
        real.send(_register(0, "real", t))
        real.send(_register(1, "real", t))
        rows = _forwarded(a, up, lambda r: len(r) >= 2)
    finally:
        squat.close()
        real.close()
        a.close()
        up.close(linger=0)
    assert _jobs_of(rows) == {"real"} and sorted(rows["rank"].tolist()) == [0, 1]
    assert a.collector.job == "real" and a.collector.bad_reasons["other job"] == 1
    said = caplog.text
    assert "the agent is serving job real" in said and "this agent serves job real" in said
    assert "master serves" not in said


def test_an_agent_named_its_job_refuses_any_other_from_the_first_message(tmp_path, monkeypatch):
    monkeypatch.setenv("C4D_JOB_ID", "real")  # the job's environment, as a launcher gives it
    a, up = _agent_and_upstream(tmp_path)
    t = H.now_ns()
    squat, nameless, real = (
        _sender(a.endpoint, "squat"),
        _sender(a.endpoint, None),
        _sender(a.endpoint, "real"),
    )
    try:
        squat.send(_register(0, "squat", t))
        nameless.send(_register(1, "", t))  # under a named job, a record without a job is not it
        a.step(0.2)
        real.send(_register(2, "real", t))
        rows = _forwarded(a, up, lambda r: len(r) >= 1)
    finally:
        for s in (squat, nameless, real):
            s.close()
        a.close()
        up.close(linger=0)
    assert rows["rank"].tolist() == [2] and _jobs_of(rows) == {"real"}
    assert a.collector.bad_reasons["other job"] == 2


def test_one_rank_alone_does_not_make_the_agents_job(tmp_path):
    """Held, not forwarded, until a second rank agrees (--agree 2); then both go on in order."""
    a, up = _agent_and_upstream(tmp_path)
    t = H.now_ns()
    s = _sender(a.endpoint, "real")
    try:
        s.send(_register(0, "real", t))
        for _ in range(10):
            a.step(0.02)
        assert a.collector.job is None and a.stats["forwarded"] == 0
        s.send(_register(1, "real", t))
        rows = _forwarded(a, up, lambda r: len(r) >= 2)
    finally:
        s.close()
        a.close()
        up.close(linger=0)
    assert rows["rank"].tolist() == [0, 1]


# -- issue 41: never a job the master upstream refuses ----------------------------------------
def _with_status(tmp_path, served_job: str | None, **cfg):
    """An Agent whose master's status endpoint (the real StatusServer) says it serves ``served_job``."""
    from c4d.master.status import StatusServer

    st = StatusServer(f"ipc://{tmp_path}/master.status")
    a, up = _agent_and_upstream(tmp_path, master_status=st.endpoint, **cfg)
    served = {"job": served_job}

    def step(timeout_s: float = 0.02) -> None:
        st.serve([], served["job"])
        a.step(timeout_s)
        st.serve([], served["job"])

    return a, up, st, served, step


def _drain(up) -> np.ndarray:
    import zmq

    from c4d.record import wire

    got = []
    while True:
        try:
            got.append(np.array(wire.decode(up.recv(zmq.NOBLOCK))))
        except zmq.Again:
            break
    return schema.join_records(got, schema.HEADER) if got else np.zeros(0, schema.HEADER)


def test_an_agent_forwards_nothing_of_a_job_the_master_refuses(tmp_path, caplog):
    """The master upstream serves another job: it would drop every record, so the agent says so once
    and forwards none (counted); once the master serves the agent's job, it forwards again, the
    ranks' registrations first."""
    import logging

    from tests.conftest import wait_for

    caplog.set_level(logging.INFO)
    a, up, st, served, step = _with_status(tmp_path, "other", job="real")
    s = _sender(a.endpoint, "real")
    t = H.now_ns()
    try:
        wait_for(lambda: (step(), a.refused_by == "other")[1], 30, "the agent to hear the master's job")
        s.send(_register(0, "real", t))
        s.send(_register(1, "real", t))
        wait_for(lambda: (step(), a.stats["refused by the master"] >= 2)[1], 30, "the records dropped")
        for _ in range(10):
            step()
        assert not len(_drain(up)) and a.stats["forwarded"] == 0
        served["job"] = "real"  # a master restarted for this job
        wait_for(lambda: (step(), a.refused_by is None)[1], 30, "the agent to forward again")
        rows = _forwarded(a, up, lambda r: len(r) >= 2)
    finally:
        s.close()
        a.close()
        st.close()
        up.close(linger=0)
    assert sorted(rows["rank"].tolist()) == [0, 1] and _jobs_of(rows) == {"real"}
    said = [r.getMessage() for r in caplog.records]
    assert sum("serves job other and refuses job real" in m for m in said) == 1, said
    assert sum("forwarding again" in m for m in said) == 1


def test_an_agent_with_no_job_named_serves_the_masters(tmp_path):
    """No job named or agreed yet: the master's job is the agent's, so two forged ranks agreeing on
    `squat` no longer make it (they did with an agent that could not hear the master)."""
    from tests.conftest import wait_for

    a, up, st, _served, step = _with_status(tmp_path, "real")
    squat, real = _sender(a.endpoint, "squat"), _sender(a.endpoint, "real")
    t = H.now_ns()
    try:
        wait_for(lambda: (step(), a.collector.job == "real")[1], 30, "the agent to take the master's job")
        squat.send(_register(0, "squat", t))
        squat.send(_register(1, "squat", t))
        wait_for(lambda: (step(), a.collector.bad_reasons["other job"] >= 2)[1], 30, "squat refused")
        real.send(_register(2, "real", t))  # one rank: no agreement needed for the master's job
        rows = _forwarded(a, up, lambda r: len(r) >= 1)
    finally:
        squat.close()
        real.close()
        a.close()
        st.close()
        up.close(linger=0)
    assert rows["rank"].tolist() == [2] and _jobs_of(rows) == {"real"}
    assert a.job == "real" and a.refused_by is None


def test_a_real_agent_says_once_that_its_master_serves_another_job(tmp_path):
    """`c4d master --job other` and `c4d agent --job real --master-status EP` as processes: the agent
    says so in one line and forwards none of what it received; the master hears nothing of job real."""
    import time

    from tests.conftest import free_port, wait_for
    from tests.test_edge_flood import Proc

    mep, st, aep = f"tcp://127.0.0.1:{free_port()}", f"ipc://{tmp_path}/status", f"ipc://{tmp_path}/a.sock"
    m = Proc(tmp_path, "master", "master", "--bind", mep, "--status-bind", st, "--job", "other")
    trace = tmp_path / "node.c4d"  # what the agent received, as it came
    args = ("--master", mep, "--master-status", st, "--bind", aep, "--job", "real", "--trace", trace)
    a = Proc(tmp_path, "agent", "agent", *args)
    s = _sender(aep, "real")
    try:
        wait_for(lambda: "refuses job real" in a.stderr(), 30, "the agent to hear the master's job")
        empty = trace.stat().st_size
        for r in range(4):
            s.send(_register(r, "real", time.time_ns()))
        wait_for(lambda: trace.stat().st_size >= empty + 4 * schema.RECORD_SIZE, 30, "the agent to receive")
    finally:
        s.close(linger=0)
        assert a.stop() == 0
        assert m.stop() == 0
    said = a.stderr()
    assert said.count("serves job other and refuses job real") == 1, said
    assert ", 0 forwarded" in said, said  # (dropped and counted: the test above counts them)
    assert "job real" not in m.stderr()  # nothing of it reached the master to be refused there
