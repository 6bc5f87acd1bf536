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
* Slow: a ring goes at the pace of its slowest link, which finishes its steps last
  (``pace_setters``). In a communicator already found slow, the link that sets the pace in
  most of the window's ops is the slow link; two links of one rank taking turns, the rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from c4d.engine.comm import Comm

if TYPE_CHECKING:
    from c4d.engine.wait_view import WaitView

SEND_WAIT, RECV_WAIT = 9, 10


class PeerTable(Protocol):
    """What the slow judge's link evidence reads of a communicator: its PEER rows (a ``Comm``,
    or the rows a shard took for the judge: slow.take_windows)."""

    def peer_table(self) -> np.ndarray: ...


def _links(rows: np.ndarray, value: np.ndarray) -> dict[tuple[int, int], float]:
    """Directed link -> min over the two ends of ``value`` (rows already one per end)."""
    src = np.where(rows["direction"] == 0, rows["comm_rank"], rows["peer"]).astype(int)
    dst = np.where(rows["direction"] == 0, rows["peer"], rows["comm_rank"]).astype(int)
    out: dict[tuple[int, int], float] = {}
    for s, d, v in zip(src.tolist(), dst.tolist(), value.tolist(), strict=True):
        k = (s, d)
        out[k] = min(out.get(k, v), v)
    return out


def _ring_gaps(links: dict[tuple[int, int], float], rows: np.ndarray, n: int, visible: set) -> None:
    """Fill in the silent ends of a ring (i -> i+1) that NCCL would report (``visible``: across
    nodes): a source that reports only finished transfers says nothing about a stuck one. If
    every reported transfer is a ring edge, a visible ring edge whose sender or receiver
    reported *other* transfers of this op but not this one has made no progress there (0). A
    transfer inside a node is never reported: its absence is not evidence."""
    if n < 3 or not links or any(d != (s + 1) % n for s, d in links):
        return
    cols = zip(rows["comm_rank"].tolist(), rows["peer"].tolist(), rows["direction"].tolist(), strict=True)
    sides = set(cols)
    reporters = {int(r) for r in rows["comm_rank"]}
    for s in range(n):
        d = (s + 1) % n
        if (s, d) in links or (s, d) not in visible:
            continue
        send_known, recv_known = (s, d, 0) in sides, (d, s, 1) in sides
        if (s in reporters and not send_known) or (d in reporters and not recv_known):
            links[(s, d)] = 0.0


def starved_segment(
    progress: dict[tuple[int, int], float], ring: list[tuple[int, int]], observed: set[tuple[int, int]]
) -> tuple[tuple[int, int], list[tuple[int, int]]] | None:
    """Where a ring stopped when its least-progressed observed link still moved some steps.

    A ring's link forwards what the link before it moved, so the links after a stopped one
    move one step more per hop and then wait for data (``SendGPUWait``): the least-progressed
    observed link, if it moved at all, is starved by a stop upstream, among the unobserved
    links (inside a node) between it and the previous observed link. Returns that link and
    those unobserved links (directed, in ring order), or None (it moved nothing: it is the
    stopped one; or no unobserved link precedes it). ``ring``: the directed ring edges in order.
    """
    seen = {k: v for k, v in progress.items() if k in observed}
    if not seen or len(ring) < 3:
        return None
    pmin = min(seen.values())
    if not 0.0 < pmin < 1.0:
        return None
    low = [k for k in ring if k in seen and seen[k] <= pmin + 1e-9]
    if len(low) != 1:
        return None
    i = ring.index(low[0])
    seg: list[tuple[int, int]] = []
    for j in range(1, len(ring)):
        e = ring[(i - j) % len(ring)]
        if e in observed:
            break
        seg.append(e)
    return (low[0], seg[::-1]) if seg else None


