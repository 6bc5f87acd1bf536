"""Per-op derived quantities shared by the report, the pandas API and the live view.

Wait vs transfer: a collective's kernel time mixes waiting for peers with moving bytes.
For op (C, k) with arrivals ``start_r`` (device start, clock-aligned) the last arrival
is ``L = max_r start_r``; rank r waited ``L - start_r`` and the transfer took
``end_r - L``. Bus bandwidth follows nccl-tests (PERFORMANCE.md): ``algbw = S / t``
with S the operation's total data size, ``busbw = algbw × factor(op, n)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from c4d.schema import Op, OpFlag

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


def split_wait_transfer(ops: pd.DataFrame, offsets_ns: dict[int, int] | None = None) -> pd.DataFrame:
    """Add arrival/wait/transfer/busbw columns to an ops frame (one row per rank and op).

    ``offsets_ns`` (rank → clock offset to subtract) aligns ranks' clocks first. Columns added:
    ``arrive_ns`` (aligned start), ``last_arrive_ns``, ``wait_ns``, ``transfer_ns``, ``lateness_ns``
    (arrival minus the op's median arrival), ``algbw_gbs``, ``busbw_gbs``. Ops without device
    timing, and p2p ops (paired, not collective), get NaN waits.
    """
    df = ops.copy()
    if df.empty:
        for c in (
            "arrive_ns",
            "last_arrive_ns",
            "wait_ns",
            "transfer_ns",
            "lateness_ns",
            "algbw_gbs",
            "busbw_gbs",
        ):
            df[c] = pd.Series(dtype=float)
        return df
    off = df["rank"].map(offsets_ns or {}).fillna(0).astype("int64") if offsets_ns else 0
    timed = (df["start_ns"] > 0) & (df["end_ns"] > 0)
    start = (df["start_ns"].astype("int64") - off).where(timed)
    end = (df["end_ns"].astype("int64") - off).where(timed)
    df["arrive_ns"] = start
    coll = (df["flags"].astype(int) & int(OpFlag.P2P)) == 0
    key = [df["comm_id"], df["seq"].where(coll, -1 - df.index.to_series())]
    last = start.groupby(key).transform("max")
    med = start.groupby(key).transform("median")
    df["last_arrive_ns"] = last.where(coll)
    df["wait_ns"] = (last - start).where(coll)
    df["transfer_ns"] = (end - last).where(coll, end - start)
    df["lateness_ns"] = (start - med).where(coll)
    for c in ("arrive_ns", "last_arrive_ns", "wait_ns", "transfer_ns", "lateness_ns"):
        df[c] = df[c].astype("float64")  # NaN = unknown; documented as float ns
    n = df["comm_nranks"].to_numpy()
    size = total_bytes(df["op"].to_numpy(), df["bytes"].to_numpy(), n)
    t = df["transfer_ns"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(t > 0, size / t, np.nan)  # bytes/ns = GB/s
    df["algbw_gbs"] = algbw
    df["busbw_gbs"] = algbw * busbw_factor(df["op"].to_numpy(), n)
    return df
