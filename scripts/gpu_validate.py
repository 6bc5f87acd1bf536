"""The checks behind scripts/gpu-validate (run that, not this): worker processes with and
without libc4d.so preloaded, their records collected here, one JSON summary line last.

Every worker (scripts/gpu_validate_worker.py) is a world-size-1 NCCL loop. The shim's records
arrive at an in-process collector (a ZeroMQ PULL socket decoded with c4d.record.wire, what
`c4d master` does), one worker at a time. Checks (docs/gpu-validation.md says what each
proves):

  records      every NCCL call of a preloaded eager worker arrived as an OP record, result 0
  times        eager ops carry device times; issue <= start <= end; wait and transfer medians
               fit inside the measured step
  overhead     per-step time with the shim vs without, interleaved pairs; the median ratio
  graph        the step captured in a CUDA graph (global mode) and replayed, with the shim
               (the same without it is the control)
  nonblocking  non-blocking communicators: the loop runs, no extra NCCL warnings, transfer
               times like the blocking run's
  contexts     the preloaded process holds a primary context on its own device only
               (CUDA driver API; nvidia-smi's compute-apps view beside it; simnccl: the
               devices it says got a context)

Exit status: 0 every check passed (or was skipped with a reason), 2 a check failed, 1 the
validation itself could not run.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import zmq

from c4d.record import schema, wire

HERE = Path(__file__).resolve().parent
SIM_DEVICES = 2  # --sim: simnccl shows this many devices; the loop uses the last, as on a GPU machine
OPS = ("AllReduce", "AllGather", "ReduceScatter", "Send", "Recv")


def log(msg: str) -> None:
    print(f"gpu-validate: {msg}", file=sys.stderr, flush=True)


class Collector:
    """A ZeroMQ PULL socket on loopback, drained by a thread into decoded record chunks."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._chunks: list[np.ndarray] = []
        self.bad: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(20):
                continue
            msg = self.sock.recv()
            try:
                recs = wire.decode(msg)
            except wire.BadBatch as e:
                self.bad.append(str(e))
                continue
            with self._lock:
                self._chunks.append(recs.copy())

    def take(self) -> dict[schema.Kind, np.ndarray]:
        """Everything received since the last take."""
        with self._lock:
            raw = np.concatenate(self._chunks) if self._chunks else np.empty(0, schema.HEADER)
            self._chunks = []
        return schema.by_kind(raw)

    def wait_final(self, pid: int, timeout: float) -> None:
        """Until `pid`'s FINAL heartbeat is in (it exited: its last batches are on the way).
        A pid that never registered gets a second, not `timeout`: nothing is coming."""
        t0 = time.monotonic()
        while True:
            with self._lock:
                raw = np.concatenate(self._chunks) if self._chunks else np.empty(0, schema.HEADER)
            recs = schema.by_kind(raw)
            reg, hb = recs[schema.Kind.REGISTER], recs[schema.Kind.HEARTBEAT]
            ranks = set(reg["rank"][reg["pid"] == pid].tolist())
            final = set(hb["rank"][(hb["hb_flags"] & schema.HBF_FINAL) != 0].tolist())
            waited = time.monotonic() - t0
            if (ranks and ranks <= final) or waited > (timeout if ranks else 1.0):
                return
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)
        self.ctx.term()


def pyzmq_libzmq() -> str:
    """The libzmq inside pyzmq's wheel (what an installed c4d finds beside itself)."""
    root = Path(zmq.__file__).resolve().parent.parent
    found = sorted(glob.glob(str(root / "pyzmq.libs" / "libzmq*.so*")))
    return found[0] if found else ""


