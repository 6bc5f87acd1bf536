"""The NCCL profiler plugin inside libc4d.so and the PEER records it produces.

Real rank processes on simnccl (which loads profiler plugins the way NCCL does) with the
shim preloaded and ``NCCL_PROFILER_PLUGIN=STATIC_PLUGIN``, and a real ZeroMQ PULL socket
(tests/test_shim.py's helpers). No mocks.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from c4d.record import schema
from tests.test_shim import (  # noqa: F401 (_tested_build: an autouse fixture)
    Master,
    _tested_build,
    base_env,
    final_seen,
    run_driver,
    run_job,
    summary,
    train,
    wait_records,
)

SEND_WAIT, RECV_WAIT = 9, 10
PROFILER = re.compile(r"profiler: (\d+) transfers, (\d+) PEER records, (\d+) events untracked")


def plugin_env(libc4d, master: Master, **extra: str) -> dict[str, str]:
    """One rank per node unless told otherwise: NCCL (and simnccl) emit ProxyOps for network
    transfers only, so per-peer progress needs ranks on different nodes."""
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50", **extra)
    env.setdefault("NCCL_PROFILER_PLUGIN", "STATIC_PLUGIN")
    env.setdefault("SIMNCCL_RANKS_PER_NODE", "1")
    return env


def members(recs) -> dict[tuple[int, int], int]:
    """(comm id, comm rank) -> global rank, from the COMM records."""
    comm = recs[schema.Kind.COMM]
    return {(int(r["comm_id"]), int(r["comm_rank"])): int(r["rank"]) for r in comm}


def link(r, mem) -> tuple[int, int]:
    """The directed link (global src, global dst) of a PEER row."""
    me, other = int(r["rank"]), mem[(int(r["comm_id"]), int(r["peer"]))]
    return (me, other) if r["direction"] == 0 else (other, me)


def profiler_counts(stderr: str) -> tuple[int, int, int]:
    m = PROFILER.search(stderr)
    assert m, f"no profiler part in the summary line:\n{stderr}"
    return int(m[1]), int(m[2]), int(m[3])


# ------------------------------------------------------------------------ plumbing


def test_exports_the_plugin_as_data_symbols(libc4d):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("binutils' nm is not installed")
    cmd = [nm, "-D", "--defined-only", str(libc4d)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    kinds = {line.split()[-1]: line.split()[-2] for line in out.stdout.splitlines() if line.strip()}
    assert kinds.get("ncclProfiler_v5") == kinds.get("ncclProfiler_v6") == "D"
    # Read the structs the way NCCL does (dlsym a data symbol): a name and five callbacks,
    # the same ones in both versions. A fresh process: loading the shim here changes nothing.
    probe = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({str(libc4d)!r})\n"
        "class P(ctypes.Structure):\n"
        "    _fields_ = [('name', ctypes.c_char_p)] + [(f, ctypes.c_void_p) for f in "
        "('init', 'start', 'stop', 'record', 'finalize')]\n"
        "v5, v6 = (P.in_dll(lib, n) for n in ('ncclProfiler_v5', 'ncclProfiler_v6'))\n"
        "print(v5.name.decode(), all(getattr(v5, f) for f, _ in P._fields_[1:]),"
        " [getattr(v5, f) for f, _ in P._fields_[1:]] == [getattr(v6, f) for f, _ in P._fields_[1:]])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe], env=base_env(None), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["c4d", "True", "True"]


REAL_ORDER_DRIVER = textwrap.dedent(
    """
    import ctypes, os, sys, threading
    lib = ctypes.CDLL(os.environ["LIBC4D"])
    V = ctypes.c_void_p
    class Coll(ctypes.Structure):
        _fields_ = [("seqNumber", ctypes.c_uint64), ("func", ctypes.c_char_p), ("sendBuff", V),
                    ("recvBuff", V), ("count", ctypes.c_size_t), ("root", ctypes.c_int),
                    ("datatype", ctypes.c_char_p), ("nChannels", ctypes.c_uint8), ("nWarps", ctypes.c_uint8),
                    ("algo", ctypes.c_char_p), ("proto", ctypes.c_char_p), ("parentGroup", V)]
    class ProxyOp(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_int), ("channelId", ctypes.c_uint8), ("peer", ctypes.c_int),
                    ("nSteps", ctypes.c_int), ("chunkSize", ctypes.c_int), ("isSend", ctypes.c_int)]
    class Step(ctypes.Structure):
        _fields_ = [("step", ctypes.c_int)]
    class U(ctypes.Union):
        _fields_ = [("coll", Coll), ("proxyOp", ProxyOp), ("proxyStep", Step), ("pad", ctypes.c_char * 128)]
    class Descr(ctypes.Structure):
        _fields_ = [("type", ctypes.c_uint64), ("parentObj", V), ("rank", ctypes.c_int), ("u", U)]
    INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(V), ctypes.c_uint64, ctypes.POINTER(ctypes.c_int),
                            ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, V)
    START = ctypes.CFUNCTYPE(ctypes.c_int, V, ctypes.POINTER(V), ctypes.POINTER(Descr))
    STOP = ctypes.CFUNCTYPE(ctypes.c_int, V)
    STATE = ctypes.CFUNCTYPE(ctypes.c_int, V, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t))
    class Api(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("init", INIT), ("start", START), ("stop", STOP),
                    ("state", STATE), ("finalize", STOP)]
    api = Api.in_dll(lib, "ncclProfiler_v6")
    ctx, mask = V(), ctypes.c_int()
    assert api.init(ctypes.byref(ctx), 0xC0FFEE, ctypes.byref(mask), b"c", 2, 2, 0, None) == 0
    assert mask.value & (2 | 8 | 16), mask.value  # Coll, ProxyOp, ProxyStep
    def start(d):
        h = V()
        assert api.start(ctx, ctypes.byref(h), ctypes.byref(d)) == 0
        return h
    for seq in range(3):
        # launching thread (enqueue.cc hostStreamPlanTask): task start, proxy ops posted, task stop
        coll = Descr(type=2, rank=0)
        coll.u.coll = Coll(seqNumber=seq, func=b"AllReduce", count=1024, root=-1, datatype=b"ncclFloat32",
                           nChannels=1, algo=b"RING", proto=b"SIMPLE")
        task = start(coll)
        assert task.value, "the Coll event is tracked"
        assert api.stop(task) == 0
        def proxy():  # proxy progress thread (proxy.cc): ProxyOps start after the task stopped
            for send in (1, 0):
                d = Descr(type=8, parentObj=task, rank=0)
                d.u.proxyOp = ProxyOp(pid=os.getpid(), peer=1, nSteps=2, chunkSize=2048, isSend=send)
                op = start(d)
                for s in range(2):
                    st = Descr(type=16, parentObj=op, rank=0)
                    st.u.proxyStep = Step(step=s)
                    h = start(st)
                    size = ctypes.c_size_t(2048)
                    assert api.state(h, 9 if send else 10, ctypes.byref(size)) == 0
                    assert api.stop(h) == 0
                assert api.stop(op) == 0
        t = threading.Thread(target=proxy)
        t.start()
        t.join()
    assert api.finalize(ctx) == 0
    """
)


def test_peer_records_when_tasks_stop_before_their_proxy_ops(libc4d, master):
    """The plugin driven by hand in NCCL 2.30.7's order: Coll start, Coll stop on the
    launching thread, then ProxyOps (parentObj = the stopped Coll) and their steps on another
    thread. Every transfer comes back as a done PEER record (a plugin that frees the task at
    its stopEvent tracks none of them)."""
    env = base_env(None, C4D_MASTER_ADDR=master.endpoint, RANK="0", WORLD_SIZE="1", LIBC4D=str(libc4d))
    p = subprocess.run([sys.executable, "-c", REAL_ORDER_DRIVER], env=env, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    transfers, records, untracked = profiler_counts(p.stderr)
    # A heartbeat that falls inside a transfer adds a progress record (done = 0) for it, so
    # under load there can be more records than transfers; the done records are exact.
    assert (transfers, untracked) == (6, 0) and records >= 6, p.stderr
    wait_records(master, lambda r: len(r[schema.Kind.PEER]) == records, f"{records} PEER records")
    peer = master.records()[schema.Kind.PEER]
    assert (peer["comm_id"] == 0xC0FFEE).all()
    peer = peer[peer["done"] == 1]
    assert len(peer) == 6, peer
    got = sorted((int(r["seq"]), int(r["direction"]), int(r["state"])) for r in peer)
    assert got == sorted((seq, d, 9 if d == 0 else 10) for seq in range(3) for d in (0, 1))
    assert (peer["steps_done"] == 2).all() and (peer["steps_total"] == 2).all()
    assert (peer["bytes_done"] == 4096).all() and (peer["peer"] == 1).all()


# ------------------------------------------------------------------ a healthy job


def test_peer_records_for_every_transfer_with_the_ops_seqs(libc4d, simtrain, master, jobs, tmp_path):
    world = 8
    job = run_job(jobs, simtrain, world, train(8, 2, 2), plugin_env(libc4d, master), tmp_path)
    assert job.wait(180) == [0] * world, [job.stderr(r) for r in range(world)]
    wait_records(master, final_seen({p.pid for p in job.procs}), "the FINAL heartbeat of every rank")
    recs = master.records()
    ops, peer, mem = recs[schema.Kind.OP], recs[schema.Kind.PEER], members(recs)
    assert len(ops) > 0 and len(peer) > 0
    done = peer[peer["done"] == 1]

    # Every op of this job runs on a 2-rank comm: a collective moves data both ways (one send
    # to the peer, one receive from it), a Send or a Recv one way. Each such transfer is one
    # done record carrying the OP record's own (comm, seq), on the same rank.
    by_op = {(int(o["rank"]), int(o["comm_id"]), int(o["op"]), int(o["seq"])): o for o in ops}
    got = collections.defaultdict(list)
    for r in done:
        got[(int(r["rank"]), int(r["comm_id"]), int(r["op"]), int(r["seq"]))].append(r)
    assert set(got) == set(by_op), (set(got) ^ set(by_op)).__repr__()[:400]
    for key, rows in got.items():
        o = by_op[key]
        want = {(0, SEND_WAIT), (1, RECV_WAIT)}  # (direction, last step state)
        if o["op"] >= schema.Op.Send:
            want = {(0, SEND_WAIT)} if o["op"] == schema.Op.Send else {(1, RECV_WAIT)}
        assert {(int(r["direction"]), int(r["state"])) for r in rows} == want, key
        for r in rows:
            assert r["comm_rank"] == o["comm_rank"] and r["peer"] == 1 - o["comm_rank"]
            if o["op"] >= schema.Op.Send:
                assert r["peer"] == o["peer"]
            assert r["steps_done"] == r["steps_total"] > 0
            assert r["bytes_done"] == o["bytes"]  # 2 ranks: each direction moves the whole buffer
            # The transfer lies within the op's device interval (anchor error: a few µs).
            assert o["start_ns"] - 1_000_000 <= r["first_ns"] <= r["last_ns"] <= o["end_ns"] + 1_000_000

    # Both ends of every link report the same transfer.
    kind = np.minimum(done["op"], schema.Op.Send).tolist()  # a Send #k meets the Recv #k at the other end
    sides = collections.Counter(
        (int(r["comm_id"]), int(r["seq"]), k, link(r, mem)) for r, k in zip(done, kind, strict=True)
    )
    assert set(sides.values()) == {2}, [k for k, n in sides.items() if n != 2][:5]

    # Transfers seen in flight at a heartbeat finished later, under the same seq (one whose op
    # was issued after the agent's last drain is numbered after another); nothing was dropped.
    flying = peer[peer["done"] == 0]
    key = ["rank", "comm_id", "seq", "peer", "direction"]
    finished = {tuple(int(r[k]) for k in key) for r in done}
    unmatched = [{k: int(r[k]) for k in [*key, "op"]} for r in flying]
    assert [u for u in unmatched if tuple(u[k] for k in key) not in finished] == [], len(flying)
    for r in range(world):
        tracked, records, untracked = profiler_counts(job.stderr(r))
        assert untracked == 0 and tracked == np.count_nonzero(done["rank"] == r)
        assert records == np.count_nonzero(peer["rank"] == r)
        assert summary(job.stderr(r))[1] == 0


def test_intra_node_transfers_have_no_peer_records(libc4d, simtrain, master, jobs, tmp_path):
    """4 ranks per node, tp2 pp2 on 8 ranks: tensor- and data-parallel pairs share a node
    (NVLink/P2P: no proxy, so NCCL emits no ProxyOp), pipeline pairs cross nodes. PEER
    records exist for the pipeline's Send/Recv only; the engine falls back on arrival times
    and cross-comm evidence for the rest."""
    world = 8
    env = plugin_env(libc4d, master, SIMNCCL_RANKS_PER_NODE="4")
    job = run_job(jobs, simtrain, world, train(4, 2, 2), env, tmp_path)
    assert job.wait(180) == [0] * world, [job.stderr(r) for r in range(world)]
    wait_records(master, final_seen({p.pid for p in job.procs}), "the FINAL heartbeat of every rank")
    recs = master.records()
    ops, peer, mem = recs[schema.Kind.OP], recs[schema.Kind.PEER], members(recs)
    done = peer[peer["done"] == 1]
    assert len(done) > 0 and (done["op"] >= schema.Op.Send).all()
    assert all((link(r, mem)[0] < 4) != (link(r, mem)[1] < 4) for r in done), "only links across nodes"
    p2p = ops[ops["op"] >= schema.Op.Send]
    assert {(int(o["rank"]), int(o["comm_id"]), int(o["seq"]), int(o["op"])) for o in p2p} == {
        (int(r["rank"]), int(r["comm_id"]), int(r["seq"]), int(r["op"])) for r in done
    }
    for r in range(world):
        tracked, _, untracked = profiler_counts(job.stderr(r))
        assert untracked == 0 and tracked == np.count_nonzero(done["rank"] == r)


def test_verify_passes_with_the_plugin_on(libc4d, simtrain, master, jobs, tmp_path):
    """Every collective checked bit for bit by the driver while the plugin tracks transfers."""
    job = run_job(jobs, simtrain, 4, ["--verify", "--job-dir", "{dir}"], plugin_env(libc4d, master), tmp_path)
    assert job.wait(120) == [0] * 4, [job.stderr(r) for r in range(4)]
    assert "verify ok" in job.stdout(0)
    wait_records(master, final_seen({p.pid for p in job.procs}), "every rank's FINAL heartbeat")
    peer = master.records()[schema.Kind.PEER]
    assert len(peer) > 0 and (peer["done"] == 1).any()
    assert {int(o) for o in np.unique(peer["op"])} >= {int(schema.Op.AllReduce), int(schema.Op.Send)}


# ---------------------------------------------------------------------- faults


def test_comm_hang_on_link_3_7_is_the_stuck_transfer(libc4d, simtrain, master, jobs, tmp_path):
    """8 ranks, tp2 pp2: 3 and 7 are pipeline neighbours. From step 5 the 3-7 link moves
    nothing: the PEER records in flight that make no progress are exactly 3<->7's, stuck in
    Send/RecvWait, while the other links' transfers of step 5 completed."""
    env = plugin_env(libc4d, master, SIMNCCL_FAULTS="comm-hang@link=3-7,step=5")
    job = run_job(jobs, simtrain, 8, train(40, 2, 2, "--progress"), env, tmp_path)

    def stuck(recs):
        fl = recs[schema.Kind.PEER]
        # Started transfers only: NCCL posts a ProxyOp when the op is launched, long before its
        # first step when the rank's stream is busy or its peer is late (first_ns = 0 until then).
        fl = fl[(fl["done"] == 0) & (fl["first_ns"] > 0)]
        # The same transfer reported, unchanged, for at least 1 s of heartbeats.
        out = []
        key = ["rank", "comm_id", "seq", "peer", "direction"]
        for k in np.unique(fl[key]):
            rows = fl[fl[key] == k]
            long = rows["time_ns"].max() - rows["time_ns"].min() > 1e9
            if long and len(np.unique(rows["steps_done"])) == 1:
                out.append(rows[np.argmax(rows["time_ns"])])
        return out

    wait_records(master, stuck, "a transfer reported in flight without progress for 1 s", timeout=90)
    time.sleep(0.3)  # one more heartbeat from every rank
    recs = master.records()
    job.kill()
    assert "step 4 done" in job.stderr(7) and "step 5 done" not in job.stderr(7)
    mem = members(recs)
    stalled = stuck(recs)
    assert stalled
    for r in stalled:
        assert set(link(r, mem)) == {3, 7}, (int(r["rank"]), link(r, mem))
        assert r["steps_done"] < r["steps_total"] and r["bytes_done"] == 0
        assert r["state"] == (SEND_WAIT if r["direction"] == 0 else RECV_WAIT)
        assert r["first_ns"] > 0 and time.time_ns() - int(r["last_ns"]) > 1e9
    # Rank 7 waits for step 5's activations from 3: the Recv its heartbeats name as pending.
    (r7,) = [r for r in stalled if r["rank"] == 7]
    assert r7["op"] == schema.Op.Recv and r7["seq"] == 5
    hb = recs[schema.Kind.HEARTBEAT]
    hb = hb[(hb["rank"] == 7) & (hb["comm_id"] == r7["comm_id"])]
    last = hb[np.argmax(hb["time_ns"])]
    assert (last["pend_seq"], last["pend_op"]) == (5, schema.Op.Recv)

    # Every other transfer that was seen moving finished; step 5 moved data on other links.
    peer = recs[schema.Kind.PEER]
    done = peer[peer["done"] == 1]
    key = ["rank", "comm_id", "seq", "peer", "direction"]
    finished = {tuple(int(r[k]) for k in key) for r in done}
    for r in peer[(peer["done"] == 0) & (peer["first_ns"] > 0)]:
        assert tuple(int(r[k]) for k in key) in finished or set(link(r, mem)) == {3, 7}
    step5 = {link(r, mem) for r in done if r["op"] >= schema.Op.Send and r["seq"] == 5}
    assert {(0, 4), (1, 5), (2, 6)} <= step5 and not step5 & {(3, 7), (7, 3)}


