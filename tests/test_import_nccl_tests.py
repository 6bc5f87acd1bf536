"""nccl-tests import: every captured output in tests/data/nccl-tests becomes a synthetic trace whose
bus bandwidth is what nccl-tests printed."""

from __future__ import annotations

import numpy as np
import pytest

from c4d.formats import nccl_tests
from c4d.formats.detect import detect, load_any
from c4d.offline import analyze
from c4d.record import opstats, schema
from tests.conftest import nccl_tests_data

DATA = nccl_tests_data()
FILES = sorted(DATA.glob("*.txt"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_sample_imports(path):
    assert detect(path) == "nccl-tests"
    runs = nccl_tests.parse_file(path)
    rt = load_any(path)
    k = rt.kinds
    ops, regs = k[schema.Kind.OP], k[schema.Kind.REGISTER]
    assert len(ops) > 0
    run = runs[0]
    n = len({d.rank for d in run.devices}) or 1
    assert sorted(regs["rank"].tolist()) == list(range(n))
    if run.devices:  # nodes are the hosts nccl-tests printed
        by_rank = {d.rank: d.host for d in run.devices}
        assert {int(r): x.decode() for r, x in zip(regs["rank"], regs["node"], strict=True)} == by_rank
    # one op per rank per printed row and block, all ranks identical times
    rows = run.rows
    printed = int(rows["oop_time_us"].notna().sum() + rows["ip_time_us"].notna().sum())
    assert len(ops) == printed * n
    r0 = ops[ops["rank"] == 0]
    assert np.all(np.diff(r0["seq"].astype(np.int64)) == 1)
    # the bus bandwidth recomputed from the records is the printed one (the trailer's mean)
    S = opstats.total_bytes(r0["op"], r0["bytes"], r0["comm_nranks"])
    busbw = (
        S
        / (r0["end_ns"].astype(np.int64) - r0["start_ns"].astype(np.int64))
        * opstats.busbw_factor(r0["op"], r0["comm_nranks"])
    )
    printed_bw = np.concatenate([rows["oop_busbw_gbs"].dropna(), rows["ip_busbw_gbs"].dropna()])
    assert busbw.mean() == pytest.approx(printed_bw.mean(), rel=0.02, abs=0.01)
    if run.avg_busbw_gbs:
        assert busbw.mean() == pytest.approx(run.avg_busbw_gbs, rel=0.02)
    # nothing to diagnose in a benchmark: no hang, no loss
    from c4d.engine import Engine, EngineConfig

    diags = analyze.replay(rt, Engine(EngineConfig()))
    assert not [d for d in diags if d.kind.value in ("RankNonCommHang", "RankCommHang", "RankLost")]


def test_directory_of_outputs(tmp_path):
    if len(FILES) < 2:
        pytest.skip("needs two samples")
    for f in FILES[:2]:
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "notes.md").write_text("# not a result\n")
    assert detect(tmp_path) == "nccl-tests"
    rt = load_any(tmp_path)
    assert len(rt.meta["comms"]) == 2  # one synthetic communicator per run
