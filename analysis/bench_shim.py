"""Hot-path cost of libc4d.so: ns per NCCL call with and without the shim, side by side.

    python analysis/bench_shim.py                  # 200000 calls, 5 interleaved repeats
    python analysis/bench_shim.py --calls 1000000 --repeats 9

Runs ``c4d-simtrain --bench N`` (a 1-rank world, N x ncclAllReduce(count=0): simnccl returns
at once, as NCCL does, so what remains is the call itself) plain and with ``LD_PRELOAD``,
the runs interleaved so that machine noise hits every variant alike, and takes medians.
No master: records go to an endpoint nobody listens on (ZeroMQ still takes them, up to
its high-water mark).

Variants with the shim:
  * ``full path``: C4D_QUEUE_CAPACITY and C4D_EVENT_POOL large enough that every call takes
    the complete path: 2 pooled events recorded with cudaEventRecord, op slot, ready ring.
  * ``default config``: the shipped defaults. A tight loop issues calls far faster than any
    real NCCL call returns, so the agent can't keep up and part of the calls take the
    cheaper drop-and-count path (queue full); the table says how many.
(Records that ZeroMQ refuses later, on the agent thread, cost the caller nothing.)
The target is < 1000 ns added per call.

    python analysis/bench_shim.py --baseline OTHER/libc4d.so   # e.g. main's build, side by side

``--baseline`` adds that library's full path as one more interleaved variant, so a change to
the hot path is measured against the previous shim under the same machine noise.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from c4d import native

BENCH = re.compile(r"bench ns_per_call=([0-9.]+)")
SUMMARY = re.compile(r"(\d+) records sent, (\d+) dropped \(queue full (\d+)")


def unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def libzmq() -> str | None:
    import zmq

    found = glob.glob(str(Path(zmq.__file__).resolve().parent.parent / "pyzmq.libs" / "libzmq*.so*"))
    return found[0] if found else None


def run_once(simtrain: Path, calls: int, env: dict[str, str]) -> tuple[float, int]:
    """(ns per call, calls dropped at enqueue) of one bench process."""
    p = subprocess.run(
        [str(simtrain), "--bench", str(calls)], env=env, capture_output=True, text=True, timeout=600
    )
    m = BENCH.search(p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"c4d-simtrain --bench failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    s = SUMMARY.search(p.stderr)
    return float(m[1]), int(s[3]) if s else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000, help="NCCL calls per bench process")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved runs of each variant")
    ap.add_argument("--baseline", type=Path, help="another libc4d.so, measured side by side (full path)")
    args = ap.parse_args(argv)

    simtrain, lib = native.simtrain_path(), native.lib_path()
    base = {k: v for k, v in os.environ.items() if not k.startswith("C4D_") and k != "LD_PRELOAD"}
    shim = dict(base, LD_PRELOAD=str(lib), C4D_MASTER_ADDR=unused_endpoint(), RANK="0", WORLD_SIZE="1")
    if z := libzmq():
        shim["C4D_LIBZMQ"] = z
    pow2 = 1 << max(args.calls, 1).bit_length()
    variants = {
        "without shim": base,
        "shim, full path": dict(shim, C4D_QUEUE_CAPACITY=str(pow2), C4D_EVENT_POOL=str(2 * pow2)),
        "shim, default config": shim,
    }
    if args.baseline:
        full = variants["shim, full path"]
        variants["baseline, full path"] = dict(full, LD_PRELOAD=str(args.baseline))
    ns: dict[str, list[float]] = {k: [] for k in variants}
    dropped: dict[str, list[int]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, env in variants.items():
            t, d = run_once(simtrain, args.calls, env)
            ns[name].append(t)
            dropped[name].append(d)

    plain = statistics.median(ns["without shim"])
    table = Table(title=f"ns per ncclAllReduce(count=0): median of {args.repeats}, {args.calls} calls each")
    for col in ("variant", "ns/call", "added ns", "ratio", "calls on the drop path (median)"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name in variants:
        med = statistics.median(ns[name])
        added = med - plain
        table.add_row(
            name,
            f"{med:.1f}",
            "" if name == "without shim" else f"{added:.1f}",
            f"{med / plain:.1f}x",
            "" if name == "without shim" else f"{statistics.median(dropped[name]):.0f}",
        )
    Console().print(table)
    worst = max(statistics.median(v) for k, v in ns.items() if not k.startswith("baseline")) - plain
    print(f"added per call: {worst:.0f} ns (target < 1000 ns): {'ok' if worst < 1000 else 'OVER'}")
    return 0 if worst < 1000 else 1


if __name__ == "__main__":
    sys.exit(main())
