"""`c4d master` as its own process: a sim with --master feeds it, garbage doesn't stop it, SIGTERM
closes the trace cleanly; `c4d lib` prints the library path."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import zmq

from c4d.record import trace
from tests.conftest import c4d_cmd, free_port, wait_for


def test_c4d_lib_prints_an_existing_absolute_path(libc4d):
    p = subprocess.run([sys.executable, "-m", "c4d", "lib"], capture_output=True, text=True, check=True)
    path = Path(p.stdout.strip())
    assert path.is_absolute() and path.is_file() and path.name == "libc4d.so"


def test_master_process_with_a_sim_and_garbage(tmp_path, libc4d, simtrain):
    ep = f"tcp://127.0.0.1:{free_port()}"
    tpath = tmp_path / "m.c4d"
    master = subprocess.Popen(
        [sys.executable, "-m", "c4d", "master", "--bind", ep, "--trace", str(tpath)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: tpath.exists(), timeout=30, what="the master to open its trace")
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(ep)
        for junk in (b"", b"hello", b"C4DB" + bytes(100), bytes(range(256)) * 10):
            push.send(junk)
        push.close()
        sim = subprocess.run(
            c4d_cmd("sim", "--ranks", 4, "--ranks-per-node", 2, "--steps", 10, "--master", ep),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sim.returncode == 0, sim.stderr

        def all_final() -> bool:
            hb = trace.load(tpath).heartbeats
            return len(hb) > 0 and hb[(hb["hb_flags"] & 1) != 0]["rank"].nunique() == 4

        wait_for(all_final, timeout=30, what="every rank's final heartbeat in the trace", interval=0.3)
    finally:
        master.send_signal(signal.SIGTERM)
        _, err = master.communicate(timeout=30)
    assert master.returncode == 0, err
    assert "Traceback" not in err
    assert "malformed message" in err
    tr = trace.load(tpath)
    assert tr.raw.truncated_bytes == 0
    assert tr.nodes == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}
    assert len(tr.ops) > 0


def test_ctrl_c_stops_the_master_between_two_steps(tmp_path):
    """SIGINT asks the serving loop to stop (c4d/cli/serve.py, _stop_on_signals): the master
    finishes its step, closes the trace whole and exits 0, with no traceback; an exception thrown
    wherever the signal landed once left the live view's console lock taken and the shutdown
    waiting on it."""
    ep = f"tcp://127.0.0.1:{free_port()}"
    tpath = tmp_path / "m.c4d"
    master = subprocess.Popen(
        [sys.executable, "-m", "c4d", "master", "--bind", ep, "--trace", str(tpath)],
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: tpath.exists() and tpath.stat().st_size > 0, timeout=30, what="the master's trace")
    master.send_signal(signal.SIGINT)
    _, err = master.communicate(timeout=30)
    assert master.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert trace.load(tpath).raw.truncated_bytes == 0


def test_a_stopping_master_takes_what_already_arrived(tmp_path):
    """Records the job sent before its master was told to stop, queued in the master's socket
    and not polled yet, reach the trace before it closes (``Master.drain``, which ``c4d master``
    calls on SIGTERM or Ctrl-C): a deployment test on a loaded CI host stopped its master right
    after its two ranks had flushed and exited, and found no REGISTER in the trace."""
    import time

    import numpy as np

    from c4d.master.master import Master, MasterConfig
    from c4d.record import schema, wire
    from tests import factories as F

    m = Master(MasterConfig(bind="tcp://127.0.0.1:0", trace=str(tmp_path / "m.c4d")))
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    try:
        _, batches = F.build_cached(F.Job(tp=2, pp=1, dp=2, steps=2))
        raw = schema.join_records([b for _, b in batches[:8]], schema.HEADER)
        raw["time_ns"] += time.time_ns() - F.T0  # sent now, by the master's clock
        assert (raw["kind"] == schema.Kind.REGISTER).sum() == 4
        push.connect(m.endpoint)
        push.send(wire.encode(raw))
        wait_for(lambda: m.collector.sock.poll(0, zmq.POLLIN), timeout=30, what="the batch at the master")
        m.drain()
        assert m.collector.records == len(raw)
    finally:
        push.close(0)
        ctx.term()
        m.close()
    tr = trace.load(tmp_path / "m.c4d")
    assert sorted(tr.nodes) == [0, 1, 2, 3]
    assert np.array_equal(np.sort(tr.raw.kinds[schema.Kind.REGISTER]["rank"]), np.arange(4))
