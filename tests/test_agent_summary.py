"""Aggregated input gives the same diagnoses as raw input: the recorded sim jobs of
tests/golden (hangs, a crash, slow ranks and links, a mismatch; 1, 2 and 4 ranks per node)
replayed once directly and once through one node agent's summariser per node
(c4d/agent/summary.py), each cut at the trace's ticks as a live agent flushes.
"""

from __future__ import annotations

import gzip
import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest

from c4d import analyze, schema, trace
from c4d.agent.summary import Summariser
from c4d.ingest import Ingest
from c4d.validate import Edge, Limits
from tests.golden import make_golden

GOLDEN = Path(make_golden.__file__).resolve().parent
NAMES = sorted(p.name.removesuffix(".expected.json") for p in GOLDEN.glob("*.expected.json"))
_V = np.dtype((np.void, schema.RECORD_SIZE))


def _load(name: str, tmp_path: Path) -> trace.RawTrace:
    path = tmp_path / f"{name}.c4d"
    with gzip.open(GOLDEN / f"{name}.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    return trace.read_raw(path)


def _node_of(raw: np.ndarray) -> dict[int, str]:
    reg = raw[raw["kind"] == schema.Kind.REGISTER].view(schema.REGISTER)
    return {int(r["rank"]): r["node"].split(b"\0")[0].decode() for r in reg}


def replay_through_agents(rt: trace.RawTrace, engine=None) -> tuple[list, dict[str, Summariser], Ingest]:
    """The trace's records, each node's through its own edge and summariser, then the master's
    ingest (into ``engine``, default a new one); every agent flushes at each tick, before the
    master evaluates."""
    raw = rt.raw
    node_of = _node_of(raw)
    nodes = sorted(set(node_of.values()))
    row_node = np.array([nodes.index(node_of.get(int(g), nodes[0])) for g in raw["rank"]])
    agents = {n: (Edge(Limits.from_env()), Summariser()) for n in nodes}
    master = Ingest(engine if engine is not None else analyze.make_engine(), Edge(Limits.from_env()))
    out: list = []
    ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK).tolist()
    last_tick = int(rt.meta.get("created_ns", 0))
    prev = 0
    for i in [*ticks, len(raw)]:
        seg, seg_node = raw[prev:i], row_node[prev:i]
        fwd = []
        for k, n in enumerate(nodes):
            edge, summ = agents[n]
            rows = edge.admit(seg[seg_node == k], last_tick)
            if len(rows):
                fwd.append(summ.feed(rows))
        fwd = [f for f in fwd if len(f)]
        if fwd:
            master.feed(np.concatenate([f.view(_V) for f in fwd]).view(schema.HEADER), last_tick)
        if i < len(raw):
            last_tick = int(raw["time_ns"][i])
            out.extend(master.tick(last_tick))
        prev = i + 1
    out.extend(master.settle())  # (an engine process's answers come a tick late)
    return out, {n: s for n, (_, s) in agents.items()}, master


def _decides(d: dict) -> tuple:
    """What the issue asks to agree: kind, culprit ranks, nodes, level (in order)."""
    return (d["level"], d["kind"], tuple(d["ranks"]), tuple(d["nodes"]))


@pytest.mark.parametrize("name", NAMES)
def test_agents_give_the_direct_diagnoses(name, tmp_path):
    rt = _load(name, tmp_path)
    direct = [make_golden.project(d.to_json()) for d in analyze.replay(rt, analyze.make_engine())]
    via, _summ, master = replay_through_agents(rt)
    via_p = [make_golden.project(d.to_json()) for d in via]
    assert [_decides(d) for d in via_p] == [_decides(d) for d in direct], name
    # and everything else a diagnosis decides (time, op, seq, how it was localized)
    assert via_p == direct, name
    assert not master.failures, master.failures
    assert not master.edge.rejected, master.edge.rejected  # the master admits what agents send


