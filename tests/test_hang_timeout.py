"""``c4d.hang_timeout``: the Python API, the shim's C function behind it, and a real training loop.

The last test is the issue's: a Python training loop over simnccl (ctypes, libc4d.so
preloaded, a real master) in which rank 0 runs a long "evaluation" while the others wait in
the next all-reduce. Wrapped in ``c4d.hang_timeout(...)`` nothing is diagnosed; the same loop
without it gets RankNonCommHang on rank 0.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import c4d
from c4d import phase
from c4d.record import schema

ROOT = Path(__file__).resolve().parents[1]


def test_blocks_nest_and_the_innermost_open_one_wins():
    assert phase.current() is None
    with c4d.hang_timeout(600):
        assert phase.current() == 600
        with c4d.hang_timeout(-1):
            assert phase.current() == -1
        assert phase.current() == 600
    assert phase.current() is None


def test_as_a_decorator_each_call_is_its_own_block():
    seen = []

    @c4d.hang_timeout(2.5)
    def evaluate(depth: int) -> None:
        seen.append(phase.current())
        if depth:
            evaluate(depth - 1)  # recursion: the same decorator entered twice
        seen.append(phase.current())

    evaluate(1)
    assert seen == [2.5, 2.5, 2.5, 2.5] and phase.current() is None


def test_threads_close_their_own_blocks():
    """A thread leaving its block does not close another thread's."""
    entered, leave_a = threading.Event(), threading.Event()

    def a() -> None:
        with c4d.hang_timeout(30):
            entered.set()
            leave_a.wait(5)

    t = threading.Thread(target=a)
    t.start()
    assert entered.wait(5)
    with c4d.hang_timeout(-1):
        leave_a.set()
        t.join(5)
        assert phase.current() == -1  # a's exit left b's block in force
    assert phase.current() is None


@pytest.mark.parametrize("bad", [0, -2, -0.5, float("nan"), "10", True, None])
def test_bad_values_are_refused_with_one_line(bad):
    with pytest.raises((ValueError, TypeError)) as e:
        c4d.hang_timeout(bad)
    assert "c4d.hang_timeout" in str(e.value) and "\n" not in str(e.value)


PROBE = """
import ctypes, c4d
get = ctypes.CDLL(None).c4d_hang_timeout
get.restype = ctypes.c_int64
vals = [get()]
with c4d.hang_timeout(90):
    vals.append(get())
    with c4d.hang_timeout(-1):
        vals.append(get())
    vals.append(get())
vals.append(get())
print(vals)
"""


