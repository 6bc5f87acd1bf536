"""The shim's hot-path clock: host times taken as TSC ticks (where the kernel keeps time with
the TSC) and turned into ns by the agent must be the host clock's own times, as with
clock_gettime (C4D_TSC=0). Real shim, real simnccl job, real master socket."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from c4d.record import schema
from tests.test_shim import base_env, final_seen, run_job, train, wait_records

KERNEL_CLOCK = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")


@pytest.mark.parametrize("tsc", ["1", "0"])
def test_op_times_are_host_clock_times_with_and_without_tsc(tsc, libc4d, simtrain, master, jobs, tmp_path):
    world = 4
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_HEARTBEAT_MS="50", C4D_TSC=tsc)
    before = time.time_ns()
    job = run_job(jobs, simtrain, world, train(20, 2, 1, "--compute-us", "3000"), env, tmp_path)
    assert job.wait(180) == [0] * world, [job.stderr(r) for r in range(world)]
    after = time.time_ns()
    pids = {p.pid for p in job.procs}
    wait_records(master, final_seen(pids), "the FINAL heartbeat of every rank")
    ops = master.records()[schema.Kind.OP]
    assert len(ops) >= world * 20
    issue, ret = ops["issue_ns"].astype(np.int64), ops["return_ns"].astype(np.int64)
    start, end = ops["start_ns"].astype(np.int64), ops["end_ns"].astype(np.int64)
    # every time is a host-clock time within the job's run ...
    for col in (issue, ret, start, end):
        assert (col >= before).all() and (col <= after).all()
    # ... in the order the shim promises (record.h), and a call returns within its step
    assert (issue <= ret).all() and (issue <= start).all() and (start <= end).all()
    assert ((ret - issue) < 1_000_000_000).all()
    # per rank, issue times follow the call order (sequence numbers of one comm), up to the
    # TSC conversion's stated error (timing.h: the first rate is measured over 10 ms, ~10 µs/s)
    for rank in range(world):
        mine = ops[(ops["rank"] == rank) & ((ops["flags"] & schema.OpFlag.P2P) == 0)]
        for cid in np.unique(mine["comm_id"]):
            one = mine[mine["comm_id"] == cid]
            by_seq = one[np.argsort(one["seq"])]
            assert (np.diff(by_seq["issue_ns"].astype(np.int64)) >= -50_000).all()


def test_tsc_is_used_only_where_the_kernel_keeps_time_with_it(libc4d, simtrain, master, jobs, tmp_path):
    """C4D_RUNTIME_LOG_LEVEL=DEBUG says once which clock the hot path uses."""
    env = base_env(libc4d, C4D_MASTER_ADDR=master.endpoint, C4D_RUNTIME_LOG_LEVEL="DEBUG")
    job = run_job(jobs, simtrain, 2, train(2, 2, 1), env, tmp_path)
    assert job.wait(120) == [0, 0]
    said = "host times on the hot path from the TSC" in job.stderr(0)
    try:
        kernel_tsc = KERNEL_CLOCK.read_text().strip() == "tsc"
    except OSError:
        kernel_tsc = False
    import platform

    assert said == (kernel_tsc and platform.machine() in ("x86_64", "AMD64"))
    env = dict(env, C4D_TSC="0")
    job = run_job(jobs, simtrain, 2, train(2, 2, 1), env, tmp_path)
    assert job.wait(120) == [0, 0]
    assert "from the TSC" not in job.stderr(0)
