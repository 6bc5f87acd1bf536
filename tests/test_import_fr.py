"""PyTorch Flight Recorder import: dumps written by tests/fr_factory.py (torch's documented layout),
converted to c4d records and replayed through the real engine."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from c4d.formats import flight_recorder as fr
from c4d.formats.detect import detect, load_any
from c4d.formats.to_records import FormatError, ImportOptions, save
from c4d.offline import analyze
from c4d.record import schema
from c4d.record.trace import load
from tests import fr_factory as frf

HANGS = {"RankNonCommHang", "RankCommHang", "RankLost"}


def _engine():
    from c4d.engine import Engine, EngineConfig

    return Engine(EngineConfig())


def _diagnose(path, **kw) -> list[dict]:
    rt = load_any(path, **kw)
    return [d.to_json() for d in analyze.replay(rt, _engine())]


def _write(tmp_path: Path, job: frf.Job, name: str = "dumps") -> Path:
    d = tmp_path / name
    frf.write(frf.build(job), d)
    return d


@pytest.mark.parametrize("timing", [True, False])
def test_two_ranks_missing_is_noncomm_naming_exactly_them(tmp_path, timing):
    job = frf.Job(tp=2, dp=4, steps=6, timing=timing, frames=3, hang=frf.Hang(op_index=4, missing=(1, 6)))
    d = _write(tmp_path, job)
    diags = _diagnose(d)
    hangs = [x for x in diags if x["kind"] in HANGS]
    assert hangs, "no hang diagnosed"
    assert {x["kind"] for x in hangs} == {"RankNonCommHang"}
    assert all(x["ranks"] == [1, 6] for x in hangs)
    assert all(x["op"] == "AllReduce" and x["seq"] == job.steps - 1 for x in hangs)  # FR id 6 → c4d seq 5
    levels = [x["level"] for x in hangs]
    assert levels[0] == "WARNING" and levels[-1] == "ERROR"
    assert hangs[-1]["hang_times"] == 18
    assert sorted(hangs[-1]["detail"]["waiting_ranks"]) == [0, 2, 3, 4, 5, 7]


def test_all_entered_and_stuck_inside_is_comm_hang(tmp_path):
    job = frf.Job(tp=2, dp=4, steps=5, hang=frf.Hang(op_index=4, missing=()))
    diags = _diagnose(_write(tmp_path, job))
    hangs = [x for x in diags if x["kind"] in HANGS]
    assert hangs and {x["kind"] for x in hangs} == {"RankCommHang"}
    assert hangs[-1]["level"] == "ERROR"
    assert hangs[-1]["ranks"] == list(range(8))  # FR has no per-peer progress: every member a suspect
    assert hangs[-1]["detail"]["localized"] is False


@pytest.mark.parametrize("timing", [True, False])
def test_a_skipped_subgroup_collective_is_a_mismatch_not_a_node(tmp_path, timing):
    """The issue-9 case: 4 ranks, sub-groups {0, 1} and {2, 3}; rank 3 skips its sub-group
    all_reduce of the last step and goes on to the world all_reduce. Rank 2 waits for it in the
    sub-group, ranks 0, 1 and 3 wait for rank 2 in the world group: a wait cycle between 2 and
    3, and 0 and 1 are victims, never suspects. Counted like a hang, never blacklisted."""
    job = frf.Job(
        tp=2, dp=2, steps=6, timing=timing, step_ops=(("all_reduce", "tp"), ("all_reduce", "world")),
        skip=frf.Skip(rank=3, op_index=0),
    )  # fmt: skip
    diags = _diagnose(_write(tmp_path, job))
    assert diags and {x["kind"] for x in diags} == {"CollectiveMismatch"}, [
        (x["kind"], x["ranks"]) for x in diags
    ]
    last = diags[-1]
    assert last["level"] == "ERROR" and last["hang_times"] == 18
    assert diags[0]["level"] == "WARNING"
    assert all(x["ranks"] == [2, 3] for x in diags)
    assert last["detail"]["victims"] == [0, 1]
    loc = last["localization"]
    assert loc["how"] == "cycle" and loc["target"] == "cycle" and loc["ranks"] == [2, 3]
    tp23 = frf.group_of(job, 3, "tp")
    world = frf.group_of(job, 3, "world")
    assert tp23 == [2, 3] and world == [0, 1, 2, 3]
    by_rank = {m["rank"]: m for m in loc["cycle"]}
    # rank 3 never entered sub-group op #5 (FR seq 6) and is blocked in world op #5; rank 2 the
    # other way round (c4d seqs count from 0: the last step's ops are #5)
    assert by_rank[3]["never_entered"]["seq"] == 5 and by_rank[3]["blocked_in"]["seq"] == 5
    assert by_rank[3]["never_entered"]["comm"] == by_rank[2]["blocked_in"]["comm"]
    assert by_rank[2]["never_entered"]["comm"] == by_rank[3]["blocked_in"]["comm"]
    assert by_rank[2]["blocked_in"]["comm"] != by_rank[3]["blocked_in"]["comm"]
    assert all(m["blocked_in"]["op"] == "AllReduce" for m in loc["cycle"])
    from c4d.engine import Level

    assert not any(
        d.blacklist_nodes for d in _replay(_write(tmp_path, job, "again")) if d.level is Level.ERROR
    )


def _replay(path):
    return analyze.replay(load_any(path), _engine())


def test_clean_dump_gives_no_hang(tmp_path):
    diags = _diagnose(_write(tmp_path, frf.Job(tp=2, dp=4, steps=8)))
    assert [x for x in diags if x["kind"] in HANGS] == []


def test_thresholds_come_from_options(tmp_path):
    d = _write(tmp_path, frf.Job(tp=2, dp=2, steps=3, hang=frf.Hang(4, (3,))))
    diags = _diagnose(d, opts=ImportOptions(hang_timeout_us=2_000_000, hang_times=3))
    hangs = [x for x in diags if x["kind"] == "RankNonCommHang"]
    assert [x["hang_times"] for x in hangs] == [1, 2, 3]
    assert hangs[-1]["level"] == "ERROR" and hangs[-1]["ranks"] == [3]


def test_records_follow_record_h(tmp_path):
    job = frf.Job(tp=2, dp=4, steps=4, hang=frf.Hang(op_index=4, missing=(1, 6)))
    d = _write(tmp_path, job)
    dumps = {r: fr.load_dump(p) for r, p in fr.find_dumps(d).files.items()}
    rt = fr.read(d)
    k = rt.kinds
    regs, comms, ops = k[schema.Kind.REGISTER], k[schema.Kind.COMM], k[schema.Kind.OP]
    assert sorted(regs["rank"].tolist()) == list(range(8))
    assert set(regs["world_size"].tolist()) == {8}
    assert set(regs["nccl_version"].tolist()) == {22105}  # comm_lib_version "2.21.5"
    assert set(regs["device_timing"].tolist()) == {1}
    # one OP per completed entry, nothing else
    done = sum(e["state"] == "completed" for dd in dumps.values() for e in dd["entries"])
    assert len(ops) == done
    # the same process group has the same comm id on every rank, and comm_rank = position in it
    world = [c for c, info in rt.meta["comms"].items() if info["desc"] == "default_pg"]
    assert len(world) == 1
    wid = int(world[0], 16)
    w = comms[comms["comm_id"] == wid]
    assert sorted(w["rank"].tolist()) == list(range(8)) and (w["comm_rank"] == w["rank"]).all()
    assert set(w["comm_nranks"].tolist()) == {8}
    # collective seq = collective_seq_id - 1; bytes = numel x BFloat16 size
    r0 = ops[(ops["rank"] == 0) & (ops["comm_id"] == wid)]
    assert r0["seq"].tolist() == [0, 1, 2]  # the 4th is pending
    assert set(r0["bytes"].tolist()) == {1024 * 1024 * 2} and set(r0["dtype"].tolist()) == {9}
    assert set(r0["op"].tolist()) == {int(schema.Op.AllReduce)}
    assert ((r0["flags"] & schema.OpFlag.DEVICE_TIMING) != 0).all()
    assert (r0["start_ns"] > r0["issue_ns"]).all()
    # reduce_scatter counts the per-rank output, all_gather the per-rank input
    rs = ops[ops["op"] == schema.Op.ReduceScatter]
    ag = ops[ops["op"] == schema.Op.AllGather]
    assert set(rs["count"].tolist()) == set(ag["count"].tolist()) == {1024 * 1024}
    # p2p: P2P flag, peer = group rank, per (comm, direction, peer) sequence matching across the pair
    sends = ops[ops["op"] == schema.Op.Send]
    recvs = ops[ops["op"] == schema.Op.Recv]
    assert len(sends) == len(recvs) > 0
    assert ((sends["flags"] & schema.OpFlag.P2P) != 0).all()
    assert set(sends["peer"].tolist()) == {1} and set(recvs["peer"].tolist()) == {0}
    s0 = sends[sends["rank"] == 0]
    r2 = recvs[(recvs["rank"] == 2) & (recvs["comm_id"] == s0["comm_id"][0])]
    assert s0["seq"].tolist() == r2["seq"].tolist() == list(range(job.steps))
    # heartbeats at the dump: waiting ranks have issued and arrived at seq 3, the missing ones not
    hb = k[schema.Kind.HEARTBEAT]
    first = hb[(hb["comm_id"] == wid) & (hb["time_ns"] == hb["time_ns"][hb["comm_id"] == wid].min())]
    by_rank = {int(h["rank"]): h for h in first}
    for r in range(8):
        h = by_rank[r]
        if r in (1, 6):
            assert (h["n_issued"], h["n_arrived"], h["n_done"]) == (3, 3, 3)
            assert h["pend_seq"] == schema.UINT64_MAX
        else:
            assert (h["n_issued"], h["n_arrived"], h["n_done"]) == (4, 4, 3)
            assert h["pend_seq"] == 3 and h["pend_op"] == schema.Op.AllReduce and h["pend_start_ns"] > 0
    # the per-kind arrays are exactly what splitting the stream gives
    for kind, arr in schema.by_kind(rt.raw).items():
        assert arr.tobytes() == k[kind].tobytes(), kind
    # TICKs: the dump time, then every T for hang_times T
    ticks = rt.raw["time_ns"][rt.raw["kind"] == schema.Kind.TICK].astype(np.int64)
    t_end = rt.meta["import"]["t_end_ns"]
    assert ticks[-19] > t_end and np.all(np.diff(ticks[-19:]) == 10_000_000_000)


def test_import_saves_as_a_c4d_trace(tmp_path):
    d = _write(tmp_path, frf.Job(tp=2, dp=2, steps=3))
    rt = fr.read(d)
    out = tmp_path / "imported.c4d"
    save(rt, str(out))
    assert detect(out) == "c4d"
    tr = load(out)
    assert len(tr.ops) == len(rt.kinds[schema.Kind.OP])
    assert tr.meta["source_format"] == "fr"


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_bad_files_are_one_line_and_others_still_load(tmp_path):
    job = frf.Job(tp=2, dp=2, steps=3, hang=frf.Hang(4, (3,)))
    d = _write(tmp_path, job)
    good = (d / "nccl_trace_rank_1").read_bytes()
    (d / "nccl_trace_rank_1").write_bytes(good[: len(good) // 2])  # truncated
    marker = tmp_path / "pwned"
    evil = frf.build(job)[2]
    evil["entries"][0]["frames"] = [_Evil(marker)]
    (d / "nccl_trace_rank_2").write_bytes(pickle.dumps(evil, protocol=2))
    warnings: list[str] = []
    rt = load_any(d, on_warning=warnings.append)
    assert not marker.exists(), "the forbidden global was called"
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    assert any("nccl_trace_rank_1" in w and "cut short" in w for w in warnings)
    assert any("nccl_trace_rank_2" in w and "posix.system" in w for w in warnings)
    assert any("no dump for ranks [1, 2]" in w for w in warnings)
    assert rt.meta["import"]["warnings"] == warnings
    assert sorted(rt.kinds[schema.Kind.REGISTER]["rank"].tolist()) == [0, 3]


@pytest.mark.parametrize(
    "blob, words",
    [
        (b"\x80\x02\xffgarbage", "invalid load key"),
        (pickle.dumps([1, 2, 3], protocol=2), "no top-level dict"),
        (pickle.dumps({"version": "2.10", "entries": 5}, protocol=2), "not a list"),
        (b"", "cut short"),
    ],
)
def test_load_dump_errors_are_one_line(tmp_path, blob, words):
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(blob)
    with pytest.raises(FormatError) as ei:
        fr.load_dump(p)
    msg = str(ei.value)
    assert words in msg and "\n" not in msg and str(p) in msg


def test_no_readable_dump_is_an_error(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "nccl_trace_rank_0").write_bytes(b"\x80\x02\x7d")  # a pickle that stops short
    with pytest.raises(FormatError, match="no readable Flight Recorder dump"):
        load_any(d, "fr")


def _jsonable(x):
    """What torch's ``_dump_fr_trace_json`` writes: tuples as lists, unknown times as 0."""
    if isinstance(x, dict):
        return {k: (0 if v is None and k.startswith("time_") else _jsonable(v)) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def test_json_form_of_the_dump_gives_the_same_diagnosis(tmp_path):
    job = frf.Job(tp=2, dp=4, steps=4, hang=frf.Hang(op_index=4, missing=(5,)))
    d = tmp_path / "json"
    d.mkdir()
    for r, dump in frf.build(job).items():
        st = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in dump["pg_status"].items()}
        (d / f"rank_{r}.json").write_text(json.dumps(_jsonable({**dump, "pg_status": st})))
    assert detect(d) == "fr"
    hangs = [x for x in _diagnose(d) if x["kind"] in HANGS]
    assert hangs and all(x["kind"] == "RankNonCommHang" and x["ranks"] == [5] for x in hangs)