def test_comm_slow_rank_5_links_take_longer_per_step(libc4d, simtrain, master, jobs, tmp_path):
    """comm-slow@rank=5,step=5,factor=4: from step 5 the steps of every transfer over a link
    of rank 5 take longer; other links' steps keep their pace."""
    # Slow links (1 ms per step) so that the modeled times dominate scheduling noise.
    env = plugin_env(
        libc4d, master, SIMNCCL_FAULTS="comm-slow@rank=5,step=5,factor=4", SIMNCCL_INTER_GBPS="0.25"
    )
    job = run_job(jobs, simtrain, 8, train(12, 2, 2), env, tmp_path)
    assert job.wait(180) == [0] * 8, [job.stderr(r) for r in range(8)]
    wait_records(master, final_seen({p.pid for p in job.procs}), "the FINAL heartbeat of every rank")
    recs = master.records()
    mem = members(recs)
    done = recs[schema.Kind.PEER]
    done = done[(done["done"] == 1) & (done["op"] < schema.Op.Send)]  # ring collectives, 1-2 steps each
    per_step = collections.defaultdict(list)
    for r in done:
        # tp comms run AllGather then ReduceScatter per training step, dp comms one AllReduce.
        tp = r["op"] in (schema.Op.AllGather, schema.Op.ReduceScatter)
        step = int(r["seq"]) // 2 if tp else int(r["seq"])
        us = (int(r["last_ns"]) - int(r["first_ns"])) / int(r["steps_done"]) / 1e3
        per_step[(5 in link(r, mem), step >= 5)].append(us)
    med = {k: float(np.median(v)) for k, v in per_step.items()}
    before, after = med[(True, False)] / med[(False, False)], med[(True, True)] / med[(False, True)]
    assert after > 2 and after > 1.6 * before, med


