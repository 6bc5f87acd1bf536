"""Expected bus bandwidth per link class, collective and size: a reference for a communicator
with no clean past of its own (a fault present from the job's first step) and no siblings.

``c4d check nccl --write-expected FILE`` writes it from nccl-tests runs on healthy nodes (one
node: class ``intra``; several: ``net``); the master reads it from ``C4D_EXPECTED_BUSBW=FILE``
(``c4d master --expected-busbw FILE``). Between measured sizes the busbw is interpolated in
log(size); below the smallest size measured (where latency, not bandwidth, sets the time) there
is no expectation.

File format (JSON)::

    {"version": 1, "rows": [{"class": "net", "op": "AllReduce", "bytes": 8388608, "busbw_gbs": 41.2}, ...]}
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from c4d.record.opstats import total_bytes
from c4d.record.schema import Op

CLASSES = ("intra", "net")
VERSION = 1
_OPS = {o.name.lower(): o for o in Op} | {"alltoall": Op.AlltoAll, "sendrecv": Op.Send}
MAX_ROWS = 100_000  # a file is a few hundred rows: more is not one of ours


class ExpectedError(ValueError):
    """The expected-busbw file cannot be used (one line: the file and why)."""


def link_class(nodes: int) -> str:
    """A communicator's link class: ``intra`` within one node, ``net`` across nodes."""
    return "intra" if nodes <= 1 else "net"


@dataclass(frozen=True)
class ExpectedBusbw:
    table: dict[tuple[str, int], tuple[tuple[float, float], ...]]
    """(link class, Op) -> (nccl-tests size in bytes, busbw GB/s), sorted by size."""

    def at(self, cls: str, op: int, nbytes: int, n: int) -> float | None:
        """The busbw a healthy communicator of ``n`` ranks should reach for a record's per-rank
        ``nbytes``; None where nothing was measured. A p2p link uses sendrecv's figures."""
        rows = self.table.get((cls, int(Op.Send) if op == int(Op.Recv) else int(op)))
        if not rows:
            return None
        size = float(total_bytes(np.array([op]), np.array([nbytes]), np.array([n]))[0])
        if size < rows[0][0]:
            return None
        sizes = np.log2([r[0] for r in rows])
        return float(np.interp(math.log2(size), sizes, [r[1] for r in rows]))

    def rows(self) -> list[dict]:
        return [
            {"class": c, "op": Op(o).name, "bytes": int(b), "busbw_gbs": v}
            for (c, o), rs in sorted(self.table.items())
            for b, v in rs
        ]

    def merged(self, other: ExpectedBusbw) -> ExpectedBusbw:
        """This table with ``other``'s (class, op) entries replacing its own."""
        return ExpectedBusbw({**self.table, **other.table})

    @classmethod
    def from_rows(cls, rows: Iterable[dict]) -> ExpectedBusbw:
        acc: dict[tuple[str, int], dict[float, float]] = {}
        for i, r in enumerate(rows):
            if i >= MAX_ROWS:
                raise ExpectedError(f"more than {MAX_ROWS} rows")
            try:
                c, op = str(r["class"]), _OPS[str(r["op"]).lower()]
                b, v = float(r["bytes"]), float(r["busbw_gbs"])
            except (KeyError, TypeError, ValueError) as e:
                raise ExpectedError(f"row {i}: needs class, op, bytes, busbw_gbs ({e})") from None
            if c not in CLASSES or not (b > 0 and math.isfinite(b)) or not (v > 0 and math.isfinite(v)):
                raise ExpectedError(f"row {i}: class one of {CLASSES}, bytes and busbw_gbs > 0")
            acc.setdefault((c, int(op)), {})[b] = v
        return cls({k: tuple(sorted(d.items())) for k, d in acc.items()})

    @classmethod
    def from_nccl_tests(
        cls, runs: Iterable, link: str = "auto", collective: str | None = None
    ) -> ExpectedBusbw:
        """Out-of-place busbw per size of each nccl-tests run (c4d.formats.nccl_tests.NcclTestsRun);
        ``link`` ``auto``: ``net`` when the run's devices were on more than one host. A run
        that does not name its binary is ``collective``'s (skipped without one)."""
        rows = []
        for run in runs:
            op = run.collective or collective
            if op is None or run.rows.empty:
                continue
            c = link if link != "auto" else link_class(len(run.hosts))
            for size, bw in zip(run.rows["size"], run.rows["oop_busbw_gbs"], strict=True):
                if bw == bw and bw > 0 and size > 0:
                    rows.append({"class": c, "op": op, "bytes": size, "busbw_gbs": float(bw)})
        return cls.from_rows(rows)

    @classmethod
    def load(cls, path: str | Path) -> ExpectedBusbw:
        try:
            raw = Path(path).read_bytes()[: 64 << 20]
            doc = json.loads(raw)
        except (OSError, ValueError) as e:
            raise ExpectedError(f"{path}: {e}") from None
        ok = isinstance(doc, dict) and doc.get("version") == VERSION and isinstance(doc.get("rows"), list)
        if not ok:
            raise ExpectedError(f"{path}: not an expected-busbw file (version {VERSION}, a list of rows)")
        try:
            return cls.from_rows(doc["rows"])
        except ExpectedError as e:
            raise ExpectedError(f"{path}: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"version": VERSION, "rows": self.rows()}, indent=1) + "\n")
