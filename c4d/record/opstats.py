"""nccl-tests' bandwidth formulas (docs/design.md), vectorised: ``algbw = S / t`` with S the
operation's total data size, ``busbw = algbw × factor(op, n)``.

The wait / transfer split itself is the engine's (c4d/engine/reduce.py ``reduce_group``, handed
out as OP_SPLIT rows): the metrics, the report and ``ops_split`` all read it from there.
"""

from __future__ import annotations

import numpy as np

from c4d.record.schema import Op

# nccl-tests' bus bandwidth factor (docs/design.md): scale x (n - 1) / n for these ops (n ranks
# in the communicator), 1 for the others (Broadcast, Reduce, Send, Recv)
_BUS_SCALE = {Op.AllReduce: 2.0, Op.AllGather: 1.0, Op.ReduceScatter: 1.0, Op.AlltoAll: 1.0,
              Op.Gather: 1.0, Op.Scatter: 1.0}  # fmt: skip
# ops whose record bytes are one rank's share of a total that is n times larger (nccl-tests' "size")
_TOTAL_IS_N_TIMES = {Op.AllGather, Op.ReduceScatter, Op.Gather, Op.Scatter}

# both by op code, looked up in one pass (not a pass per op kind)
_SCALE = np.zeros(256)
_SCALE[[int(k) for k in _BUS_SCALE]] = list(_BUS_SCALE.values())
_N_TIMES = np.zeros(256, bool)
_N_TIMES[[int(k) for k in _TOTAL_IS_N_TIMES]] = True


def _by_code(table: np.ndarray, op: np.ndarray) -> np.ndarray:
    """``table[op]``, 0 (False) for a code outside the table."""
    code = np.asarray(op).astype(np.intp)
    ok = (code >= 0) & (code < len(table))
    return np.where(ok, table[np.where(ok, code, 0)], table.dtype.type(0))


def busbw_factor(op: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Vectorised nccl-tests factor for arrays of op kinds and communicator sizes."""
    scale = _by_code(_SCALE, op)
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    out = np.where(scale > 0, scale * (n - 1) / n, 1.0)
    return np.broadcast_to(out, np.broadcast(scale, n).shape).astype(float)


def total_bytes(op: np.ndarray, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests' size S of the operation from a record's per-rank bytes."""
    mult = np.where(_by_code(_N_TIMES, op), np.asarray(n, dtype=float), 1.0)
    return np.asarray(nbytes, dtype=float) * mult