# ----------------------------------------------------------------- switched off


def test_no_plugin_no_peer_records_and_everything_else_intact(libc4d, simtrain, master, jobs, tmp_path):
    world = 4
    env = plugin_env(libc4d, master, NCCL_PROFILER_PLUGIN="none")
    job = run_job(jobs, simtrain, world, train(6, 2, 2), env, tmp_path)
    assert job.wait(120) == [0] * world, [job.stderr(r) for r in range(world)]
    wait_records(master, final_seen({p.pid for p in job.procs}), "the FINAL heartbeat of every rank")
    recs = master.records()
    assert len(recs[schema.Kind.PEER]) == 0
    ops = recs[schema.Kind.OP]
    assert len(ops) > 0 and (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    for r in range(world):
        assert "profiler:" not in job.stderr(r) and summary(job.stderr(r))[1] == 0


def test_disabled_shim_refuses_the_plugin_and_passes_through(libc4d, simtrain, master, jobs, tmp_path):
    """C4D_ENABLE=0: init fails, so NCCL runs without the plugin; nothing is sent or printed."""
    world = 4
    env = plugin_env(libc4d, master, C4D_ENABLE="0")
    job = run_job(jobs, simtrain, world, ["--verify", "--job-dir", "{dir}"], env, tmp_path)
    assert job.wait(120) == [0] * world, [job.stderr(r) for r in range(world)]
    assert "verify ok" in job.stdout(0)
    for r in range(world):
        assert "c4d:" not in job.stderr(r), job.stderr(r)
    time.sleep(0.3)  # nothing is expected: give a stray batch the time to arrive
    assert master.batches == 0


# ------------------------------------------------ one process, shape-matched comms

INIT_ALL = """
comms = (ctypes.c_void_p * 2)()
check(g.ncclCommInitAll(comms, 2, (ctypes.c_int * 2)(0, 1)), "ncclCommInitAll")
c = [ctypes.c_void_p(x) for x in comms]
s = [new_stream()]
check(g.cudaSetDevice(1), "cudaSetDevice")
s.append(new_stream())
check(g.cudaSetDevice(0), "cudaSetDevice")
big = (ctypes.c_float * 256)()
def both(fn, args):
    check(g.ncclGroupStart(), "ncclGroupStart")  # one thread drives both ranks
    for i in range(2):
        check(fn(*args(i), c[i], s[i]), fn.__name__)
    check(g.ncclGroupEnd(), "ncclGroupEnd")
"""


def init_all_driver(body: str) -> str:
    """INIT_ALL, then ``body`` (dedented), for run_driver."""
    return INIT_ALL + textwrap.dedent(body)


def test_init_all_comms_matched_by_shape_keep_the_shims_seqs(libc4d, simnccl_dir, master):
    """ncclCommInitAll: the shim's comm id is not the one simnccl hands the plugin, so the
    contexts are matched by (nranks, rank) and creation order. Seqs still equal the OP
    records', across a count = 0 collective (the shim numbers it, the profiler never sees it)
    and a change of collective function."""
    body = init_all_driver(
        """
    both(g.ncclAllReduce, lambda i: (buf, out, 64, F32, 0))
    both(g.ncclAllGather, lambda i: (buf, big, 64, F32))
    both(g.ncclAllReduce, lambda i: (buf, out, 0, F32, 0))
    both(g.ncclAllReduce, lambda i: (buf, out, 64, F32, 0))
    both(g.ncclReduceScatter, lambda i: (big, out, 64, F32, 0))
    for i in range(2):
        check(g.cudaStreamSynchronize(s[i]), "sync")
    for i in range(2):
        check(g.ncclCommDestroy(c[i]), "ncclCommDestroy")
    """
    )
    env = dict(plugin_env(libc4d, master), C4D_PEER_TRACK="oops")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("C4D_PEER_TRACK='oops' is not an integer >= 16; using 4096") == 1, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    recs = master.records()
    ops, peer = recs[schema.Kind.OP], recs[schema.Kind.PEER]
    (comm_id,) = set(recs[schema.Kind.COMM]["comm_id"].tolist())
    assert sorted(int(o) for o in ops["seq"][ops["comm_rank"] == 0]) == [0, 1, 2, 3, 4]
    assert (peer["comm_id"] == comm_id).all()
    key = ["comm_rank", "seq", "op", "direction"]
    done = peer[peer["done"] == 1]
    finished = {tuple(int(r[k]) for k in key) for r in done}
    assert all(tuple(int(r[k]) for k in key) in finished for r in peer), "seen in flight, then done"
    got = sorted((int(r["comm_rank"]), int(r["seq"]), int(r["op"]), int(r["direction"])) for r in done)
    ops_seen = [
        (0, schema.Op.AllReduce),
        (1, schema.Op.AllGather),
        (3, schema.Op.AllReduce),
        (4, schema.Op.ReduceScatter),
    ]
    want = sorted((cr, seq, int(op), d) for cr in (0, 1) for seq, op in ops_seen for d in (0, 1))
    assert got == want


def test_collectives_past_the_hooks_are_named_once(libc4d, simnccl_dir, master):
    """NCCL called through its own library handle (ctypes.CDLL(libnccl), as vLLM's pynccl
    does) bypasses the preloaded hooks; the profiler plugin still sees those collectives. The
    shim says once that collectives went past the hooks and counts them: three on a
    communicator no hook saw created, two on one it tracks."""
    body = """
    own = ctypes.CDLL(os.environ["SIMNCCL_LIB"])  # dlsym on this handle: NCCL's own symbols
    comm = new_comm()  # through the hooks
    s = new_stream()
    for _ in range(2):
        check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "hooked ncclAllReduce")
    uid, past = UID(), ctypes.c_void_p()
    check(own.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    check(own.ncclCommInitRank(ctypes.byref(past), 1, uid, 0), "ncclCommInitRank past the hooks")
    for c, n in ((past, 3), (comm, 2)):
        for _ in range(n):
            check(own.ncclAllReduce(buf, out, 64, F32, 0, c, s), "ncclAllReduce past the hooks")
    check(g.cudaStreamSynchronize(s), "sync")
    import time
    time.sleep(0.3)  # a few heartbeats
    for c in (past, comm):
        check(own.ncclCommDestroy(c), "ncclCommDestroy")
    """
    p = run_driver(simnccl_dir, body, plugin_env(libc4d, master))
    assert p.returncode == 0, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "collectives that no hook saw" in ln]
    assert len(said) == 1, p.stderr  # said when first seen (some of the five, or all)
    assert ", 5 collectives past the hooks" in p.stderr, "the exit summary counts them all"
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    assert len(master.records()[schema.Kind.OP]) == 2, "only the hooked calls are ops"


