"""The shim under faults: the job's results and exit status never depend on the master or on how
the process uses NCCL (issue 13, item 1; docs/reliability.md).

Real processes: ``c4d-simtrain`` ranks (``--verify`` checks every collective's result bit for bit)
or a ctypes driver of simnccl for exact call sequences, the real shim preloaded, and a real
master (``c4d master``) or a bare ZeroMQ PULL socket. The shim's own sanitizer builds run this
file too (scripts/sanitize.sh).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from c4d.record import schema, trace
from tests.conftest import wait_for
from tests.masterproc import MasterProc
from tests.test_shim import (
    CTYPES_DRIVER,
    Job,
    Master,
    base_env,
    final_seen,
    free_tcp_endpoint,
    run_driver,
    run_job,
    summary,
    train,
    wait_records,
)

VERIFY = ["--verify", "--job-dir", "{dir}"]
EXIT_FLUSH_MS, EXIT_MARGIN_MS = 200, 50  # config.cc default, agent.h kExitMarginMs
TSAN = "tsan" in os.environ.get("C4D_TEST_PRELOAD_PREFIX", "")
SANITIZED = bool(os.environ.get("C4D_TEST_PRELOAD_PREFIX"))
EXIT_LINE = re.compile(r"c4d: exit: the agent (finished|was left) after ([\d.]+) ms \(bound (\d+) ms\)")


def _verified(job: Job, world: int, timeout: float = 180) -> None:
    assert job.wait(timeout) == [0] * world, [job.stderr(r) for r in range(world)]
    assert job.stdout(0) == "verify ok\n", job.stdout(0)


class NeverReads:
    """A master that never reads, as a hung master process looks from the ranks: the port
    takes connections (the kernel's backlog) and nothing ever answers, so the ZeroMQ handshake
    never completes, each rank's queue fills to C4D_SEND_HWM and its sends fail (EAGAIN), counted
    as "master busy". (A ZeroMQ master whose thread stops reading has its I/O thread fill the
    kernel's buffers first, megabytes: minutes of records before the same happens.)"""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self.sock.close()


# ------------------------------------------------------------------------ master faults


def test_master_absent_for_the_whole_run(tmp_path, simtrain, libc4d, jobs):
    world = 4
    env = base_env(libc4d, C4D_MASTER_ADDR=free_tcp_endpoint(), C4D_HEARTBEAT_MS="50")
    job = run_job(jobs, simtrain, world, VERIFY, env, tmp_path)
    _verified(job, world)
    for r in range(world):
        sent, _, _ = summary(job.stderr(r))
        assert sent > 0 and f"no master ever connected at {env['C4D_MASTER_ADDR']}" in job.stderr(r)


def _step_ms(job: Job, ranks) -> list[float]:
    return [float(m) for r in ranks for m in re.findall(r"step \d+ done ms=([\d.]+)", job.stderr(r))]


@pytest.mark.slow
def test_master_killed_and_restarted_mid_run(tmp_path, simtrain, libc4d, jobs):
    """kill -9 of the master while 4 ranks train; a new master on the same port 1.5 s later.
    The job runs to its end; records of the gap beyond the ranks' 2-message queue are dropped
    and counted (the heartbeats tell the new master); neither master diagnoses anything, though
    a 1 s hang threshold would flag any rank the new master thought stuck or lost."""
    world, port = 4, None
    a = MasterProc(tmp_path, "--hang-timeout", "1000000", "--hang-times", "2", name="a")
    port = a.port
    env = base_env(
        libc4d, C4D_MASTER_ADDR=a.endpoint, C4D_HEARTBEAT_MS="200", C4D_SEND_HWM="2", C4D_JOB_ID="restart"
    )
    args = train(400, 2, 1, "--compute-us", "15000", "--progress")
    job = run_job(jobs, simtrain, world, args, env, tmp_path)
    b = None
    try:
        wait_for(lambda: "step 60 done" in job.stderr(0), 120, "rank 0 to run 60 steps")
        a.stop(signal.SIGKILL)
        killed_at = max(len(_step_ms(job, [0])), 1)
        time.sleep(1.5)  # the gap: the ranks go on, their queues fill, then they drop
        b = MasterProc(tmp_path, "--hang-timeout", "1000000", "--hang-times", "2", port=port, name="b")
        assert job.wait(300) == [0] * world, [job.stderr(r) for r in range(world)]
        wait_for(lambda: len(_final_ranks(b.trace)) == world, 30, "every rank's FINAL heartbeat at b")
    finally:
        if b is not None:
            assert b.stop() == 0
    for r in range(world):
        assert "step 399 done" in job.stderr(r)
        _, dropped, _ = summary(job.stderr(r))
        assert dropped > 0, job.stderr(r)  # the gap cost records, and the rank counted them
    assert a.diagnoses() == [] and b.diagnoses() == [], (a.diagnoses(), b.diagnoses())
    rt = trace.read_raw(b.trace)
    hb = rt.kinds[schema.Kind.HEARTBEAT]
    assert (hb["dropped"] > 0).any()  # the new master was told about the gap
    reg = rt.kinds[schema.Kind.REGISTER]
    assert set(reg["rank"].tolist()) == set(range(world))  # it learned every rank (REGISTER repeats)
    ops = rt.kinds[schema.Kind.OP]
    assert len(ops) > 0 and killed_at < 400


def _final_ranks(path: Path) -> set[int]:
    try:
        hb = trace.read_raw(path).kinds[schema.Kind.HEARTBEAT]
    except Exception:
        return set()
    return set(hb["rank"][(hb["hb_flags"] & schema.HBF_FINAL) != 0].tolist())


@pytest.mark.slow
def test_a_master_that_never_reads_leaves_step_time_unchanged(tmp_path, simtrain, libc4d, jobs):
    """Median step time with a master that binds and never reads, against a master that reads,
    runs interleaved (reading, never, reading, never). The noise band is measured, not assumed:
    the difference between the two runs of the same kind."""
    world, steps = 4, 120
    args = train(steps, 2, 1, "--compute-us", "10000", "--progress")
    medians: dict[str, list[float]] = collections.defaultdict(list)
    drops = []
    for kind in ("reading", "never", "reading", "never"):
        m = Master() if kind == "reading" else NeverReads()
        try:
            env = base_env(libc4d, C4D_MASTER_ADDR=m.endpoint, C4D_HEARTBEAT_MS="20", C4D_SEND_HWM="4")
            job = run_job(jobs, simtrain, world, args, env, tmp_path)
            assert job.wait(300) == [0] * world, [job.stderr(r) for r in range(world)]
        finally:
            m.close()
        ms = _step_ms(job, range(world))
        assert len(ms) == world * steps
        medians[kind].append(statistics.median(ms[world * 5 :]))  # warm-up steps out
        if kind == "never":
            drops.append(sum(summary(job.stderr(r))[1] for r in range(world)))
    assert all(d > 0 for d in drops), drops  # the master really never read: sends failed
    noise = max(abs(v[0] - v[1]) for v in medians.values())
    reading, never = statistics.mean(medians["reading"]), statistics.mean(medians["never"])
    print(f"median step ms: reading {medians['reading']}, never {medians['never']}, noise band {noise:.2f}")
    # within the measured noise (at least 5% of a step: a loaded 2-core box)
    assert abs(never - reading) <= max(2 * noise, 0.05 * reading), (medians, noise)


# ----------------------------------------------------------------------------- exit


EXIT_BODY = """
    import time
    comm = new_comm()
    s = new_stream()
    for i in range(3000):
        check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "ncclAllReduce")
    check(g.cudaStreamSynchronize(s), "sync")
    print(time.monotonic(), flush=True)
"""


def _exit_ms(simnccl_dir: Path, env: dict[str, str]) -> tuple[float, str]:
    """(ms from the driver's last statement to the process reaped, its stderr)."""
    code = CTYPES_DRIVER + textwrap.dedent(EXIT_BODY)
    env = dict(env, SIMNCCL_LIB=str(simnccl_dir / "libnccl.so.2"), SIMNCCL_JOB=f"c4dexit-{os.getpid()}",
               RANK="0", WORLD_SIZE="1")  # fmt: skip
    pipe = subprocess.PIPE
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=pipe, stderr=pipe)
    out, err = p.communicate(timeout=120)
    end = time.monotonic()
    assert p.returncode == 0, err.decode()
    return (end - float(out.split()[-1])) * 1e3, err.decode()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["absent", "never reads", "unreachable"])
