"""nccl-tests' bandwidth formulas (PERFORMANCE.md), vectorised: ``algbw = S / t`` with S the
operation's total data size, ``busbw = algbw × factor(op, n)``.

The wait / transfer split itself is the engine's (c4d/engine/state.py ``Comm._reduce``, handed
out as OP_SPLIT rows): the metrics, the report and ``ops_split`` all read it from there.
"""

from __future__ import annotations

import numpy as np

from c4d.schema import Op

# nccl-tests' bus bandwidth factors as a function of n (ranks in the communicator)
_FACTORS = {
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
# ops whose record bytes are one rank's share of a total that is n times larger (nccl-tests' "size")
_TOTAL_IS_N_TIMES = {Op.AllGather, Op.ReduceScatter, Op.Gather, Op.Scatter}


def busbw_factor(op: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Vectorised nccl-tests factor for arrays of op kinds and communicator sizes."""
    op = np.asarray(op)
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    out = np.ones(np.broadcast(op, n).shape, dtype=float)
    for kind, f in _FACTORS.items():
        sel = op == int(kind)
        if sel.any():
            out[sel] = f(n[sel] if n.shape else n)
    return out


def total_bytes(op: np.ndarray, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests' size S of the operation from a record's per-rank bytes."""
    op = np.asarray(op)
    mult = np.where(np.isin(op, [int(k) for k in _TOTAL_IS_N_TIMES]), np.asarray(n, dtype=float), 1.0)
    return np.asarray(nbytes, dtype=float) * mult
