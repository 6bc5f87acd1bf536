"""libc4d.so, the LD_PRELOAD interposer, end to end.

Real rank processes (``c4d-simtrain`` on simnccl, or a small ctypes driver of simnccl
for exact call sequences), the real shim preloaded, and a real ZeroMQ PULL socket in
the test, decoded with c4d.record.schema. No mocks.

Sanitizer runs: build with ``-DC4D_SANITIZE=address|thread -DC4D_OUT=DIR``, then run
with ``C4D_NATIVE_DIR=DIR`` and ``C4D_TEST_PRELOAD_PREFIX=<path of libasan/libtsan>``
(the sanitizer runtime must come first in LD_PRELOAD).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import zmq

from c4d.record import schema
from tests.conftest import wait_for

EXPECTED_EXPORTS = {
    *(
        f"nccl{n}"
        for n in [
            "AllReduce", "Broadcast", "Bcast", "Reduce", "AllGather", "ReduceScatter", "AlltoAll", "Gather",
            "Scatter", "AllReduceConfig", "BroadcastConfig", "ReduceConfig", "AllGatherConfig",
            "ReduceScatterConfig", "AlltoAllConfig", "GatherConfig", "ScatterConfig", "Send", "Recv",
            "GroupStart", "GroupEnd", "GroupSimulateEnd", "CommInitRank", "CommInitRankConfig",
            "CommInitRankScalable", "CommInitAll", "CommSplit", "CommShrink", "CommFinalize", "CommDestroy",
            "CommAbort", "CommGetAsyncError", "CommRevoke", "CommSuspend", "CommResume", "CommGrow",
            "PutSignal", "Signal", "WaitSignal",
        ]
    ),
    "c4d_version",
    "ncclProfiler_v5",
    "ncclProfiler_v6",
    "c4d_stats",
    "c4d_set_hang_timeout",
    "c4d_hang_timeout",
}  # fmt: skip

C4D_VARS = [
    "C4D_HANG_TIMEOUT", "C4D_HANG_TIMES", "C4D_CONN_BW_CHECK_PERIOD", "C4D_RUNTIME_LOG_LEVEL",
    "C4D_ENABLE_STATS_OUTPUT", "C4D_MASTER_ADDR", "C4D_ENABLE", "C4D_NODE_NAME", "C4D_HEARTBEAT_MS",
    "C4D_QUEUE_CAPACITY", "C4D_EVENT_POOL", "C4D_SEND_HWM", "C4D_EXIT_FLUSH_MS", "C4D_CLOCK_OFFSET_NS",
    "C4D_LIBZMQ", "C4D_JOB_ID", "C4D_PTRACER_PID",
]  # fmt: skip

SUMMARY = re.compile(r"c4d: rank (-?\d+) pid (\d+): (\d+) records sent, (\d+) dropped \(queue full (\d+)")


# ----------------------------------------------------------------------------- helpers


def pyzmq_libzmq() -> str:
    """The libzmq bundled with pyzmq (what an installed c4d finds beside itself)."""
    root = Path(zmq.__file__).resolve().parent.parent
    found = sorted(glob.glob(str(root / "pyzmq.libs" / "libzmq*.so*")))
    if not found:
        pytest.skip("this pyzmq has no bundled libzmq in pyzmq.libs/")
    return found[0]


def preload(lib: Path) -> str:
    prefix = os.environ.get("C4D_TEST_PRELOAD_PREFIX", "").strip()
    return f"{prefix} {lib}".strip()


def base_env(lib: Path | None, **extra: str) -> dict[str, str]:
    """Environment of a rank process; lib None: no shim (a sanitizer run still preloads its
    runtime, which must come first in any process that loads an instrumented library)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("C4D_") or k == "C4D_NATIVE_DIR"}
    env.update(ASAN_OPTIONS="detect_leaks=0", C4D_LIBZMQ=pyzmq_libzmq())
    prefix = os.environ.get("C4D_TEST_PRELOAD_PREFIX", "").strip()
    if lib is not None:
        env["LD_PRELOAD"] = preload(lib)
    elif prefix:
        env["LD_PRELOAD"] = prefix
    env.update(extra)
    return env


def free_tcp_endpoint() -> str:
    """An endpoint nobody listens on (a port the kernel just handed out and we released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


class Master:
    """A ZeroMQ PULL socket drained by a thread; batches are checked and decoded."""

    def __init__(self, endpoint: str | None = None):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        if endpoint:
            self.sock.bind(endpoint)
            self.endpoint = endpoint
        else:
            port = self.sock.bind_to_random_port("tcp://127.0.0.1")
            self.endpoint = f"tcp://127.0.0.1:{port}"
        self._chunks: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.batches = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(20):
                continue
            msg = self.sock.recv()
            hdr = np.frombuffer(msg[:16], schema.BATCH_HEADER)[0]
            body = msg[16:]
            ok = (
                hdr["magic"] == schema.BATCH_MAGIC
                and hdr["version"] == schema.SCHEMA_VERSION
                and hdr["record_size"] == schema.RECORD_SIZE
                and len(body) == int(hdr["n_records"]) * schema.RECORD_SIZE
            )
            if not ok:
                self.errors.append(f"bad batch header {hdr} for {len(body)} bytes")
                continue
            recs = np.frombuffer(body, schema.HEADER)
            if not (recs["rank"] == hdr["rank"]).all():
                self.errors.append("a record's rank differs from its batch's")
            with self._lock:
                self._chunks.append(recs)
                self.batches += 1

    def records(self) -> dict[schema.Kind, np.ndarray]:
        with self._lock:
            raw = np.concatenate(self._chunks) if self._chunks else np.empty(0, schema.HEADER)
        return schema.by_kind(raw)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture(autouse=True)
def _tested_build(libc4d):
    """A sanitizer run (C4D_NATIVE_DIR) must test that build, not silently fall back to another."""
    want = os.environ.get("C4D_NATIVE_DIR")
    assert not want or Path(libc4d).resolve().is_relative_to(Path(want).resolve()), (libc4d, want)


class Job:
    """Rank processes of c4d-simtrain, one per rank, stderr captured to files."""

    def __init__(self, simtrain: Path, world: int, args: list[str], env: dict[str, str], tmp: Path):
        self.job = f"c4dshim-{uuid.uuid4().hex[:10]}"
        self.dir = tmp / self.job
        self.dir.mkdir()
        self.procs: list[subprocess.Popen] = []
        self.t0 = time.monotonic()
        for r in range(world):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), SIMNCCL_JOB=self.job)
            err = open(self.dir / f"rank{r}.err", "w")  # noqa: SIM115 (closed in wait)
            out = open(self.dir / f"rank{r}.out", "w")  # noqa: SIM115
            a = [a.replace("{dir}", str(self.dir)) for a in args]
            self.procs.append(subprocess.Popen([str(simtrain), *a], env=e, stdout=out, stderr=err))
            self.procs[-1]._files = (out, err)  # type: ignore[attr-defined]

    def stderr(self, r: int) -> str:
        return (self.dir / f"rank{r}.err").read_text()

    def stdout(self, r: int) -> str:
        return (self.dir / f"rank{r}.out").read_text()

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            rcs = [p.wait(max(0.1, deadline - time.monotonic())) for p in self.procs]
        finally:
            self.kill()
        self.elapsed = time.monotonic() - self.t0
        return rcs

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
            for f in p._files:  # type: ignore[attr-defined]
                f.close()
        for f in glob.glob(f"/dev/shm/simnccl-{self.job}*"):
            os.unlink(f)


def run_job(jobs, simtrain, world, args, env, tmp_path) -> Job:
    j = Job(simtrain, world, args, env, tmp_path)
    jobs.append(j)
    return j


def fnv1a(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    """FNV-1a 64, the hash behind every comm id (native/shim/lifecycle.h)."""
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def train(steps: int, tp: int, pp: int, *extra: str) -> list[str]:
    """c4d-simtrain arguments for a training run in the job's own directory."""
    return ["--steps", str(steps), "--tp", str(tp), "--pp", str(pp), *extra, "--job-dir", "{dir}"]