def test_exit_with_records_queued_is_bounded(simnccl_dir, libc4d, where):
    """3,000 ops' records queued behind a master that is absent, never reads, or can't be reached
    (TEST-NET-1: the connect hangs): the shim's exit handler returns within C4D_EXIT_FLUSH_MS +
    50 ms, measured by the shim (DEBUG line), and the process exits at most that much later than
    the same program without the shim."""
    never = NeverReads() if where == "never reads" else None
    endpoint = {"absent": free_tcp_endpoint(), "unreachable": "tcp://192.0.2.1:5555"}.get(
        where, never.endpoint if never else ""
    )
    try:
        base = [_exit_ms(simnccl_dir, base_env(None))[0] for _ in range(3)]
        env = base_env(libc4d, C4D_MASTER_ADDR=endpoint, C4D_SEND_HWM="1", C4D_RUNTIME_LOG_LEVEL="DEBUG")
        runs = [_exit_ms(simnccl_dir, env) for _ in range(3)]
    finally:
        if never:
            never.close()
    bound = EXIT_FLUSH_MS + EXIT_MARGIN_MS
    for _, err in runs:
        m = EXIT_LINE.search(err)
        assert m, err
        assert float(m[2]) <= bound + 20 and int(m[3]) == bound, m[0]  # 20 ms: timer slack
    extra = statistics.median(ms for ms, _ in runs) - statistics.median(base)
    print(f"{where}: exit {[round(ms) for ms, _ in runs]} ms, {[round(b) for b in base]} ms without the shim")
    assert extra <= bound + 100, (runs, base)  # + scheduling on a loaded box


