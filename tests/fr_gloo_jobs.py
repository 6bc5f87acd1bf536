"""Real PyTorch Flight Recorder dumps from small gloo jobs on CPU, one directory per case.

    python tests/fr_gloo_jobs.py tests/data/fr_gloo          # remake every fixture (a few minutes)
    python tests/fr_gloo_jobs.py OUT --case type --mode pending

Each case is a torch.distributed job (gloo, 4 or 8 processes forked from this one, a FileStore
rendezvous) with ``TORCH_FR_BUFFER_SIZE`` set, so torch records every collective; each rank
writes ``torch._C._distributed_c10d._dump_fr_trace()`` (the pickle ``fr_trace`` reads) to
``OUT/<case>-<mode>/rank_<r>``. Two modes:

* ``pending``: the collective that cannot complete is issued with ``async_op=True`` and every
  rank dumps a second later, while it is still outstanding (as NCCL's watchdog dumps a stuck job);
* ``retired``: the job runs with a 2 s process-group timeout; gloo raises, the job catches the
  error and dumps (torch then marks every entry ``retired``, as on any dump written after the
  error was handled).

Ranks wait for each other's dumps (marker files) before they exit, so no rank's exit breaks a
peer's pending op before that peer has dumped. ``MANIFEST.json`` in OUT says, per case, the
world size, the process groups (name -> ranks, as ``new_group`` numbered them) and the fault
injected, so tests can check findings and rewrite ``pg_config`` for torch's own analyzer.

Cases (the fault is always in the last step):

* ``type``: rank 3 calls ``broadcast`` where ranks 0-2 call ``all_reduce`` (same group, same seq);
* ``size``: rank 3's all_reduce has 32 elements, the others' 16;
* ``dtype``: rank 3's all_reduce is float64, the others' float32;
* ``skip``: 8 ranks, tp=2 x dp=4 (tp groups of consecutive ranks, dp groups of stride 2); each
  step a tp all_reduce then a dp all_reduce; rank 6 never enters its last tp all_reduce and goes
  on to the dp one. Rank 7 waits for it in tp; ranks 1, 3, 5 wait for rank 7 in dp;
* ``lost``: rank 2 stops before the last all_reduce and never dumps (pending: it stays alive and
  silent; retired: the process exits, so gloo's peers get an error at once);
* ``slow``: each step rank 1 computes 30x longer (60 ms against 2 ms) before its all_reduce;
  pending: the dump is taken while rank 1 computes before the last one; retired: the job ends
  normally (every op done).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

CASES = ("type", "size", "dtype", "skip", "lost", "slow")
MODES = ("pending", "retired")
WORLD = {"skip": 8}
FAULT = {
    "type": {"rank": 3, "what": "op", "values": {"3": "broadcast", "others": "all_reduce"}},
    "size": {"rank": 3, "what": "count", "values": {"3": 32, "others": 16}},
    "dtype": {"rank": 3, "what": "dtype", "values": {"3": "Double", "others": "Float"}},
    "skip": {"rank": 6, "what": "skip", "group": "tp"},
    "lost": {"rank": 2, "what": "lost"},
    "slow": {"rank": 1, "what": "slow", "factor": 30},
}
STEPS = 3
SLOW_STEPS = 10


def _wait_all(done_dir: Path, world: int, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while len(list(done_dir.iterdir())) < world and time.monotonic() < end:
        time.sleep(0.02)


def _job(rank: int, world: int, case: str, mode: str, out: str, store: str, done: str) -> None:
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=2 if mode == "retired" else 120)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timeout
    )
    pending = mode == "pending"
    t = torch.ones(16)
    groups = {}
    if case == "skip":  # every rank creates every group, in the same order
        for b in range(world // 2):
            g = dist.new_group([2 * b, 2 * b + 1], timeout=timeout)
            if rank in (2 * b, 2 * b + 1):
                groups["tp"] = g
        for s in range(2):
            g = dist.new_group(list(range(s, world, 2)), timeout=timeout)
            if rank % 2 == s:
                groups["dp"] = g
    culprit = FAULT[case]["rank"]
    steps = SLOW_STEPS if case == "slow" else STEPS
    works = []
    late = False
    try:
        for step in range(steps):
            last = step == steps - 1
            if case == "skip":
                if not (last and rank == culprit):
                    works.append(dist.all_reduce(t, group=groups["tp"], async_op=pending and last))
                works.append(dist.all_reduce(t, group=groups["dp"], async_op=pending and last))
                continue
            if case == "slow":
                time.sleep(0.06 if rank == culprit else 0.002)
                if last and pending and rank == culprit:
                    time.sleep(3.0)  # still computing when the others dump
                    break
            if case == "lost" and last and rank == culprit:
                if mode == "retired":
                    os._exit(1)  # dies: no dump; gloo's peers see the connection close
                _wait_all(Path(done), world - 1)  # alive and silent until the others have dumped
                os._exit(0)
            x = t
            if last and rank == culprit and case in ("size", "dtype"):
                # gloo aborts a receiver whose peer sends more bytes than it expects: issue after
                # the others have dumped, so every rank's dump holds the disagreeing entries
                _wait_all(Path(done), world - 1)
                x = torch.ones(32) if case == "size" else torch.ones(16, dtype=torch.float64)
                late = True  # pending: dump at once; retired: after its own timeout
            if last and rank == culprit and case == "type":
                works.append(dist.broadcast(x, src=0, async_op=pending))
            else:
                works.append(dist.all_reduce(x, async_op=pending and last))
    except RuntimeError as e:  # the timeout (or a peer gone): handled, then dumped
        print(f"{case}-{mode} rank {rank}: {str(e).splitlines()[0][:90]}", file=sys.stderr)
    if pending and not late:
        time.sleep(1.0)
    Path(out, f"rank_{rank}").write_bytes(torch._C._distributed_c10d._dump_fr_trace())
    Path(done, str(rank)).touch()
    _wait_all(Path(done), world - (1 if case == "lost" else 0))
    os._exit(0)  # a pending op would block a clean shutdown


def _groups(case: str, world: int) -> dict[str, list[int]]:
    """Process-group names as torch numbers them (the default group "0", then new_group order)."""
    out = {"0": list(range(world))}
    if case == "skip":
        blocks = [[2 * b, 2 * b + 1] for b in range(world // 2)] + [
            list(range(s, world, 2)) for s in range(2)
        ]
        for i, ranks in enumerate(blocks, start=1):
            out[str(i)] = ranks
    return out


def make(out: Path, case: str, mode: str) -> Path:
    import torch.multiprocessing as mp

    world = WORLD.get(case, 4)
    d = out / f"{case}-{mode}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        done = Path(tmp, "done")
        done.mkdir()
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
        ctx = mp.start_processes(
            _job,
            args=(world, case, mode, str(d), str(Path(tmp, "store")), str(done)),
            nprocs=world,
            join=False,
            start_method="fork",
        )
        end = time.monotonic() + 120
        for p in ctx.processes:  # one by one: a rank that dies (case lost, gloo's abort) ends
            p.join(max(0.0, end - time.monotonic()))  # no other rank early, as ctx.join would
            if p.is_alive():
                p.kill()
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--case", choices=CASES, action="append")
    ap.add_argument("--mode", choices=MODES, action="append")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    man_path = a.out / "MANIFEST.json"
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {}
    import torch

    for case in a.case or CASES:
        for mode in a.mode or MODES:
            t0 = time.monotonic()
            d = make(a.out, case, mode)
            world = WORLD.get(case, 4)
            manifest[d.name] = {
                "case": case,
                "mode": mode,
                "world": world,
                "groups": _groups(case, world),
                "fault": FAULT[case],
                "torch": torch.__version__,
            }
            print(f"{d}: {len(list(d.iterdir()))} dumps in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    man_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