def test_the_value_reaches_the_preloaded_shim(libc4d):
    env = dict(os.environ, LD_PRELOAD=str(libc4d), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[0, 90000000, -1, 90000000, 0]"


def test_without_the_shim_it_is_a_no_op_with_one_debug_line():
    code = (
        "import logging, c4d; logging.basicConfig(level=logging.DEBUG, format='%(message)s')\n"
        "with c4d.hang_timeout(5):\n    pass\nwith c4d.hang_timeout(6):\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert p.stderr.splitlines() == [
        "c4d.hang_timeout: libc4d.so is not preloaded; staged timeouts are a no-op"
    ]


# -- a training loop over simnccl -----------------------------------------------------------
TRAIN = textwrap.dedent(
    """
    import ctypes, os, sys, time
    import c4d
    ctypes.CDLL(os.environ["SIMNCCL_LIB"], mode=ctypes.RTLD_GLOBAL)
    g = ctypes.CDLL(None)  # global scope: the preloaded shim's hooks first
    class UID(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]
    def check(r, what):
        if r != 0:
            sys.exit(f"{what} returned {r}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    uid_file = os.path.join(os.environ["JOB_DIR"], "uid")
    uid = UID()
    if rank == 0:
        check(g.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        with open(uid_file + ".tmp", "wb") as f:
            f.write(bytes(uid))
        os.rename(uid_file + ".tmp", uid_file)
    else:
        while not os.path.exists(uid_file):
            time.sleep(0.01)
        ctypes.memmove(ctypes.byref(uid), open(uid_file, "rb").read(), 128)
    comm, stream = ctypes.c_void_p(), ctypes.c_void_p()
    check(g.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
    check(g.cudaStreamCreateWithFlags(ctypes.byref(stream), 1), "cudaStreamCreateWithFlags")
    buf = (ctypes.c_float * 256)()

    def evaluate():
        time.sleep(float(os.environ["EVAL_S"]))  # a long evaluation on the host: no NCCL call

    for step in range(12):
        if rank == 0 and step == 6:
            if os.environ["WRAP"] == "1":
                with c4d.hang_timeout(60):
                    evaluate()
            else:
                evaluate()
        check(g.ncclAllReduce(buf, buf, 256, 7, 0, comm, stream), "ncclAllReduce")
        check(g.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        time.sleep(0.02)
    check(g.ncclCommDestroy(comm), "ncclCommDestroy")
    """
)


def train_and_diagnose(libc4d, simnccl_dir, tmp_path, wrap: bool) -> list:
    """Run the 4-rank loop against an in-process master; every diagnosis until the ranks exit.

    The master writes a trace; its offline replay must give the same diagnoses (the STAGE
    records are in it)."""
    from c4d.master.master import Master, MasterConfig, make_engine
    from c4d.offline import analyze
    from c4d.record import trace

    tmp_path.mkdir()
    m = Master(MasterConfig(bind="tcp://127.0.0.1:*", trace=str(tmp_path / "t.c4d")))
    job = f"c4dhto-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, LD_PRELOAD=str(libc4d), PYTHONPATH=str(ROOT), C4D_MASTER_ADDR=m.endpoint,
               C4D_HANG_TIMEOUT="1000000", C4D_HANG_TIMES="3", C4D_HEARTBEAT_MS="200",
               SIMNCCL_LIB=str(simnccl_dir / "libnccl.so.2"), SIMNCCL_JOB=job, JOB_DIR=str(tmp_path),
               WORLD_SIZE="4", EVAL_S="4.5", WRAP="1" if wrap else "0")  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(4)
    ]
    try:
        deadline = time.monotonic() + 90
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            m.step(timeout_s=0.05)
        end = time.monotonic() + 0.5  # the last heartbeats
        while time.monotonic() < end:
            m.step(timeout_s=0.05)
        rcs = [p.wait(5) for p in procs]
        assert rcs == [0] * 4, [p.stderr.read() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        m.close()
        for f in Path("/dev/shm").glob(f"simnccl-{job}*"):
            f.unlink()
    raw = trace.read_raw(tmp_path / "t.c4d")
    st = raw.kinds[schema.Kind.STAGE]
    seen = set(
        zip(st["rank"].tolist(), st["generation"].tolist(), st["hang_timeout_us"].tolist(), strict=True)
    )
    assert seen == ({(0, 1, 60_000_000), (0, 2, 0)} if wrap else set())  # into the block, out (and repeats)
    replayed = analyze.replay(raw, make_engine())
    assert [d.summary() for d in replayed] == [d.summary() for d in m.diagnoses]
    return list(m.diagnoses)


@pytest.mark.slow
def test_a_wrapped_evaluation_is_not_a_hang_and_the_bare_one_is(libc4d, simnccl_dir, tmp_path):
    bare = train_and_diagnose(libc4d, simnccl_dir, tmp_path / "bare", wrap=False)
    hangs = [d for d in bare if d.kind.value == "RankNonCommHang"]
    assert hangs and {d.ranks for d in hangs} == {(0,)}, [d.summary() for d in bare]
    assert any(d.level.name == "ERROR" for d in hangs)  # 4.5 s > T x 3

    wrapped = train_and_diagnose(libc4d, simnccl_dir, tmp_path / "wrapped", wrap=True)
    assert [d.summary() for d in wrapped if d.kind.value.endswith("Hang")] == []
    logging.getLogger("c4d").info("wrapped run diagnoses: %s", [d.summary() for d in wrapped])
