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


# the same as lookup tables by op code: factor = _SCALE[op] * (n - 1) / n, or 1.0 where 0
_SCALE = np.zeros(256)
_SCALE[int(Op.AllReduce)] = 2.0
for _k in (Op.AllGather, Op.ReduceScatter, Op.AlltoAll, Op.Gather, Op.Scatter):
    _SCALE[int(_k)] = 1.0
_N_TIMES = np.zeros(256, bool)
_N_TIMES[[int(k) for k in _TOTAL_IS_N_TIMES]] = True


def busbw_factor(op: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Vectorised nccl-tests factor for arrays of op kinds and communicator sizes (_FACTORS,
    looked up: a pass per op kind was 1% of the master at 16,384 ranks through agents)."""
    code = np.asarray(op).astype(np.intp)
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    ok = (code >= 0) & (code < 256)
    scale = np.where(ok, _SCALE[np.where(ok, code, 0)], 0.0)
    out = np.where(scale > 0, scale * (n - 1) / n, 1.0)  # evaluated as _FACTORS do: bit for bit
    return np.broadcast_to(out, np.broadcast(code, n).shape).astype(float)


def total_bytes(op: np.ndarray, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests' size S of the operation from a record's per-rank bytes."""
    code = np.asarray(op).astype(np.intp)
    ok = (code >= 0) & (code < 256)
    times = np.where(ok, _N_TIMES[np.where(ok, code, 0)], False)
    mult = np.where(times, np.asarray(n, dtype=float), 1.0)
    return np.asarray(nbytes, dtype=float) * mult