def test_missing_dump_file_is_reported(tmp_path):
    d = _write(tmp_path, frf.Job(tp=2, dp=2, steps=2))
    (d / "nccl_trace_rank_3").unlink()
    warnings: list[str] = []
    load_any(d, on_warning=warnings.append)
    assert any("no dump for ranks [3]" in w for w in warnings)


def test_coalesced_entries_are_one_op(tmp_path):
    """Entries sharing a collective_seq_id on a rank (coalescing) become one op with IN_GROUP."""
    dumps = frf.build(frf.Job(tp=2, dp=2, steps=2))
    for dump in dumps.values():
        ents = dump["entries"]
        last = ents[-1]  # world all_reduce: add a second tensor and the coalesced end entry
        end = dict(last, record_id=len(ents), profiling_name="nccl:coalesced")
        end.update(input_sizes=[], output_sizes=[])
        ents.append(end)
        ents.insert(len(ents) - 1, dict(last, record_id=len(ents) - 1, input_sizes=[[10]]))
    d = tmp_path / "co"
    frf.write(dumps, d)
    rt = fr.read(d)
    ops = rt.kinds[schema.Kind.OP]
    world = next(int(c, 16) for c, i in rt.meta["comms"].items() if i["desc"] == "default_pg")
    last = ops[(ops["rank"] == 0) & (ops["comm_id"] == world)]
    last = last[last["seq"] == last["seq"].max()]
    assert len(last) == 1
    assert last["bytes"][0] == (1024 * 1024 + 10) * 2
    assert last["flags"][0] & schema.OpFlag.IN_GROUP


