"""The live view's snapshot (``Engine.state``): each rank's state and each communicator's
recent pace, read from the engine's memory without changing it."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import NamedTuple

import numpy as np

from c4d.engine.comm import Comm
from c4d.engine.config import ResolvedThresholds
from c4d.engine.pool import RATE_WINDOW_NS, Pool
from c4d.engine.ranks import RankTable
from c4d.engine.types import CommSnapshot, DiagKind, Diagnosis, EngineSnapshot, RankState


class StatePart(NamedTuple):
    """What the live view reads of one set of communicators (an engine shard's, or all of one
    engine's): the ranks blocked in them and each one's snapshot, by communicator index."""

    blocked: dict[int, RankState]  # global rank -> waiting, or in_collective (everyone arrived)
    comms: list[tuple[int, CommSnapshot]]


def state_part(
    comms: Mapping[int, Comm], pool: Pool, ranks: RankTable, now: int, comms_ever: int
) -> StatePart:
    """``comms_ever``: communicator indices handed out so far (the rate log's width)."""
    blocked: dict[int, RankState] = {}
    waiting, _ = pool.busy()
    for c in (comms[i] for i in waiting.tolist() if i in comms):
        done = c.done_eff()
        arr = np.maximum(c.n_arrived, done)
        live = c.hb_seen & ~c.gone & (c.grank >= 0)
        for cr in np.flatnonzero(live & (arr > done)).tolist():
            k = done[cr]
            everyone = bool((arr[c.members()] > k).all())
            g = int(c.grank[cr])
            if blocked.get(g) is not RankState.waiting:
                blocked[g] = RankState.in_collective if everyone else RankState.waiting
    # OP rows per communicator over the last RATE_WINDOW_NS of master time (the rate)
    rows = pool.rate.since(now - RATE_WINDOW_NS, comms_ever)
    world = int(ranks.seen.sum())
    return StatePart(blocked, [(i, comm_snapshot(c, rows, world, now)) for i, c in comms.items()])


def engine_snapshot(
    ranks: RankTable,
    parts: list[StatePart],
    slow_ranks: Mapping[int, int],
    active: Mapping[Hashable, Diagnosis],
    th: ResolvedThresholds,
    now: int,
) -> EngineSnapshot:
    """The live view's snapshot from the communicators' parts (``state_part``: one, or an
    engine shard's each). ``slow_ranks``: global rank -> the last slow window it was named in
    (SlowJudge); ``active``: each live hang's latest diagnosis (emission.py)."""
    R = ranks
    seen = np.flatnonzero(R.seen[: R.n]).tolist()
    states: dict[int, RankState] = {g: RankState.computing for g in seen}
    for part in parts:
        for g, st in part.blocked.items():
            if states.get(g) is not RankState.waiting:
                states[g] = st
    period_w = (now // th.period_ns) if th.period_ns else 0
    for g, w in slow_ranks.items():
        if w >= period_w - 2 and g in states:
            states[g] = RankState.slow
    for d in active.values():
        if d.kind is not DiagKind.RankLost:
            for g in d.ranks if d.localized else ():
                states[g] = RankState.hung
    silence = R.prev_tick_ns - R.last_recv  # see Engine.tick
    for g in seen:
        if R.final[g]:
            states[g] = RankState.done
        elif silence[g] > th.lost_after_ns + R.delivery_lag_ns:
            states[g] = RankState.lost
    comms = sorted((c for part in parts for c in part.comms), key=lambda c: c[0])
    return EngineSnapshot(
        time_ns=now,
        rank_states=states,
        rank_nodes={g: R.node_name(g) for g in seen},
        comms=tuple(c for _, c in comms),
        offsets_ms={g: round(R.offset(g) / 1e6, 3) for g in seen},
        active=tuple(active[k] for k in sorted(active, key=repr)),
    )


def comm_snapshot(c: Comm, rows_since: np.ndarray, world: int, now: int) -> CommSnapshot:
    """``rows_since``: OP rows per communicator index over the rate window; ``world``: ranks
    seen."""
    members = np.sort(c.grank[c.grank >= 0])
    # Megatron layout: TP groups are consecutive ranks, DP groups strided, PP is p2p
    if c.has_p2p and not c.has_coll:
        kind = "PP"
    elif len(members) > 1 and len(members) == world:
        kind = "WORLD"
    elif len(members) > 1 and (np.diff(members) == 1).all():
        kind = "TP"
    else:
        kind = "DP"
    ops = c.recent_ops()
    # ops finished per second over the last RATE_WINDOW_NS of master time (OP rows received:
    # one per member for a collective, two per p2p transfer), so a hang reads 0
    rows = int(rows_since[c.idx])
    first = c.first_done_ns if c.first_done_ns is not None else now
    span = max(min(RATE_WINDOW_NS, now - first), 1_000_000_000)
    per_op = 2 if kind == "PP" else max(c.n, 1)
    rate = rows / per_op / (span / 1e9)
    p2p = c.recent_transfers() if kind == "PP" else None
    if p2p is not None and len(p2p):
        xfer = p2p["transfer"] / 1e3
        xm, xp = float(np.median(xfer)), float(np.percentile(xfer, 99))
        wm = wp = 0.0
        bw = float(np.median(p2p["bytes"] / np.maximum(p2p["transfer"], 1)))
    elif len(ops) >= 2:
        wait = ops["wait_max"] / 1e3
        xfer = ops["transfer"] / 1e3
        wm, wp = float(np.median(wait)), float(np.percentile(wait, 99))
        xm, xp = float(np.median(xfer)), float(np.percentile(xfer, 99))
        fin = ops["busbw"][np.isfinite(ops["busbw"])]
        bw = float(np.median(fin)) if len(fin) else 0.0
    else:
        wm = wp = xm = xp = bw = 0.0
    return CommSnapshot(
        comm=f"{c.id:016x}",
        kind=kind,
        nranks=c.n,
        last_done_seq=int(c.done_eff().min()) - 1,  # over every member, finalized ones too
        ops_per_s=round(rate, 2),
        wait_med_us=round(wm, 1),
        wait_p99_us=round(wp, 1),
        xfer_med_us=round(xm, 1),
        xfer_p99_us=round(xp, 1),
        busbw_gbs=round(bw, 4),
        p2p_done=c.p2p_rows // 2,
    )
