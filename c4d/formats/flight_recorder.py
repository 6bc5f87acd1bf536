"""Import PyTorch Flight Recorder dumps (one pickle per rank) as c4d records: ``read``, and the
names other modules use.

Pipeline, as torch's own analyzer splits it (loader → builder → types):

* ``fr_load``: ``find_dumps`` (which files, which rank) → per file, the native reader
  (c4d/formats/fr_native.py: pickle bytes → columns) or, for a dump it leaves alone or without
  the library, ``load_dump`` (the guarded loader: a restricted unpickler, one-line errors), in
  reading threads or worker processes when there are many;
* ``fr_columns``: a dump's entries → numpy columns, and the FR vocabulary (op names, dtypes);
* ``fr_limits``: what a dump may cost while it is read (both readers check it);
* ``fr_convert``: every rank's columns → communicators, sequences, OP records, per-communicator
  heartbeats (vectorised) → ``to_records.assemble``.

Mapping (facts: docs/design.md, "PyTorch Flight Recorder dumps"; semantics: record.h):

* rank: the number at the end of the file name (``<prefix><rank>``, as torch's ``DebugInfoWriter``
  names them); the dumps hold no host name, so REGISTER.node is "".
* communicator: a process group, identified by its name (``process_group[0]``) plus its member
  ranks (``pg_config[name]["ranks"]``; inferred from which dumps use the name when ``pg_config``
  does not list it, as on gloo). ``comm_id`` = blake2b of both, equal on every rank; comm_rank =
  position in the sorted members (torch's own convention for p2p peers).
* collectives: ``seq = collective_seq_id - 1`` (FR counts from 1, c4d from 0, so a heartbeat's
  ``n_issued`` is the next seq). Entries sharing a ``collective_seq_id`` on one rank (a coalesced
  group and its ``coalesced`` end entry) are one op: bytes summed, IN_GROUP set.
* p2p (``send a->b`` / ``recv a<-b``, peers are group ranks): seq counted per (rank, comm,
  direction, peer) in dump order, P2P set. With a wrapped ring buffer the count starts at the
  oldest kept entry, so sender and receiver may not line up (FR keeps no per-peer counter).
* times: ``issue_ns`` = ``time_created_ns``; ``start_ns`` = ``time_discovered_started_ns`` (when the
  watchdog saw the start event: CUDA-event based, but only as fine as the watchdog's polling);
  ``end_ns`` = ``time_discovered_completed_ns``. Done = state "completed" or ``retired``.
* a rank whose dump shows no start times (``TORCH_NCCL_ENABLE_TIMING`` off, or gloo) has
  REGISTER.device_timing = 0 and "arrived" = "issued", as docs/design.md says for ranks without device
  timing; otherwise a "scheduled" op has not arrived.
* every op not done is pending in that rank × communicator's HEARTBEAT at the dump time (the latest
  time any dump mentions), the oldest one as pend_*; see to_records for how the replay goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from c4d.formats.budget import Budget
from c4d.formats.fr_columns import parse_name
from c4d.formats.fr_convert import KNOWN_MAJOR, convert
from c4d.formats.fr_limits import (
    BUILT_PER_BYTE,
    COLUMN_COST,
    ENTRY_COST,
    EXPAND_PER_BYTE,
    FREE,
    JSON_COST,
    MAX_RANK,
    NODE_COST,
    expanded_size,
    walk_limit,
)
from c4d.formats.fr_load import SAFE_GLOBALS, DumpFiles, find_dumps, load_all, load_dump, rank_of
from c4d.formats.to_records import FormatError, ImportOptions
from c4d.record.trace import RawTrace
from c4d.util import heap

__all__ = [
    "BUILT_PER_BYTE",
    "COLUMN_COST",
    "ENTRY_COST",
    "EXPAND_PER_BYTE",
    "FREE",
    "JSON_COST",
    "KNOWN_MAJOR",
    "MAX_RANK",
    "NODE_COST",
    "SAFE_GLOBALS",
    "DumpFiles",
    "FormatError",
    "ImportOptions",
    "convert",
    "expanded_size",
    "find_dumps",
    "load_dump",
    "parse_name",
    "read",
    "walk_limit",
]


def read(
    path: str | os.PathLike,
    opts: ImportOptions | None = None,
    *,
    prefix: str | None = None,
    workers: int | None = None,
    on_warning: Callable[[str], None] | None = None,
    budget: Budget | None = None,
) -> RawTrace:
    """A directory of dumps (or one dump file) → RawTrace, within ``budget`` (c4d.formats.budget).
    Unreadable files, and dumps built to cost far more than they weigh, are skipped with a warning."""
    opts = opts or ImportOptions()
    budget = budget or Budget()
    heap.keep_freed_blocks()  # the columns' many large temporaries reuse freed pages (c4d/util/heap.py)
    p = Path(path)
    if p.is_dir():
        found = find_dumps(p, prefix)
        files, warns = found.files, list(found.skipped)
    else:
        files, warns = {rank_of(p.name): p}, []
    with heap.without_huge_pages():  # the import writes its arrays once (c4d/util/heap.py)
        loaded: list[tuple[int, dict[str, Any]]] = []
        for rank, res in load_all(files, workers, budget):
            if isinstance(res, str):
                warns.append(res)
            else:
                loaded.append((rank, res))
        if not loaded:
            raise FormatError(f"{p}: no readable Flight Recorder dump" + (f" ({warns[0]})" if warns else ""))
        budget.check_time(str(p))
        rt = convert(
            loaded,
            opts,
            job=p.resolve().name if p.is_dir() else p.resolve().parent.name,
            path=str(p),
            warnings=warns,
        )
    if on_warning:
        for w in warns:
            on_warning(w)
    return rt
