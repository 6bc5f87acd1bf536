"""libc4d.so's profiler plugin driven in the event order real NCCL produces.

tests/native/profiler_replay.c, compiled here against upstream's own profiler headers
(tests/native/upstream_nccl/, NCCL v2.30.7-1), loads the plugin symbol the way NCCL does and
replays what NCCL 2.30.7 emits for a 2-rank, 2-node communicator: the Coll/P2p task events
start and *stop* on the API thread (src/enqueue.cc, hostStreamPlanTask), and the ProxyOps start
later on a separate progress thread with the stopped task as their parent (src/proxy.cc,
src/transport/net.cc). The same harness with the ProxyOps started while the task is still open
(simnccl's order before issue 8, and a race real NCCL's progress thread can also win) is the
control. PEER records are collected through a real ZeroMQ PULL socket. No GPU, no NCCL library
needed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from c4d.record import schema
from tests.test_shim import Master, base_env, wait_records

HERE = Path(__file__).resolve().parent
HEADERS = HERE / "native" / "upstream_nccl" / "nccl"
COMM_ID = 0xC4DC0FFEE0000001  # profiler_replay.c: the commId it passes to init
N = 25  # AllReduce and AllGather calls each, and Send/Recv pairs
CHANNELS, STEPS, STEP_BYTES = 2, 4, 1 << 19  # profiler_replay.c's communicator
GPU_WAIT_NS, WIRE_NS = 300_000, 100_000  # profiler_replay.c: a send step's data wait, its Isend
SEND_STATES = {8, 20, 9}  # SendGPUWait, SendPeerWait_v4, SendWait
RECV_STATES = {10, 11, 12}  # RecvWait, RecvFlushWait, RecvGPUWait
REPLAYED = re.compile(r"replayed (\d+) plans, (\d+) transfers, (\d+) events, mask 0x([0-9a-f]+)")
PROFILER = re.compile(r"profiler: (\d+) transfers, (\d+) PEER records, (\d+) events untracked")


@pytest.fixture(scope="session")
def replay(tmp_path_factory) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    assert cc, "no C compiler (cc/gcc): the native build needs one too"
    exe = tmp_path_factory.mktemp("replay") / "profiler_replay"
    cmd = [cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{HEADERS}"]
    cmd += [str(HERE / "native" / "profiler_replay.c"), "-o", str(exe), "-lpthread", "-ldl"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def run_replay(replay: Path, libc4d, master: Master, symbol: str, order: str, via: str):
    """The harness as one process; via 'path' dlopens libc4d.so like NCCL_PROFILER_PLUGIN=<path>,
    'static' preloads it and looks the symbol up like NCCL_PROFILER_PLUGIN=STATIC_PLUGIN."""
    env = base_env(libc4d if via == "static" else None, C4D_MASTER_ADDR=master.endpoint, RANK="0")
    lib = "STATIC_PLUGIN" if via == "static" else str(libc4d)
    p = subprocess.run(
        [str(replay), lib, symbol, order, str(N)], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    m = REPLAYED.search(p.stdout)
    assert m, p.stdout
    wait_records(
        master,
        lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(),
        "the harness's FINAL heartbeat",
    )
    return p, int(m[2])


def expected_transfers() -> set[tuple[int, int, int]]:
    """(op, seq, direction) of every transfer the harness replays, all with peer 1."""
    out = set()
    for seq in range(N):
        for op in (schema.Op.AllReduce, schema.Op.AllGather):
            out |= {(int(op), seq, 0), (int(op), seq, 1)}
        out |= {(int(schema.Op.Send), seq, 0), (int(schema.Op.Recv), seq, 1)}
    return out


def check_peer_records(p, transfers: int, master: Master):
    peer = master.records()[schema.Kind.PEER]
    done = peer[peer["done"] == 1]
    got = [(int(r["op"]), int(r["seq"]), int(r["direction"])) for r in done]
    assert len(got) == transfers == len(set(got)), (len(got), transfers)
    assert set(got) == expected_transfers()
    # One communicator this process never created through a hooked call: the profiler's commId.
    assert (done["comm_id"] == COMM_ID).all() and (done["comm_rank"] == 0).all() and (done["peer"] == 1).all()
    # Both channels' ProxyOps joined one transfer: every step and byte counted once.
    assert (done["steps_total"] == CHANNELS * STEPS).all() and (done["steps_done"] == CHANNELS * STEPS).all()
    assert (done["bytes_done"] == CHANNELS * STEPS * STEP_BYTES).all()
    for r in done:
        assert int(r["state"]) in (SEND_STATES if r["direction"] == 0 else RECV_STATES), r
        assert 0 < r["first_ns"] <= r["last_ns"]
        # The sender's own transfer time: SendWait -> step stop of each step, without the wait
        # for the GPU's data before it (the harness runs the steps one after another, so the
        # waits and the transfers are disjoint spans inside [first_ns, last_ns]).
        steps = CHANNELS * STEPS
        if r["direction"] == 0:
            span = int(r["last_ns"]) - int(r["first_ns"])
            assert steps * WIRE_NS <= int(r["wire_ns"]) <= span - steps * GPU_WAIT_NS, r
        else:
            assert r["wire_ns"] == 0, r  # a receive's wait includes its sender's: no own time
    m = PROFILER.search(p.stderr)
    assert m, p.stderr
    tracked, records, untracked = (int(x) for x in m.groups())
    assert (tracked, untracked) == (transfers, 0), p.stderr
    assert records == len(peer) and np.count_nonzero(peer["done"] == 0) == records - transfers


def expected_events(mask: int) -> int:
    """Events the harness starts for the plugin's mask: the gating of NCCL's src/plugin/profiler.cc
    for the event types profiler_replay.c emits."""
    coll, p2p, op, step, kch, launch = (1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 6, 1 << 11)
    api = 1 << 8 | 1 << 9 | 1 << 10  # GroupApi, CollApi, P2pApi
    below = op | step | kch | 1 << 7  # ProxyOp, ProxyStep, KernelCh, NetPlugin
    ops = 2 * CHANNELS  # ProxyOps per plan: per task, per channel, each direction it moves
    n_task = {"coll": 1, "p2p": 2}
    total = 0
    for kind, own in (("coll", coll | 1 << 9), ("p2p", p2p | 1 << 10)):
        e = 0
        e += bool(mask & (api | launch | 1 | coll | p2p | below | 7 << 12))  # GroupApi
        e += n_task[kind] * bool(mask & (own | below))  # CollApi / P2pApi
        e += bool(mask & launch)  # KernelLaunch
        e += bool(mask & (1 | coll | p2p | below))  # Group
        e += n_task[kind] * bool(mask & (own | below))  # Coll / P2p
        e += ops * bool(mask & (op | step | 1 << 7))  # ProxyOp
        e += ops * STEPS * bool(mask & (step | 1 << 7))  # ProxyStep
        e += n_task[kind] * CHANNELS * bool(mask & kch)  # KernelCh
        total += e * (2 * N if kind == "coll" else N)
    return total


def test_harness_replays_what_it_claims(replay, libc4d, master):
    """The replay's own counts: 25 x (AllReduce, AllGather, Send+Recv) plans, 2 transfers each,
    every event NCCL would start for the mask the shim asked for (Coll|P2p|ProxyOp|ProxyStep
    at least)."""
    p, transfers = run_replay(replay, libc4d, master, "ncclProfiler_v6", "nccl", "path")
    plans, _, events, mask = REPLAYED.search(p.stdout).groups()  # type: ignore[union-attr]
    assert (int(plans), transfers) == (3 * N, 6 * N)
    assert int(mask, 16) & 0x1E == 0x1E
    assert int(events) == expected_events(int(mask, 16))
    assert expected_events(0x1E) == 2 * N * 24 + N * 26  # 1850: worked out by hand for today's mask


def test_task_open_order_gives_a_peer_record_per_transfer(replay, libc4d, master):
    """The control: ProxyOps that start while their task is still open."""
    p, transfers = run_replay(replay, libc4d, master, "ncclProfiler_v6", "task-open", "path")
    check_peer_records(p, transfers, master)


@pytest.mark.parametrize(("symbol", "via"), [("ncclProfiler_v6", "path"), ("ncclProfiler_v5", "static")])
def test_nccl_order_gives_a_peer_record_per_transfer(replay, libc4d, master, symbol, via):
    """NCCL 2.30.7's order: the task stopped before its ProxyOps start on another thread.
    (Before issue 8 the shim freed a task at its stop: 0 PEER records, everything untracked.)"""
    p, transfers = run_replay(replay, libc4d, master, symbol, "nccl", via)
    check_peer_records(p, transfers, master)
