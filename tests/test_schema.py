"""The numpy mirror agrees with native/include/c4d/record.h: sizes and every field offset."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from c4d.record import schema

ROOT = Path(__file__).resolve().parents[1]
STRUCTS = {
    schema.REGISTER: "c4d_register_record",
    schema.OP: "c4d_op_record",
    schema.HEARTBEAT: "c4d_heartbeat_record",
    schema.COMM: "c4d_comm_record",
    schema.PEER: "c4d_peer_record",
    schema.STAGE: "c4d_stage_record",
    schema.OPSUM: "c4d_opsum_record",
    schema.OPPART: "c4d_oppart_record",
}
HEADER_FIELDS = {"kind", "version", "rank", "time_ns"}


def _probe_source() -> str:
    lines = ["#include <cstdio>", "#include <cstddef>", '#include "c4d/record.h"', "int main() {"]
    lines.append('printf("batch_header %zu\\n", sizeof(c4d_batch_header));')
    lines.append('printf("version %d\\n", C4D_SCHEMA_VERSION);')
    lines.append('printf("record_size %d\\n", C4D_RECORD_SIZE);')
    lines.append('printf("magic %u\\n", C4D_BATCH_MAGIC);')
    for f in schema.BATCH_HEADER.names:
        lines.append(
            f'printf("c4d_batch_header.{f} %zu %zu\\n", offsetof(c4d_batch_header, {f}), '
            f"sizeof(((c4d_batch_header*)0)->{f}));"
        )
    for dt, st in STRUCTS.items():
        lines.append(f'printf("{st} %zu\\n", sizeof({st}));')
        for f in dt.names:
            member = f"h.{f}" if f in HEADER_FIELDS else f
            lines.append(
                f'printf("{st}.{f} %zu %zu\\n", offsetof({st}, {member}), sizeof((({st}*)0)->{member}));'
            )
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict[str, list[int]]:
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed to check the schema (the README's install command brings one)"
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.cc").write_text(_probe_source())
    subprocess.run(
        [cxx, "-std=c++17", f"-I{ROOT / 'native/include'}", "probe.cc", "-o", "probe"], cwd=d, check=True
    )
    out = subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout
    return {k: [int(x) for x in v] for k, *v in (line.split() for line in out.splitlines())}


def test_constants_agree(probe):
    assert probe["version"] == [schema.SCHEMA_VERSION]
    assert probe["record_size"] == [schema.RECORD_SIZE]
    assert probe["magic"] == [schema.BATCH_MAGIC]
    assert probe["batch_header"] == [schema.BATCH_HEADER.itemsize]


@pytest.mark.parametrize("dt", list(STRUCTS), ids=list(STRUCTS.values()))
def test_every_field_offset_and_size(probe, dt):
    st = STRUCTS[dt]
    assert probe[st] == [dt.itemsize]
    for f in dt.names:
        off, size = probe[f"{st}.{f}"]
        assert (off, size) == (dt.fields[f][1], dt.fields[f][0].itemsize), f"{st}.{f}"


def test_batch_header_fields(probe):
    for f in schema.BATCH_HEADER.names:
        off, size = probe[f"c4d_batch_header.{f}"]
        assert (off, size) == (schema.BATCH_HEADER.fields[f][1], schema.BATCH_HEADER.fields[f][0].itemsize)


def test_every_kind_has_a_dtype_of_record_size():
    for kind, dt in schema.DTYPES.items():
        assert dt.itemsize == schema.RECORD_SIZE, kind


def test_unique_runs_is_np_unique():
    """schema.unique_runs (only each run's first value sorted) gives np.unique's values, first
    indices and flat inverse, with runs and without (its plain path)."""
    rng = np.random.default_rng(5)
    paths = set()
    for _ in range(400):
        m, k = int(rng.integers(0, 300)), int(rng.integers(1, 20))
        vals = rng.integers(0, 2**63, k, dtype=np.int64).astype(np.uint64)
        a = vals[rng.integers(0, k, m)]
        if rng.random() < 0.7:
            a = np.repeat(a, rng.integers(1, 8, m))
        u, first, inv = np.unique(a, return_index=True, return_inverse=True)
        got = schema.unique_runs(a)
        assert (got[0] == u).all() and (got[1] == first).all() and (got[2] == inv.ravel()).all()
        paths.add(len(a) > 1 and 2 * int((a[1:] != a[:-1]).sum() + 1) > len(a))
    assert paths == {True, False}


def test_join_records_is_concatenate_for_any_parts():
    """join_records gives np.concatenate's rows, writable, for many small parts (a batch per
    sender), a part that is a strided view, empty parts and a different dtype of the same size."""
    rng = np.random.default_rng(5)
    rows = np.zeros(200, schema.OP)
    for f in ("seq", "issue_ns", "end_ns", "comm_id"):
        rows[f] = rng.integers(0, 1 << 62, len(rows), dtype=np.uint64)
    rows["rank"] = rng.integers(0, 4096, len(rows))
    parts = [rows[i : i + 7] for i in range(0, 200, 7)]
    for ps in (parts, [rows[:0], *parts, rows[:0]], [rows[::3], rows[1:50]], [rows[5:6], rows[::-1]]):
        got = schema.join_records(ps)
        want = np.concatenate(ps)
        assert got.dtype == schema.OP and got.flags.writeable
        assert got.tobytes() == want.tobytes()
        as_header = schema.join_records(ps, schema.HEADER)
        assert as_header.dtype == schema.HEADER and as_header.tobytes() == want.tobytes()


# -- version 1 (the heartbeat without its pending op's size) ------------------------------


def _v1_rows() -> np.ndarray:
    """Two version-1 heartbeats (one with counters past the narrower version-2 fields) and an
    OP record, as a version-1 writer laid them out."""
    hb = np.zeros(2, schema.HEARTBEAT_V1)
    hb["kind"], hb["version"], hb["rank"], hb["time_ns"] = schema.Kind.HEARTBEAT, 1, [3, 4], [10, 11]
    hb["comm_id"], hb["n_issued"], hb["n_arrived"], hb["n_done"] = 77, [9, 5], [8, 5], [7, 5]
    hb["last_arrive_ns"], hb["last_done_ns"] = 1234, 1200
    hb["pend_seq"], hb["pend_issue_ns"], hb["pend_start_ns"] = [7, schema.UINT64_MAX], 1300, [1310, 0]
    hb["dropped"], hb["sent"] = [12, 1 << 40], [5000, 6000]
    hb["comm_rank"], hb["comm_nranks"], hb["pend_peer"] = [1, 2], 4, [-1, -1]
    hb["pend_op"], hb["pend_flags"], hb["hb_flags"] = [0, 255], [1, 0], [0, schema.HBF_FINAL]
    hb["p2p_in_flight"], hb["device"] = [2, 1000], [3, -1]
    op = np.zeros(1, schema.OP)
    op["kind"], op["version"], op["rank"], op["comm_id"], op["seq"], op["count"] = (
        schema.Kind.OP,
        1,
        3,
        77,
        6,
        99,
    )
    return np.concatenate([hb.view(schema.HEADER), op.view(schema.HEADER)])


def test_version_1_heartbeats_are_upgraded():
    raw = _v1_rows()
    before = raw.copy()
    up = schema.upgrade(raw)
    assert raw.tobytes() == before.tobytes()  # the input is never written
    hb, old = up[:2].view(schema.HEARTBEAT), raw[:2].view(schema.HEARTBEAT_V1)
    assert (hb["version"] == schema.SCHEMA_VERSION).all()
    same = set(schema.HEARTBEAT_V1.names) - {"version", "dropped", "p2p_in_flight"}
    for f in sorted(same):
        assert (hb[f].astype(np.int64) == old[f].astype(np.int64)).all(), f
    assert hb["dropped"].tolist() == [12, 2**32 - 1] and hb["p2p_in_flight"].tolist() == [2, 255]  # saturated
    assert hb["pend_count"].tolist() == [0, 0]
    assert hb["pend_dtype"].tolist() == [255, 255] and hb["pend_redop"].tolist() == [255, 255]  # unknown
    assert up[2:].tobytes() == raw[2:].tobytes()  # other kinds: the same layout in both versions
    assert schema.upgrade(up) is up  # current rows: returned as they are


def test_a_version_1_batch_is_read_upgraded():
    from c4d.record import wire

    msg = bytearray(wire.encode(_v1_rows(), rank=3))
    msg[4:6] = (1).to_bytes(2, "little")  # the batch header of a version-1 shim
    hb = wire.decode(bytes(msg))[:2].view(schema.HEARTBEAT)
    assert hb["pend_op"].tolist() == [0, 255] and hb["pend_seq"][0] == 7 and hb["pend_dtype"][0] == 255


def test_a_version_1_trace_is_analyzed(tmp_path):
    """A trace written by a version-1 master (tests/golden: schema 1 records) is read, its
    heartbeats upgraded, and `c4d analyze` names what the live engine named."""
    import gzip
    import json
    import sys

    from c4d.record import trace

    path = tmp_path / "mismatch.c4d"
    path.write_bytes(gzip.decompress((ROOT / "tests/golden/mismatch.c4d.gz").read_bytes()))
    rt = trace.read_raw(path)
    assert rt.meta["schema_version"] == 1 and rt.skipped == 0
    hb = rt.kinds[schema.Kind.HEARTBEAT]
    assert len(hb) and (hb["version"] == schema.SCHEMA_VERSION).all() and (hb["pend_dtype"] == 255).all()
    assert set(np.unique(hb["pend_op"]).tolist()) <= set(range(len(schema.Op))) | {255}
    assert set(np.unique(hb["hb_flags"]).tolist()) <= {0, schema.HBF_FINAL}
    p = subprocess.run([sys.executable, "-m", "c4d", "analyze", "--json", str(path)], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    got = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    want = json.loads((ROOT / "tests/golden/mismatch.expected.json").read_text())["diagnoses"]
    assert [(d["kind"], d["ranks"]) for d in got][:1] == [(d["kind"], d["ranks"]) for d in want][:1]
