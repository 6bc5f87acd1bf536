"""One process of scripts/gpu-validate: a world-size-1 NCCL loop, timed, then one JSON line.

Started by scripts/gpu_validate.py, with or without libc4d.so preloaded (the driver decides;
this loop does not know). A step is: a matmul (the compute a training step would do),
all-reduce, all-gather, reduce-scatter, and a Send/Recv to itself in one group.

Backends: ``torch`` drives NCCL through the machine's own PyTorch (ProcessGroupNCCL, world
size 1, bound to one device); ``sim`` drives simnccl's libnccl.so.2 and CUDA runtime subset
through ctypes, the same calls in the same order (CI has no GPU).

Modes: ``plain`` the eager loop; ``graph`` the step captured once in a CUDA graph and
replayed (torch.cuda.graph, global capture mode), the capture held open 1.5 s as a large
model's would be, so that the shim's agent makes its periodic CUDA calls (event polls, a
clock anchor about every second) while it is open; ``nonblocking`` communicators created
non-blocking (torch: TORCH_NCCL_USE_COMM_NONBLOCKING=1, set by the driver; sim: ncclConfig_t
blocking=0 and ncclCommGetAsyncError polled, as NCCL documents).

The last stdout line is a JSON object: ok, error, step_ms (median over timed repeats),
calls (NCCL calls made, per op), device, contexts (devices with an active primary context in
this process), smi (nvidia-smi's compute-apps rows for this pid), versions.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

OPS = ("AllReduce", "AllGather", "ReduceScatter", "Send", "Recv")


def timed_repeats(
    step: Callable[[], None], sync: Callable[[], None], steps: int, repeats: int
) -> list[float]:
    """ms per step of `repeats` runs of steps // repeats steps, one sync at the end of each."""
    k = max(1, steps // repeats)
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            step()
        sync()
        out.append((time.perf_counter() - t0) * 1e3 / k)
    return out


def primary_contexts() -> list[int] | None:
    """Devices on which this process holds an active primary context (CUDA driver API), or None
    without a driver. Independent of pid namespaces, unlike nvidia-smi."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    n = ctypes.c_int()
    if cu.cuInit(0) != 0 or cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return None
    active = []
    for i in range(n.value):
        dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if (
            cu.cuDeviceGet(ctypes.byref(dev), i) == 0
            and cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
            and on.value
        ):
            active.append(i)
    return active


def smi_rows() -> dict[str, Any]:
    """nvidia-smi's view: the GPU indexes on which it lists this pid as a compute app."""
    pid = os.getpid()
    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        return {"devices": None, "reason": f"nvidia-smi: {e}"}
    index = {u.strip(): int(i) for i, u in (line.split(",", 1) for line in gpus.splitlines() if "," in line)}
    mine, mem = [], []
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0] == str(pid):
            mine.append(index.get(parts[1], -1))
            mem.append(parts[2])
    if not mine:
        return {"devices": None, "reason": "nvidia-smi lists no compute app with this pid (pid namespace?)"}
    return {"devices": sorted(mine), "used_mib": mem}


# --------------------------------------------------------------------------- torch