@dataclass
class HangLinks:
    """Per-link transfer progress of a stuck collective (comm ranks), for the evidence model."""

    progress: dict[tuple[int, int], float] = field(default_factory=dict)
    """Directed link -> share of its steps done (1: done), reported or filled in (_ring_gaps)."""
    stalled: list[tuple[int, int]] = field(default_factory=list)
    """The links at the least progress, when some link made more."""
    missing: list[int] = field(default_factory=list)
    """Members that reported no transfer of the op."""
    evidence: dict[str, Any] = field(default_factory=dict)


def hang_links(c: Comm | WaitView, seq: int, visible: set[tuple[int, int]]) -> HangLinks:
    """Transfer progress of (C, seq) from PEER records; ``visible``: the directed ring links NCCL
    reports (across nodes)."""
    tab = c.peer_table()
    rows = tab[tab["seq"].astype(np.int64) == seq] if len(tab) else tab
    members = c.members().tolist()
    if not len(rows):
        return HangLinks(missing=members)
    rows = _latest(rows)
    reported = set(rows["comm_rank"].tolist())
    missing = [m for m in members if m not in reported]
    tot = rows["steps_total"].astype(float)
    frac = np.where(tot > 0, rows["steps_done"] / np.maximum(tot, 1), rows["done"].astype(float))
    frac = np.where(rows["done"] > 0, 1.0, frac)
    links = _links(rows, frac)
    _ring_gaps(links, rows, c.n, visible)
    out = HangLinks(links, [], missing)
    if not links:
        return out
    pmin = min(links.values())
    stalled = sorted(k for k, v in links.items() if v <= pmin + 1e-9)
    if len(stalled) < len(links) and pmin < 1.0:
        out.stalled = stalled
    pairs = set(stalled) | {(b, a) for a, b in stalled}
    waits = {
        f"{int(r['comm_rank'])}->{int(r['peer'])}": ("SendWait" if r["state"] == SEND_WAIT else "RecvWait")
        for r in rows
        if int(r["state"]) in (SEND_WAIT, RECV_WAIT) and (int(r["comm_rank"]), int(r["peer"])) in pairs
    }
    others = [v for k, v in links.items() if k not in stalled]
    out.evidence = {
        "stalled_links": [f"{a}->{b}" for a, b in out.stalled],
        "stalled_progress": round(pmin, 3),
        "other_links_median_progress": round(float(np.median(others)), 3) if others else None,
        "wait_states": waits,
    }
    return out


def _latest(rows: np.ndarray) -> np.ndarray:
    """Latest row per (comm_rank, peer, direction)."""
    order = np.lexsort((rows["time_ns"], rows["direction"], rows["peer"], rows["comm_rank"]))
    r = rows[order]
    key = np.stack([r["comm_rank"], r["peer"], r["direction"].astype(np.int32)], axis=1)
    last = np.r_[(key[1:] != key[:-1]).any(axis=1), True]
    return r[last]


