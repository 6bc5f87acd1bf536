"""How an engine sharded by communicator divides its work (c4d/engine/shards.py): the owner of
each communicator, a chunk's rows routed whole by communicator and in their order, and the
benchmarks that measure it (analysis/bench_shards.py, bench_master --profile). That the shards
give one engine's diagnoses: tests/test_engine_sharded.py."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np

from c4d.engine import EngineConfig
from c4d.engine.chunking import Chunker, apart
from c4d.engine.ingest import Ingest
from c4d.engine.shards import ShardedEngine, owner, route
from c4d.record import trace
from c4d.record.schema import Kind
from tests.golden import make_golden

GOLDEN = Path(make_golden.__file__).resolve().parent


def test_the_owner_spreads_sequential_ids_and_is_stable():
    """Launchers' and tests' ids often come in sequence: they spread as random ones do; the same
    id always has the same shard."""
    ids = (1 << 40) | np.arange(4096, dtype=np.uint64)
    for n in (2, 3, 4, 8):
        count = np.bincount(owner(ids, n), minlength=n)
        assert count.min() > 0.8 * len(ids) / n, (n, count)
    assert (owner(ids, 4) == owner(ids.copy(), 4)).all()
    assert owner(np.array([12345], np.uint64), 7).tolist() == owner(np.array([12345], np.uint64), 7).tolist()


def test_a_golden_chunk_is_routed_whole_by_communicator_in_order(tmp_path):
    """A recorded sim job's chunk after its front: every communicator's COMM, HEARTBEAT, OP and
    PEER rows and node summaries in its owner's part only, in their order, nothing lost or
    added; each new communicator numbered for its owner alone."""
    path = tmp_path / "t.c4d"
    with gzip.open(GOLDEN / "comm-hang-link.c4d.gz", "rb") as g, path.open("wb") as f:
        shutil.copyfileobj(g, f)
    raw = trace.read_raw(path).raw
    raw = raw[raw["kind"] != Kind.TICK]
    eng = ShardedEngine(EngineConfig(), shards=3)
    front: Ingest = eng._front  # (the test reads the front's output)
    chunker = Chunker()
    rest, sums = apart(raw)
    chunker.add(rest, 1, sums, len(raw))
    (chunk,) = list(chunker.cut(whole_chunks=False))
    rows = front.front(chunk)
    made = eng._numbers.make(rows.new)
    assert len(made) >= 3  # the job has communicators to spread
    parts = route(rows, made, 3)
    for kind in ("comm", "hb", "ops", "peer"):
        whole = getattr(rows, kind)
        assert sum(len(getattr(p, kind)) for _, p in parts) == len(whole)
        for s, (mine, p) in enumerate(parts):
            cid = getattr(p, kind)["comm_id"]
            assert (owner(cid, 3) == s).all()
            want = whole[owner(whole["comm_id"], 3) == s]
            assert getattr(p, kind).tobytes() == want.tobytes()  # whole records, in their order
            assert all(owner(np.array([m[0]], np.uint64), 3)[0] == s for m in mine)
    assert sorted(m for mine, _ in parts for m in mine) == sorted(made)


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