def summary(stderr: str) -> tuple[int, int, int]:
    """(sent, dropped, queue-full drops) from the shim's exit line."""
    m = SUMMARY.search(stderr)
    assert m, f"no c4d summary line in:\n{stderr}"
    return int(m[3]), int(m[4]), int(m[5])


CTYPES_DRIVER = textwrap.dedent(
    """
    import ctypes, os, sys
    ctypes.CDLL(os.environ["SIMNCCL_LIB"], mode=ctypes.RTLD_GLOBAL)
    g = ctypes.CDLL(None)  # global scope: the preloaded shim's hooks come first
    class UID(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]
    def check(r, what):
        if r != 0:
            sys.exit(f"{what} returned {r}")
    def new_comm():
        uid, comm = UID(), ctypes.c_void_p()
        check(g.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        check(g.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0), "ncclCommInitRank")
        return comm
    def new_stream():
        s = ctypes.c_void_p()
        check(g.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "cudaStreamCreateWithFlags")
        return s
    F32 = 7
    buf, out = (ctypes.c_float * 64)(), (ctypes.c_float * 64)()
    """
)


def run_driver(simnccl_dir: Path, body: str, env: dict[str, str], timeout: float = 60):
    code = CTYPES_DRIVER + textwrap.dedent(body)
    job = f"c4dshim-{uuid.uuid4().hex[:10]}"
    env = dict(env, SIMNCCL_LIB=str(simnccl_dir / "libnccl.so.2"), SIMNCCL_JOB=job)
    env.setdefault("RANK", "0")
    env.setdefault("WORLD_SIZE", "1")
    cmd = [sys.executable, "-c", code]
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        for f in glob.glob(f"/dev/shm/simnccl-{env['SIMNCCL_JOB']}*"):
            os.unlink(f)


def wait_records(m: Master, cond, what: str, timeout: float = 10.0):
    try:
        return wait_for(lambda: cond(m.records()), timeout, what)
    except AssertionError as e:
        recs = m.records()
        seen = {k.name: len(v) for k, v in recs.items()}
        hb = recs[schema.Kind.HEARTBEAT]
        final = hb[(hb["hb_flags"] & schema.HBF_FINAL) != 0]
        finals = sorted(zip(final["rank"].tolist(), final["time_ns"].tolist(), strict=True))
        pids = sorted(set(recs[schema.Kind.REGISTER]["pid"].tolist()))
        msg = f"{e}; received {seen}, register pids {pids}, FINAL (rank, time) {finals}"
        raise AssertionError(msg) from None


def final_seen(pids: set[int]):
    """Condition: every pid's process-level FINAL heartbeat has arrived."""

    def cond(recs):
        reg = recs[schema.Kind.REGISTER]
        hb = recs[schema.Kind.HEARTBEAT]
        done_ranks = set(hb["rank"][(hb["hb_flags"] & schema.HBF_FINAL) != 0].tolist())
        return {int(p) for p in reg["pid"]} >= pids and set(reg["rank"].tolist()) <= done_ranks

    return cond


# ------------------------------------------------------------------- no NCCL, no job


def test_preload_into_python_without_nccl_is_silent(libc4d):
    """A process that never calls NCCL starts no thread, loads no libzmq, prints nothing,
    even with every variable malformed (configuration is read at the first NCCL call)."""
    probe = "import os; print(len(os.listdir('/proc/self/task')), 'libzmq' in open('/proc/self/maps').read())"
    env = base_env(libc4d, **{v: "garbage\x01" for v in C4D_VARS})
    p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1", "False"]
    assert p.stderr == ""

    p = subprocess.run([sys.executable, "-c", "pass"], env=base_env(libc4d), capture_output=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"", b"")