def test_exit_flush_of_zero_leaves_at_once(simnccl_dir, libc4d):
    env = base_env(libc4d, C4D_MASTER_ADDR="tcp://192.0.2.1:5555", C4D_EXIT_FLUSH_MS="0",
                   C4D_RUNTIME_LOG_LEVEL="DEBUG")  # fmt: skip
    _, err = _exit_ms(simnccl_dir, env)
    m = EXIT_LINE.search(err)
    assert m and float(m[2]) <= EXIT_MARGIN_MS + 20, err


# ------------------------------------------------------------------ how NCCL is used


def test_fork_after_init_children_that_never_use_nccl(simnccl_dir, libc4d, master):
    """30 children forked while the agent is busy (10 ms heartbeats, ops in flight): each exits
    at once, by sys.exit (atexit handlers run), os._exit, or exec; none sends a record or prints a
    line, none hangs; the parent's results stay exact and every op of it is recorded."""
    if TSAN:
        pytest.skip("ThreadSanitizer does not support fork() in a multi-threaded process")
    body = """
    import time
    comm = new_comm()
    s = new_stream()
    for i in range(64):
        buf[i] = i
    kids = []
    for k in range(30):
        check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "parent ncclAllReduce")
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            how = k % 3
            if how == 0:
                sys.exit(0)
            if how == 1:
                os._exit(0)
            os.execv("/bin/true", ["true"])
        _, status = os.waitpid(pid, 0)
        kids.append((pid, os.waitstatus_to_exitcode(status), time.monotonic() - t0))
    check(g.cudaStreamSynchronize(s), "sync")
    assert list(out) == list(buf), "wrong result"
    check(g.ncclCommDestroy(comm), "destroy")
    for pid, rc, took in kids:
        print(pid, rc, round(took, 3))
    print("parent", os.getpid(), flush=True)
    """
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="10")
    p = run_driver(simnccl_dir, body, env)
    assert p.returncode == 0, p.stderr
    lines = [ln.split() for ln in p.stdout.splitlines()]
    parent = int(lines[-1][1])
    kids = [(int(a), int(b), float(c)) for a, b, c in lines[:-1]]
    assert len(kids) == 30 and all(rc == 0 for _, rc, _ in kids), kids
    assert max(took for *_, took in kids) < 5.0, kids  # a child that hung at exit would sit here
    wait_records(master, final_seen({parent}), "the parent's FINAL heartbeat")
    recs = master.records()
    assert {int(x) for x in recs[schema.Kind.REGISTER]["pid"]} == {parent}
    ops = recs[schema.Kind.OP]
    assert sorted(ops["seq"].tolist()) == list(range(30))
    assert p.stderr.count(" records sent, ") == 1 and f"pid {parent}: " in p.stderr, (
        p.stderr
    )  # the parent's only
    assert not any(f"pid {pid}" in p.stderr for pid, _, _ in kids), p.stderr  # the children said nothing


