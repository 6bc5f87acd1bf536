"""Trace framing (format 2): a damaged batch is skipped and reported, reading resynchronizes at
the next batch, and old traces (format 1) still read.

Traces here are written by the real TraceWriter from the record factories' 8-rank job with a
hang, the way the master writes them (one frame per received batch, one per TICK).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge
from c4d.master.master import make_engine
from c4d.offline.analyze import replay
from c4d.record import framing, schema, trace
from tests import factories as F
from tests.conftest import c4d_cmd

GOLDEN_V1 = Path(__file__).parent / "golden" / "format-v1.c4d"


def _hang_job() -> F.Job:
    return F.Job(tp=2, pp=1, dp=4, steps=8, faults=[F.Fault("noncomm-hang", rank=5, step=4)], tail_s=3.5)


def _write(path: Path, job: F.Job) -> list[tuple[int, int]]:
    """Write the job's stream like c4d.master.master; return each frame's (file offset, records)."""
    model, batches = F.build_cached(job)
    w = trace.TraceWriter(path, {"command": "test"})
    frames: list[tuple[int, int]] = []

    def put(write, n: int) -> None:
        w.flush()
        frames.append((w._f.tell(), n))
        write()

    put(lambda: w.tick(F.T0), 1)  # the master ticks once when it starts
    tick, nxt, bi = job.tick_ms * F.MS, job.tick_ms * F.MS, 0
    while nxt <= model.end_time + 2 * tick:
        while bi < len(batches) and batches[bi][0] <= nxt:
            b = batches[bi][1]
            put(lambda b=b: w.write(b), len(b))
            bi += 1
        put(lambda t=int(F.T0 + nxt): w.tick(t), 1)
        nxt += tick
    w.close()
    return frames


def _frame_bytes(n: int) -> int:
    return framing.HEAD_BYTES + n * schema.RECORD_SIZE


def _errors(diags) -> set[tuple[str, tuple[int, ...]]]:
    return {(d.kind.value, d.ranks) for d in diags if d.level.name == "ERROR"}


@pytest.fixture(scope="module")
def framed(tmp_path_factory):
    p = tmp_path_factory.mktemp("framing") / "job.c4d"
    frames = _write(p, _hang_job())
    rt = trace.read_raw(p)
    return p, frames, rt


def test_a_framed_trace_reads_back_every_record(framed):
    _, frames, rt = framed
    assert rt.format_version == trace.FORMAT_VERSION == 2
    assert not rt.damaged and rt.truncated_bytes == 0
    assert len(rt.raw) == sum(n for _, n in frames)
    assert _errors(replay(rt, make_engine())) == {("RankNonCommHang", (5,))}


def _damaged_copy(src: Path, dst: Path, edit) -> trace.RawTrace:
    blob = bytearray(src.read_bytes())
    edit(blob)
    dst.write_bytes(bytes(blob))
    return trace.read_raw(dst)


def _expected_without(full: np.ndarray, frames, hit: int) -> bytes:
    """The records of every frame but ``hit``."""
    out, i = [], 0
    for k, (_, n) in enumerate(frames):
        if k != hit:
            out.append(full[i : i + n].tobytes())
        i += n
    return b"".join(out)


def _frame_at(frames, off: int) -> int:
    return max(k for k, (s, _) in enumerate(frames) if s <= off)


def test_one_inserted_byte_costs_the_batch_it_hit_and_nothing_else(framed, tmp_path):
    p, frames, rt = framed
    rng = random.Random(3)
    big = [k for k, (_, n) in enumerate(frames) if n > 1]
    for k in rng.sample(big, 12):
        start, n = frames[k]
        off = rng.randrange(start, start + _frame_bytes(n))  # anywhere in the frame, header included
        got = _damaged_copy(p, tmp_path / "ins.c4d", lambda b, off=off: b.insert(off, 0x5A))
        assert len(got.damaged) == 1, (k, off)
        assert got.damaged[0][0] == start  # skipped from the frame's start to the next sync marker
        assert got.raw.tobytes() == _expected_without(rt.raw, frames, k)


def test_a_flipped_bit_is_caught_by_the_crc(framed, tmp_path):
    p, frames, rt = framed
    rng = random.Random(5)
    for k in rng.sample(range(len(frames)), 12):
        start, n = frames[k]
        off = rng.randrange(start + 8, start + _frame_bytes(n))  # length, crc or payload
        bit = 1 << rng.randrange(8)

        def flip(b, off=off, bit=bit):
            b[off] ^= bit

        got = _damaged_copy(p, tmp_path / "flip.c4d", flip)
        assert [s for s, _ in got.damaged] == [start], (k, off)
        assert got.raw.tobytes() == _expected_without(rt.raw, frames, k)


def test_a_run_of_garbage_is_skipped_and_reading_goes_on(framed, tmp_path):
    p, frames, rt = framed
    start, _ = frames[len(frames) // 2]
    junk = random.Random(1).randbytes(5000)
    got = _damaged_copy(p, tmp_path / "junk.c4d", lambda b: b.__setitem__(slice(start, start), junk))
    assert got.damaged_bytes == 5000 and len(got.raw) == len(rt.raw)
    assert got.raw.tobytes() == rt.raw.tobytes()


def test_analyze_exits_1_on_damage_unless_allowed_and_keeps_the_diagnosis(framed, tmp_path):
    p, frames, _ = framed
    bad = tmp_path / "bad.c4d"
    blob = bytearray(p.read_bytes())
    mid = frames[len(frames) // 2][0] + 40
    blob.insert(mid, 0x00)  # the 1-byte insertion that used to make analyze skip the rest
    bad.write_bytes(bytes(blob))
    r = subprocess.run(c4d_cmd("analyze", bad, "--json"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert "skipped 1 damaged batch(es)" in r.stderr and "--allow-damaged" in r.stderr
    r = subprocess.run(
        c4d_cmd("analyze", bad, "--json", "--allow-damaged"), capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 1, r.stderr
    assert '"level": "ERROR", "kind": "RankNonCommHang"' in r.stdout and '"ranks": [5]' in r.stdout
    assert len(r.stderr.splitlines()) == 1, r.stderr  # the damage line; the edge dropped nothing


def test_old_format_trace_still_reads_and_replays():
    rt = trace.read_raw(GOLDEN_V1)
    assert rt.format_version == 1 and len(rt.raw) == 278 and not rt.damaged
    eng = make_engine()
    ing = Ingest(eng, Edge())
    diags = replay(rt, eng, ing)
    assert not ing.edge.rejected and not ing.failures
    got = [(d.level.name, d.kind.value, d.ranks, d.nodes, d.hang_times) for d in diags]
    assert got == [
        ("WARNING", "RankNonCommHang", (3,), ("node-0",), 1),
        ("WARNING", "RankNonCommHang", (3,), ("node-0",), 2),
        ("ERROR", "RankNonCommHang", (3,), ("node-0",), 3),
    ]


def test_a_newer_format_is_refused_in_one_line(tmp_path):
    blob = bytearray(GOLDEN_V1.read_bytes())
    blob[8:12] = (99).to_bytes(4, "little")
    (tmp_path / "new.c4d").write_bytes(bytes(blob))
    with pytest.raises(trace.TraceError, match="format 99 is newer"):
        trace.read_raw(tmp_path / "new.c4d")


def test_a_large_batch_is_written_in_frames_of_at_most_512_records(tmp_path):
    """The master writes a poll's messages joined (c4d.master.collector): a flipped bit costs the
    512-record frame it hit, not the whole batch."""
    rows = np.zeros(1300, schema.HEADER)
    rows["kind"], rows["version"], rows["rank"] = schema.Kind.OP, schema.SCHEMA_VERSION, 0
    rows["time_ns"] = F.T0 + np.arange(1300)
    p = tmp_path / "big.c4d"
    w = trace.TraceWriter(p, {"command": "test"})
    w.flush()
    start = w._f.tell()
    w.write(rows)
    w.close()
    assert p.stat().st_size - start == 3 * framing.HEAD_BYTES + 1300 * schema.RECORD_SIZE  # 512, 512, 276
    second = start + _frame_bytes(512) + framing.HEAD_BYTES + 100  # inside the second frame's payload

    def flip(b):
        b[second] ^= 1

    got = _damaged_copy(p, tmp_path / "flip.c4d", flip)
    assert len(got.damaged) == 1
    assert got.raw["time_ns"].tolist() == rows["time_ns"][np.r_[0:512, 1024:1300]].tolist()