def test_exports_exactly_the_hooks_and_the_c_api(libc4d):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("binutils' nm is not installed")
    cmd = [nm, "-D", "--defined-only", str(libc4d)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    assert names == EXPECTED_EXPORTS
    # No link-time dependency on libstdc++, libzmq or CUDA: those are static or found at run time.
    dyn = subprocess.run(["readelf", "-d", str(libc4d)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dyn))
    assert not {n for n in needed if re.match(r"lib(stdc\+\+|gcc_s|zmq|cuda|nccl)", n)}, needed
    # Never unmapped (a dlclose of it as NCCL's profiler plugin would leave its agent thread
    # and its thread-exit key destructor pointing at nothing).
    assert "NODELETE" in dyn


def _stress(tmp_path: Path, name: str, sources: list[str]) -> str:
    """Builds native/shim/tests/<name>.cc with ``sources`` (shim files) under ThreadSanitizer
    when the compiler has it (plain otherwise), runs it, returns its stdout (exit 0 = pass)."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    shim = Path(__file__).resolve().parents[1] / "native" / "shim"
    exe = tmp_path / name
    base = [
        cxx,
        "-std=c++17",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{shim}",
        f"-I{shim.parent}/include",
    ]
    src = [str(shim / "tests" / f"{name}.cc"), *(str(shim / f) for f in sources), "-o", str(exe), "-lpthread"]
    built = subprocess.run([*base, "-fsanitize=thread", *src], capture_output=True, text=True)
    if built.returncode != 0:  # no libtsan here: still worth running plain
        subprocess.run([*base, *src], capture_output=True, text=True, check=True)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_lock_free_queues_under_stress(tmp_path):
    """queue.h's rings and free list (one index or a batch at a time), many threads,
    ThreadSanitizer when the compiler has it."""
    assert _stress(tmp_path, "queue_stress", []).count(" ok\n") == 4


def test_kept_event_pairs_under_stress(tmp_path):
    """event_pool.h's kept pairs with the shim's own pool sources and a counting CUDA stand-in
    (no GPU here): no event held by two ops at once, none lost, none stranded after a burst
    or kept across a fork; ThreadSanitizer when the compiler has it."""
    out = _stress(tmp_path, "event_pairs_stress", ["event_pool.cc", "op_pool.cc", "log.cc"])
    assert out.count(" ok\n") == 3, out


def test_thread_lanes_under_stress(tmp_path):
    """op_pool.h's thread lanes with the shim's own pool sources: waves of threads (more in all
    than lanes, one wave with more at once), one agent; every op out once, no event held twice,
    lanes reused and reclaimed, every slot and event back once; ThreadSanitizer when the
    compiler has it."""
    out = _stress(tmp_path, "lanes_stress", ["event_pool.cc", "op_pool.cc", "log.cc"])
    assert out.count(" ok\n") == 3, out


# ------------------------------------------------------------------ a real sim job


def test_tp2_pp2_job_streams_consistent_records(libc4d, simtrain, master, jobs, tmp_path):
    world = 8
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50", C4D_NODE_NAME="node-x")
    job = run_job(jobs, simtrain, world, train(12, 2, 2, "--compute-us", "8000"), env, tmp_path)
    assert job.wait(180) == [0] * world, [job.stderr(r) for r in range(world)]
    pids = {p.pid for p in job.procs}
    wait_records(master, final_seen(pids), "the FINAL heartbeat of every rank")
    recs = master.records()

    reg = recs[schema.Kind.REGISTER]
    assert set(reg["rank"].tolist()) == set(range(world))
    assert {int(p) for p in reg["pid"]} == pids
    first = reg[np.unique(reg["rank"], return_index=True)[1]]
    assert (first["world_size"] == world).all()
    assert (first["node"] == b"node-x").all()
    assert (first["hang_timeout_us"] == 10_000_000).all() and (first["hang_times"] == 18).all()
    assert (first["heartbeat_ms"] == 50).all() and (first["device_timing"] == 1).all()
    assert (first["nccl_version"] > 0).all()

    # Communicators: every id names one communicator, with ranks 0..n-1 across processes.
    comm = recs[schema.Kind.COMM]
    made = comm[np.isin(comm["event"], [schema.CommEvent.INIT_RANK, schema.CommEvent.SPLIT])]
    # Every 10th heartbeat repeats each live comm's creation record (for a late master):
    # identical content, so keep one per (rank, comm).
    made = made[np.unique(made[["rank", "comm_id"]], return_index=True)[1]]
    assert (made["result"] == 0).all()
    members = collections.defaultdict(set)
    sizes = collections.defaultdict(set)
    for r in made:
        members[int(r["comm_id"])].add((int(r["rank"]), int(r["comm_rank"])))
        sizes[int(r["comm_id"])].add(int(r["comm_nranks"]))
    assert len(members) >= 1 + 3 * world // 2  # world + tp + pp + dp groups
    for cid, mem in members.items():
        (n,) = sizes[cid]
        assert sorted(cr for _, cr in mem) == list(range(n)), (hex(cid), mem)
        assert len({g for g, _ in mem}) == n
    # Ids: the world comm hashes the 128 bytes of the unique id rank 0 published; each
    # split child hashes (parent id, split index, color).
    body = (job.dir / "nccl.id").read_bytes()
    world_id = fnv1a(body[body.index(b"\n") + 1 :])
    init = made[made["event"] == schema.CommEvent.INIT_RANK]
    assert set(init["comm_id"].tolist()) == {world_id} and len(init) == world
    splits = made[made["event"] == schema.CommEvent.SPLIT]
    assert (splits["parent_id"] == world_id).all() and len(splits) == 3 * world
    for r in splits:
        candidates = {fnv1a(struct.pack("<QIi", world_id, i, int(r["color"]))) for i in range(3)}
        assert int(r["comm_id"]) in candidates
    destroyed = comm[comm["event"] == schema.CommEvent.DESTROY]
    assert set(zip(destroyed["rank"].tolist(), destroyed["comm_id"].tolist(), strict=True)) == {
        (int(r["rank"]), int(r["comm_id"])) for r in made
    }

    ops = recs[schema.Kind.OP]
    assert len(ops) > 0 and set(ops["comm_id"].tolist()) <= set(members)
    assert (ops["result"] == 0).all()
    assert (ops["bytes"] == ops["count"] * schema.DTYPE_SIZE[ops["dtype"]]).all()
    timed = (ops["flags"] & schema.OpFlag.DEVICE_TIMING) != 0
    assert timed.all(), collections.Counter(ops["flags"].tolist())
    assert (ops["issue_ns"] <= ops["start_ns"]).all() and (ops["start_ns"] <= ops["end_ns"]).all()
    assert (ops["issue_ns"] <= ops["return_ns"]).all()

    # Sequences: contiguous from 0 per (comm, rank); p2p per (comm, rank, direction, peer).
    p2p = (ops["flags"] & schema.OpFlag.P2P) != 0
    assert p2p.any() and (~p2p).any()
    keys = collections.defaultdict(list)
    for r in ops:
        k = (int(r["comm_id"]), int(r["rank"]))
        if r["flags"] & schema.OpFlag.P2P:
            k += (int(r["op"]), int(r["peer"]))
        keys[k].append(int(r["seq"]))
    for k, seqs in keys.items():
        assert sorted(seqs) == list(range(len(seqs))), k
    # Each collective (comm, seq) was recorded by every member of its communicator.
    coll = ops[~p2p]
    per = collections.Counter(zip(coll["comm_id"].tolist(), coll["seq"].tolist(), strict=True))
    for (cid, _), n in per.items():
        assert n == next(iter(sizes[cid]))
    # A send #k from a to b is matched by b's recv #k from a, with the same size.
    sends = {(int(r["comm_id"]), int(r["comm_rank"]), int(r["peer"]), int(r["seq"])): int(r["bytes"])
             for r in ops[ops["op"] == schema.Op.Send]}  # fmt: skip
    recvs = {(int(r["comm_id"]), int(r["peer"]), int(r["comm_rank"]), int(r["seq"])): int(r["bytes"])
             for r in ops[ops["op"] == schema.Op.Recv]}  # fmt: skip
    assert sends and sends == recvs

    hb = recs[schema.Kind.HEARTBEAT]
    per_comm = hb[hb["comm_id"] != 0]
    assert set(per_comm["comm_id"].tolist()) <= set(members) and len(per_comm) > 0
    assert (per_comm["n_done"] <= per_comm["n_issued"]).all()
    assert (per_comm["n_arrived"] >= per_comm["n_done"]).all()
    for rank in range(world):
        mine = hb[(hb["rank"] == rank) & (hb["comm_id"] == 0)]
        last = mine[np.argmax(mine["time_ns"])]
        assert last["hb_flags"] & schema.HBF_FINAL
        assert last["n_done"] == last["n_issued"] == np.count_nonzero(ops["rank"] == rank)
        assert last["dropped"] == 0 and last["pend_seq"] == schema.UINT64_MAX
        assert last["sent"] > 0
        sent, dropped, _ = summary(job.stderr(rank))
        assert dropped == 0 and sent >= last["sent"]


def test_no_master_exits_promptly_and_counts_drops(libc4d, simtrain, jobs, tmp_path):
    """Nobody listening, a 1-message high-water mark and a 2-slot queue: the job is not
    held up, and the drops are counted in every rank's summary line."""
    world = 4
    args = train(6, 2, 1)
    base = run_job(jobs, simtrain, world, args, base_env(None), tmp_path)
    assert base.wait(120) == [0] * world
    env = base_env(libc4d, C4D_MASTER_ADDR=free_tcp_endpoint(), C4D_SEND_HWM="1", C4D_QUEUE_CAPACITY="2")
    job = run_job(jobs, simtrain, world, args, env, tmp_path)
    assert job.wait(120) == [0] * world
    # The exit flush is bounded by C4D_EXIT_FLUSH_MS (500 ms); allow a loaded 2-core box slack.
    assert job.elapsed < base.elapsed + 5.0, (job.elapsed, base.elapsed)
    for r in range(world):
        _, dropped, full = summary(job.stderr(r))
        assert dropped > 0 and full > 0


def test_master_started_late_sees_the_drops(libc4d, simtrain, jobs, tmp_path):
    endpoint = free_tcp_endpoint()
    env = base_env(
        libc4d, C4D_MASTER_ADDR=endpoint, C4D_SEND_HWM="1", C4D_QUEUE_CAPACITY="2", C4D_HEARTBEAT_MS="50"
    )
    job = run_job(jobs, simtrain, 2, train(400, 2, 1, "--compute-us", "5000", "--progress"), env, tmp_path)
    wait_for(lambda: "step 5 done" in job.stderr(0), 60, "rank 0 to run 5 steps")
    m = Master(endpoint)
    try:
        drops = lambda recs: (recs[schema.Kind.HEARTBEAT]["dropped"] > 0).any()  # noqa: E731
        wait_records(m, drops, "a heartbeat reporting drops", timeout=30)
    finally:
        m.close()
        job.kill()
    assert not m.errors


def test_disabled_is_a_pure_pass_through(libc4d, simtrain, master, jobs, tmp_path):
    world = 4
    args = ["--verify", "--job-dir", "{dir}"]
    plain = run_job(jobs, simtrain, world, args, base_env(None), tmp_path)
    assert plain.wait(120) == [0] * world
    env = base_env(libc4d, C4D_ENABLE="0", C4D_MASTER_ADDR=master.endpoint)
    off = run_job(jobs, simtrain, world, args, env, tmp_path)
    assert off.wait(120) == [0] * world
    for r in range(world):
        assert off.stdout(r) == plain.stdout(r) == ("verify ok\n" if r == 0 else off.stdout(r))
        assert "c4d:" not in off.stderr(r)
    time.sleep(0.3)  # nothing is expected: give a stray batch the time to arrive
    assert master.batches == 0


def test_verify_passes_with_the_shim(libc4d, simtrain, master, jobs, tmp_path):
    """Every collective, checked bit for bit by the driver, with the shim recording."""
    world = 4
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint)
    job = run_job(jobs, simtrain, world, ["--verify", "--job-dir", "{dir}"], env, tmp_path)
    assert job.wait(120) == [0] * world, [job.stderr(r) for r in range(world)]
    assert "verify ok" in job.stdout(0)
    wait_records(master, final_seen({p.pid for p in job.procs}), "every rank's FINAL heartbeat")
    ops = master.records()[schema.Kind.OP]
    seen = {schema.Op(int(o)).name for o in np.unique(ops["op"])}
    assert seen == {o.name for o in schema.Op}