def test_parse_name():
    assert fr.parse_name("nccl:send 3->5") == (int(schema.Op.Send), 5, False)
    assert fr.parse_name("nccl:recv 5<-3") == (int(schema.Op.Recv), 3, False)
    assert fr.parse_name("gloo:_reduce_scatter_base") == (int(schema.Op.ReduceScatter), -1, True)
    assert fr.parse_name("nccl:coalesced")[0] == -1
    assert fr.parse_name("nccl:barrier")[0] == int(schema.Op.AllReduce)


_GLOO_JOB = """
import os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, world, out, port, skip):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(16)
    sub = dist.new_group([0, 1])
    for _ in range(3):
        dist.all_reduce(t)
        if rank in (0, 1):
            dist.all_reduce(t, group=sub)
    dist.barrier()
    if rank != skip:
        dist.all_reduce(t, async_op=True)  # rank `skip` never joins: the others wait in it
    time.sleep(1.0)
    with open(f"{out}/rank_{rank}", "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace())
    os._exit(0)  # the pending all_reduce would block a clean shutdown

if __name__ == "__main__":
    out, port, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mp.spawn(run, args=(4, out, port, skip), nprocs=4)
"""


@pytest.mark.slow
def test_real_torch_gloo_dumps(tmp_path):
    """Dumps torch itself wrote (gloo on CPU, 4 ranks, rank 3 skips an all_reduce) → rank 3 named."""
    pytest.importorskip("torch")
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "job.py"
    script.write_text(_GLOO_JOB)
    out = tmp_path / "dumps"
    out.mkdir()
    subprocess.run([sys.executable, str(script), str(out), str(port), "3"], check=True, timeout=300)
    assert sorted(p.name for p in out.iterdir()) == [f"rank_{r}" for r in range(4)]
    assert detect(out) == "fr"
    hangs = [x for x in _diagnose(out) if x["kind"] in HANGS]
    assert hangs and {x["kind"] for x in hangs} == {"RankNonCommHang"}
    assert hangs[-1]["ranks"] == [3] and hangs[-1]["level"] == "ERROR"
    assert hangs[-1]["detail"]["culprit_state"] == {"3": "not issued"}


