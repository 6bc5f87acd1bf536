"""Files built to cost an importer far more than their size (issue 41's probes), and a runner that
measures what ``c4d analyze`` spends on one: wall time and peak RSS of the child process.

    python tests/hostile_files.py DIR            # write every probe at the issue's sizes
    python tests/hostile_files.py DIR --measure  # ... and run c4d analyze on each (docs figures)

Each generator takes its size as arguments so the tests can write small versions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INSPECTOR_LINE = {
    "header": {"id": "0x1234abcd", "rank": 0, "n_ranks": 1, "nnodes": 1},
    "metadata": {"inspector_output_format_version": "v4.0", "hostname": "node-0", "pid": 100,
                 "dump_timestamp_us": 1700000000000000},
    "coll_perf": {"coll": "AllReduce", "coll_sn": 1, "coll_msg_size_bytes": 1048576,
                  "coll_exec_time_us": 120, "coll_timing_source": "kernel_gpu",
                  "coll_algobw_gbs": 8.7, "coll_busbw_gbs": 8.7},
}  # fmt: skip


def _entry(i: int = 1, sizes: object = None) -> dict:
    return {
        "record_id": i,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": i,
        "p2p_seq_id": 0,
        "op_id": i,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1_700_000_000_000_000_000 + i * 1000,
        "input_sizes": [[1024, 1024]] if sizes is None else sizes,
        "input_dtypes": ["Float"],
        "output_sizes": [[1024, 1024]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "time_discovered_started_ns": 1_700_000_000_000_000_000 + i * 1000 + 10,
        "time_discovered_completed_ns": 1_700_000_000_000_000_000 + i * 1000 + 500,
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": False,
        "duration_ms": 0.4,
    }


def _dump(entries: list) -> dict:
    return {
        "version": "2.10",
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
        "pg_status": {},
        "entries": entries,
    }


def fr_shared_list(path: str | os.PathLike, entries: int = 200_000, width: int = 200_000) -> Path:
    """``entries`` references to one entry whose input_sizes is one ``width``-element list: the pickle
    is small (the pickler writes each shared object once), the work of reading every entry's sizes
    grows with entries x width."""
    sizes = [[1]] * width
    e = _entry(1, sizes)
    p = Path(path)
    p.write_bytes(pickle.dumps(_dump([e] * entries), protocol=2))
    return p


def fr_many_refs(path: str | os.PathLike, refs: int = 5_000_000) -> Path:
    """``refs`` references to one well-formed entry (the entries list is all the file holds)."""
    p = Path(path)
    p.write_bytes(pickle.dumps(_dump([_entry(1)] * refs), protocol=2))
    return p


def fr_empty_sets(path: str | os.PathLike, n: int = 10_000_000) -> Path:
    """``n`` empty containers, one byte of pickle each (protocol 4 EMPTY_SET + APPENDS): hundreds of
    bytes of memory per byte of file as the unpickler builds them."""
    body = bytearray(b"\x80\x04}\x94(\x8c\x07version\x94\x8c\x042.10\x94\x8c\x07entries\x94]\x94(")
    body += b"\x8f" * n  # EMPTY_SET
    body += b"eu."  # APPENDS, SETITEMS, STOP
    p = Path(path)
    p.write_bytes(bytes(body))
    return p


def inspector_gz_bomb(path: str | os.PathLike, inflated: int = 600 << 20) -> Path:
    """One valid Inspector line repeated until ``inflated`` bytes, gzip'd (about 1000 to 1)."""
    line = (json.dumps(INSPECTOR_LINE) + "\n").encode()
    block = line * max(1, (1 << 20) // len(line))
    p = Path(path)
    with gzip.open(p, "wb", compresslevel=9) as g:
        left = inflated
        while left > 0:
            g.write(block[:left])
            left -= len(block)
    return p


def inspector_long_line(path: str | os.PathLike, line_bytes: int = 200 << 20, good: int = 100) -> Path:
    """``good`` valid Inspector lines around one line of ``line_bytes`` (a JSON string never closed)."""
    p = Path(path)
    good_lines = []
    for i in range(good):
        obj = json.loads(json.dumps(INSPECTOR_LINE))
        obj["coll_perf"]["coll_sn"] = i + 1
        obj["metadata"]["dump_timestamp_us"] += i * 1000
        good_lines.append(json.dumps(obj) + "\n")
    with open(p, "w") as f:
        f.writelines(good_lines[: good // 2])
        f.write('{"header": "')
        chunk = "x" * (1 << 20)
        left = line_bytes
        while left > 0:
            f.write(chunk[:left])
            left -= len(chunk)
        f.write("\n")
        f.writelines(good_lines[good // 2 :])
    return p


NCCL_TESTS_HEAD = """# nccl-tests version 2.13.9 nccl-headers=22105 nccl-library=22105
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1234 on     node-0 device  0 [0000:04:00] NVIDIA H100
#  Rank  1 Group  0 Pid   1235 on     node-0 device  1 [0000:05:00] NVIDIA H100
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""  # noqa: E501
NCCL_TESTS_ROW = "     1048576        262144     float     sum      -1    52.11   20.12   20.12      0    51.90   20.20   20.20      0\n"  # noqa: E501


def nccl_tests_text(
    path: str | os.PathLike, size: int = 500 << 20, rows: bool = True, tail_rows: int = 0
) -> Path:
    """A run's preamble, then table rows (``rows``) or NCCL INFO noise up to ``size`` bytes, then
    ``tail_rows`` table rows (what a well-formed reader must keep) and the trailer."""
    p = Path(path)
    filler = NCCL_TESTS_ROW if rows else "node-0:1234:1234 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7\n"
    block = filler * max(1, (1 << 20) // len(filler))
    with open(p, "w") as f:
        f.write(NCCL_TESTS_HEAD)
        left = size
        while left > 0:  # whole lines only
            f.write(block if left >= len(block) else filler * max(1, left // len(filler)))
            left -= len(block)
        f.write(NCCL_TESTS_ROW * tail_rows)
        f.write("\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 20.16\n")
    return p


PROBES = {
    "fr-shared-list/nccl_trace_rank_0": fr_shared_list,
    "fr-many-refs/nccl_trace_rank_0": fr_many_refs,
    "fr-empty-sets/nccl_trace_rank_0": fr_empty_sets,
    "inspector-bomb.log.gz": inspector_gz_bomb,
    "inspector-long-line.log": inspector_long_line,
    "nccl-tests-rows.txt": nccl_tests_text,
    "nccl-tests-noise.txt": lambda p: nccl_tests_text(p, rows=False),
}


# run c4d from another checkout: past the editable install's finder, which would pick this one
_BOOT = (
    "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in type(f).__name__ "
    "and 'Redirecting' not in type(f).__name__]; sys.path.insert(0, {src!r}); "
    "runpy.run_module('c4d', run_name='__main__')"
)


def _vm_hwm_kib(pid: int) -> int:
    """A live process's peak resident memory (KiB), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(path: str | os.PathLike, *args: str, timeout: float = 900.0) -> dict:
    """Run ``c4d analyze PATH --json ARGS`` in a child: exit status, wall seconds, the child's own
    peak RSS (MiB, its VmHWM sampled every 20 ms until it exits) and its stderr lines."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        src = os.environ.get("C4D_SRC")  # another checkout (the figures before a change)
        boot = ["-m", "c4d"] if not src else ["-c", _BOOT.format(src=src)]
        proc = subprocess.Popen(
            [sys.executable, *boot, "analyze", str(path), "--json", *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=src or ROOT,
        )
        hwm_kib = 0  # the child's own peak (VmHWM): wait4's ru_maxrss starts from this process's
        # size at fork (Linux keeps the larger of the old and new memory's peak across exec)
        while True:
            hwm_kib = max(hwm_kib, _vm_hwm_kib(proc.pid))
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                proc.kill()
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return {
        "rc": proc.returncode,
        "wall_s": round(wall, 2),
        "peak_rss_mib": round((hwm_kib or ru.ru_maxrss) / 1024),
        "stderr": lines,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    d = Path(args.dir)
    for name, gen in PROBES.items():
        if args.only and not any(o in name for o in args.only):
            continue
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            gen(p)
        target = p.parent if name.startswith("fr-") else p
        size = p.stat().st_size
        line = {"probe": name, "file_mib": round(size / 2**20, 2)}
        if args.measure:
            line.update(measure(target))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
