"""Link localization from per-peer progress (PEER records: NCCL profiler ProxyOp/ProxyStep).

A ring (or tree) collective moves data over directed links ``src -> dst``; each end reports
its side: the sender's ``(comm_rank=src, peer=dst, direction=0)`` and the receiver's
``(comm_rank=dst, peer=src, direction=1)``. A link's progress is the smaller of the two
sides' ``steps_done / steps_total``.

* Hang: when a transfer stops, the stuck link(s) have the least progress; downstream links
  still moved what was buffered. The *stalled* links are those at the minimum. Two or more
  stalled links that share one rank name that rank (its transfers stopped); a single link
  (or its two directions) names the link. If every link is equally stalled, progress does
  not discriminate and the caller falls back.
* Slow: over a window, each link's own step rate (``link_rates``: bytes of a step over
  the step's own move time, separated from the pace every link of a ring shares); links
  below ``link_ratio`` x their baseline (earlier clean windows) are slow, and are reduced
  to a rank or link the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from c4d.engine.state import Comm

SEND_WAIT, RECV_WAIT = 9, 10


@dataclass
class PeerVerdict:
    ranks: tuple[int, ...]  # comm ranks: one (rank) or two (link)
    is_link: bool
    confidence: float
    evidence: dict = field(default_factory=dict)


def _links(rows: np.ndarray, value: np.ndarray) -> dict[tuple[int, int], float]:
    """Directed link -> min over the two ends of ``value`` (rows already one per end)."""
    src = np.where(rows["direction"] == 0, rows["comm_rank"], rows["peer"]).astype(int)
    dst = np.where(rows["direction"] == 0, rows["peer"], rows["comm_rank"]).astype(int)
    out: dict[tuple[int, int], float] = {}
    for s, d, v in zip(src.tolist(), dst.tolist(), value.tolist(), strict=True):
        k = (s, d)
        out[k] = min(out.get(k, v), v)
    return out


def _ring_gaps(links: dict[tuple[int, int], float], rows: np.ndarray, n: int) -> None:
    """Fill in the silent ends of a ring (i -> i+1): a source that reports only finished
    transfers says nothing about a stuck one. If every reported transfer is a ring edge,
    a ring edge whose sender or receiver reported *other* transfers of this op but not
    this one has made no progress there (0)."""
    if n < 3 or not links or any(d != (s + 1) % n for s, d in links):
        return
    cols = zip(rows["comm_rank"].tolist(), rows["peer"].tolist(), rows["direction"].tolist(), strict=True)
    sides = set(cols)
    reporters = {int(r) for r in rows["comm_rank"]}
    for s in range(n):
        d = (s + 1) % n
        send_known, recv_known = (s, d, 0) in sides, (d, s, 1) in sides
        if (s in reporters and not send_known) or (d in reporters and not recv_known):
            links[(s, d)] = 0.0


def _reduce(stalled: list[tuple[int, int]]) -> tuple[tuple[int, ...], bool, float] | None:
    """Stalled links -> (comm ranks, is_link, confidence), or None when they do not agree."""
    ends = [set(link) for link in stalled]
    pairs = {frozenset(link) for link in stalled}
    if len(pairs) == 1:
        a, b = sorted(next(iter(pairs)))
        return (a, b), True, 0.85
    common = set.intersection(*ends)
    if len(common) == 1:
        return (next(iter(common)),), False, 0.9
    counts: dict[int, int] = {}
    for e in ends:
        for r in e:
            counts[r] = counts.get(r, 0) + 1
    best = max(counts.values())
    top = sorted(r for r, c in counts.items() if c == best)
    if best >= 2 and len(top) == 1:
        return (top[0],), False, 0.6
    return None


def _latest(rows: np.ndarray) -> np.ndarray:
    """Latest row per (comm_rank, peer, direction)."""
    order = np.lexsort((rows["time_ns"], rows["direction"], rows["peer"], rows["comm_rank"]))
    r = rows[order]
    key = np.stack([r["comm_rank"], r["peer"], r["direction"].astype(np.int32)], axis=1)
    last = np.r_[(key[1:] != key[:-1]).any(axis=1), True]
    return r[last]


def localize_hang(c: Comm, seq: int) -> tuple[PeerVerdict | None, list[int]]:
    """Stuck link/rank of (C, seq) from PEER progress; also the comm ranks with no PEER evidence."""
    tab = c.peer_table()
    rows = tab[tab["seq"].astype(np.int64) == seq] if len(tab) else tab
    members = c.members().tolist()
    if not len(rows):
        return None, members
    rows = _latest(rows)
    reported = set(rows["comm_rank"].tolist())
    missing = [m for m in members if m not in reported]
    tot = rows["steps_total"].astype(float)
    frac = np.where(tot > 0, rows["steps_done"] / np.maximum(tot, 1), rows["done"].astype(float))
    frac = np.where(rows["done"] > 0, 1.0, frac)
    links = _links(rows, frac)
    _ring_gaps(links, rows, c.n)
    if len(links) < 2:
        return None, missing
    pmin = min(links.values())
    stalled = sorted(k for k, v in links.items() if v <= pmin + 1e-9)
    if len(stalled) == len(links):
        return None, missing
    red = _reduce(stalled)
    if red is None:
        return None, missing
    ranks, is_link, conf = red
    others = [v for k, v in links.items() if k not in stalled]
    if missing:
        conf *= 0.8
    waits = {
        f"{int(r['comm_rank'])}->{int(r['peer'])}": ("SendWait" if r["state"] == SEND_WAIT else "RecvWait")
        for r in rows
        if int(r["state"]) in (SEND_WAIT, RECV_WAIT)
        and (int(r["comm_rank"]), int(r["peer"])) in {s for s in stalled} | {(b, a) for a, b in stalled}
    }
    ev = {
        "stalled_links": [f"{a}->{b}" for a, b in stalled],
        "stalled_progress": round(pmin, 3),
        "other_links_median_progress": round(float(np.median(others)), 3),
        "wait_states": waits,
    }
    return PeerVerdict(ranks, is_link, round(conf, 2), ev), missing


def link_rates(c: Comm, seqs: np.ndarray) -> dict[tuple[int, int], float]:
    """Per directed link: median bytes/ns of one step's own move time over the finished
    transfers of ``seqs``.

    Every link's steps start at the pace of the slowest one (step s at t0 + s·pace), so a
    transfer's ``last - first`` is ``(nsteps - 1)·pace + move``: the slowest transfer of an
    op gives the pace (its move is the pace) and every other one its own move time. A link
    whose own steps got slower shows a lower rate; one that is merely paced by another
    does not.
    """
    tab = c.peer_table()
    if not len(tab) or not len(seqs):
        return {}
    rows = tab[np.isin(tab["seq"].astype(np.int64), seqs) & (tab["done"] > 0) & (tab["steps_total"] > 0)]
    if len(rows) < 2:
        return {}
    rows = _latest_per_op(rows)
    d = (rows["last_ns"].astype(np.int64) - rows["first_ns"].astype(np.int64)).astype(float)
    nst = rows["steps_total"].astype(float)
    ok = d > 0
    rows, d, nst = rows[ok], d[ok], nst[ok]
    if len(rows) < 2:
        return {}
    _, inv = np.unique(rows["seq"], return_inverse=True)
    inv = inv.ravel()
    pace = np.zeros(inv.max() + 1)
    np.maximum.at(pace, inv, d / nst)
    p = pace[inv]
    move = np.clip(d - (nst - 1) * p, 0.02 * p, None)
    rate = rows["bytes_done"].astype(float) / nst / move
    src = np.where(rows["direction"] == 0, rows["comm_rank"], rows["peer"]).astype(np.int64)
    dst = np.where(rows["direction"] == 0, rows["peer"], rows["comm_rank"]).astype(np.int64)
    key = src * (c.n + 1) + dst
    uk, kinv = np.unique(key, return_inverse=True)
    kinv = kinv.ravel()
    order = np.argsort(kinv, kind="stable")
    cuts = np.flatnonzero(np.diff(kinv[order])) + 1
    meds = [float(np.median(part)) for part in np.split(rate[order], cuts)]
    return {(int(k // (c.n + 1)), int(k % (c.n + 1))): m for k, m in zip(uk.tolist(), meds, strict=True)}


def _latest_per_op(rows: np.ndarray) -> np.ndarray:
    order = np.lexsort((rows["time_ns"], rows["direction"], rows["peer"], rows["comm_rank"], rows["seq"]))
    r = rows[order]
    key = np.stack(
        [r["seq"].astype(np.int64), r["comm_rank"], r["peer"], r["direction"].astype(np.int64)], axis=1
    )
    last = np.r_[(key[1:] != key[:-1]).any(axis=1), True]
    return r[last]


def localize_slow(
    rates: dict[tuple[int, int], float], baseline: dict[tuple[int, int], float], link_ratio: float
) -> PeerVerdict | None:
    """Slow link/rank: links whose step rate fell below ``link_ratio`` x their own baseline
    (or, for links without one, x the median link of this window)."""
    if len(rates) < 2:
        return None
    ref_all = float(np.median(list(rates.values())))
    slow = []
    for k, v in sorted(rates.items()):
        ref = baseline.get(k, ref_all)
        if v < link_ratio * ref:
            slow.append(k)
    if not slow or len(slow) == len(rates):
        return None
    red = _reduce(slow)
    if red is None:
        return None
    ranks, is_link, conf = red
    ev = {
        "slow_links": [f"{a}->{b}" for a, b in slow],
        "slow_link_rate_gbs": round(min(rates[k] for k in slow), 4),
        "link_baseline_gbs": round(float(np.median([baseline.get(k, ref_all) for k in slow])), 4),
    }
    return PeerVerdict(ranks, is_link, round(conf * 0.95, 2), ev)