def test_malformed_variables_one_line_each_and_the_job_runs(libc4d, simtrain, jobs, tmp_path):
    world = 2
    env = base_env(libc4d, **{v: "gar bage\n" for v in C4D_VARS})
    env["C4D_EXIT_FLUSH_MS"] = "-5"
    job = run_job(jobs, simtrain, world, train(2, 2, 1), env, tmp_path)
    assert job.wait(120) == [0] * world
    for r in range(world):
        lines = job.stderr(r).splitlines()
        for var in C4D_VARS:
            mine = [ln for ln in lines if ln.startswith(f"c4d: {var}=")]
            assert len(mine) == 1, (var, lines)
            assert "; using " in mine[0]
        assert "c4d: C4D_HANG_TIMES='gar bage?' is not a positive integer; using 18" in lines


# --------------------------------------------------- exact call sequences (ctypes)


def test_bcast_is_one_broadcast_and_groups_share_events(libc4d, simnccl_dir, master):
    body = """
    comm = new_comm()
    s1, s2 = new_stream(), new_stream()
    check(g.ncclBcast(buf, 64, F32, 0, comm, s1), "ncclBcast")          # seq 0 (calls ncclBroadcast inside)
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s1), "ncclAllReduce")  # seq 1
    check(g.ncclGroupStart(), "ncclGroupStart")
    check(g.ncclGroupStart(), "nested ncclGroupStart")
    check(g.ncclAllReduce(buf, out, 16, F32, 0, comm, s1), "grouped ncclAllReduce")  # seq 2
    check(g.ncclSend(buf, 8, F32, 0, comm, s2), "ncclSend")
    check(g.ncclRecv(out, 8, F32, 0, comm, s2), "ncclRecv")
    check(g.ncclGroupEnd(), "inner ncclGroupEnd")
    check(g.ncclAllGather(buf, out, 4, F32, comm, s1), "grouped ncclAllGather")  # seq 3
    check(g.ncclGroupEnd(), "ncclGroupEnd")
    check(g.cudaStreamSynchronize(s1), "sync")
    check(g.cudaStreamSynchronize(s2), "sync")
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")
    """
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_ENABLE_STATS_OUTPUT="TRUE")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    ops = master.records()[schema.Kind.OP]
    ops = ops[np.argsort(ops["issue_ns"])]
    assert [schema.Op(int(o)).name for o in ops["op"]] == [
        "Broadcast", "AllReduce", "AllReduce", "Send", "Recv", "AllGather"
    ]  # fmt: skip
    assert ops["flags"][0] & schema.OpFlag.INPLACE and ops["peer"][0] == 0
    assert ops["seq"][ops["flags"] & schema.OpFlag.P2P == 0].tolist() == [0, 1, 2, 3]
    grouped = ops[2:]
    assert (grouped["flags"] & schema.OpFlag.IN_GROUP != 0).all()
    assert len(set(grouped["group_id"].tolist())) == 1 and grouped["group_id"][0] > 0
    assert (ops["group_id"][:2] == 0).all()
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    # Ops of one stream in one group share the events recorded around the real ncclGroupEnd.
    by_stream = collections.defaultdict(set)
    for r in grouped:
        by_stream[int(r["stream"])].add((int(r["start_ns"]), int(r["end_ns"])))
    assert len(by_stream) == 2 and all(len(v) == 1 for v in by_stream.values())
    assert len(set(grouped["return_ns"].tolist())) == 1
    # C4D_ENABLE_STATS_OUTPUT: per comm x op lines at exit.
    stats = [ln for ln in p.stderr.splitlines() if ln.startswith("c4d: stats ")]
    assert any("AllReduce" in ln and "count=2 " in ln for ln in stats), p.stderr
    assert any("Broadcast" in ln and "count=1 " in ln for ln in stats), p.stderr