def test_node_local_collectives_arrive_as_one_summary_each(tmp_path):
    """4 ranks per node with tp=2: the tensor-parallel all-reduces never leave the node as OP
    records; the data-parallel ones (across nodes) do, with the rank's compute attached."""
    rt = _load("clean", tmp_path)
    _, summ, master = replay_through_agents(rt)
    tot = sum((s.stats for s in summ.values()), start=type(next(iter(summ.values())).stats)())
    assert tot["ops summarised"] > 0 and tot["summaries"] * 2 == tot["ops summarised"]
    assert tot["out"] < tot["in"]
    eng = master.engine
    tp = [c for c in eng.comms.values() if c.n == 2 and c.has_coll]
    assert tp and all(len(c.recent_ops()) for c in tp)
    # the job destroyed its communicators at the end: the agents hold none of them any more
    assert all(not s.comms and not s.members and not s.size for s in summ.values())


def test_a_member_registered_late_loses_no_op():
    """The ranks' first batches reach the agent in any order: a rank may send its first ops of
    a node-local communicator before its peer registered (seen in CI). Those ops go raw for
    every member, the later ones as summaries: each op reaches the master once, whole."""
    from tests import hostile as H

    t, cid = H.now_ns(), 0x77
    reg = H.registers(2, t, node_of=lambda r: b"node-0")
    init = H.comm_init(range(2), cid, 2, t)
    ops = H.allreduces(2, range(6), t, cid)
    a_early = ops[(ops["rank"] == 0) & (ops["seq"] < 3)]
    s = Summariser()
    first = s.feed(H.as_header(reg[:1], init[:1], a_early))
    rest = s.feed(
        H.as_header(reg[1:], init[1:], ops[ops["rank"] == 1], ops[(ops["rank"] == 0) & (ops["seq"] >= 3)])
    )
    out = np.concatenate([first, rest])
    raw = out[out["kind"] == schema.Kind.OP].view(schema.OP)
    sums = out[out["kind"] == schema.Kind.OPSUM].view(schema.OPSUM)
    assert sorted(zip(raw["seq"].tolist(), raw["rank"].tolist(), strict=True)) == [
        (q, g) for q in range(3) for g in (0, 1)
    ]
    assert sorted(sums["seq"].tolist()) == [3, 4, 5]


def test_summaries_grouped_or_interleaved_keep_the_same_rows():
    """The master takes summaries that come as agents send them (each communicator's rows one
    run in seq order) without a sort (Engine._feed_opsum), others sorted: both keep the same
    rows for every communicator and the same members' progress."""
    from c4d.engine.engine import _grouped
    from tests import hostile as H

    t, cids = H.now_ns(), (0x72, 0x71, 0x73)
    reg = H.registers(4, t, node_of=lambda r: b"node-0")
    s = Summariser()
    hello = s.feed(H.as_header(reg, *(H.comm_init(range(4), c, 4, t) for c in cids)))
    sums = s.feed(H.as_header(*(H.allreduces(4, range(8), t, c) for c in cids)))
    sums = sums[sums["kind"] == schema.Kind.OPSUM]
    v = sums.view(schema.OPSUM)
    run_of = np.array([cids.index(c) for c in v["comm_id"].tolist()])
    grouped = sums[np.lexsort((v["seq"], run_of))]  # runs in the order 0x72, 0x71, 0x73
    rr = sums[np.lexsort((v["comm_id"], v["seq"]))]  # round robin: a sort needed
    v = grouped.view(schema.OPSUM)
    assert v["comm_id"][0] == 0x72 and _grouped(v["comm_id"], v["seq"]) is not None
    assert _grouped(rr.view(schema.OPSUM)["comm_id"], rr.view(schema.OPSUM)["seq"]) is None

    def kept(chunk):
        ing = Ingest(analyze.make_engine(), Edge(Limits.from_env()))
        ing.feed(hello, t)
        ing.engine.flush()  # the communicators known: the chunk after is their summaries alone
        ing.feed(chunk, t)
        ing.engine.flush()
        assert not ing.failures and not ing.edge.rejected
        eng = ing.engine
        rows = {c.id: schema.join_records(c.kept()) for c in eng.comms.values()}
        return rows, eng._pool.member["op_done"].copy()

    (a, done_a), (b, done_b) = kept(grouped), kept(rr)
    assert sorted(a) == sorted(b) == sorted(cids)
    for cid in cids:
        assert len(a[cid]) == 8 and a[cid].tobytes() == b[cid].tobytes(), hex(cid)
    assert (done_a == done_b).all() and (done_a[done_a > 0] == 8).all()


