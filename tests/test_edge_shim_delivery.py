"""Honest delivery in the shim (issue 14 item 4): real simnccl rank processes with libc4d.so
preloaded. "sent" counts records handed to ZeroMQ; "delivered" only what a connected master
could receive. With nobody listening, or a malformed C4D_MASTER_ADDR, the job runs and
finishes as usual, and the shim says once at start and once at exit that nothing arrived,
naming the address — and never sends to another address."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from c4d.master.master import Master, MasterConfig
from c4d.sim.sim import SimConfig, SimJob
from tests.conftest import free_port, wait_for

SUMMARY = re.compile(r"rank (\d+) pid \d+: (\d+) records sent, (\d+) dropped .*?, (\d+) delivered")


def _run(tmp_path: Path, endpoint: str, steps: int, compute_us: int = 0, master: Master | None = None):
    cfg = SimConfig(ranks=2, ranks_per_node=2, steps=steps)
    if compute_us:
        cfg.driver_args = ["--compute-us", str(compute_us)]
    job = SimJob(cfg, endpoint, job_dir=tmp_path)
    job.start()
    try:
        deadline = time.monotonic() + 120
        while not job.finished() and time.monotonic() < deadline:
            if master is not None:
                master.step(0.05)
            else:
                time.sleep(0.05)
        assert job.finished(), "the job did not finish"
        if master is not None:  # the final heartbeats
            m = master

            def finals() -> bool:
                m.step(0.05)
                return all(
                    m.received.ranks.get(r) is not None and m.received.ranks[r].final for r in range(2)
                )

            wait_for(finals, 30, "the final heartbeats")
        return job.returncodes(), [(tmp_path / f"rank-{r}.log").read_text() for r in range(2)]
    finally:
        job.kill()
        job.cleanup()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["loopback port nobody listens on", "unreachable host (TEST-NET-1)"])
def test_nothing_listening_is_said_at_start_and_exit_and_the_job_is_fine(tmp_path, where):
    # "sent" used to read as if it arrived ("406 records sent, 0 dropped" while nothing did)
    ep = f"tcp://127.0.0.1:{free_port()}" if where.startswith("loopback") else "tcp://192.0.2.1:5555"
    rcs, logs = _run(tmp_path, ep, steps=100, compute_us=40_000)  # ≥ 4 s: past the 3 s grace
    assert rcs == [0, 0]
    for r, text in enumerate(logs):
        lines = text.strip().splitlines()
        assert len(lines) <= 4, lines  # start warning, summary, nothing-delivered (+ at most one more)
        start = [ln for ln in lines if "no master has connected" in ln]
        assert len(start) == 1 and ep in start[0]
        m = SUMMARY.search(text)
        assert m and int(m.group(1)) == r and int(m.group(2)) > 0 and int(m.group(4)) == 0
        end = [ln for ln in lines if "nothing was delivered" in ln]
        assert len(end) == 1 and ep in end[0] and "no master ever connected" in end[0]


def test_a_malformed_master_address_is_reported_and_not_replaced(tmp_path):
    rcs, logs = _run(tmp_path, "garbage", steps=20)
    assert rcs == [0, 0]
    for text in logs:
        assert "C4D_MASTER_ADDR='garbage' is not a ZeroMQ endpoint" in text
        assert "records are counted, not sent" in text
        # no socket at all (0 handed to ZeroMQ, every record a "no link" drop): the default
        # tcp://127.0.0.1:5555 that this used to fall back to is never tried
        m = re.search(
            r"(\d+) records sent, (\d+) dropped \(queue full 0, master busy 0, no link (\d+)\)", text
        )
        assert m and int(m.group(1)) == 0 and int(m.group(2)) == int(m.group(3)) > 0
        assert "nothing was delivered: C4D_MASTER_ADDR is not a usable endpoint" in text
        assert "5555" not in text


def test_with_a_master_delivered_counts_what_it_received(tmp_path):
    m = Master(MasterConfig(bind=f"tcp://127.0.0.1:{free_port()}"))
    try:
        rcs, logs = _run(tmp_path, m.endpoint, steps=50, master=m)
        got = m.collector.records
    finally:
        m.close()
    assert rcs == [0, 0]
    delivered = 0
    for text in logs:
        mm = SUMMARY.search(text)
        assert mm, text
        assert int(mm.group(2)) == int(mm.group(4))  # everything queued was delivered
        delivered += int(mm.group(4))
        assert "nothing was delivered" not in text and "no master has connected" not in text
    assert got == delivered