def test_group_simulate_end_leaves_no_op_behind(libc4d, simnccl_dir, master):
    """ncclGroupSimulateEnd ends the group without launching it: the shim's group depth comes
    back down, the simulated ops are neither numbered nor recorded (NCCL runs none of them),
    and the ops after it are ordinary ops, timed and done (no false hang)."""
    body = """
    class SimInfo(ctypes.Structure):
        _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                    ("estimatedTime", ctypes.c_float)]
    comm = new_comm()
    s = new_stream()
    info = SimInfo(ctypes.sizeof(SimInfo), 0x74685283, 23102, -1.0)
    check(g.ncclGroupStart(), "ncclGroupStart")
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "grouped ncclAllReduce")
    check(g.ncclSend(buf, 8, F32, 0, comm, s), "grouped ncclSend")
    check(g.ncclRecv(out, 8, F32, 0, comm, s), "grouped ncclRecv")
    check(g.ncclGroupSimulateEnd(ctypes.byref(info)), "ncclGroupSimulateEnd")
    assert info.estimatedTime >= 0, info.estimatedTime
    for _ in range(2):
        check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "ncclAllReduce")
    check(g.ncclGroupStart(), "ncclGroupStart")
    check(g.ncclSend(buf, 8, F32, 0, comm, s), "ncclSend")
    check(g.ncclRecv(out, 8, F32, 0, comm, s), "ncclRecv")
    check(g.ncclGroupEnd(), "ncclGroupEnd")
    check(g.cudaStreamSynchronize(s), "sync")
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")
    """
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    recs = master.records()
    ops = recs[schema.Kind.OP]
    ops = ops[np.argsort(ops["issue_ns"])]
    assert [schema.Op(int(o)).name for o in ops["op"]] == ["AllReduce", "AllReduce", "Send", "Recv"]
    assert ops["seq"].tolist() == [0, 1, 0, 0], "simulated ops take no sequence numbers"
    assert (ops["flags"] & schema.OpFlag.IN_GROUP != 0).tolist() == [False, False, True, True]
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    hb = recs[schema.Kind.HEARTBEAT]
    final = hb[(hb["hb_flags"] & schema.HBF_FINAL) != 0]
    assert (final["pend_seq"] == schema.UINT64_MAX).all(), "nothing left pending"
    proc = final[final["comm_id"] == 0]
    assert proc["n_issued"].tolist() == proc["n_done"].tolist() == [4]


def test_a_group_of_300_ops_is_timed_whole(libc4d, simnccl_dir, master):
    """Every op of a 300-op group shares the group's events (none reported done at enqueue
    with host times only, as past a fixed 256-op table)."""
    body = """
    comm = new_comm()
    s = new_stream()
    check(g.ncclGroupStart(), "ncclGroupStart")
    for _ in range(300):
        check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "grouped ncclAllReduce")
    check(g.ncclGroupEnd(), "ncclGroupEnd")
    check(g.cudaStreamSynchronize(s), "sync")
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")
    """
    p = run_driver(simnccl_dir, body, base_env(libc4d, C4D_MASTER_ADDR=master.endpoint))
    assert p.returncode == 0, p.stderr
    wait_records(master, lambda r: len(r[schema.Kind.OP]) == 300, "300 op records")
    ops = master.records()[schema.Kind.OP]
    assert sorted(ops["seq"].tolist()) == list(range(300)) and len(set(ops["group_id"].tolist())) == 1
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    assert (ops["flags"] & (schema.OpFlag.NO_EVENT | schema.OpFlag.EVENT_ERROR) == 0).all()
    assert len(set(zip(ops["start_ns"].tolist(), ops["end_ns"].tolist(), strict=True))) == 1


def test_revoke_suspend_resume_are_recorded_grow_and_rma_named_once(libc4d, simnccl_dir, master):
    """ncclCommSuspend/Resume/Revoke pass through with a COMM record each; ncclCommGrow and the
    one-sided ncclPutSignal/ncclSignal/ncclWaitSignal pass through untracked, and the blind
    spot is said once per process. Return codes are NCCL's own, with the shim or without."""
    body = """
    comm = new_comm()
    s = new_stream()
    got = []
    got.append(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s))
    got.append(g.ncclCommSuspend(comm, 1))
    got.append(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s))  # refused while suspended
    got.append(g.ncclCommResume(comm))
    got.append(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s))
    check(g.cudaStreamSynchronize(s), "sync")
    got.append(g.ncclCommRevoke(comm, 0))
    state = ctypes.c_int(7)
    while state.value == 7:  # in progress until quiescent
        check(g.ncclCommGetAsyncError(comm, ctypes.byref(state)), "ncclCommGetAsyncError")
    got.append(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s))  # refused once revoked
    grown = ctypes.c_void_p()
    for _ in range(2):
        got.append(g.ncclCommGrow(comm, 2, None, -1, ctypes.byref(grown), None))
        got.append(g.ncclPutSignal(buf, 8, F32, 0, None, ctypes.c_size_t(0), 0, 0, 0, comm, s))
        got.append(g.ncclSignal(0, 0, 0, 0, comm, s))
        got.append(g.ncclWaitSignal(0, None, comm, s))
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")
    print(got)
    """
    plain = run_driver(simnccl_dir, body, base_env(None))
    assert plain.returncode == 0, plain.stderr
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    assert p.stdout == plain.stdout == "[0, 0, 5, 0, 0, 0, 5, 5, 5, 5, 5, 5, 5, 5, 5]\n"
    assert p.stderr.count("c4d: ncclCommGrow: communicators made by growing are not tracked") == 1, p.stderr
    assert p.stderr.count("c4d: ncclPutSignal/ncclSignal/ncclWaitSignal (one-sided RMA)") == 1, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    comm = master.records()[schema.Kind.COMM]
    events = [schema.CommEvent(int(e)).name for e in comm["event"]]
    assert events == ["INIT_RANK", "SUSPEND", "RESUME", "REVOKE", "DESTROY"]
    assert comm["result"].tolist() == [0, 0, 0, 0, 0] and len(set(comm["comm_id"].tolist())) == 1


