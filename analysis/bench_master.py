"""One master, many ranks: how many a master diagnoses in real time, with and without node agents.

    python analysis/bench_master.py [--quick] [--json] [--max-ranks N] [--seconds S] [--window-s W]
    python analysis/bench_master.py --ranks 16384 --window-s 10 --seconds 25   # one size, agents
    python analysis/bench_master.py --ranks 16384 --window-s 10 --seconds 25 --engine-process --paced
    python analysis/bench_master.py --ranks 16384 --window-s 10 --seconds 25 --engine-process --paced \
        --speed 1 2   # paced at the job's rate and at twice it
    python analysis/bench_master.py --ranks 16384 --window-s 10 --seconds 25 --engine-process \
        --engine-shards 1 2   # the engine's capacity against its shard count
    python analysis/bench_master.py --ranks 16384 --window-s 10 --seconds 25 --engine-process \
        --agent-flush-ms 100 0   # agents at 100 ms against the period they take for the job

A synthetic TP x PP x DP job (analysis/master_load.py: valid v1 records, 500 collectives per
second per rank, 8 ranks a node, slow-detection windows of ``--window-s``: 1 s by default, ten
times as many windows to judge as C4D_CONN_BW_CHECK_PERIOD's default of 10 s) is sent through
real ZeroMQ by a sender process to a real ``c4d.master.master.Master`` (collector, edge validation,
engine; no trace) in this process:

* capacity: a sender pushes a job's records as fast as the master takes them; records/s the
  master ingests with the engine on (wall and CPU time of the master), for N ranks raw and
  for N ranks through agents (what one agent per node forwards: c4d/agent/summary.py);
* real time: the largest N (tp 8 x pp 4 x dp 2^i) whose capacity covers the job's own rate
  after aggregation, measured at each N on the way up (not extrapolated); then a paced run
  at that N (the sender sends each 50 ms window of the job when it is due) that checks the
  master keeps up, reports the master's memory, and injects a hang (a rank stops before its
  TP all-reduce) to measure the end-to-end diagnosis latency: from the hang's start to the
  master's RankNonCommHang WARNING naming it (T = the job's hang timeout is part of it);
* the agent's own cost: records/s one Summariser takes for a node's raw stream (one core);
* ``--ranks N ...``: only capacity runs at those sizes through agents, each with the master's
  RSS at its end and its peak: the master's memory at a size it does not keep up with (run
  it for 2.5 windows, ``--seconds 25`` with 10 s windows, so that windows are judged); with
  ``--paced`` a paced run follows each, its hang 3 s before the end (the windows closed
  before it are judged while the job runs: windows a hang covers are not); ``--speed X ...``:
  the paced run at each X times the job's collective rate: kept up at 2 is a margin of 2x at
  the job's own pace (a capacity run's sender sends the whole run as fast as it can, its
  records stamped up to the run's length ahead of the master's clock).

The sender stands in for the job's node agents, each on a host of its own: it runs ahead of the
master (nice ``SENDER_NICE``) where the system lets it, so that the master it measures cannot
starve it (``sender_nice`` in the figures: what it got, 0 when refused).

``--engine-process``: the master's engine in a process of its own (its CPU and memory counted
with the master's); ``--engine-shards N ...`` (with it and ``--ranks``): that engine's
communicators over N shard processes (``c4d master --engine-shards``: their CPU and memory
counted with the engine's), each count in turn, side by side. ``--pp-every R``: a pipeline
send/recv every R rounds (default 156, Megatron's
1F1B at the issue's arithmetic; 25 sends six times as many).

The machine may be shared: figures are wall time on it; ``uptime`` is printed with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "analysis")]

from master_load import Load, Shape  # noqa: E402

from c4d.agent.agent import MAX_BATCH as MAX_ROWS  # noqa: E402  (an agent's flush, split in messages)
from c4d.record import schema  # noqa: E402

# Connections the sender opens, each carrying its share of the senders' messages (sender k on
# connection k % CONNECTIONS): the master queues a few messages per connection
# (C4D_RECV_SENDER_BYTES), so one connection for the whole job would measure that queue, not the
# master. The job's agents each have one; under the master's connection budget (2,048 at once).
CONNECTIONS = 256
CHUNK_ROUNDS = 25  # rounds per window a sender sends at once (50 ms at 500 rounds/s)
SENDER_NICE = -10  # the sender's priority where the system allows it (_ahead)


# -- the sender process ----------------------------------------------------------------
def _sender(endpoint: str, shape: Shape, agents: bool, rounds: int, paced: bool, t0_ns: int,
            hang: tuple[int, int] | None, ready, sent, lag, start=None, prio=None) -> None:  # fmt: skip
    """Send the job's records; paced, from ``t0_ns`` or later (the time chosen in ``start``)."""
    import zmq

    _ahead(prio)
    ctx = zmq.Context()
    n_senders = shape.nodes if agents else shape.world
    socks = [_push(ctx, endpoint) for _ in range(min(n_senders, CONNECTIONS))]
    step = _flush_rounds(shape) if agents else CHUNK_ROUNDS  # an agent's flush, a shim's 50 ms
    wins = [(k, min(k + step, rounds)) for k in range(0, rounds, step)]
    if paced:
        # the job's clock starts once every message is built (sending is all the sender does
        # then): a window built first (by a load of its own: an agents' load keeps heartbeat
        # state) says how long that takes. A fixed lead was 1.6 s short at 8,192 ranks through
        # agents, and the late start was counted as the master's.
        c0 = time.perf_counter()
        Load(shape, t0_ns, agents=agents, hang=hang).messages(*wins[0], MAX_ROWS)
        build_s = (time.perf_counter() - c0) * len(wins)
        t0_ns = max(t0_ns, time.time_ns() + int((1.0 + 1.5 * build_s) * 1e9))
        start.value = t0_ns
    load = Load(shape, t0_ns, agents=agents, hang=hang)
    pre = [load.messages(a, b, MAX_ROWS) for a, b in wins]  # built before the clock starts: then only sends
    # stamped when sent: sent before the job's clock starts (t0), a REGISTER stamped t0 would
    # tell the master the ranks' clocks run ahead (clock.py's receipt bound) and make every
    # wait look longer by that much
    hello = load.hello_messages(MAX_ROWS, min(t0_ns, time.time_ns()))
    ready.set()
    n = 0
    worst = 0.0
    for i, msgs in enumerate([hello, *pre]):
        if paced and i:
            due = t0_ns + wins[i - 1][1] * shape.period_ns  # the window's last round has happened
            wait = (due - time.time_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
            worst = max(worst, -wait)
        data, who = msgs
        for m, w in zip(data, (who % len(socks)).tolist(), strict=True):
            socks[w].send(m, copy=False)  # a sender's messages in order on its connection
        n += sum((len(m) - schema.BATCH_HEADER.itemsize) // schema.RECORD_SIZE for m in data)
        sent.value = n
    lag.value = worst
    for s in socks:
        s.close(linger=-1)
    ctx.term()


def _flush_rounds(shape: Shape) -> int:
    """Rounds per agent flush: ``shape.flush_ms``, else the period a node agent takes for this
    job (c4d/agent/flush.py)."""
    from c4d.agent.flush import flush_period_s

    s = shape.flush_ms / 1e3 or flush_period_s(shape.world, shape.tp, shape.hb_ms)
    return max(1, round(s * shape.rate))


def _push(ctx, endpoint: str):
    import zmq

    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 100000)
    s.setsockopt(zmq.METADATA, b"X-C4D-Job:bench")  # as a node agent and the shim name their job
    s.connect(endpoint)
    return s


def _ahead(prio) -> None:
    """The sender stands in for the job's agents, each on a host of its own: here it shares the
    cores with the master it measures, which would starve it (a paced run at 16,384 ranks once
    sent 3.1 s late: the job slowed, not the master). So it runs ahead of the master (nice
    SENDER_NICE, its ZeroMQ thread too: made after) where the system lets it; ``prio`` (a shared
    value) says what it got: the nice value, or 0 when refused (then it competes as before)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, SENDER_NICE)
        got = SENDER_NICE
    except OSError:
        got = 0
    if prio is not None:
        prio.value = got


def _quiet() -> None:
    """The masters' incident log is not the bench's output (here and in each spawned run)."""
    quiet = logging.getLogger("c4d")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False


def _master(tick_s: float = 0.2, engine_process: bool = False):
    from c4d.master.master import Master, MasterConfig

    _quiet()
    return Master(MasterConfig(bind="tcp://127.0.0.1:*", tick_s=tick_s, engine_process=engine_process))


def _engine_pid(m) -> int | None:
    """The master's engine process (c4d master --engine-process), if it has one."""
    return getattr(m.engine, "pid", None)


def _engine_pids(m) -> list[int]:
    """The master's engine process and its shards' processes (--engine-shards), if any."""
    if (pid := _engine_pid(m)) is None:
        return []
    from c4d.run import proctree

    return [pid, *proctree.descendants([pid])]


def _receiver_pids(m) -> list[int]:
    """The master's receiving process (c4d master --receiver-process), if it has one."""
    pid = getattr(m.collector, "pid", None)
    return [] if pid is None else [pid]


def _rss_mib(pid: int | str = "self") -> tuple[float, float]:
    cur = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


def _rss(m) -> dict[str, float]:
    """The master's memory, read once: its loop's process, its engine's process and its
    receiving process (those it has) together (peaks summed), and each one's peak apart (which
    one holds the memory)."""
    parts = {"loop": _rss_mib()}
    for name, pids in (("engine", _engine_pids(m)), ("receiver", _receiver_pids(m))):
        if pids:  # (the engine's shards, if any, counted with it)
            each = [_rss_mib(p) for p in pids]
            parts[name] = (sum(c for c, _ in each), sum(p for _, p in each))
    out = {
        "master_rss_mib": round(sum(c for c, _ in parts.values()), 1),
        "master_peak_rss_mib": round(sum(p for _, p in parts.values()), 1),
    }
    return out | {f"{k}_peak_rss_mib": round(p, 1) for k, (_, p) in parts.items()}


def _cpu(m=None) -> float:
    """CPU seconds of this process (the master) and of its engine and receiving processes, if any."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + (_engine_cpu(m) or 0.0) + (_receiver_cpu(m) or 0.0)


def _pids_cpu(pids: list[int]) -> float | None:
    if not pids:
        return None
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
            total += int(utime) + int(stime)
    return total / os.sysconf("SC_CLK_TCK")


def _engine_cpu(m) -> float | None:
    """CPU seconds of the master's engine process and its shards' (if any); None without one."""
    return _pids_cpu(_engine_pids(m) if m is not None else [])


def _receiver_cpu(m) -> float | None:
    """CPU seconds of the master's receiving process; None without one."""
    return _pids_cpu(_receiver_pids(m) if m is not None else [])


def _cores(cpu: float, e0: float | None, e1: float | None, n: int, rate: float,
           r0: float | None = None, r1: float | None = None) -> dict:  # fmt: skip
    """The cores each of the master's processes needs at the job's rate (``rate`` records/s), from
    the CPU it spent per record: the engine's process is one thread, so more than 1.0 there is
    more than any number of cores gives it (with ``--engine-process``; else the loop's is all);
    so are the loop and the receiving process (``--receivers 1``)."""
    if not n:
        return {}
    eng = (e1 - e0) if e0 is not None and e1 is not None else 0.0
    rcv = (r1 - r0) if r0 is not None and r1 is not None else 0.0
    out = {"loop_cores_at_job_rate": round((cpu - eng - rcv) / n * rate, 2)}
    if e0 is not None:
        out["engine_cores_at_job_rate"] = round(eng / n * rate, 2)
    if r0 is not None:
        out["receiver_cores_at_job_rate"] = round(rcv / n * rate, 2)
    return out


# -- capacity ----------------------------------------------------------------------------
def capacity(
    shape: Shape, agents: bool, seconds: float, engine_process: bool = False, profile: str | None = None
) -> dict:
    """Records/s the master ingests (engine on) when a sender pushes as fast as it takes them.
    ``profile``: a file the engine's process writes its cProfile statistics to (C4D_ENGINE_PROFILE)."""
    if profile:
        os.environ["C4D_ENGINE_PROFILE"] = profile  # (this process is the run's own: _fresh)
    m = _master(engine_process=engine_process)
    rounds = int(seconds * shape.rate)
    ctx = mp.get_context("fork")
    ready, sent, lag, prio = ctx.Event(), ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("i", 0)
    p = ctx.Process(target=_sender, args=(m.endpoint, shape, agents, rounds, False, time.time_ns(), None,
                                          ready, sent, lag, None, prio), daemon=True)  # fmt: skip
    p.start()
    ready.wait(600)
    w0, c0, e0, r0 = time.perf_counter(), _cpu(m), _engine_cpu(m), _receiver_cpu(m)
    while True:
        m.step(timeout_s=0.02)
        if not p.is_alive() and (m.collector.records >= sent.value or p.exitcode):
            break
        if time.perf_counter() - w0 > 600:
            break
    if p.exitcode:
        raise SystemExit(f"bench_master: the sender failed (exit {p.exitcode})")
    m.tick(time.time_ns())  # the last records evaluated
    m.settle()  # (an engine in a process of its own: until it has evaluated them)
    wall, cpu, e1, r1 = time.perf_counter() - w0, _cpu(m) - c0, _engine_cpu(m), _receiver_cpu(m)
    n = m.collector.records
    job_rate = sent.value * shape.rate / rounds
    p.join(10)
    out = {
        "ranks": shape.world,
        "agents": agents,
        "engine_process": engine_process,
        "records": n,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "records_per_s": round(n / wall),
        "records_per_cpu_s": round(n / cpu) if cpu else None,
        "job_records_per_s": round(job_rate),  # what the job (its agents) sent
        **_cores(cpu, e0, e1, n, job_rate, r0, r1),
        "receivers": len(_receiver_pids(m)),
        "sender_nice": prio.value,
        **_rss(m),  # this process is the master alone (_fresh), its sender forked off
        "dropped": m.edge.dropped,
        "rejected": {str(k): v for k, v in m.edge.rejected.items() if v},  # the edge's reasons
        "failures": dict(m.ingest.failures),
    }
    m.close()
    if profile:
        out["engine_profile"] = _profile_summary(profile)
    return out


def _profile_summary(path: str, top: int = 20) -> dict:
    """Where the engine's process spent its time: each of the ``top`` functions by time
    including what they call, as a share of the process's profiled time (cumulative, so shares
    nest and add up to more than 1), and the file for ``python -m pstats``."""
    import pstats

    if not os.path.exists(path):
        return {"file": path, "error": "not written (the engine's process did not stop in time?)"}
    st = pstats.Stats(path)
    total = st.total_tt or 1.0  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_cc, _nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((ct, tt, f"{Path(file).name}:{line}:{name}"))
    rows.sort(reverse=True)
    return {
        "file": path,
        "total_s": round(total, 2),
        "cumulative": [
            {"fn": f, "share": round(ct / total, 3), "own": round(tt / total, 3)} for ct, tt, f in rows[:top]
        ],
        "own": [
            {"fn": f, "share": round(tt / total, 3)} for _ct, tt, f in sorted(rows, key=lambda r: -r[1])[:top]
        ],
    }


# -- real time -----------------------------------------------------------------------------
def paced(shape: Shape, agents: bool, seconds: float, hang_at_s: float, engine_process: bool = False) -> dict:
    """The job sent at its own pace; a hang injected at ``hang_at_s``."""
    m = _master(tick_s=0.2, engine_process=engine_process)
    rounds = int(seconds * shape.rate)
    k_h = int(hang_at_s * shape.rate)
    culprit = shape.world - 3  # a rank of the last node: its TP group waits for it
    ctx = mp.get_context("fork")
    ready, sent, lag, start = ctx.Event(), ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("q", 0)
    prio = ctx.Value("i", 0)
    # the job's clock starts once the sender has built every message (it chooses when, and
    # reports how late it sent)
    hang = (k_h, culprit)
    args = (m.endpoint, shape, agents, rounds, True, time.time_ns(), hang, ready, sent, lag, start, prio)
    p = ctx.Process(target=_sender, args=args, daemon=True)
    p.start()
    ready.wait(600)
    t0 = start.value
    backlog = []
    seen_ms = None
    seen_d = None
    c0, e0, r0 = _cpu(m), _engine_cpu(m), _receiver_cpu(m)
    last = time.perf_counter()

    def seen(new) -> None:
        nonlocal seen_ms, seen_d
        for d in new:
            if seen_ms is None and d.kind.name == "RankNonCommHang" and culprit in d.ranks:
                seen_ms, seen_d = time.time_ns(), d

    while True:
        seen(m.step())
        if time.perf_counter() - last >= 0.25:
            last = time.perf_counter()
            backlog.append(sent.value - m.collector.records)
        if not p.is_alive():
            break
    if p.exitcode:
        raise SystemExit(f"bench_master: the sender failed (exit {p.exitcode})")
    done = time.perf_counter()
    while m.collector.records < sent.value and time.perf_counter() - done < 30:
        seen(m.step(timeout_s=0.02))
    seen(m.tick(time.time_ns()))
    seen(m.settle())  # (an engine in a process of its own: until it has taken every record)
    drain = time.perf_counter() - done
    cpu, e1, r1 = _cpu(m) - c0, _engine_cpu(m), _receiver_cpu(m)
    job_rate = sent.value * shape.rate / rounds
    hang_ns = t0 + k_h * shape.period_ns
    T = shape.hang_timeout_us / 1e6
    lat = (seen_ms - hang_ns) / 1e9 if seen_ms else None
    out = {
        "ranks": shape.world,
        "agents": agents,
        "engine_process": engine_process,
        "seconds": seconds,
        "records": m.collector.records,
        "job_records_per_s": round(job_rate),  # what the job (its agents) sent
        **_cores(cpu, e0, e1, m.collector.records, job_rate, r0, r1),
        "sender_late_s": round(lag.value, 3),
        "sender_nice": prio.value,
        "drain_s": round(drain, 3),
        "never_arrived": sent.value - m.collector.records,  # (an oversized message loses its connection)
        "backlog_max_records": int(max(backlog)) if backlog else 0,
        "kept_up": drain < 1.0 and lag.value < 0.5,
        "master_cpu_share": round(cpu / seconds, 2),
        **_rss(m),
        "hang_timeout_s": T,
        "hang_latency_s": round(lat, 3) if lat is not None else None,
        "hang_latency_beyond_T_s": round(lat - T, 3) if lat is not None else None,
        # what the engine measured: the wait on the master clock (rank times moved by its offsets)
        "hang_waited_s": seen_d.detail.get("waited_s") if seen_d is not None else None,
        "dropped": m.edge.dropped,
    }
    m.close()
    p.join(10)
    return out


# -- the agent's own cost ------------------------------------------------------------------
def agent_rate(seconds: float) -> dict:
    """Records/s one node agent's edge + summariser take (a node of 8 ranks of a 32-rank job)."""
    from c4d.agent.summary import Summariser
    from c4d.intake.validate import Edge

    shape = Shape(tp=8, pp=2, dp=2)
    load = Load(shape, time.time_ns())
    hello = load.hello()
    rounds = int(seconds * shape.rate)
    wins = []
    for k in range(0, rounds, 50):
        raw, _who = load.by_sender(k, min(k + 50, rounds))  # as the agent receives them: per rank
        wins.append(raw[load.node[raw["rank"]] == 0])
    edge, summ = Edge(), Summariser()
    t = time.time_ns()
    summ.feed(edge.admit(hello[load.node[hello["rank"]] == 0], t))
    c0 = time.process_time()
    n = out = 0
    for w in wins:
        o = summ.feed(edge.admit(w, t))
        n += len(w)
        out += len(o)
    cpu = time.process_time() - c0
    return {"records": n, "records_per_cpu_s": round(n / cpu), "forwarded": out,
            "node_records_per_s": round(n / seconds), "summarised": int(summ.stats["summaries"])}  # fmt: skip


def _fresh(fn, *args):
    """fn(*args) in a master process of its own (spawned): one run's heap and garbage did not
    slow the next (4,096 ranks after thirteen runs in one process: 434k records/s, alone 531k)."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_run_to, args=(send, fn, args))  # not daemonic: it starts a sender
    p.start()
    send.close()
    try:
        ok, out = recv.recv()
    except EOFError:
        p.join()
        ok, out = False, f"the run's process died (exit {p.exitcode})"
    p.join()
    if not ok:
        raise SystemExit(f"bench_master: {out}")
    return out


def _run_to(conn, fn, args) -> None:
    try:
        conn.send((True, fn(*args)))
    except BaseException as e:  # reported to the parent, one line
        conn.send((False, f"{type(e).__name__}: {e}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds (CI smoke run)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object on the last line")
    ap.add_argument("--max-ranks", type=int, default=16384)
    ap.add_argument("--ranks", type=int, nargs="+", metavar="N",
                    help="capacity runs at these sizes only, through agents (no raw runs, no paced "
                         "run): rate and master memory where real time is not reached")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=None, help="job seconds per capacity run (default 4)")
    ap.add_argument("--engine-process", action="store_true",
                    help="the master's engine in a process of its own (c4d master --engine-process): "
                         "its CPU time and memory are counted with the master's")  # fmt: skip
    ap.add_argument("--window-s", type=int, default=1,
                    help="the job's slow-detection window (C4D_CONN_BW_CHECK_PERIOD; 1 judges 10x as "
                         "often as the default 10)")  # fmt: skip
    ap.add_argument("--paced", action="store_true",
                    help="with --ranks: a paced run (the job at its own pace, a hang injected) after each "
                         "capacity run")  # fmt: skip
    ap.add_argument("--speed", type=float, nargs="+", default=[1.0], metavar="X",
                    help="with --ranks and --paced: a paced run at each X times the job's collective rate "
                         "(2: the job sends twice as fast; kept up at 2 is a margin of 2x measured at the "
                         "job's own pace; a capacity run's records come stamped ahead of the master's "
                         "clock)")  # fmt: skip
    ap.add_argument("--profile", metavar="FILE", default=None,
                    help="with --ranks and --engine-process: the engine's process profiled (cProfile, "
                         "C4D_ENGINE_PROFILE) in each capacity run, its statistics written to FILE "
                         "(its size appended) and summarised")  # fmt: skip
    ap.add_argument("--pp-every", type=int, default=Shape.pp_every, metavar="ROUNDS",
                    help="a pipeline send/recv every ROUNDS tensor-parallel rounds (default %(default)s; "
                         "156 is Megatron's 1F1B at the issue's arithmetic: 4 p2p ops per micro-batch, "
                         "8 micro-batches per 5 s step)")  # fmt: skip
    ap.add_argument("--agent-window-ops", type=int, nargs="+", default=[Shape.window_ops], metavar="N",
                    help="with --ranks: the agents' window sample of each tensor-parallel group's "
                         "all-reduces (C4D_SLOW_WINDOW_OPS, default %(default)s; 0: every one sent, as "
                         "before agents sampled); several: each in turn, side by side")  # fmt: skip
    ap.add_argument("--engine-shards", type=int, nargs="+", default=[1], metavar="N",
                    help="with --ranks --engine-process: the engine's communicators over N shard "
                         "processes (c4d master --engine-shards; default 1: one engine); several: each "
                         "in turn, side by side")  # fmt: skip
    ap.add_argument("--receivers", type=int, nargs="+", default=[0], choices=(0, 1), metavar="N",
                    help="with --ranks: 1 receives in a process of its own (c4d master "
                         "--receiver-process), 0 in the master's loop (the default); both: each in "
                         "turn, side by side")  # fmt: skip
    ap.add_argument("--agent-flush-ms", type=float, nargs="+", default=[0.0], metavar="MS",
                    help="with --ranks: the agents' flush period (default 0: the one a node agent takes "
                         "for the job, c4d/agent/flush.py; 100 was every agent's before it grew with the "
                         "job); several: each in turn, side by side")  # fmt: skip
    args = ap.parse_args()
    if args.agent_flush_ms != [0.0] and not args.ranks:
        ap.error("--agent-flush-ms compares --ranks runs: give --ranks")
    if args.receivers != [0] and not args.ranks:
        ap.error("--receivers compares --ranks runs: give --ranks")
    if args.engine_shards != [1] and not (args.ranks and args.engine_process):
        ap.error("--engine-shards compares shard counts of --ranks runs: give --ranks and --engine-process")
    if args.profile and not (args.ranks and args.engine_process):
        ap.error("--profile profiles the engine's process of --ranks runs: give --ranks and --engine-process")
    _quiet()
    print(f"uptime: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"(load average, {os.cpu_count()} cores)")  # fmt: skip
    if args.quick:
        sizes, cap_s, run_s, hang_s, T = [16, 32], args.seconds or 0.2, 2.5, 0.5, 500_000
    else:
        sizes = [32 * 2**i for i in range(12) if 32 * 2**i <= args.max_ranks]
        # 4 s: a 1 s run was mostly start-up at 2,048 ranks (registering 6,144 communicator
        # members), which the job pays once; and two slow windows judged at least in every run
        judged = 2.5 * args.window_s
        cap_s, run_s, hang_s, T = args.seconds or max(4.0, judged), max(8.0, judged), 3.0, 1_000_000
    W = args.window_s
    res: dict = {"capacity": [], "paced": []}
    best: dict[bool, int] = {}
    if args.ranks:
        return _sizes(args.ranks, cap_s, T, args)
    for agents in (False, True):
        for n in sizes:
            shape = Shape(tp=8, pp=min(4, n // 8), dp=max(1, n // 32), hang_timeout_us=T,
                          window_s=args.window_s, pp_every=args.pp_every)  # fmt: skip
            c = _fresh(capacity, shape, agents, cap_s, args.engine_process)
            res["capacity"].append(c)
            ok = c["records_per_s"] >= c["job_records_per_s"]
            mode = "agents" if agents else "raw"
            verdict = "real time" if ok else "falls behind"
            print(f"{mode:>6} {n:>6} ranks: master ingests {c['records_per_s']:>9,} records/s "
                  f"({c['records_per_cpu_s'] or 0:>9,} per CPU s); the job makes "
                  f"{c['job_records_per_s']:>10,}/s: {verdict}", flush=True)  # fmt: skip
            if not ok:
                break
            best[agents] = n
    kept_at: dict[bool, int] = {}
    for agents in (False, True):
        # the largest size whose capacity run kept up, paced; if the paced run falls behind (a
        # capacity just above the job's rate, the sender's sockets and the master on 2 cores),
        # the next size down
        for n in [k for k in sizes if k <= best.get(agents, 0)][::-1]:
            shape = Shape(tp=8, pp=min(4, n // 8), dp=max(1, n // 32), hang_timeout_us=T, window_s=W,
                          pp_every=args.pp_every)  # fmt: skip
            r = _fresh(paced, shape, agents, run_s, hang_s, args.engine_process)
            res["paced"].append(r)
            mode = "agents" if agents else "raw"
            print(f"{mode:>6} {n:>6} ranks paced {run_s:g} s: kept up {r['kept_up']} "
                  f"(drain {r['drain_s']} s, sender late {r['sender_late_s']} s), master RSS "
                  f"{r['master_rss_mib']} MiB (peak {r['master_peak_rss_mib']}), hang diagnosed after "
                  f"{r['hang_latency_s']} s (T = {r['hang_timeout_s']} s)", flush=True)  # fmt: skip
            if r["kept_up"]:
                kept_at[agents] = n
                break
    a = agent_rate(1.0 if not args.quick else 0.5)
    res["agent"] = a
    print(f" agent: {a['records_per_cpu_s']:,} records/s per CPU s (a node of 8 ranks makes "
          f"{a['node_records_per_s']:,}/s)")  # fmt: skip
    raw_caps = [c for c in res["capacity"] if not c["agents"]]
    agent_caps = [c for c in res["capacity"] if c["agents"]]
    kept = {bool(r["agents"]): r for r in res["paced"] if r["kept_up"] or bool(r["agents"]) not in kept_at}
    summary = {
        "records_per_s": max((c["records_per_s"] for c in raw_caps), default=0),
        "records_per_s_agents": max((c["records_per_s"] for c in agent_caps), default=0),
        "ranks_real_time": kept_at.get(False, 0),
        "ranks_real_time_agents": kept_at.get(True, 0),
        "master_rss_mib": max((r["master_peak_rss_mib"] for r in kept.values()), default=None),
        "hang_latency_s": kept.get(True, kept.get(False, {})).get("hang_latency_s"),
        "agent_records_per_cpu_s": a["records_per_cpu_s"],
        "sender_nice": min((c["sender_nice"] for c in res["capacity"]), default=0),
        "window_s": args.window_s,
        "pp_every": args.pp_every,
        "engine_process": args.engine_process,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(summary))
    return 0


def _cores_text(r: dict) -> str:
    if "engine_cores_at_job_rate" not in r:
        return ""
    rcv = r.get("receiver_cores_at_job_rate")
    return (f"; at the job's rate the loop needs {r['loop_cores_at_job_rate']} of a core, the engine's "
            f"process {r['engine_cores_at_job_rate']}"
            + (f", the receiving process {rcv}" if rcv is not None else ""))  # fmt: skip


def _sizes(sizes: list[int], cap_s: float, T: int, args) -> int:
    """--ranks: one capacity run per size through agents (and with --paced a paced one), each in
    a master of its own."""
    out: list[dict] = []
    paced_out: list[dict] = []
    runs = [(n, ops, k, rc, fl) for n in sizes for ops in args.agent_window_ops for k in args.engine_shards
            for rc in args.receivers for fl in args.agent_flush_ms]  # fmt: skip
    for n, ops, k, rc, fl in runs:
        os.environ["C4D_ENGINE_SHARDS"] = str(k)  # (each run's master is spawned: it reads it)
        os.environ["C4D_MASTER_RECEIVER_PROCESS"] = str(rc)
        sh = f", {k} engine shards" if len(args.engine_shards) > 1 or k > 1 else ""
        if rc or len(args.receivers) > 1:
            sh += ", a receiving process" if rc else ", receiving in the loop"
        shape = Shape(tp=8, pp=min(4, max(1, n // 8)), dp=max(1, n // 32), hang_timeout_us=T,
                      window_s=args.window_s, pp_every=args.pp_every, window_ops=ops,
                      flush_ms=fl)  # fmt: skip
        flush_ms = round(_flush_rounds(shape) / shape.rate * 1e3)
        sh += f", flush {flush_ms} ms"
        prof = f"{args.profile}.{n}" if args.profile else None
        c = _fresh(capacity, shape, True, cap_s, args.engine_process, prof)
        c["agent_window_ops"], c["engine_shards"], c["agent_flush_ms"] = ops, k, flush_ms
        out.append(c)
        verdict = "real time" if c["records_per_s"] >= c["job_records_per_s"] else "falls behind"
        print(f"agents (window sample {ops or 'off'}{sh}) {n:>6} ranks, {cap_s:g} s of the job: "
              f"master ingests "
              f"{c['records_per_s']:,} records/s "
              f"({c['records_per_cpu_s'] or 0:,} per CPU s); the job makes {c['job_records_per_s']:,}/s: "
              f"{verdict}; master RSS {c['master_rss_mib']:,.0f} MiB (peak {c['master_peak_rss_mib']:,.0f})"
              f"{_cores_text(c)}", flush=True)  # fmt: skip
        if prof:
            ep = c["engine_profile"]
            print(f"  the engine's process, {ep.get('total_s')} s profiled ({ep['file']}):", flush=True)
            for r in ep.get("cumulative", []):
                print(f"    {r['share']:6.1%} (own {r['own']:5.1%})  {r['fn']}", flush=True)
        for x in args.speed if args.paced else ():
            # the hang 3 s before the end: the windows closed before it are judged while the job
            # goes on (the windows a hang covers are not: docs/engine.md, Stalls)
            fast = replace(shape, rate=shape.rate * x)
            r = _fresh(paced, fast, True, cap_s, max(cap_s / 3, cap_s - 3.0), args.engine_process)
            r["speed"], r["agent_window_ops"], r["engine_shards"], r["agent_flush_ms"] = x, ops, k, flush_ms
            r["receivers"] = rc
            paced_out.append(r)
            print(f"agents (window sample {ops or 'off'}{sh}) {n:>6} ranks paced {cap_s:g} s at {x:g}x "
                  f"the job's rate: kept up {r['kept_up']} "
                  f"(drain {r['drain_s']} s, "
                  f"backlog at most {r['backlog_max_records']:,} records, "
                  f"sender late {r['sender_late_s']} s), "
                  f"master RSS {r['master_rss_mib']:,.0f} MiB, hang diagnosed after {r['hang_latency_s']} s "
                  f"(T = {r['hang_timeout_s']} s){_cores_text(r)}", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"capacity": out, "paced": paced_out, "window_s": args.window_s,
                          "engine_process": args.engine_process, "pp_every": args.pp_every}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