def test_old_dumps_without_optional_keys(tmp_path):
    """Older FR versions lack some keys (no discovery times, no `retired`): still imported, by state."""
    dumps = frf.build(frf.Job(tp=2, dp=2, steps=3, hang=frf.Hang(4, (1,))))
    for dump in dumps.values():
        dump["version"] = "2.2"
        for e in dump["entries"]:
            for k in ("time_discovered_started_ns", "time_discovered_completed_ns", "retired", "duration_ms"):
                e.pop(k, None)
    d = tmp_path / "old"
    frf.write(dumps, d)
    hangs = [x for x in _diagnose(d) if x["kind"] in HANGS]
    assert hangs and hangs[-1]["kind"] == "RankNonCommHang" and hangs[-1]["ranks"] == [1]


def _laughs(depth: int) -> tuple:
    """Nested tuples, each level twice the one below: a few bytes of pickle, 2**depth leaves, and a
    hash that walks every one of them (tuples do not cache their hash)."""
    t: tuple = ("ha",)
    for _ in range(depth):
        t = (t, t)
    return t


def _dump_with(tmp_path, change) -> Path:
    """A clean 8-rank job's dumps (200 entries each), rank 0's entries changed by ``change(entries)``."""
    dumps = frf.build(frf.Job(tp=2, dp=4, steps=40))
    change(dumps[0]["entries"])
    return _write_dumps(tmp_path, dumps)