def test_fork_child_records_on_its_own(libc4d, simnccl_dir, master):
    prefix = os.environ.get("C4D_TEST_PRELOAD_PREFIX", "")
    if "tsan" in prefix:
        pytest.skip("ThreadSanitizer does not support fork() in a multi-threaded process")
    if "asan" in prefix:
        # GCC's AddressSanitizer runtime does not hold its allocator's locks across fork(): a
        # thread of the parent (simnccl's stream workers, libzmq's I/O threads) that allocates
        # at that moment leaves a size class locked in the child, whose agent then blocks in
        # operator new inside zmq_ctx_new (gdb, 2026-11-25: 1 child in 8 on b552031, 3 in 6
        # after; glibc's malloc takes its locks across fork and the plain run passes)
        pytest.skip("AddressSanitizer's allocator can be left locked in a fork child")
    body = """
    comm = new_comm()
    s = new_stream()
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "parent ncclAllReduce")
    check(g.cudaStreamSynchronize(s), "sync")
    pid = os.fork()
    if pid == 0:
        os.environ["SIMNCCL_JOB"] += "-child"
        c = new_comm()
        cs = new_stream()
        for _ in range(3):
            check(g.ncclAllReduce(buf, out, 64, F32, 0, c, cs), "child ncclAllReduce")
        check(g.cudaStreamSynchronize(cs), "sync")
        check(g.ncclCommDestroy(c), "child destroy")
        print("child", os.getpid(), flush=True)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "parent ncclAllReduce")
    check(g.cudaStreamSynchronize(s), "sync")
    check(g.ncclCommDestroy(comm), "parent destroy")
    print("parent", os.getpid(), flush=True)
    """
    p = run_driver(simnccl_dir, body, base_env(libc4d, C4D_MASTER_ADDR=master.endpoint))
    assert p.returncode == 0, p.stderr
    pids = {name: int(pid) for name, pid in (ln.split() for ln in p.stdout.splitlines())}
    wait_records(master, final_seen(set(pids.values())), "FINAL heartbeats of parent and child")
    recs = master.records()
    reg = recs[schema.Kind.REGISTER]
    assert {int(x) for x in reg["pid"]} == set(pids.values())
    ops, comms = recs[schema.Kind.OP], recs[schema.Kind.COMM]
    init = comms[comms["event"] == schema.CommEvent.INIT_RANK]
    assert len(set(init["comm_id"].tolist())) == 2  # the child's own communicator
    per_comm = collections.defaultdict(list)
    for r in ops:
        per_comm[int(r["comm_id"])].append(int(r["seq"]))
    assert sorted(sorted(v) for v in per_comm.values()) == [[0, 1], [0, 1, 2]]
    assert p.stderr.count(" records sent, 0 dropped") == 2  # one summary line per process


def test_libzmq_found_beside_an_installed_package(libc4d, simnccl_dir, master, tmp_path):
    """Installed layout: site-packages/c4d/_native/libc4d.so finds site-packages/pyzmq.libs/."""
    site = tmp_path / "site-packages"
    (site / "c4d" / "_native").mkdir(parents=True)
    shutil.copy(libc4d, site / "c4d" / "_native" / "libc4d.so")
    (site / "pyzmq.libs").symlink_to(Path(pyzmq_libzmq()).parent)
    env = base_env(site / "c4d" / "_native" / "libc4d.so", C4D_MASTER_ADDR=master.endpoint)
    env["C4D_RUNTIME_LOG_LEVEL"] = "DEBUG"  # names the libzmq it loaded
    del env["C4D_LIBZMQ"]
    body = """
    comm = new_comm()
    s = new_stream()
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "ncclAllReduce")
    check(g.cudaStreamSynchronize(s), "sync")
    check(g.ncclCommDestroy(comm), "destroy")
    """
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    loaded = [ln for ln in p.stderr.splitlines() if re.match(r"c4d: libzmq [\d.]+ from ", ln)]
    assert len(loaded) == 1 and f"{site}/c4d/_native/../../pyzmq.libs/" in loaded[0], p.stderr
    wait_records(master, lambda r: len(r[schema.Kind.OP]) == 1, "the op record")


@pytest.fixture(scope="module")
def framework_lib(simnccl_dir, tmp_path_factory):
    """libsimnccl-framework.so: beside simnccl in a plain CMake build; a wheel (CI's editable
    install included) leaves this test-only library out, so build just that target here."""
    lib = simnccl_dir.parent / "tests" / "libsimnccl-framework.so"
    if lib.exists():
        return lib
    if not shutil.which("cmake"):
        pytest.skip("no cmake to build the test-only framework library")
    root = Path(__file__).resolve().parents[1]
    out, build = tmp_path_factory.mktemp("native-out"), tmp_path_factory.mktemp("native-build")
    cfg = ["cmake", "-S", str(root), "-B", str(build), f"-DC4D_OUT={out}", "-DC4D_BUILD_SHIM=OFF"]
    for cmd in (cfg, ["cmake", "--build", str(build), "--target", "simnccl-framework", "-j2"]):
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return out / "tests" / "libsimnccl-framework.so"


def test_nccl_linked_into_a_library_loaded_rtld_local(libc4d, framework_lib, master):
    """NCCL inside the library that calls it, loaded RTLD_LOCAL (a source build of PyTorch:
    NCCL static in libtorch_cuda.so, which Python dlopens locally). The library's calls reach
    the preloaded hooks; RTLD_NEXT and libnccl.so.2 find nothing, so the shim finds NCCL in
    the calling object (dladdr on the return address), says once which NCCL it bound, and
    records the ops (the CUDA runtime linked in beside it gives device timing)."""
    lib = framework_lib
    job = f"c4dshim-{uuid.uuid4().hex[:10]}"
    code = f"import ctypes, sys; sys.exit(ctypes.CDLL({str(lib)!r}).framework_allreduce_loop(5))"
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, RANK="0", WORLD_SIZE="1", SIMNCCL_JOB=job)
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    finally:
        for f in glob.glob(f"/dev/shm/simnccl-{job}*"):
            os.unlink(f)
    assert p.returncode == 0, (p.returncode, p.stderr)
    bound = [ln for ln in p.stderr.splitlines() if " bound from " in ln]
    assert bound == [f"c4d: NCCL 2.31.2 bound from {lib} (the calling object)"], p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    ops = master.records()[schema.Kind.OP]
    assert ops["seq"].tolist() == [0, 1, 2, 3, 4] and (ops["result"] == 0).all()
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()

    # The hooks called from elsewhere (here ctypes through the global scope): NCCL is found in
    # whichever loaded object defines it (dl_iterate_phdr).
    code = textwrap.dedent(
        f"""
        import ctypes, sys
        fw, g = ctypes.CDLL({str(lib)!r}), ctypes.CDLL(None)
        class UID(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]
        uid, comm, s = UID(), ctypes.c_void_p(), ctypes.c_void_p()
        assert fw.ncclGetUniqueId(ctypes.byref(uid)) == 0 and fw.cudaStreamCreate(ctypes.byref(s)) == 0
        assert g.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
        buf = (ctypes.c_float * 8)()
        assert g.ncclAllReduce(buf, buf, 8, 7, 0, comm, s) == 0 and fw.cudaStreamSynchronize(s) == 0
        assert g.ncclCommDestroy(comm) == 0
        """
    )
    env["SIMNCCL_JOB"] = job = f"c4dshim-{uuid.uuid4().hex[:10]}"
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    finally:
        for f in glob.glob(f"/dev/shm/simnccl-{job}*"):
            os.unlink(f)
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert f"c4d: NCCL 2.31.2 bound from {lib} (a loaded object)" in p.stderr.splitlines(), p.stderr