def run_torch(a: argparse.Namespace, out: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    out.update(torch=torch.__version__, device_name=torch.cuda.get_device_name(dev))
    v = torch.cuda.nccl.version()  # a tuple (2, 27, 5); an int in old releases
    out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    dist.init_process_group("nccl", init_method=f"file://{a.store}", rank=0, world_size=1, device_id=dev)
    calls: Counter[str] = Counter()
    n = max(1, a.bytes // 4)
    x = torch.ones(n, device=dev)
    gathered = torch.empty(n, device=dev)
    rs_in, rs_out = torch.ones(n, device=dev), torch.empty(n, device=dev)
    send, recv = torch.ones(n, device=dev), torch.empty(n, device=dev)
    m = torch.randn(a.compute, a.compute, device=dev, dtype=torch.bfloat16) if a.compute else None

    def step() -> None:
        if m is not None:
            torch.mm(m, m)
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, x)
        dist.reduce_scatter_tensor(rs_out, rs_in)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, 0), dist.P2POp(dist.irecv, recv, 0)]):
            w.wait()
        calls.update(OPS)

    def check_values(v: float) -> None:
        """Fill the inputs with v, run (or replay) a step, expect v everywhere (world size 1)."""
        for t in (x, rs_in, send):
            t.fill_(v)
        run_once()
        torch.cuda.synchronize()
        for name, t in (
            ("all_reduce", x),
            ("all_gather", gathered),
            ("reduce_scatter", rs_out),
            ("recv", recv),
        ):
            if not bool((t == v).all()):
                raise AssertionError(f"{name} result wrong after a step: expected {v}")

    run_once: Callable[[], None] = step
    if a.mode == "graph":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(a.warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # global capture mode: another thread's CUDA calls break it
            step()
            time.sleep(a.capture_hold_ms / 1e3)  # as a large model: the agent polls while it is open
        run_once = graph.replay
        check_values(3.0)
        out["step_ms_all"] = timed_repeats(graph.replay, torch.cuda.synchronize, a.steps, a.repeats)
        check_values(5.0)
        out["replays"] = a.steps + 2
    else:
        for _ in range(a.warmup):
            step()
        check_values(3.0)
        out["step_ms_all"] = timed_repeats(step, torch.cuda.synchronize, a.steps, a.repeats)
    torch.cuda.synchronize()
    out["calls"] = dict(calls)
    out["contexts"] = primary_contexts()
    out["smi"] = smi_rows()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- sim


_INT_FIELDS_1 = ("blocking", "cgaClusterSize", "minCTAs", "maxCTAs")
_INT_FIELDS_2 = (
    "collnetEnable", "CTAPolicy", "shrinkShare", "nvlsCTAs", "nChannelsPerNetPeer", "nvlinkCentricSched",
    "graphUsageMode", "numRmaCtx", "maxP2pPeers", "graphStreamOrdering", "launchOrderImplicit", "numRmaSig",
    "rmaEagerInit", "hostCftMode", "nvlsHostMode",
)  # fmt: skip


class NcclConfig(ctypes.Structure):
    """ncclConfig_t of NCCL 2.32.3 (nccl.h, struct ncclConfig_v23100; tests/test_conformance_real_nccl.py
    compares the layout with the wheel's header)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        *((f, ctypes.c_int) for f in _INT_FIELDS_1),
        ("netName", ctypes.c_void_p),
        ("splitShare", ctypes.c_int),
        ("trafficClass", ctypes.c_int),
        ("commName", ctypes.c_void_p),
        *((f, ctypes.c_int) for f in _INT_FIELDS_2),
    ]


def nccl_config(blocking: int) -> NcclConfig:
    """NCCL_CONFIG_INITIALIZER with blocking set (NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT)."""
    undef = -(2**31)
    c = NcclConfig()
    for name, _ in NcclConfig._fields_[3:]:
        setattr(c, name, None if name in ("netName", "commName") else undef)
    c.size, c.magic, c.version, c.blocking = ctypes.sizeof(NcclConfig), 0xCAFEBEEF, 23203, blocking
    return c


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


IN_PROGRESS = 7  # ncclInProgress


def run_sim(a: argparse.Namespace, out: dict[str, Any]) -> None:
    ctypes.CDLL(os.path.join(a.sim_dir, "libnccl.so.2"), mode=ctypes.RTLD_GLOBAL)
    g = ctypes.CDLL(None)  # the global scope: a preloaded shim's hooks come first
    out["device_name"] = "simnccl"
    v = ctypes.c_int()
    g.ncclGetVersion(ctypes.byref(v))
    out["nccl_version"] = f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100} (simnccl)"
    calls: Counter[str] = Counter()
    comm, stream, uid = ctypes.c_void_p(), ctypes.c_void_p(), UniqueId()

    def check(r: int, what: str) -> None:
        if r != 0:
            raise RuntimeError(f"{what} returned {r}")

    def settle(r: int, what: str) -> None:
        """A non-blocking comm: ncclInProgress means poll ncclCommGetAsyncError until done."""
        if r == IN_PROGRESS and comm.value:
            deadline = time.monotonic() + 30
            state = ctypes.c_int(IN_PROGRESS)
            while state.value == IN_PROGRESS and time.monotonic() < deadline:
                check(g.ncclCommGetAsyncError(comm, ctypes.byref(state)), "ncclCommGetAsyncError")
            r = state.value
        check(r, what)

    check(g.cudaSetDevice(a.device), "cudaSetDevice")
    check(g.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    if a.mode == "nonblocking":
        cfg = nccl_config(0)
        r = g.ncclCommInitRankConfig(ctypes.byref(comm), 1, uid, 0, ctypes.byref(cfg))
        if r != IN_PROGRESS:
            check(r, "ncclCommInitRankConfig")
            out["skipped"] = (
                "a non-blocking ncclCommInitRankConfig returned ncclSuccess: "
                "this simnccl has no non-blocking communicators"
            )
            return
        settle(r, "ncclCommInitRankConfig")
    else:
        check(g.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0), "ncclCommInitRank")
    check(g.cudaStreamCreateWithFlags(ctypes.byref(stream), 1), "cudaStreamCreateWithFlags")
    n = max(1, a.bytes // 4)
    size = ctypes.c_size_t(n * 4)
    host = (ctypes.c_float * n)()
    bufs = []
    for _ in range(6):
        p = ctypes.c_void_p()
        check(g.cudaMalloc(ctypes.byref(p), size), "cudaMalloc")
        bufs.append(p)
    x, gathered, rs_in, rs_out, send, recv = bufs
    count, f32, sum_ = ctypes.c_size_t(n), 7, 0

    def step() -> None:
        if a.compute:
            g.simLaunchCompute(stream, ctypes.c_uint64(a.compute * 1000))
        settle(g.ncclAllReduce(x, x, count, f32, sum_, comm, stream), "ncclAllReduce")
        settle(g.ncclAllGather(x, gathered, count, f32, comm, stream), "ncclAllGather")
        settle(g.ncclReduceScatter(rs_in, rs_out, count, f32, sum_, comm, stream), "ncclReduceScatter")
        check(g.ncclGroupStart(), "ncclGroupStart")
        settle(g.ncclSend(send, count, f32, 0, comm, stream), "ncclSend")
        settle(g.ncclRecv(recv, count, f32, 0, comm, stream), "ncclRecv")
        settle(g.ncclGroupEnd(), "ncclGroupEnd")
        calls.update(OPS)

    def sync() -> None:
        check(g.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def check_values(v: float, run_once: Callable[[], None]) -> None:
        """Fill the inputs with v, run (or replay) a step, expect v everywhere (world size 1)."""
        sync()  # the stream is non-blocking: cudaMemcpy does not wait for it
        for i in range(n):
            host[i] = v
        for b in (x, rs_in, send):
            check(g.cudaMemcpy(b, host, size, 1), "cudaMemcpy H2D")
        run_once()
        sync()
        for name, b in (
            ("all_reduce", x),
            ("all_gather", gathered),
            ("reduce_scatter", rs_out),
            ("recv", recv),
        ):
            check(g.cudaMemcpy(host, b, size, 2), "cudaMemcpy D2H")
            if any(host[i] != v for i in range(0, n, max(1, n // 64))):
                raise AssertionError(f"{name} result wrong after a step: expected {v}")

    for _ in range(a.warmup):
        step()
    if a.mode == "graph":
        if not hasattr(g, "cudaStreamBeginCapture"):
            out["skipped"] = "this simnccl has no CUDA graph capture (cudaStreamBeginCapture)"
            return
        replay = capture_sim(g, step, sync, stream, check, a.capture_hold_ms)
        check_values(3.0, replay)
        out["step_ms_all"] = timed_repeats(replay, sync, a.steps, a.repeats)
        check_values(5.0, replay)
        out["replays"] = a.steps + 2
    else:
        check_values(3.0, step)
        out["step_ms_all"] = timed_repeats(step, sync, a.steps, a.repeats)
    sync()
    out["calls"] = dict(calls)
    out["contexts"] = None  # the driver reads simnccl's SIMNCCL_CONTEXT_DUMP after the exit
    out["smi"] = {"devices": None, "reason": "no nvidia-smi on simnccl"}
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")


def capture_sim(g, step, sync, stream, check, hold_ms: int) -> Callable[[], None]:
    """The step captured on `stream` in global mode (what torch.cuda.graph uses) with simnccl's
    CUDA graph API, the capture held open hold_ms; returns a replay."""
    sync()
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    check(g.cudaStreamBeginCapture(stream, 0), "cudaStreamBeginCapture(global mode)")
    step()
    time.sleep(hold_ms / 1e3)
    check(g.cudaStreamEndCapture(stream, ctypes.byref(graph)), "cudaStreamEndCapture")
    check(g.cudaGraphInstantiate(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)), "cudaGraphInstantiate")

    def replay() -> None:
        check(g.cudaGraphLaunch(exe, stream), "cudaGraphLaunch")

    return replay


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("torch", "sim"), required=True)
    p.add_argument("--mode", choices=("plain", "graph", "nonblocking"), default="plain")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--bytes", type=int, default=16 << 20, help="bytes per collective buffer")
    p.add_argument("--compute", type=int, default=0, help="torch: matmul size; sim: compute µs per step")
    p.add_argument("--device", type=int, default=0)
    p.add_argument(
        "--capture-hold-ms",
        type=int,
        default=1500,
        help="graph: how long the capture stays open (longer than the shim's ~1 s clock anchor period)",
    )
    p.add_argument("--store", default="", help="torch: file for the process group's FileStore")
    p.add_argument("--sim-dir", default="", help="sim: folder of simnccl's libnccl.so.2")
    a = p.parse_args()
    out: dict[str, Any] = {"ok": False, "error": None, "pid": os.getpid(), "mode": a.mode, "device": a.device}
    try:
        (run_torch if a.backend == "torch" else run_sim)(a, out)
        if out.get("step_ms_all"):
            out["step_ms"] = statistics.median(out["step_ms_all"])
        out["ok"] = True
    except Exception as e:  # the driver reports it; the line below must still be printed
        out["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    sys.stdout.flush()
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