def test_bounded_tracking_drops_and_counts(libc4d, simnccl_dir, master):
    """C4D_PEER_TRACK=16 and 48 transfers in flight at once in one process (2 ranks, 12
    AllReduces each in one group): the rest are not tracked, they are counted, and the
    job is not held up."""
    body = init_all_driver(
        """
    check(g.ncclGroupStart(), "ncclGroupStart")
    for i in range(2):
        for _ in range(12):  # simnccl: at most 16 collectives per comm in one group
            check(g.ncclAllReduce(buf, out, 64, F32, 0, c[i], s[i]), "ncclAllReduce")
    check(g.ncclGroupEnd(), "ncclGroupEnd")
    for i in range(2):
        check(g.cudaStreamSynchronize(s[i]), "sync")
    for i in range(2):
        check(g.ncclCommDestroy(c[i]), "ncclCommDestroy")
    """
    )
    p = run_driver(simnccl_dir, body, plugin_env(libc4d, master, C4D_PEER_TRACK="16"))
    assert p.returncode == 0, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    recs = master.records()
    assert len(recs[schema.Kind.OP]) == 24
    peer = recs[schema.Kind.PEER]
    tracked, _, untracked = profiler_counts(p.stderr)
    assert 16 <= len(peer[peer["done"] == 1]) == tracked < 48 and untracked > 0