THREADS_BODY = """
    import threading, time
    from pathlib import Path
    rank, world, steps = int(os.environ["RANK"]), 2, 20
    d = Path(os.environ["IDS"])
    errors = []
    def worker(t):
        try:
            uid, comm = UID(), ctypes.c_void_p()
            f = d / f"id-{t}"
            if rank == 0:
                check(g.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
                (d / f"id-{t}.tmp").write_bytes(ctypes.string_at(ctypes.addressof(uid), 128))
                os.replace(d / f"id-{t}.tmp", f)
            else:
                while not f.exists():
                    time.sleep(0.005)
                ctypes.memmove(ctypes.addressof(uid), f.read_bytes(), 128)
            check(g.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
            s = new_stream()
            x, y = (ctypes.c_float * 256)(), (ctypes.c_float * 256)()
            for i in range(steps):
                for j in range(256):
                    x[j] = (rank + 1) * (t + 1) + i + j
                check(g.ncclAllReduce(x, y, 256, F32, 0, comm, s), "ncclAllReduce")
                check(g.cudaStreamSynchronize(s), "sync")
                want = [3 * (t + 1) + 2 * (i + j) for j in range(256)]
                if list(y) != want:
                    errors.append(f"thread {t} step {i}: wrong sum")
            check(g.ncclCommDestroy(comm), "destroy")
        except BaseException as e:
            errors.append(f"thread {t}: {e}")
    ts = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    assert not errors, errors
    print("ok", os.getpid(), flush=True)
"""


def test_sixteen_threads_on_their_own_communicators(tmp_path, simnccl_dir, libc4d, master):
    """Two processes, 16 threads each, thread t of both on communicator t: every sum exact, and the
    master gets every op of every communicator from both ranks, in sequence, none dropped."""
    code = CTYPES_DRIVER + textwrap.dedent(THREADS_BODY)
    job = f"c4dthreads-{os.getpid()}"
    procs = []
    for rank in range(2):
        lib = str(simnccl_dir / "libnccl.so.2")
        env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, RANK=str(rank), WORLD_SIZE="2",
                       IDS=str(tmp_path), SIMNCCL_LIB=lib, SIMNCCL_JOB=job)  # fmt: skip
        out, err = (open(tmp_path / f"rank{rank}.{x}", "w+") for x in ("out", "err"))  # noqa: SIM115
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=err))
        procs[-1]._files = (out, err)  # type: ignore[attr-defined]
    try:
        wait_for(lambda: any(p.poll() not in (None, 0) for p in procs) or all(p.poll() == 0 for p in procs),
                 240, "both processes to finish")  # fmt: skip
    finally:
        for p in procs:
            p.kill()  # one failed: don't wait for a partner that will never come
            p.wait()
        for f in Path("/dev/shm").glob(f"simnccl-{job}*"):
            f.unlink()
    outs = []
    for p in procs:
        for f in p._files:  # type: ignore[attr-defined]
            f.seek(0)
        outs.append(tuple(f.read() for f in p._files))  # type: ignore[attr-defined]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.startswith("ok"), err
    pids = {int(out.split()[1]) for out, _ in outs}
    wait_records(master, final_seen(pids), "both FINAL heartbeats", timeout=30)
    recs = master.records()
    ops = recs[schema.Kind.OP]
    per = collections.defaultdict(list)
    for r in ops:
        per[(int(r["comm_id"]), int(r["rank"]))].append(int(r["seq"]))
    assert len({c for c, _ in per}) == 16 and len(per) == 32
    assert all(sorted(v) == list(range(20)) for v in per.values())
    hb = recs[schema.Kind.HEARTBEAT]
    assert (hb["dropped"] == 0).all()
    for _, err in outs:
        _, dropped, _ = summary(err)
        assert dropped == 0


