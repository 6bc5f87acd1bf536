"""The routing step of an engine sharded by communicator (c4d/engine/shard.py): each
communicator's records reach exactly one shard, whole and in arrival order, and every record
that names no communicator reaches every shard (the sharded engine itself routes a chunk's
rows after its rank-level half: c4d/engine/shards.py, tests/test_engine_sharded.py)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.engine import shard
from c4d.record import schema, trace
from c4d.record.schema import Kind
from tests.golden import make_golden

GOLDEN = Path(make_golden.__file__).resolve().parent
KINDS = [int(k) for k in Kind] + [0, 99]  # an unknown kind too: it names no communicator


def _rows(kinds: list[int], cids: list[int]) -> np.ndarray:
    raw = np.zeros(len(kinds), schema.HEADER)
    raw["kind"] = kinds
    raw["version"] = schema.SCHEMA_VERSION
    raw["rank"] = np.arange(len(kinds))  # each row's position, to follow it
    body = raw.view(np.uint8).reshape(len(kinds), schema.RECORD_SIZE)
    body[:, shard.CID_OFFSET : shard.CID_OFFSET + 8] = (
        np.array(cids, "<u8").view(np.uint8).reshape(len(kinds), 8)
    )
    return raw


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**64 - 1) | st.integers(0, 5)), max_size=60),
    st.integers(1, 5),
)
def test_each_communicator_goes_whole_to_one_shard_and_rank_records_to_every_one(rows, n):
    raw = _rows([k for k, _ in rows], [c for _, c in rows])
    parts = shard.split(raw, n)
    assert len(parts) == n
    per_comm = np.isin(raw["kind"], [int(k) for k, dt in schema.DTYPES.items() if "comm_id" in dt.names])
    cid = np.array([c for _, c in rows], np.uint64)
    named = per_comm & (cid != 0)
    where = shard.owner(cid, n)
    for s, part in enumerate(parts):
        pos = part["rank"]
        assert (np.diff(pos) > 0).all()  # arrival order kept
        want = np.flatnonzero(~named | (where == s))
        assert pos.tolist() == want.tolist()
        assert part.tobytes() == raw[want].tobytes()  # the records themselves, untouched


def test_one_shard_is_the_rows_as_they_are():
    raw = _rows([int(Kind.OP), int(Kind.REGISTER)], [7, 0])
    assert shard.split(raw, 1)[0] is raw


def test_the_owner_spreads_sequential_ids_and_is_stable():
    """Launchers' and tests' ids often come in sequence: they spread as random ones do; the same
    id always has the same shard."""
    ids = (1 << 40) | np.arange(4096, dtype=np.uint64)
    for n in (2, 3, 4, 8):
        count = np.bincount(shard.owner(ids, n), minlength=n)
        assert count.min() > 0.8 * len(ids) / n, (n, count)
    assert (shard.owner(ids, 4) == shard.owner(ids.copy(), 4)).all()
    assert (
        shard.owner(np.array([12345], np.uint64), 7).tolist()
        == shard.owner(np.array([12345], np.uint64), 7).tolist()
    )


def test_a_golden_trace_splits_by_its_communicators(tmp_path):
    """A recorded sim job: every communicator's OP, HEARTBEAT, COMM and PEER records in one
    shard; REGISTER and the processes' own heartbeats in each; nothing lost or added."""
    path = tmp_path / "t.c4d"
    with gzip.open(GOLDEN / "comm-hang-link.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    raw = trace.read_raw(path).raw
    raw = raw[raw["kind"] != Kind.TICK]
    parts = shard.split(raw, 3)
    cids = shard.comm_ids(raw)
    assert len(np.unique(cids[cids != 0])) >= 2  # the job has communicators to spread
    shared = int((cids == 0).sum())
    assert sum(len(p) for p in parts) == len(raw) + 2 * shared
    for p in parts:
        assert (p["kind"] == Kind.REGISTER).sum() == (raw["kind"] == Kind.REGISTER).sum()
        mine = shard.comm_ids(p)
        for c in np.unique(mine[mine != 0]).tolist():
            assert (mine == c).sum() == (cids == c).sum()  # the whole communicator


def test_bench_shards_runs_one_engine_and_the_sharded_one_on_the_same_records():
    """analysis/bench_shards.py at a small size: one engine and two shards in processes of
    their own took the same records and gave the same diagnoses; the figures it prints are
    there (each shard's CPU time its own)."""
    import sys

    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "analysis")]
    import bench_shards

    r = bench_shards.run(64, 0.5, 1, [1, 2])
    one, two = r["shards"]["engine"], r["shards"]["2"]
    assert r["records"] > 0 and one["records_per_s"] > 0 and two["records_per_s"] > 0
    assert two["same_diagnoses"] and r["shards"]["1"]["same_diagnoses"] and one["speedup"] == 1.0
    assert len(two["shard_cpu_s"]) == 2 and min(two["shard_cpu_s"]) > 0
    assert 0 < two["free_cores_speedup"][0] <= two["free_cores_speedup"][1] and two["overhead"] > 0


def test_bench_master_summarises_a_profile(tmp_path):
    """bench_master --profile: the statistics the engine's process wrote, summarised (shares of
    its profiled time, nesting); a file not written is said so, not a crash."""
    import cProfile
    import sys

    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "analysis")]
    import bench_master

    from c4d.offline.analyze import make_engine

    e = make_engine()
    prof = cProfile.Profile()
    prof.runcall(e.tick, 1_000_000_000)
    prof.dump_stats(str(tmp_path / "p"))
    s = bench_master._profile_summary(str(tmp_path / "p"), top=5)
    assert s["total_s"] >= 0 and len(s["cumulative"]) == 5
    assert any(r["fn"].endswith(":tick") for r in s["cumulative"])
    shares = [r["share"] for r in s["cumulative"]]
    assert shares == sorted(shares, reverse=True) and all(
        0 <= x <= 1.05 for x in shares
    )  # (the profiler's own time)
    assert "error" in bench_master._profile_summary(str(tmp_path / "none"))
