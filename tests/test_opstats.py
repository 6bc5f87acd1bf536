"""nccl-tests' bus bandwidth factors, looked up by op code, equal the formulas they come from."""

from __future__ import annotations

import numpy as np

from c4d.record import opstats
from c4d.record.schema import Op

# nccl-tests' bus bandwidth factors as docs/design.md writes them, as functions of n
FORMULAS = {
    Op.AllReduce: lambda n: 2 * (n - 1) / n,
    Op.AllGather: lambda n: (n - 1) / n,
    Op.ReduceScatter: lambda n: (n - 1) / n,
    Op.AlltoAll: lambda n: (n - 1) / n,
    Op.Broadcast: lambda n: 1.0,
    Op.Reduce: lambda n: 1.0,
    Op.Gather: lambda n: (n - 1) / n,
    Op.Scatter: lambda n: (n - 1) / n,
    Op.Send: lambda n: 1.0,
    Op.Recv: lambda n: 1.0,
}


def test_factor_table_equals_the_formulas_bit_for_bit():
    n = np.arange(1, 4097)
    assert set(FORMULAS) == set(Op)
    for op in Op:
        want = np.broadcast_to(np.asarray(FORMULAS[op](n.astype(float)), float), n.shape)
        got = opstats.busbw_factor(np.full(len(n), int(op), np.uint8), n)
        assert np.array_equal(got, want), op.name
    # an unknown op code is scaled by 1, a size below 1 counts as 1
    assert opstats.busbw_factor(np.array([200, 0]), np.array([8, 0])).tolist() == [1.0, 0.0]


def test_total_size_is_n_times_a_record_for_the_gathering_ops():
    ops = np.array([int(o) for o in Op])
    got = opstats.total_bytes(ops, np.full(len(ops), 100), np.full(len(ops), 8))
    assert got.tolist() == [800.0 if o in opstats._TOTAL_IS_N_TIMES else 100.0 for o in Op]
