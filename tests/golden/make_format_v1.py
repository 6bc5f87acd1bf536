"""Writes tests/golden/format-v1.c4d: trace format 1 (records back to back after the header), the
layout c4d wrote before framing. Run from the repository root: python tests/golden/make_format_v1.py
"""

import json
import struct
from pathlib import Path

import numpy as np

from c4d.record import schema
from tests import factories as F


def tick(t: int) -> np.ndarray:
    r = np.zeros(1, schema.HEADER)
    r["kind"], r["version"], r["rank"], r["time_ns"] = schema.Kind.TICK, 1, -1, t
    return r


def main() -> None:
    job = F.Job(
        tp=2,
        pp=1,
        dp=2,
        steps=6,
        peer=False,
        hb_ms=250,
        faults=[F.Fault("noncomm-hang", rank=3, step=3)],
        tail_s=3.5,
    )
    model, batches = F.build(job)
    parts = [tick(F.T0)]
    t, nxt, bi = job.tick_ms * F.MS, job.tick_ms * F.MS, 0
    while nxt <= model.end_time + 2 * t:
        while bi < len(batches) and batches[bi][0] <= nxt:
            parts.append(batches[bi][1].view(schema.HEADER))
            bi += 1
        parts.append(tick(int(F.T0 + nxt)))
        nxt += t
    meta = {"schema_version": 1, "record_size": 128, "c4d_version": "0.1.0", "created_ns": F.T0}
    blob = json.dumps({**meta, "master_host": "fixture", "command": "fixture"}, sort_keys=True).encode()
    body = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    out = Path(__file__).parent / "format-v1.c4d"
    out.write_bytes(struct.pack("<8sII", b"C4DTRACE", 1, len(blob)) + blob + body)


if __name__ == "__main__":
    main()