def test_abort_and_destroy_with_ops_in_flight(simnccl_dir, libc4d, master):
    """Destroy with an op queued behind a 300 ms kernel (NCCL finishes it first); abort of a
    2-rank communicator whose op can never complete (its other rank never joins); abort of one
    whose stream is stuck in a kernel that never ends (simnccl leaks it). The process goes on,
    a new communicator computes right, and it exits cleanly; the shim reports every op and every
    lifecycle event."""
    body = """
    sim = ctypes.CDLL(os.environ["SIMNCCL_LIB"])
    sim.simLaunchCompute.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    # 1. destroy while an op waits behind a long kernel
    comm = new_comm()
    s = new_stream()
    check(sim.simLaunchCompute(s, 300_000_000), "simLaunchCompute")
    check(g.ncclAllReduce(buf, out, 64, F32, 0, comm, s), "queued ncclAllReduce")
    check(g.ncclCommDestroy(comm), "ncclCommDestroy with an op in flight")
    # 2. abort while an op waits for a rank that never comes
    comms = (ctypes.c_void_p * 2)()
    check(g.ncclCommInitAll(comms, 2, (ctypes.c_int * 2)(0, 1)), "ncclCommInitAll")
    c0, c1 = (ctypes.c_void_p(c) for c in comms)
    s0 = new_stream()
    check(g.ncclAllReduce(buf, out, 64, F32, 0, c0, s0), "lonely ncclAllReduce")
    check(g.ncclCommAbort(c0), "ncclCommAbort c0")
    check(g.ncclCommAbort(c1), "ncclCommAbort c1")
    # 3. abort while the stream is stuck forever
    c3 = new_comm()
    s3 = new_stream()
    check(sim.simLaunchCompute(s3, 2**64 - 1), "simLaunchCompute forever")
    check(g.ncclAllReduce(buf, out, 64, F32, 0, c3, s3), "ncclAllReduce behind a hung kernel")
    check(g.ncclCommAbort(c3), "ncclCommAbort c3")
    # 4. the job goes on
    c4 = new_comm()
    s4 = new_stream()
    for i in range(64):
        buf[i] = 2 * i
    check(g.ncclAllReduce(buf, out, 64, F32, 0, c4, s4), "ncclAllReduce after")
    check(g.cudaStreamSynchronize(s4), "sync")
    assert list(out) == list(buf)
    check(g.ncclCommDestroy(c4), "destroy")
    print("ok", os.getpid(), flush=True)
    """
    t0 = time.monotonic()
    p = run_driver(simnccl_dir, body, base_env(libc4d, C4D_MASTER_ADDR=master.endpoint))
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stderr
    assert time.monotonic() - t0 < 30
    pid = int(p.stdout.split()[1])
    wait_records(master, final_seen({pid}), "the FINAL heartbeat")
    recs = master.records()
    comm = recs[schema.Kind.COMM]
    events = [
        (schema.CommEvent(int(e)).name, int(c)) for e, c in zip(comm["event"], comm["comm_id"], strict=True)
    ]
    names = [e for e, _ in events]
    assert names == ["INIT_RANK", "DESTROY", "INIT_ALL", "INIT_ALL", "ABORT", "ABORT", "INIT_RANK", "ABORT",
                     "INIT_RANK", "DESTROY"], names  # fmt: skip
    first, pair, stuck, after = events[0][1], events[2][1], events[6][1], events[8][1]
    # the queued op (1) and the one after (4) completed on the device; the lonely one (2) was ended
    # by the abort; the one behind the hung kernel (3) never started: no record, it stays pending
    ops = recs[schema.Kind.OP]
    assert sorted(ops["comm_id"].tolist()) == sorted([first, pair, after]), ops
    assert (ops["result"] == 0).all() and (ops["end_ns"] >= ops["start_ns"]).all()
    hb = recs[schema.Kind.HEARTBEAT]
    final = hb[((hb["hb_flags"] & schema.HBF_FINAL) != 0) & (hb["comm_id"] == 0)]
    assert len(final) == 1
    assert final["pend_seq"][0] == 0 and final["pend_start_ns"][0] == 0  # op 3: issued, never arrived
    assert stuck not in ops["comm_id"].tolist()


