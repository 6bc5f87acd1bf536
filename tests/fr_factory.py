"""Write PyTorch Flight Recorder dumps with the field layout torch 2.13 documents.

No GPU and no torch needed: this builds the dict that ``FlightRecorder::dump()`` pickles
(top-level ``version``, ``comm_lib_version``, ``pg_config``, ``pg_status``, ``entries``; each entry
with the keys of ``getCollectiveTrace``, see docs/design.md) for a
synthetic job, and writes one pickle per rank named ``<prefix><rank>`` as ``DebugInfoWriter`` does.

The job: ``world = tp * dp`` ranks (``dp`` even). Process groups, named by a global counter as
``new_group`` does: ``"0"`` (default_pg, every rank), one ``tp`` group per block of ``tp``
consecutive ranks, one ``dp`` group per stride-``tp`` set, and one two-rank ``pp`` group per pair
``(r, r + tp)`` with ``r // tp`` even (pipeline stage to stage, p2p only). Each step on each rank
issues, in program order::

    tp all_gather, tp _reduce_scatter_base, pp send (lower rank) or recv (upper), dp all_reduce,
    world all_reduce

so five entries per step (``Job.step_ops`` replaces that program). A ``Hang`` freezes the job at
one op of the last step:

* ``missing``: those ranks never issue it (they stopped before it; all their ops completed) while
  every other rank issued it and is waiting in it — a non-communication hang;
* no ``missing``: every rank issued and entered it, none completed — a communication hang.

A ``Skip`` makes one rank leave out one op of the last step (a program-order bug). Who then
completes what is simulated: an op completes once every member of its group has reached it
(same group, same sequence number); a rank stops at the first op that cannot complete, which
is pending in its dump, and issues nothing after it.

``timing=True`` mimics ``TORCH_NCCL_ENABLE_TIMING=1`` (start times, ``state`` "started",
``duration_ms``); ``timing=False`` leaves start times None and pending ops "scheduled".
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

FR_VERSION = "2.10"
STEP_OPS = ("all_gather", "_reduce_scatter_base", "p2p", "all_reduce", "all_reduce")
STEP_GROUP = ("tp", "tp", "pp", "dp", "world")
_DTYPE = "BFloat16"
_FRAME_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py", "train.py")


@dataclass
class Hang:
    """Freeze the job at op ``op_index`` (0..4, see STEP_OPS) of the last step."""

    op_index: int = 4
    missing: tuple[int, ...] = ()


@dataclass
class Skip:
    """Rank ``rank`` leaves out op ``op_index`` of the last step and goes on with the next."""

    rank: int
    op_index: int


@dataclass
class Job:
    tp: int = 2
    dp: int = 4
    steps: int = 10
    hang: Hang | None = None
    skip: Skip | None = None
    step_ops: tuple[tuple[str, str], ...] = tuple(zip(STEP_OPS, STEP_GROUP, strict=True))
    """(op, group) per op of a step; op "p2p" is the pipeline send/recv."""
    timing: bool = True
    frames: int = 0  # stack frames per entry (real timeout dumps carry them)
    t0_ns: int = 1_732_270_000_000_000_000
    step_ns: int = 120_000_000
    buffer: int = 2000  # TORCH_FR_BUFFER_SIZE: entries kept per rank (oldest dropped)
    elem: tuple[int, ...] = (1024, 1024)
    tensors: int = 1  # tensors per entry (a list of ``tensors`` shapes in input_sizes/output_sizes)
    timeout_ms: int = 600_000
    used_groups_only: bool = False  # pg_config lists only the groups step_ops uses (one world group)

    @property
    def world(self) -> int:
        return self.tp * self.dp


def groups(job: Job) -> tuple[dict[str, list[int]], dict[str, str], dict[int, dict[str, str]]]:
    """pg name -> sorted global ranks; pg name -> desc; rank -> {tp|dp|pp|world -> pg name}."""
    if job.dp % 2:
        raise ValueError("dp must be even (pipeline pairs)")
    members: dict[str, list[int]] = {"0": list(range(job.world))}
    desc: dict[str, str] = {"0": "default_pg"}
    of_rank: dict[int, dict[str, str]] = {r: {"world": "0"} for r in range(job.world)}

    def add(kind: str, ranks: list[int]) -> None:
        name = str(len(members))
        members[name], desc[name] = ranks, kind
        for r in ranks:
            of_rank[r][kind] = name

    for b in range(job.dp):
        add("tp", list(range(b * job.tp, (b + 1) * job.tp)))
    for s in range(job.tp):
        add("dp", list(range(s, job.world, job.tp)))
    for r in range(job.world):
        if (r // job.tp) % 2 == 0:
            add("pp", [r, r + job.tp])
    return members, desc, of_rank


def _sizes(op: str, job: Job, gsize: int) -> tuple[list[list[int]], list[list[int]]]:
    shape = list(job.elem)
    big = [gsize * shape[0], *shape[1:]]
    k = job.tensors
    if op == "all_gather":
        return [shape] * k, [big] * k
    if op == "_reduce_scatter_base":
        return [big] * k, [shape] * k
    return [shape] * k, [shape] * k


def build(job: Job) -> dict[int, dict]:
    """Rank -> the dict FlightRecorder would pickle for that rank."""
    members, desc, of_rank = groups(job)
    # torch symbolizes each unique frame once and every entry's list refers to those dicts, so its
    # pickler memoizes them (BINGET): one stack per call site (op of the step) here, shared likewise
    stacks = [
        [{"name": f"{op}_{k}" if i == 0 else f"fn{i}", "filename": _FRAME_FILES[i % len(_FRAME_FILES)],
          "line": 100 + 10 * k + i} for i in range(job.frames)]
        for k, (op, _) in enumerate(job.step_ops)
    ]  # fmt: skip
    fate = _resolve(job, members, of_rank)
    dumps: dict[int, dict] = {}
    for r in range(job.world):
        mine = of_rank[r]
        kinds = ("world", "tp", "dp", "pp")
        if job.used_groups_only:
            kinds = tuple(dict.fromkeys(("world", *(g for _, g in job.step_ops))))
        pg_ids = {name: i for i, name in enumerate(mine[g] for g in kinds)}
        cseq = dict.fromkeys(pg_ids, 0)
        pseq = dict.fromkeys(pg_ids, 0)
        status = {str(i): {"last_enqueued_collective": -1, "last_started_collective": -1,
                           "last_completed_collective": -1} for i in pg_ids.values()}  # fmt: skip
        entries: list[dict] = []
        for op_id, (step, k, op0, grp, pending) in enumerate(fate[r], start=1):
            op = op0
            name = mine[grp]
            gr = members[name]
            me = gr.index(r)
            p2p = op == "p2p"
            if p2p:
                pseq[name] += 1
                op = "send" if me == 0 else "recv"
                pname = "nccl:send 0->1" if me == 0 else "nccl:recv 1<-0"
            else:
                cseq[name] += 1
                pname = f"nccl:{op}"
            # deterministic per-rank jitter
            created = job.t0_ns + step * job.step_ns + k * job.step_ns // 8 + (r * 7919 % 50_000)
            started = created + 20_000 + (r % 5) * 1000
            dur_ns = 3_000_000 + (k * 250_000)
            completed = started + dur_ns + 150_000
            ins, outs = _sizes(op, job, len(gr))
            e = {
                "record_id": len(entries),
                "pg_id": pg_ids[name],
                "process_group": (name, desc[name]),
                "collective_seq_id": cseq[name],
                "p2p_seq_id": pseq[name],
                "op_id": op_id,
                "profiling_name": pname,
                "time_created_ns": created,
                "input_sizes": ins,
                "input_dtypes": [_DTYPE] * len(ins),
                "output_sizes": outs,
                "output_dtypes": [_DTYPE] * len(outs),
                "state": "completed",
                "time_discovered_started_ns": started if job.timing else None,
                "time_discovered_completed_ns": completed,
                "retired": True,
                "timeout_ms": job.timeout_ms,
                "is_p2p": p2p,
                "thread_name": "pt_main_thread",
                "thread_id": "140000000000000",
            }
            if job.timing:
                e["duration_ms"] = dur_ns / 1e6
            if pending:
                e["state"] = "started" if job.timing else "scheduled"
                e["time_discovered_completed_ns"] = None
                e["retired"] = False
                e.pop("duration_ms", None)
            if job.frames:
                e["frames"] = list(stacks[k])  # a new list of shared frame dicts, as torch builds it
            st = status[str(pg_ids[name])]
            if not p2p:
                st["last_enqueued_collective"] = cseq[name]
                if e["state"] != "scheduled" and job.timing:
                    st["last_started_collective"] = cseq[name]
                if e["state"] == "completed":
                    st["last_completed_collective"] = cseq[name]
            entries.append(e)
        entries = entries[-job.buffer :]
        dumps[r] = {
            "version": FR_VERSION,
            "comm_lib_version": "2.21.5",
            "pg_config": {n: {"name": n, "desc": desc[n], "ranks": str(members[n])} for n in pg_ids},
            "pg_status": status,
            "entries": entries,
        }
    return dumps


def _resolve(
    job: Job, members: dict[str, list[int]], of_rank: dict[int, dict[str, str]]
) -> dict[int, list[tuple[int, int, str, str, bool]]]:
    """Per rank, the ops it issued as (step, op index, op, group, pending), in program order."""
    hang, skip = job.hang, job.skip
    last = job.steps - 1
    prog: dict[int, list[tuple[int, int, str, str]]] = {}
    for r in range(job.world):
        ops = []
        for step in range(job.steps):
            for k, (op, grp) in enumerate(job.step_ops):
                stop = hang is not None and (k > hang.op_index or (k == hang.op_index and r in hang.missing))
                if step == last and stop:
                    break
                if step == last and skip is not None and skip.rank == r and k == skip.op_index:
                    continue
                ops.append((step, k, op, grp))
        prog[r] = ops
    # an op is (group name, its sequence number in that group on this rank)
    ident: dict[int, list[tuple[str, int]]] = {}
    for r, ops in prog.items():
        count: dict[str, int] = {}
        ident[r] = []
        for _, _, _, grp in ops:
            name = of_rank[r][grp]
            count[name] = count.get(name, 0) + 1
            ident[r].append((name, count[name]))
    stuck = (last, hang.op_index) if hang is not None and not hang.missing else None
    pos = dict.fromkeys(prog, 0)
    moved = True
    while moved:
        moved = False
        for r in sorted(prog):
            i = pos[r]
            if i >= len(prog[r]) or prog[r][i][:2] == stuck:
                continue
            name, seq = ident[r][i]
            peers = members[name]
            if all(pos[q] < len(prog[q]) and ident[q][pos[q]] == (name, seq) for q in peers):
                for q in peers:
                    pos[q] += 1
                moved = True
    return {r: [(*prog[r][i], i == pos[r]) for i in range(min(pos[r] + 1, len(prog[r])))] for r in prog}


def write(dumps: dict[int, dict], directory: str | Path, prefix: str = "nccl_trace_rank_") -> list[Path]:
    """One pickle per rank, ``<prefix><rank>``, protocol 2 like torch's C++ pickler."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for r, dump in sorted(dumps.items()):
        p = d / f"{prefix}{r}"
        p.write_bytes(pickle.dumps(dump, protocol=2))
        out.append(p)
    return out


def group_of(job: Job, rank: int, which: str) -> list[int]:
    """Global ranks of ``rank``'s ``which`` group (tp, dp, pp or world)."""
    members, _, of_rank = groups(job)
    return members[of_rank[rank][which]]