def test_aborted_hang_is_reported_then_dropped(libc4d, simnccl_dir, master):
    """A hung collective's transfers are reported in flight every heartbeat; once the comms
    are aborted (their contexts finalized) they are reported a last time and forgotten."""
    body = init_all_driver(
        """
    import time
    both(g.ncclAllReduce, lambda i: (buf, out, 64, F32, 0))
    time.sleep(0.5)  # the hang, seen by ~10 heartbeats
    for i in range(2):
        check(g.ncclCommAbort(c[i]), "ncclCommAbort")
    time.sleep(0.5)  # the same rank, still running: heartbeats without the aborted transfers
    """
    )
    env = plugin_env(libc4d, master, SIMNCCL_FAULTS="comm-hang@rank=0,step=0")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    recs = master.records()
    peer, comm, hb = recs[schema.Kind.PEER], recs[schema.Kind.COMM], recs[schema.Kind.HEARTBEAT]
    assert (peer["done"] == 0).all() and len(peer) >= 4 * 5
    ends = set(zip(peer["comm_rank"].tolist(), peer["direction"].tolist(), strict=True))
    assert ends == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert (peer["steps_done"] == 0).all() and (peer["steps_total"] == 2).all()
    # A heartbeat may catch a transfer made before its first step's state (state 0, a loaded
    # host); each end's last report is the step it hangs in.
    assert set(peer["state"].tolist()) <= {0, SEND_WAIT, RECV_WAIT}
    last = {
        (int(r["comm_rank"]), int(r["direction"])): int(r["state"]) for r in np.sort(peer, order="time_ns")
    }
    assert last == {(0, 0): SEND_WAIT, (0, 1): RECV_WAIT, (1, 0): SEND_WAIT, (1, 1): RECV_WAIT}
    aborted = int(comm[comm["event"] == schema.CommEvent.ABORT]["time_ns"].max())
    final = int(hb[(hb["hb_flags"] & schema.HBF_FINAL) != 0]["time_ns"].max())
    assert final - aborted > 400_000_000
    assert int(peer["time_ns"].max()) < aborted + 200_000_000  # at most one heartbeat after the abort
    tracked, records, untracked = profiler_counts(p.stderr)
    assert (tracked, records, untracked) == (4, len(peer), 0)