def test_lifecycle_records_init_all_shrink_finalize_abort(libc4d, simnccl_dir, master):
    body = """
    comms = (ctypes.c_void_p * 2)()
    check(g.ncclCommInitAll(comms, 2, (ctypes.c_int * 2)(0, 1)), "ncclCommInitAll")
    c0, c1 = (ctypes.c_void_p(c) for c in comms)  # array items come back as ints: keep 64 bits
    s0 = new_stream()
    check(g.cudaSetDevice(1), "cudaSetDevice")
    s1 = new_stream()
    check(g.cudaSetDevice(0), "cudaSetDevice")
    check(g.ncclGroupStart(), "ncclGroupStart")  # one thread drives both ranks
    check(g.ncclAllReduce(buf, out, 64, F32, 0, c0, s0), "ncclAllReduce 0")
    check(g.ncclAllReduce(buf, out, 64, F32, 0, c1, s1), "ncclAllReduce 1")
    check(g.ncclGroupEnd(), "ncclGroupEnd")
    check(g.cudaStreamSynchronize(s0), "sync")
    check(g.cudaStreamSynchronize(s1), "sync")
    child = ctypes.c_void_p()
    excluded = (ctypes.c_int * 1)(1)
    check(g.ncclCommShrink(c0, excluded, 1, ctypes.byref(child), None, 0), "ncclCommShrink")
    check(g.ncclAllReduce(buf, out, 64, F32, 0, child, s0), "ncclAllReduce child")
    check(g.cudaStreamSynchronize(s0), "sync")
    check(g.ncclCommFinalize(child), "ncclCommFinalize")
    check(g.ncclCommDestroy(child), "ncclCommDestroy child")
    check(g.ncclCommAbort(c1), "ncclCommAbort")
    check(g.ncclCommDestroy(c0), "ncclCommDestroy")
    """
    p = run_driver(simnccl_dir, body, base_env(libc4d, C4D_MASTER_ADDR=master.endpoint))
    assert p.returncode == 0, p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    recs = master.records()
    comm = recs[schema.Kind.COMM]
    events = [schema.CommEvent(int(e)).name for e in comm["event"]]
    assert events == ["INIT_ALL", "INIT_ALL", "SHRINK", "FINALIZE", "DESTROY", "ABORT", "DESTROY"]
    assert (comm["result"] == 0).all()
    init_all = comm[:2]
    assert len(set(init_all["comm_id"].tolist())) == 1
    assert init_all["comm_rank"].tolist() == [0, 1] and (init_all["comm_nranks"] == 2).all()
    assert init_all["device"].tolist() == [0, 1]
    parent = int(init_all["comm_id"][0])
    shrink = comm[2]
    expect = fnv1a(struct.pack("<QIi", parent, 0x80000000, 1) + struct.pack("<i", 1))
    assert (int(shrink["parent_id"]), int(shrink["comm_id"])) == (parent, expect)
    assert (shrink["comm_rank"], shrink["comm_nranks"]) == (0, 1)
    assert comm["comm_id"][3:5].tolist() == [expect, expect]
    assert comm["comm_id"][5:].tolist() == [parent, parent] and comm["comm_rank"][5:].tolist() == [1, 0]

    ops = recs[schema.Kind.OP]
    ops = ops[np.argsort(ops["issue_ns"])]
    assert ops["comm_id"].tolist() == [parent, parent, expect] and ops["seq"].tolist() == [0, 0, 0]
    assert ops["device"].tolist() == [0, 1, 0]  # each device has its own events and anchors
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    assert ops["group_id"][0] == ops["group_id"][1] > 0 and ops["group_id"][2] == 0


def test_graph_capture_survives_the_agent_and_is_named_once(libc4d, simnccl_dir, master):
    """The application captures an all-reduce into a CUDA graph (global mode, PyTorch's
    default) while the agent polls the events of an eager op on another stream. The agent
    works in relaxed capture mode, so the capture is not invalidated; the captured op is
    not numbered (NCCL numbers no replay), its replays run, and the blind spot is said once."""
    body = """
    import time
    g.simLaunchCompute.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    comm = new_comm()
    eager, cap = new_stream(), new_stream()
    check(g.simLaunchCompute(eager, 400_000_000), "simLaunchCompute")  # its op stays pending 0.4 s
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, eager), "eager ncclAllReduce")
    time.sleep(0.05)  # the agent is polling its events now
    check(g.cudaStreamBeginCapture(cap, 0), "cudaStreamBeginCapture")  # cudaStreamCaptureModeGlobal
    status = ctypes.c_int()
    check(g.cudaStreamIsCapturing(cap, ctypes.byref(status)), "cudaStreamIsCapturing")
    assert status.value == 1, status.value
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, cap), "captured ncclAllReduce")
    time.sleep(0.2)  # ~40 agent polls of the eager op's events
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    check(g.cudaStreamEndCapture(cap, ctypes.byref(graph)), "cudaStreamEndCapture")
    check(g.cudaGraphInstantiate(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)), "cudaGraphInstantiate")
    for i in range(3):
        buf[0] = float(i + 1)
        check(g.cudaGraphLaunch(exe, cap), "cudaGraphLaunch")
        check(g.cudaStreamSynchronize(cap), "sync")
        assert out[0] == float(i + 1), (i, out[0])  # a 1-rank all-reduce copies
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, cap), "eager ncclAllReduce after the graph")
    check(g.cudaStreamSynchronize(eager), "sync")
    check(g.cudaStreamSynchronize(cap), "sync")
    check(g.cudaGraphExecDestroy(exe), "cudaGraphExecDestroy")
    check(g.cudaGraphDestroy(graph), "cudaGraphDestroy")
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")
    """
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("capturing stream go into a CUDA graph") == 1, p.stderr
    assert "; 1 ops captured into CUDA graphs" in p.stderr
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    ops = master.records()[schema.Kind.OP]
    ops = ops[np.argsort(ops["issue_ns"])]
    assert ops["seq"].tolist() == [0, 1], "the captured op took no sequence number"
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    assert ops["end_ns"][0] - ops["issue_ns"][0] > 300_000_000, "the eager op waited for its stream"