class Runner:
    """Starts workers one at a time and pairs each preloaded one with its records."""

    def __init__(self, a: argparse.Namespace, collector: Collector, tmp: Path) -> None:
        self.a, self.collector, self.tmp = a, collector, tmp
        self.lib = str(Path(a.native_dir) / "libc4d.so")
        self.deadline = time.monotonic() + a.budget

    def run(self, mode: str, preload: bool, **env_extra: str) -> dict[str, Any]:
        a = self.a
        if time.monotonic() > self.deadline:  # a worker hung before: the summary still comes in time
            log(f"{mode:11s} {'c4d' if preload else 'plain':5s} not run: the time budget is spent")
            skipped = "not run: the time budget was spent"
            return {"ok": False, "error": skipped, "skipped": skipped, "mode": mode, "preload": preload}
        env = {k: v for k, v in os.environ.items() if not k.startswith("C4D_") and k != "LD_PRELOAD"}
        env.update(NCCL_DEBUG="WARN", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", **env_extra)
        job = f"gpuval-{uuid.uuid4().hex[:8]}"
        env["SIMNCCL_JOB"] = job
        dump = self.tmp / f"{job}.contexts"
        if a.sim:  # simnccl writes, at exit, the devices that got a context (when it can)
            env.update(SIMNCCL_NUM_DEVICES=str(SIM_DEVICES), SIMNCCL_CONTEXT_DUMP=str(dump))
        if preload:
            env.update(
                LD_PRELOAD=self.lib,
                C4D_MASTER_ADDR=self.collector.endpoint,
                C4D_LIBZMQ=pyzmq_libzmq(),
                C4D_HEARTBEAT_MS="200",
                NCCL_PROFILER_PLUGIN="STATIC_PLUGIN",  # the documented setup: per-peer progress
            )
        cmd = [sys.executable, str(HERE / "gpu_validate_worker.py"), "--backend", "sim" if a.sim else "torch"]
        cmd += [
            "--mode",
            mode,
            "--steps",
            str(a.steps),
            "--repeats",
            str(a.repeats),
            "--warmup",
            str(a.warmup),
        ]
        cmd += ["--bytes", str(a.bytes), "--compute", str(a.compute), "--device", str(a.device)]
        cmd += ["--store", str(self.tmp / f"{job}.store"), "--capture-hold-ms", str(a.capture_hold_ms)]
        if a.sim:
            cmd += ["--sim-dir", str(Path(a.native_dir) / "simnccl")]
        self.collector.take()  # nothing of an earlier worker counts for this one
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.worker_timeout)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = (
                -9,
                _text(e.stdout),
                _text(e.stderr) + f"\n(killed after {a.worker_timeout} s)",
            )
        finally:
            for f in glob.glob(f"/dev/shm/simnccl-{job}*"):
                os.unlink(f)
        lines = stdout.strip().splitlines()
        try:
            out = json.loads(lines[-1])
        except (IndexError, ValueError):
            out = {"ok": False, "error": f"worker exited {rc} without its JSON line", "pid": -1}
        out.update(rc=rc, wall_s=round(time.monotonic() - t0, 1), preload=preload)
        if a.sim and out.get("ok") and not out.get("skipped"):
            words = dump.read_text().split() if dump.is_file() else []
            out["contexts"] = [int(d) for d in words[1:]] if words[:1] == ["contexts"] else None
        out["nccl_warnings"] = sum(line.count("NCCL WARN") for line in (stdout + stderr).splitlines())
        out["stderr_tail"] = stderr[-1500:]
        out["c4d_lines"] = [line for line in stderr.splitlines() if line.startswith("c4d: ")][-5:]
        if preload and out.get("pid", -1) > 0:
            self.collector.wait_final(out["pid"], 10)
            out["records"] = self.collector.take()
        state = "ok" if out.get("ok") else f"FAILED: {out.get('error')}"
        log(f"{mode:11s} {'c4d' if preload else 'plain':5s} {out['wall_s']:6.1f} s  {state}")
        return out


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


# ---------------------------------------------------------------------- checks


def op_stats(w: dict[str, Any]) -> dict[str, Any]:
    """What a preloaded worker's OP records say, against the calls it made."""
    recs = w.get("records")
    if recs is None:
        return {"ok": False, "reason": "no records (the worker did not run with the shim)"}
    ops, reg = recs[schema.Kind.OP], recs[schema.Kind.REGISTER]
    calls = w.get("calls") or {}
    got = {n: int(np.count_nonzero(ops["op"] == schema.Op[n])) for n in OPS}
    timed = ops[(ops["flags"] & schema.OpFlag.DEVICE_TIMING) != 0]
    wait = (timed["start_ns"].astype(np.int64) - timed["issue_ns"].astype(np.int64)) / 1e3
    xfer = (timed["end_ns"].astype(np.int64) - timed["start_ns"].astype(np.int64)) / 1e3
    med = {}
    for n in OPS:
        sel = timed["op"] == schema.Op[n]
        if sel.any():
            med[n] = {
                "wait_us": round(float(np.median(wait[sel])), 1),
                "transfer_us": round(float(np.median(xfer[sel])), 1),
            }
    ordered = bool(((wait >= 0) & (xfer >= 0) & (xfer < 10e6) & (wait < 60e6)).all())
    return {
        "registered": len(reg),
        "register_device": sorted(set(reg["cuda_device"].tolist())),
        "calls": calls,
        "records": got,
        "all_arrived": bool(calls) and all(got[n] >= calls.get(n, 0) for n in OPS),
        "failed_results": int(np.count_nonzero(ops["result"] != 0)),
        "untimed": int(len(ops) - len(timed)),
        "ordered": ordered,
        "median": med,
        "profiler_plugin": any("profiler:" in line for line in w.get("c4d_lines", [])),
    }