def _write_dumps(tmp_path, dumps) -> Path:
    d = tmp_path / "dumps"
    frf.write(dumps, d)
    return d


def test_a_field_c4d_reads_that_expands_is_refused_before_it_is_hashed(tmp_path):
    """A profiling_name of nested tuples shared down 60 levels would take years to hash: counted
    first (the read fields' structure), refused with one line; the other ranks are read."""
    bomb = _laughs(60)

    def change(ents):
        for e in ents:
            e["profiling_name"] = bomb

    warns: list[str] = []
    rt = fr.read(_dump_with(tmp_path, change), on_warning=warns.append, workers=1)
    assert rt.meta["fr"]["ranks"] == 7
    said = [w for w in warns if "nccl_trace_rank_0" in w]
    assert len(said) == 1 and "expands to more than" in said[0], warns


def test_a_field_c4d_never_reads_is_never_walked(tmp_path):
    """Stack frames (never read) that share one long list are not a cost: the dump is read whole.
    The same list as input_sizes (read) is refused."""
    long = [[1, 2]] * 200_000

    def frames(ents):
        for e in ents:
            e["frames"] = long

    rt = fr.read(_dump_with(tmp_path / "a", frames), workers=1)
    assert rt.meta["fr"]["ranks"] == 8 and not rt.meta["import"]["warnings"]

    def sizes(ents):
        for e in ents:
            e["input_sizes"] = long

    warns: list[str] = []
    rt = fr.read(_dump_with(tmp_path / "b", sizes), on_warning=warns.append, workers=1)
    assert rt.meta["fr"]["ranks"] == 7
    assert any("nccl_trace_rank_0" in w and "expands to more than" in w for w in warns), warns


@pytest.mark.parametrize(
    "field, value",
    [
        ("collective_seq_id", [1, 2]),
        ("time_created_ns", (1, 2)),
        ("retired", [[True] * 1000]),
        ("input_sizes", [[[1] * 10, 10**9]]),  # math.prod would repeat the list 10**9 times
        ("input_sizes", [[2**70]]),
    ],
)
def test_fields_of_the_wrong_type_are_one_line_and_cost_nothing(tmp_path, field, value):
    def change(ents):
        ents[-1][field] = value

    warns: list[str] = []
    rt = fr.read(_dump_with(tmp_path, change), on_warning=warns.append, workers=1)
    said = [w for w in warns if "nccl_trace_rank_0" in w]
    if said:  # refused: one line, the other ranks read
        assert len(said) == 1 and "\n" not in said[0] and rt.meta["fr"]["ranks"] == 7
    else:  # or read, the odd value taken as "not known"
        assert rt.meta["fr"]["ranks"] == 8