def test_agent_creates_no_context_on_another_device(libc4d, simnccl_dir, master, tmp_path):
    """8 devices visible, this process drives devices 3 and 5 (one ncclCommInitAll clique).
    The agent sets the device of the events it polls, so CUDA contexts exist on 3 and 5
    only: a thread that never calls cudaSetDevice works on device 0, and on real GPUs its
    first CUDA call there costs every rank ~500 MiB of GPU 0 (simnccl notes contexts)."""
    body = """
    check(g.cudaSetDevice(3), "cudaSetDevice")
    comms = (ctypes.c_void_p * 2)()
    check(g.ncclCommInitAll(comms, 2, (ctypes.c_int * 2)(3, 5)), "ncclCommInitAll")
    c = [ctypes.c_void_p(x) for x in comms]
    s = [new_stream()]
    check(g.cudaSetDevice(5), "cudaSetDevice")
    s.append(new_stream())
    check(g.cudaSetDevice(3), "cudaSetDevice")
    for _ in range(20):
        check(g.ncclGroupStart(), "ncclGroupStart")
        for i in range(2):
            check(g.ncclAllReduce(buf, out, 64, F32, 0, c[i], s[i]), "ncclAllReduce")
        check(g.ncclGroupEnd(), "ncclGroupEnd")
        for i in range(2):
            check(g.cudaStreamSynchronize(s[i]), "sync")
    for i in range(2):
        check(g.ncclCommDestroy(c[i]), "ncclCommDestroy")
    """
    dump = tmp_path / "contexts"
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, SIMNCCL_NUM_DEVICES="8")
    env["SIMNCCL_CONTEXT_DUMP"] = str(dump)
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    assert dump.read_text() == "contexts 3 5\n"
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    ops = master.records()[schema.Kind.OP]
    assert len(ops) == 40 and sorted(set(ops["device"].tolist())) == [3, 5]
    assert (ops["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all(), "events polled on their own devices"


NONBLOCKING = ["--nonblocking", "--compute-us", "0", "--dp-bytes", str(1 << 20)]
NONBLOCKING += ["--tp-bytes", "4", "--pp-bytes", "4"]
SLOW_LINK = {"SIMNCCL_INTRA_GBPS": "0.1", "SIMNCCL_JITTER": "0"}  # a 1 MiB all-reduce: ~10.5 ms modeled


def test_nonblocking_comm_ops_are_timed_once_launched(libc4d, simtrain, master, jobs, tmp_path):
    """Nonblocking communicators (ncclConfig_t.blocking = 0): every call returns ncclInProgress
    and NCCL's helper thread launches the kernels later; the driver polls
    ncclCommGetAsyncError as PyTorch does. The end events are recorded once the comm says the
    launch is done, so the all-reduces last their modeled ~10.5 ms, not ~0; and the shim asks
    nothing of a comm in progress (NCCL would WARN and ncclGetLastError would say so)."""
    world, args = 2, train(6, 1, 1, *NONBLOCKING)
    plain = run_job(jobs, simtrain, world, args, base_env(None, **SLOW_LINK), tmp_path)
    assert plain.wait(120) == [0] * world, [plain.stderr(r) for r in range(world)]
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, **SLOW_LINK)
    job = run_job(jobs, simtrain, world, args, env, tmp_path)
    assert job.wait(120) == [0] * world, [job.stderr(r) for r in range(world)]
    for r in range(world):
        assert job.stdout(r) == plain.stdout(r) == "nccl last error: ''\n"
        assert "simnccl:" not in job.stderr(r), job.stderr(r)
    wait_records(master, final_seen({p.pid for p in job.procs}), "the FINAL heartbeat of every rank")
    ops = master.records()[schema.Kind.OP]
    ar = ops[ops["op"] == schema.Op.AllReduce]
    assert len(ar) == world * 6 and (ar["result"] == 0).all(), "the settled result, not ncclInProgress"
    assert (ar["flags"] & schema.OpFlag.DEVICE_TIMING != 0).all()
    ms = (ar["end_ns"].astype(np.int64) - ar["start_ns"].astype(np.int64)) / 1e6
    assert (ms > 8).all(), ms


def test_nonblocking_hang_is_blamed_on_the_hung_op(libc4d, simtrain, master, jobs, tmp_path):
    """The link between the two ranks hangs at step 3 on nonblocking communicators: the
    heartbeats name step 3's all-reduce as arrived and not done (recording its end event
    when the call returned would have put it before the kernel: done at once, nothing pending)."""
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50",
                   SIMNCCL_FAULTS="comm-hang@link=0-1,step=3", **SLOW_LINK)  # fmt: skip
    job = run_job(jobs, simtrain, 2, train(50, 1, 1, *NONBLOCKING, "--progress"), env, tmp_path)

    def stuck(recs):
        hb = recs[schema.Kind.HEARTBEAT]
        hb = hb[(hb["comm_id"] != 0) & (hb["comm_nranks"] == 2) & (hb["n_issued"] > 0) & (hb["rank"] == 0)]
        if not len(hb):
            return None
        last = hb[np.argmax(hb["time_ns"])]
        late = time.time_ns() - int(last["pend_start_ns"]) > 300_000_000
        return last if last["pend_seq"] != schema.UINT64_MAX and last["pend_start_ns"] > 0 and late else None

    hb = wait_records(master, stuck, "rank 0's data-parallel all-reduce stuck", timeout=60)
    job.kill()
    assert (hb["pend_seq"], hb["pend_op"]) == (3, schema.Op.AllReduce)
    assert hb["n_done"] == 3 and hb["n_arrived"] == hb["n_issued"] == 4
    assert "step 2 done" in job.stderr(0) and "step 3 done" not in job.stderr(0)


def test_heartbeats_name_the_pending_op_of_a_hung_rank(libc4d, simtrain, master, jobs, tmp_path):
    """noncomm-hang on rank 1 (its stream never reaches the next op): rank 1's heartbeats
    show that op issued but not arrived; its tensor-parallel peer shows the same op
    arrived (start time set) and not done. That is what the master's detection reads."""
    env = base_env(
        libc4d,
        C4D_MASTER_ADDR=master.endpoint,
        C4D_HEARTBEAT_MS="50",
        SIMNCCL_FAULTS="noncomm-hang@rank=1,step=3",
    )
    job = run_job(jobs, simtrain, 4, train(50, 2, 1, "--progress"), env, tmp_path)

    def stuck(recs):
        hb = recs[schema.Kind.HEARTBEAT]
        hb = hb[(hb["comm_id"] != 0) & (hb["pend_seq"] != schema.UINT64_MAX)]
        last = {}
        for r in hb[np.argsort(hb["time_ns"])]:
            last[(int(r["rank"]), int(r["comm_id"]))] = r
        for (rank, cid), r in last.items():
            peer = last.get((0, cid))
            if rank != 1 or r["pend_start_ns"] != 0 or peer is None or peer["pend_seq"] != r["pend_seq"]:
                continue
            if peer["pend_start_ns"] > 0 and time.time_ns() - int(peer["pend_start_ns"]) > 100_000_000:
                return r, peer
        return None

    hung, waiting = wait_records(master, stuck, "rank 1 stuck before an op rank 0 waits in", timeout=60)
    job.kill()
    assert hung["n_arrived"] <= hung["pend_seq"] < hung["n_issued"]
    assert waiting["n_done"] <= waiting["pend_seq"] < waiting["n_arrived"]
    assert hung["pend_op"] == waiting["pend_op"] and hung["pend_issue_ns"] > 0
    assert "step 2 done" in job.stderr(1) and "step 3 done" not in job.stderr(1)