def check_records(workers: list[dict[str, Any]]) -> dict[str, Any]:
    st = [op_stats(w) for w in workers]
    ok = bool(st) and all(
        w.get("ok") and s.get("registered", 0) >= 1 and s["all_arrived"] and s["failed_results"] == 0
        for w, s in zip(workers, st, strict=True)
    )
    return {"ok": ok, "runs": len(st), "first": st[0] if st else None}


def check_times(workers: list[dict[str, Any]], device: int, sim: bool) -> dict[str, Any]:
    """Eager runs: every op device-timed, ordered, and the per-op medians add up to no more
    than the measured step."""
    out: dict[str, Any] = {"ok": True, "runs": []}
    for w in workers:
        s = op_stats(w)
        fit = step_fit(w.get("records"))
        ar = s.get("median", {}).get("AllReduce", {}).get("transfer_us", 0)
        run_ok = (
            bool(w.get("ok"))
            and s.get("untimed") == 0
            and s.get("ordered", False)
            and ar > 0
            and fits(fit)
            and (sim or s.get("register_device") == [device])
        )
        out["runs"].append({**fit, "median": s.get("median")})
        out["ok"] = out["ok"] and run_ok
    out["ok"] = out["ok"] and bool(workers)
    return out


def check_overhead(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    ratios = [
        c["step_ms"] / p["step_ms"]
        for p, c in pairs
        if p.get("ok") and c.get("ok") and p.get("step_ms") and c.get("step_ms")
    ]
    if len(ratios) != len(pairs) or not ratios:
        return {"ok": False, "reason": "a timed run failed"}
    return {
        "ok": True,
        "overhead_pct": round((statistics.median(ratios) - 1) * 100, 2),
        "pairs": len(ratios),
        "step_ms_plain": round(statistics.median(p["step_ms"] for p, _ in pairs), 4),
        "step_ms_c4d": round(statistics.median(c["step_ms"] for _, c in pairs), 4),
        "ratios": [round(r, 4) for r in ratios],
    }


def check_graph(plain: dict[str, Any], c4d: dict[str, Any]) -> dict[str, Any]:
    if plain.get("skipped") or c4d.get("skipped"):
        return {"ok": None, "reason": plain.get("skipped") or c4d.get("skipped")}
    if not plain.get("ok"):
        return {"ok": None, "reason": f"the control without c4d failed too: {plain.get('error')}"}
    s = op_stats(c4d)
    return {
        "ok": bool(c4d.get("ok")) and s.get("failed_results") == 0,
        "error": c4d.get("error"),
        "replays": c4d.get("replays"),
        "step_ms": {"plain": plain.get("step_ms"), "c4d": c4d.get("step_ms")},
        "records": s.get("records"),
        "untimed_ops": s.get("untimed"),
    }


def step_fit(records: dict[Any, np.ndarray] | None) -> dict[str, float | None]:
    """The run's transfers (a group's ops share its events: one span) against the run's span
    (the first op's issue to the last op's end), each per step: the same ops on both sides, so
    a load burst stretches both (the worker's timed step holds fewer ops than the records)."""
    none: dict[str, float | None] = {"busy_us": None, "step_us": None, "fit": None}
    if not records:
        return none
    ops = records[schema.Kind.OP]
    t = ops[(ops["flags"] & schema.OpFlag.DEVICE_TIMING) != 0]
    steps = int(np.count_nonzero(t["op"] == schema.Op.AllReduce))
    if not steps:
        return none
    grouped = (t["flags"] & schema.OpFlag.IN_GROUP) != 0
    span = (t["end_ns"].astype(np.int64) - t["start_ns"].astype(np.int64)) / 1e3
    shared = {(int(x), int(y)) for x, y in zip(t["start_ns"][grouped], t["end_ns"][grouped], strict=True)}
    busy = (float(span[~grouped].sum()) + sum(y - x for x, y in shared) / 1e3) / steps
    step = (int(t["end_ns"].max()) - int(t["issue_ns"].min())) / 1e3 / steps
    return {
        "busy_us": round(busy, 1),
        "step_us": round(step, 1),
        "fit": round((busy - 50) / step, 3) if step > 0 else None,
    }


def fits(fit: dict[str, float | None]) -> bool:
    """A step's transfers fit inside it (1.2: the events' own latency; 50 µs of slack)."""
    return fit["fit"] is not None and fit["fit"] <= 1.2


def check_nonblocking(
    plain: dict[str, Any], c4d: dict[str, Any], blocking_c4d: dict[str, Any]
) -> dict[str, Any]:
    """The non-blocking run against the control without the shim and against the blocking
    runs: ops timed once really launched (not closed at the return: near-zero transfer times),
    times that fit inside the step, no extra NCCL warnings."""
    if plain.get("skipped") or c4d.get("skipped"):
        return {"ok": None, "reason": plain.get("skipped") or c4d.get("skipped")}
    if not plain.get("ok"):
        return {"ok": None, "reason": f"the control without c4d failed too: {plain.get('error')}"}
    s, b = op_stats(c4d), op_stats(blocking_c4d)
    nb = s.get("median", {}).get("AllReduce", {}).get("transfer_us", 0)
    bl = b.get("median", {}).get("AllReduce", {}).get("transfer_us", 0)
    ratio = nb / bl if bl else None
    fit = step_fit(c4d.get("records"))
    ok = (
        bool(c4d.get("ok"))
        and s.get("all_arrived", False)
        and s.get("failed_results") == 0
        and s.get("untimed") == 0
        and s.get("ordered", False)
        and c4d["nccl_warnings"] <= plain["nccl_warnings"]
        and ratio is not None
        and ratio >= 0.25
        and fits(fit)
    )
    return {
        "ok": ok,
        "error": c4d.get("error"),
        "nccl_warnings": {"plain": plain["nccl_warnings"], "c4d": c4d["nccl_warnings"]},
        "allreduce_transfer_us": {"nonblocking": nb, "blocking": bl},
        **fit,
        "records": s.get("records"),
    }


def check_contexts(workers: list[dict[str, Any]], device: int, sim: bool) -> dict[str, Any]:
    seen = [w.get("contexts") for w in workers if w.get("ok") and not w.get("skipped")]
    if sim:
        if not seen or any(c is None for c in seen):
            return {"ok": None, "reason": "this simnccl does not report which devices got a context"}
        return {"ok": all(c == [device] for c in seen), "device": device, "contexts": seen}
    smi = [w.get("smi") or {} for w in workers if w.get("ok")]
    if not seen or any(c is None for c in seen):
        return {"ok": False, "reason": "could not read the primary context state (libcuda.so.1)"}
    ok = all(c == [device] for c in seen)
    smi_devs = [s.get("devices") for s in smi]
    smi_ok = None if any(d is None for d in smi_devs) else all(d == [device] for d in smi_devs)
    return {
        "ok": ok and smi_ok is not False,
        "device": device,
        "primary_contexts": seen[0] if len(set(map(tuple, seen))) == 1 else seen,
        "nvidia_smi": {
            "ok": smi_ok,
            "devices": smi_devs[0] if smi_devs else None,
            "reason": (smi[0] or {}).get("reason"),
        },
    }


# ------------------------------------------------------------------------ main


def facts(a: argparse.Namespace) -> dict[str, Any]:
    def cmd(*c: str) -> str:
        try:
            return subprocess.run(c, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "rev": cmd("git", "-C", str(HERE.parent), "rev-parse", "--short=8", "HEAD") or "unknown",
        "gpus": []
        if a.sim
        else cmd("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader").splitlines(),
    }


def pick_device(a: argparse.Namespace) -> int:
    """The last GPU: a stray context on GPU 0 then shows (one GPU: there is nothing else to see)."""
    if a.device is not None:
        return a.device
    if a.sim:
        return SIM_DEVICES - 1
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    return max(0, sum(1 for line in out.splitlines() if line.startswith("GPU ")) - 1)


def validate(a: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    a.device = pick_device(a)
    summary: dict[str, Any] = {"c4d_gpu_validate": 1, "mode": "sim" if a.sim else "gpu", **facts(a)}
    collector = Collector()
    try:
        with tempfile.TemporaryDirectory(prefix="c4d-gpu-validate-") as tmp:
            r = Runner(a, collector, Path(tmp))
            pairs = []
            for i in range(a.pairs):  # interleaved, order alternating: drift cancels out
                first, second = (False, True) if i % 2 == 0 else (True, False)
                x, y = r.run("plain", first), r.run("plain", second)
                pairs.append((x, y) if not first else (y, x))
            c4d_runs = [c for _, c in pairs]
            graph = (r.run("graph", False), r.run("graph", True))
            nb_env = {} if a.sim else {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"}
            nonblocking = (r.run("nonblocking", False, **nb_env), r.run("nonblocking", True, **nb_env))
    finally:
        collector.close()
    ref = c4d_runs[0] if c4d_runs else {}
    summary.update(
        device=ref.get("device_name"),
        device_index=a.device,
        nccl_version=ref.get("nccl_version"),
        torch=ref.get("torch"),
    )
    checks = {
        "records": check_records(c4d_runs),  # graph/nonblocking runs: their own checks below
        "times": check_times(c4d_runs, a.device, a.sim),
        "overhead": check_overhead(pairs),
        "graph": check_graph(*graph),
        "nonblocking": check_nonblocking(nonblocking[0], nonblocking[1], ref),
        "contexts": check_contexts([*c4d_runs, graph[1], nonblocking[1]], a.device, a.sim),
    }
    failed_workers = [w for w in [*(x for p in pairs for x in p), *graph, *nonblocking] if not w.get("ok")]
    summary.update(
        ok=all(c["ok"] is not False for c in checks.values())
        and checks["records"]["ok"]
        and checks["times"]["ok"],
        overhead_pct=checks["overhead"].get("overhead_pct"),
        checks=checks,
        errors=[
            {
                "mode": w.get("mode"),
                "preload": w.get("preload"),
                "error": w.get("error"),
                "stderr": w.get("stderr_tail", "")[-600:],
            }
            for w in failed_workers
        ],
        seconds=round(time.monotonic() - t0, 1),
    )
    if collector.bad:
        summary["bad_batches"] = collector.bad[:5]
        summary["ok"] = False
    return summary


class Parser(argparse.ArgumentParser):
    """Usage errors: one line on stderr, the JSON line, exit status 1 (argparse's default is 2,
    which c4d's commands keep for "found a problem")."""

    def error(self, message: str) -> NoReturn:
        log(f"{message} (scripts/gpu-validate --help)")
        print(json.dumps({"c4d_gpu_validate": 1, "ok": False, "error": message}), flush=True)
        sys.exit(1)


def main() -> int:
    p = Parser(description="scripts/gpu-validate's checks (run that script, not this).")
    p.add_argument("--native-dir", required=True, help="folder with libc4d.so (and simnccl/ with --sim)")
    p.add_argument("--sim", action="store_true", help="simnccl stands in for the GPU, NCCL and PyTorch")
    p.add_argument("--pairs", type=int, default=None, help="interleaved plain/c4d pairs for the overhead")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per run (median)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--bytes", type=int, default=None, help="bytes per collective buffer")
    p.add_argument("--compute", type=int, default=None, help="torch: matmul size per step; sim: µs")
    p.add_argument("--device", type=int, default=None, help="GPU index (default: the last one)")
    p.add_argument("--capture-hold-ms", type=int, default=1500, help="graph: how long the capture stays open")
    p.add_argument("--worker-timeout", type=int, default=120, help="seconds one worker may run")
    p.add_argument("--budget", type=int, default=420, help="seconds after which no worker starts")
    a = p.parse_args()
    a.pairs = a.pairs or (3 if a.sim else 5)
    a.steps = a.steps or (40 if a.sim else 1000)
    a.repeats = a.repeats or (5 if a.sim else 20)
    a.bytes = a.bytes or ((1 << 16) if a.sim else (16 << 20))
    a.compute = (200 if a.sim else 4096) if a.compute is None else a.compute
    try:
        summary = validate(a)
    except Exception as e:  # one JSON line, whatever happened
        print(
            json.dumps({"c4d_gpu_validate": 1, "ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True
        )
        return 1
    print(json.dumps(summary, default=str), flush=True)
    return 0 if summary["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