def test_summaries_ordered_by_their_runs_as_a_full_sort_orders_them():
    """Engine._feed_opsum groups a chunk's summaries by sorting their runs (an agent's message
    holds each communicator's rows in seq order); runs of one communicator that overlap in seq,
    repeated seqs and rows in no runs at all take the full sort: always np.lexsort's order."""
    from c4d.engine.engine import _comm_seq_order

    rng = np.random.default_rng(5)
    by_runs = 0
    for trial in range(400):
        cids = rng.integers(1, 2**64 - 1, int(rng.integers(1, 40)), dtype=np.uint64)
        msgs = int(rng.integers(1, 5))  # messages of the agents in one chunk, each a run per comm
        cid, seq = [], []
        for k in range(msgs):
            for c in rng.permutation(cids):
                n = int(rng.integers(1, 12))
                first = k * 20 + (int(rng.integers(0, 25)) if trial % 4 == 0 else 0)  # overlapping
                cid.append(np.full(n, c, np.uint64))
                seq.append(np.arange(first, first + n, dtype=np.uint64))
        cid, seq = np.concatenate(cid), np.concatenate(seq)
        if trial % 5 == 0:  # rows shuffled: no runs
            p = rng.permutation(len(cid))
            cid, seq = cid[p], seq[p]
        if trial % 7 == 0 and len(seq) > 2:  # a seq repeated
            seq[len(seq) // 2] = seq[len(seq) // 2 - 1]
        got, want = _comm_seq_order(cid, seq), np.lexsort((seq, cid))
        assert (got == want).all(), trial
        head = np.r_[True, (cid[1:] != cid[:-1]) | (seq[1:] <= seq[:-1])]
        by_runs += 4 * int(head.sum()) <= len(cid)
    assert 100 < by_runs < 400  # both ways taken


@pytest.mark.parametrize("name", ["comm-slow-rank", "noncomm-hang"])
def test_summaries_read_in_the_masters_loop_give_the_same_diagnoses(name, tmp_path):
    """With an engine process the master's loop reads the node summaries from the edge's columns
    and they travel read (c4d.engine.summaries): field for field what one process gives."""
    from c4d.engine_process import EngineProcess

    rt = _load(name, tmp_path)
    here, summ, _ = replay_through_agents(rt)
    assert sum(s.stats["summaries"] for s in summ.values()) > 0  # node-local collectives summarised
    ep = EngineProcess()
    try:
        there, _, master = replay_through_agents(rt, ep)
        assert ep.local is None and not master.failures  # the process took every call
    finally:
        ep.close()
    assert here and [d.to_json() for d in there] == [d.to_json() for d in here]


def test_summaries_are_read_row_by_row():
    """Read from rows or from their columns, whole or in pieces joined, cut again, or sent
    between processes: the same arrays; frames that do not fit together are refused."""
    from c4d.columns import Columns
    from c4d.engine.summaries import Summaries

    rng = np.random.default_rng(3)
    n = 500
    raw = np.zeros(n, schema.HEADER)
    u8 = raw.view(np.uint8).reshape(n, schema.RECORD_SIZE)
    u8[:] = rng.integers(0, 256, u8.shape, dtype=np.uint8)  # any bytes: reading is row by row
    raw["kind"] = rng.choice([int(schema.Kind.OP), int(schema.Kind.OPSUM), int(schema.Kind.HEARTBEAT)], n)

    def same(a: Summaries, b: Summaries) -> bool:
        return all(
            np.asarray(getattr(a, f)).tobytes() == np.asarray(getattr(b, f)).tobytes()
            for f in Summaries.__slots__
        )

    whole = Summaries.of(raw)
    assert 100 < len(whole) < 400
    assert same(whole, Summaries.of(raw, Columns.of(raw)))
    cuts = [0, 7, 131, 132, 400, n]
    pieces = [(Summaries.of(raw[a:b], Columns.of(raw[a:b])), a) for a, b in itertools.pairwise(cuts)]
    assert same(Summaries.join(pieces), whole)
    assert same(whole.cut(131, 400), Summaries.of(raw[131:400]))
    back = Summaries.from_frames([memoryview(f).cast("B") for f in whole.frames()], n)
    assert back is not None and same(back, whole)
    frames = [bytes(memoryview(f).cast("B")) for f in whole.frames()]
    assert Summaries.from_frames(frames[:-1], n) is None  # one missing
    assert Summaries.from_frames([*frames[:-1], frames[-1][:-4]], n) is None  # a short one
    assert Summaries.from_frames(frames, int(whole.pos[-1])) is None  # rows beyond the batch
    backwards = np.frombuffer(frames[0], np.int64)[::-1].tobytes()
    assert Summaries.from_frames([backwards, *frames[1:]], n) is None  # not in order


class _Apart:
    """An in-process engine fed as an engine process feeds it (c4d.engine_process): each batch
    with node summaries apart (``Engine.feed_apart``), or every other one whole (``alternate``:
    a chunk of both kinds of batches)."""

    def __init__(self, alternate: bool) -> None:
        self.engine, self.alternate, self.n = analyze.make_engine(), alternate, 0

    def feed(self, raw, recv_ns, cols=None):
        from c4d.engine.summaries import Summaries

        self.n += 1
        rest, sums = Summaries.apart(raw, cols)
        if not len(sums) or (self.alternate and self.n % 2):
            return self.engine.feed(raw, recv_ns, cols)
        return self.engine.feed_apart(rest, recv_ns, sums, len(raw))

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.mark.parametrize("chunk", [None, 97], ids=["chunks-at-ticks", "chunks-of-97-rows"])
@pytest.mark.parametrize("alternate", [False, True], ids=["apart", "apart-and-whole"])
@pytest.mark.parametrize("name", ["comm-slow-rank", "noncomm-hang", "clean"])
def test_batches_apart_give_what_whole_batches_give(name, alternate, chunk, tmp_path, monkeypatch):
    """Engine.feed_apart (the summaries' rows never joined) cuts the same chunks and takes the
    same steps as feed of the whole batches: the same diagnoses, field for field, and state
    (with chunks of 97 rows, batches are cut and what is left of one waits for the next)."""
    from c4d.engine import engine as engine_mod

    if chunk:
        monkeypatch.setattr(engine_mod, "CHUNK", chunk)
    rt = _load(name, tmp_path)
    here, _, whole = replay_through_agents(rt)
    there, _, apart = replay_through_agents(rt, _Apart(alternate))
    assert [d.to_json() for d in there] == [d.to_json() for d in here]
    a, b = whole.engine, apart.engine.engine
    assert a.stats == b.stats and a.stats["records"] > 0
    for k in ("last_recv", "pend_tmax", "seen", "theta_cur"):
        assert getattr(a.ranks, k).tobytes() == getattr(b.ranks, k).tobytes(), k
    assert sorted(a.comms) == sorted(b.comms)
    for i, c in a.comms.items():
        d = b.comms[i]
        assert (c.version, c.ops_seen, c.op_done.tobytes()) == (d.version, d.ops_seen, d.op_done.tobytes())


def test_a_batch_apart_whose_parts_do_not_fit_is_counted_not_taken():
    from c4d.engine import Engine, EngineConfig
    from c4d.engine.summaries import Summaries
    from tests import hostile as H

    t = H.now_ns()
    raw = H.as_header(H.registers(2, t), H.allreduces(2, range(3), t))
    e = Engine(EngineConfig())
    none = Summaries.of(raw[:0])
    e.feed_apart(raw, t, none, len(raw) + 1)  # one row missing
    assert e.stats["invalid"] == len(raw) + 1 and e.stats["batches"] == 0