STUB_NCCL = r"""
/* An NCCL with only five entry points and no CUDA runtime anywhere in the process: what an old
 * or stripped libnccl looks like to the shim (no ncclGetVersion, ncclCommCount/UserRank/CuDevice,
 * groups, split, p2p, Config variants, profiler). World size 1; "device" memory is host memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks; } comm_t;
int ncclGetUniqueId(ncclUniqueId* id) { memset(id, 7, sizeof *id); return 0; }
int ncclCommInitRank(comm_t** c, int nranks, ncclUniqueId id, int rank) {
  (void)id; (void)rank;
  if (nranks != 1) return 4; /* ncclInvalidArgument */
  *c = malloc(sizeof **c);
  (*c)->nranks = 1;
  return 0;
}
int ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, comm_t* c, void* st) {
  (void)op; (void)c; (void)st;
  if (dt != 7) return 4;
  memmove(r, s, n * 4);
  return 0;
}
int ncclCommDestroy(comm_t* c) { free(c); return 0; }
const char* ncclGetErrorString(int r) { return r ? "error" : "no error"; }
"""


@pytest.fixture(scope="module")
def stub_nccl(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("stubnccl")
    (d / "stub.c").write_text(STUB_NCCL)
    lib = d / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(d / "stub.c")], check=True)
    names = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "ncclGetVersion" not in names and "ncclCommSplit" not in names
    return lib


def test_an_nccl_without_optional_symbols(stub_nccl, libc4d, master):
    """The shim over the stub: every call the application makes works and is recorded (ranks and
    sizes from the init arguments, host times only); a hooked function this NCCL lacks returns
    ncclInternalError with one line, never a crash."""
    code = textwrap.dedent(
        """
        import ctypes, os, sys
        ctypes.CDLL(os.environ["STUB"], mode=ctypes.RTLD_GLOBAL)
        g = ctypes.CDLL(None)
        class UID(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]
        uid, comm = UID(), ctypes.c_void_p()
        assert g.ncclGetUniqueId(ctypes.byref(uid)) == 0
        assert g.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
        x, y = (ctypes.c_float * 32)(*range(32)), (ctypes.c_float * 32)()
        for i in range(10):
            assert g.ncclAllReduce(x, y, 32, 7, 0, comm, None) == 0
            assert list(y) == list(x)
        child = ctypes.c_void_p()
        print(g.ncclCommSplit(comm, 0, 0, ctypes.byref(child), None), g.ncclGroupStart(), g.ncclGroupStart())
        assert g.ncclCommDestroy(comm) == 0
        print("ok", os.getpid(), flush=True)
        """
    )
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, STUB=str(stub_nccl))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    split, group, group2 = (int(v) for v in p.stdout.splitlines()[0].split())
    assert split == group == group2 == 3  # ncclInternalError
    missing = [ln for ln in p.stderr.splitlines() if "not found in the loaded NCCL" in ln]
    assert sorted(ln.split()[1] for ln in missing) == ["ncclCommSplit:", "ncclGroupStart:"], p.stderr
    pid = int(p.stdout.split()[-1])
    wait_records(master, final_seen({pid}), "the FINAL heartbeat")
    recs = master.records()
    reg = recs[schema.Kind.REGISTER]
    assert (reg["nccl_version"] == 0).all() and (reg["device_timing"] == 0).all()
    comm = recs[schema.Kind.COMM]
    assert [schema.CommEvent(int(e)).name for e in comm["event"]] == ["INIT_RANK", "DESTROY"]
    assert comm["comm_rank"].tolist() == [0, 0] and comm["comm_nranks"].tolist() == [1, 1]
    ops = recs[schema.Kind.OP]
    assert len(ops) == 10 and sorted(ops["seq"].tolist()) == list(range(10))
    assert not (ops["flags"] & schema.OpFlag.DEVICE_TIMING).any()
    assert (ops["issue_ns"] > 0).all() and (ops["return_ns"] >= ops["issue_ns"]).all()