def pace_setters(
    c: PeerTable, seqs: np.ndarray
) -> tuple[dict[tuple[int, int], int], int, set[tuple[int, int]]]:
    """Per directed link, in how many of the finished ops ``seqs`` it set the ring's pace.

    The slowest link's own transfer is the slowest: where the sender reports it (``wire_ns``,
    NCCL's SendWait -> step stop, summed over its steps), the longest per-step transfer time
    of the op sets the pace. Without it (an older shim, or a sender that reported none), a
    ring's steps go at the pace of its slowest link (step s starts at t0 + s·pace on every
    link), so the slowest link is the one that finishes its steps last: the longest
    ``last_ns - first_ns`` of the op's transfers, reported by both of its ends. That one
    needs no clock across ranks, but a link's own move time is a small difference of large
    numbers in it. Returns the counts, the number of ops that had PEER rows and every
    directed link seen in them.
    """
    rows = _finished(c, seqs)
    rows = rows[rows["steps_total"] > 0]
    if len(rows) < 2:
        return {}, 0, set()
    rows = _latest_per_op(rows)
    s_all = np.where(rows["direction"] == 0, rows["comm_rank"], rows["peer"]).astype(np.int64)
    d_all = np.where(rows["direction"] == 0, rows["peer"], rows["comm_rank"]).astype(np.int64)
    seen = set(zip(s_all.tolist(), d_all.tolist(), strict=True))
    send = rows["direction"] == 0
    if send.sum() >= 2 and (rows["wire_ns"][send] > 0).all():
        rows = rows[send]
        d = (rows["wire_ns"] // np.maximum(rows["steps_done"], 1)).astype(np.int64)
    else:
        d = rows["last_ns"].astype(np.int64) - rows["first_ns"].astype(np.int64)
    seq = rows["seq"].astype(np.int64)
    useq, inv = np.unique(seq, return_inverse=True)
    inv = inv.ravel()
    longest = np.zeros(len(useq), np.int64)
    np.maximum.at(longest, inv, d)
    # ties within 1 % share the count: a rank's two slowed links are equally slow
    top = rows[d >= longest[inv] - longest[inv] // 100]
    src = np.where(top["direction"] == 0, top["comm_rank"], top["peer"]).astype(np.int64)
    dst = np.where(top["direction"] == 0, top["peer"], top["comm_rank"]).astype(np.int64)
    key = np.unique(np.stack([top["seq"].astype(np.int64), src, dst], axis=1), axis=0)  # once per op
    counts: dict[tuple[int, int], int] = {}
    for a, b in key[:, 1:].tolist():
        counts[(a, b)] = counts.get((a, b), 0) + 1
    return counts, len(useq), seen


def link_wire(c: PeerTable, seqs: np.ndarray) -> dict[tuple[int, int], tuple[float, int]]:
    """Per directed link (comm ranks) over the finished ops ``seqs``: the median time its sender
    took per step on the wire (``wire_ns`` / steps: SendWait -> step stop, the link's own pace,
    not the ring's) and the number of ops it was measured in; links whose sender reported no
    wire time are left out."""
    rows = _finished(c, seqs)
    rows = rows[(rows["steps_done"] > 0) & (rows["direction"] == 0) & (rows["wire_ns"] > 0)]
    if not len(rows):
        return {}
    rows = _latest_per_op(rows)
    per_step = rows["wire_ns"].astype(np.float64) / rows["steps_done"]
    key = rows["comm_rank"].astype(np.int64) * (1 << 32) + rows["peer"].astype(np.int64)
    out: dict[tuple[int, int], tuple[float, int]] = {}
    for k in np.unique(key).tolist():
        m = key == k
        out[(k >> 32, k & 0xFFFFFFFF)] = (float(np.median(per_step[m])), int(m.sum()))
    return out


def _finished(c: PeerTable, seqs: np.ndarray) -> np.ndarray:
    """The PEER rows of ``c`` that finished a transfer of one of the ops ``seqs``."""
    tab = c.peer_table()
    if not len(tab) or not len(seqs):
        return tab[:0]
    return tab[np.isin(tab["seq"].astype(np.int64), seqs) & (tab["done"] > 0)]


def _latest_per_op(rows: np.ndarray) -> np.ndarray:
    order = np.lexsort((rows["time_ns"], rows["direction"], rows["peer"], rows["comm_rank"], rows["seq"]))
    r = rows[order]
    key = np.stack(
        [r["seq"].astype(np.int64), r["comm_rank"], r["peer"], r["direction"].astype(np.int64)], axis=1
    )
    last = np.r_[(key[1:] != key[:-1]).any(axis=1), True]
    return r[last]


def global_links(ev: dict, c: Comm | WaitView) -> dict:
    """PEER evidence names links by comm rank ("3->4"); the user reads global ranks."""

    def g(link: str) -> str:
        a, b = link.split("->")
        return f"{int(c.grank[int(a)])}->{int(c.grank[int(b)])}"

    out = dict(ev)
    for k in ("slow_links", "stalled_links"):
        if k in out:
            out[k] = [g(x) for x in out[k]]
    for k in ("pace_share", "wait_states"):
        if k in out:
            out[k] = {g(x): v for x, v in out[k].items()}
    return out
