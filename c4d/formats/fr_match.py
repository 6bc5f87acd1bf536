"""Flight Recorder dumps matched across ranks: what the entries say beyond "pending".

A dump set holds every member's record of every op of a process group, keyed by (group, seq),
so it can be checked the way torch's ``fr_trace`` does, with cause told from consequence by the
engine's replay. ``check`` runs inside the import (``fr_convert.convert``) on the op
columns; what it finds goes two ways:

* into the records: an entry that some member of its group never issued cannot have completed,
  whatever its ``state`` / ``retired`` says (gloo marks every entry retired once the job caught
  the timeout). Those ops are made pending, so the engine's replay sees the hang and names the
  member that never issued (or the wait cycle);
* as findings in ``meta["fr"]["findings"]``, which ``amend`` turns into diagnoses after the
  replay (``c4d.analyze.replay`` calls it for Flight Recorder imports):

  - ``mismatch``: members of (group, seq) disagree on the collective type, element count or
    dtype -> CollectiveMismatch naming the minority rank(s), what differs and each side's
    values; the engine's diagnoses of that op (its hang, or its own live check's mismatch) become
    this one (same times, levels and hang counts: one incident), and a mismatch that did not
    stall is reported once, WARNING, as the live check does;
  - ``lost``: a member without a dump while its group's other members wait in an op -> RankLost
    ("no dump and absent from every pending op");
  - ``slow``: without device timing, a rank that issues most ops of each of its groups last by
    a clear margin (``time_created_ns``) -> RankNonCommSlow. A rank that is last only in the
    groups it enters after waiting for a slow peer (a blocking backend) is not named.

Every diagnosis of an FR import says which evidence decided, in ``detail["evidence"]``
("match", "pending" or "timing") and in its localization's evidence line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from c4d.record import schema
from c4d.util.sorted_lookup import find_sorted

Op = schema.Op

# counts that must agree between members (per-rank sizes differ legitimately in all_to_all,
# gather and scatter)
_SIZED = frozenset(int(o) for o in (Op.AllReduce, Op.Broadcast, Op.Reduce, Op.AllGather, Op.ReduceScatter))
MAX_FINDINGS = 64  # per kind: a run of mismatches after the first is one bug, not 10,000 findings
SLOW_MIN_OPS = 5  # complete ops a group needs before lateness in it says anything
SLOW_SHARE = 0.6  # "most ops": the share a rank must be last in, by a clear margin
SLOW_MIN_MARGIN_NS = 10_000_000  # a clear margin: 10 ms and twice the spread of the others
# How often each evidence's own finding named exactly the culprit, (findings, right), measured by
# ``python analysis/calibrate_fr.py --jobs 40 --seed 2`` (its docstring says which jobs and faults:
# random synthetic dumps of every case, pending and retired, and the real gloo dumps). The
# confidence stated is the Wilson lower bound of that share (z 1.28), as c4d/engine/calibration.py
# does for the live engine: "match" a disagreement's minority (CollectiveMismatch), "pending" a rank
# without a dump that pending ops wait for (RankLost), "stopped" one without a dump where nothing is
# pending (a lost rank and a dump that was not collected look alike), "timing" a late issuer.
MEASURED: dict[str, tuple[int, int]] = {
    "match": (218, 218),
    "pending": (41, 41),
    "timing": (82, 82),
    "stopped": (81, 41),
}


def confidence(evidence: str) -> float:
    """The calibrated confidence of an FR finding (see MEASURED)."""
    from c4d.engine.calibration import wilson_lower

    n, right = MEASURED[evidence]
    return round(wilson_lower(right, n), 2)


@dataclass
class Comms:
    """The import's process groups: comm id, name and member ranks per comm index."""

    ids: np.ndarray
    names: list[str]
    members: list[list[int]]


@dataclass
class Result:
    """What ``check`` found; ``done`` is the ops' corrected done column."""

    done: np.ndarray
    findings: list[dict[str, Any]] = field(default_factory=list)
    unissued_ops: int = 0


def check(
    *,
    comms: Comms,
    cidx: np.ndarray,
    rank: np.ndarray,
    seq: np.ndarray,
    kind: np.ndarray,
    count: np.ndarray,
    dtype: np.ndarray,
    dtype_names: Sequence[str],
    issue: np.ndarray,
    done: np.ndarray,
    dump_ranks: Sequence[int],
    unknown_ranks: set[tuple[int, int]],
    timed_ranks: set[int],
) -> Result:
    """Cross-rank match of the collective ops (one row per rank × op; ``cidx`` indexes ``comms``).

    ``unknown_ranks``: (rank, comm index) whose issued count is not known (a wrapped ring buffer
    without entries of that group); ``timed_ranks``: ranks whose dumps have device start times.
    """
    done = done.copy()
    res = Result(done=done)
    n = len(seq)
    ncomm = len(comms.names)
    dumped = set(int(r) for r in dump_ranks)
    # -- issued count per (rank, comm): highest seq + 1
    key = rank.astype(np.int64) * max(ncomm, 1) + cidx
    ukey, _, inv = schema.unique_runs(key)  # a rank's ops of one group come in runs
    hi = np.full(len(ukey), -1, np.int64)
    np.maximum.at(hi, inv, seq)
    issued = {
        (int(k) // max(ncomm, 1), int(k) % max(ncomm, 1)): int(h) + 1 for k, h in zip(ukey, hi, strict=True)
    }
    min_issued = np.full(max(ncomm, 1), np.iinfo(np.int64).max, np.int64)
    for ci, mem in enumerate(comms.members):
        for r in mem:
            if r in dumped and (r, ci) not in unknown_ranks:
                min_issued[ci] = min(min_issued[ci], issued.get((r, ci), 0))

    # -- an op some dumped member never issued cannot have completed
    if n:
        unissued = seq >= min_issued[cidx]
        claimed = unissued & done
        res.unissued_ops = int(claimed.sum())
        done[unissued] = False
        for ci, s in _pairs(cidx[claimed], seq[claimed])[:MAX_FINDINGS]:
            mem = comms.members[ci]
            never = [
                r for r in mem if r in dumped and (r, ci) not in unknown_ranks and issued.get((r, ci), 0) <= s
            ]
            rows = np.flatnonzero((cidx == ci) & (seq == s))
            res.findings.append(
                {
                    "kind": "unissued",
                    "comm": int(comms.ids[ci]),
                    "group": comms.names[ci],
                    "seq": int(s),
                    "op": _op_name(int(kind[rows[0]])),
                    "never_issued": never,
                    "issued_by": sorted(int(r) for r in rank[rows]),
                    "marked_done_by": sorted(int(r) for r in rank[rows[claimed[rows]]]),
                }
            )

    # -- members of (group, seq) that disagree
    if n:
        order = np.lexsort((rank, seq, cidx))
        c_s, s_s = cidx[order], seq[order]
        heads = np.flatnonzero(np.r_[True, (c_s[1:] != c_s[:-1]) | (s_s[1:] != s_s[:-1])])
        differs = np.zeros(len(heads), bool)
        for col in (kind, count, dtype):
            v = col[order]
            differs |= np.minimum.reduceat(v, heads) != np.maximum.reduceat(v, heads)
        ends = np.r_[heads[1:], len(order)]
        for h in np.flatnonzero(differs)[:MAX_FINDINGS].tolist():
            rows = order[heads[h] : ends[h]]
            f = _mismatch(
                comms, int(cidx[rows[0]]), int(seq[rows[0]]), rows, rank, kind, count, dtype, dtype_names
            )
            if f is not None:
                res.findings.append(f)

    # -- members with no dump that their group's pending op waits for
    lost: dict[int, list[dict[str, Any]]] = {}
    for ci, mem in enumerate(comms.members):
        absent = [r for r in mem if r not in dumped]
        if not absent or len(absent) == len(mem):
            continue
        rows = np.flatnonzero((cidx == ci) & ~done)
        if not len(rows):
            continue
        s = int(seq[rows].min())
        waiting = sorted(int(r) for r in rank[rows[seq[rows] == s]])
        for r in absent:
            lost.setdefault(r, []).append(
                {"comm": int(comms.ids[ci]), "group": comms.names[ci], "seq": s,
                 "op": _op_name(int(kind[rows[seq[rows] == s][0]])), "waiting": waiting}
            )  # fmt: skip
    stopped = _stopped_at(comms, cidx, rank, seq, kind, dumped, lost)
    for r, waits in sorted(lost.items())[:MAX_FINDINGS]:
        res.findings.append({"kind": "lost", "rank": r, "waits": waits, "pending": True})
    for r, waits in sorted(stopped.items())[:MAX_FINDINGS]:
        res.findings.append({"kind": "lost", "rank": r, "waits": waits, "pending": False})

    # -- lateness from issue times, where no member has device timing
    res.findings.extend(_slow(comms, cidx, rank, seq, issue, dumped, timed_ranks))
    return res


def p2p_unissued(
    *,
    comms: Comms,
    cidx: np.ndarray,
    rank: np.ndarray,
    recv: np.ndarray,
    peer: np.ndarray,
    seq: np.ndarray,
    counted: set[int],
) -> np.ndarray:
    """Per p2p op (one row per rank's send or recv; ``peer`` its group rank, ``seq`` its count per
    rank, group, direction and peer): True where the peer's dump holds fewer of the matching side,
    so this one cannot have completed. Only between ``counted`` ranks (a dump that counts every p2p
    op of the job: its ring buffer never wrapped)."""
    n = len(seq)
    out = np.zeros(n, bool)
    if not n:
        return out
    # the peer's global rank, per distinct (group, peer) pair
    pair = cidx.astype(np.int64) * (1 << 20) + (peer.astype(np.int64) + 1)
    upair, pinv = np.unique(pair, return_inverse=True)
    glob = np.array(
        [_member(comms.members[int(u) >> 20], int(u & ((1 << 20) - 1)) - 1) for u in upair.tolist()], np.int64
    )
    other = glob[pinv.ravel()]
    width = max(int(rank.max(initial=0)), int(other.max(initial=0))) + 2
    ncomm = max(len(comms.names), 1)

    def key(a: np.ndarray, d: np.ndarray, b: np.ndarray) -> np.ndarray:
        return ((a.astype(np.int64) * ncomm + cidx) * 2 + d) * width + (b + 1)

    d = recv.astype(np.int64)
    mine = key(rank, d, other)
    ukey, inv = np.unique(mine, return_inverse=True)
    issued = np.zeros(len(ukey), np.int64)
    np.maximum.at(issued, inv.ravel(), seq.astype(np.int64) + 1)
    theirs = key(other, 1 - d, rank.astype(np.int64))
    at, hit = find_sorted(ukey, theirs)
    got = np.where(hit, issued[at], 0)
    ok = np.isin(rank, list(counted)) & np.isin(other, list(counted))
    return ok & (seq >= got)


def _member(members: list[int], i: int) -> int:
    return members[i] if 0 <= i < len(members) else -1


def _stopped_at(
    comms: Comms,
    cidx: np.ndarray,
    rank: np.ndarray,
    seq: np.ndarray,
    kind: np.ndarray,
    dumped: set[int],
    lost: dict[int, list[dict[str, Any]]],
) -> dict[int, list[dict[str, Any]]]:
    """Members without a dump where nothing is pending but every dumped rank's last entry is the
    same op of one of their groups: the job stopped there (a dump written after the error was
    caught marks it retired, done or failed alike) and they left no dump."""
    if not len(seq):
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    for ci, mem in enumerate(comms.members):
        absent = [r for r in mem if r not in dumped and r not in lost]
        present = [r for r in mem if r in dumped]
        if not absent or not present:
            continue
        rows = np.flatnonzero(cidx == ci)
        if not len(rows):
            continue
        s = int(seq[rows].max())
        at = rows[seq[rows] == s]
        if sorted(int(r) for r in rank[at]) != present:
            continue
        for r in absent:
            out.setdefault(r, []).append(
                {"comm": int(comms.ids[ci]), "group": comms.names[ci], "seq": s,
                 "op": _op_name(int(kind[at[0]])), "waiting": present}
            )  # fmt: skip
    return out


def _pairs(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
    if not len(a):
        return []
    u = np.unique(np.stack([a.astype(np.int64), b.astype(np.int64)], axis=1), axis=0)
    return [(int(x), int(y)) for x, y in u]


def _op_name(k: int) -> str:
    try:
        return Op(k).name
    except ValueError:
        return "?"


def _mismatch(
    comms: Comms,
    ci: int,
    s: int,
    rows: np.ndarray,
    rank: np.ndarray,
    kind: np.ndarray,
    count: np.ndarray,
    dtype: np.ndarray,
    dtype_names: Sequence[str],
) -> dict[str, Any] | None:
    """One (group, seq) whose members disagree: what differs, each side's values, the minority."""
    sig = {}
    for i in rows.tolist():
        k = int(kind[i])
        sig[int(rank[i])] = (
            _op_name(k),
            int(count[i]) if k in _SIZED else None,
            dtype_names[int(dtype[i])] or None,
        )
    what = [w for j, w in enumerate(("op", "count", "dtype")) if len({v[j] for v in sig.values()}) > 1]
    if not what:
        return None  # only per-rank sizes that may differ (all_to_all, gather, scatter)
    sides: dict[tuple[Any, ...], list[int]] = {}
    for r, v in sorted(sig.items()):
        sides.setdefault(v, []).append(r)
    by_size = sorted(sides.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    majority = by_size[0][1] if len(by_size) == 1 or len(by_size[0][1]) > len(by_size[1][1]) else []
    culprits = sorted(r for r in sig if r not in majority)
    return {
        "kind": "mismatch",
        "comm": int(comms.ids[ci]),
        "group": comms.names[ci],
        "seq": s,
        "what": what,
        "ranks": culprits,
        "localized": bool(majority),
        "sides": [{"ranks": rs, "op": v[0], "count": v[1], "dtype": v[2]} for v, rs in by_size],
    }


def _slow(
    comms: Comms,
    cidx: np.ndarray,
    rank: np.ndarray,
    seq: np.ndarray,
    issue: np.ndarray,
    dumped: set[int],
    timed: set[int],
) -> list[dict[str, Any]]:
    """Ranks that issue most ops of every group they are in last, by a clear margin."""
    per_rank: dict[int, dict[int, dict[str, Any]]] = {}  # rank -> comm index -> its lateness there
    for ci, mem in enumerate(comms.members):
        m = len(mem)
        if m < 2 or any(r not in dumped or r in timed for r in mem):
            continue
        rows = np.flatnonzero(cidx == ci)
        if len(rows) < m * SLOW_MIN_OPS:
            continue
        rows = rows[np.argsort(seq[rows])]  # each op's rows together (in any order: see below)
        s = seq[rows]
        size = np.diff(np.flatnonzero(np.r_[True, s[1:] != s[:-1], True]))
        rows = rows[np.repeat(size == m, size)]  # the ops every member issued
        nops = len(rows) // m
        if nops < SLOW_MIN_OPS:
            continue
        t = issue[rows].astype(np.int64).reshape(nops, m)
        # the latest issue, the one before it and the earliest: a tie for the latest is no margin,
        # so which of the tied ranks counts as last never matters
        top = np.partition(t, m - 2, axis=1)
        margin = top[:, -1] - top[:, -2]
        spread = top[:, -2] - t.min(axis=1)
        clear = (margin >= SLOW_MIN_MARGIN_NS) & (margin >= 2 * spread)
        last = rank[rows].reshape(nops, m)[np.arange(nops), t.argmax(axis=1)][clear]
        late = margin[clear]
        for r in mem:
            mine = late[last == r] if len(last) else late
            per_rank.setdefault(r, {})[ci] = {
                "share": float(len(mine)) / nops,
                "ops": nops,
                "median_margin_ms": round(float(np.median(mine)) / 1e6, 3) if len(mine) else 0.0,
            }
    out = []
    for r, by in sorted(per_rank.items()):
        if by and all(v["share"] >= SLOW_SHARE for v in by.values()):
            ci = max(by, key=lambda c: (by[c]["share"], by[c]["ops"]))
            out.append(
                {
                    "kind": "slow",
                    "rank": r,
                    "comm": int(comms.ids[ci]),
                    "group": comms.names[ci],
                    "groups": {comms.names[c]: v for c, v in by.items()},
                    **by[ci],
                }
            )
    return out[:MAX_FINDINGS]


# ------------------------------------------------------------------------------------------ amend
def amend(rt: Any, diags: list[Any]) -> list[Any]:
    """The replay's diagnoses of an FR import with the findings of ``check`` merged in."""
    from c4d.engine.types import DiagKind, Level

    fr = rt.meta.get("fr") or {}
    findings = fr.get("findings")
    if findings is None:
        return diags
    imp = rt.meta.get("import") or {}
    ticks = imp.get("final_ticks_ns") or [int(imp.get("t_end_ns", 0))]
    mism = {(f["comm"], f["seq"]): f for f in findings if f["kind"] == "mismatch"}
    unissued = {(f["comm"], f["seq"]): f for f in findings if f["kind"] == "unissued"}
    lost_at: dict[tuple[int, int], dict[str, Any]] = {}
    for f in findings:
        if f["kind"] == "lost":
            for w in f["waits"]:
                lost_at.setdefault((w["comm"], w["seq"]), {"ranks": [], "waits": [], "pending": f["pending"]})
                lost_at[(w["comm"], w["seq"])]["ranks"].append(f["rank"])
                lost_at[(w["comm"], w["seq"])]["waits"].append(w)
    hangs = {DiagKind.RankNonCommHang, DiagKind.RankCommHang, DiagKind.CollectiveMismatch}
    out: list[Any] = []
    used_m: set[tuple[int, int]] = set()
    used_l: set[tuple[int, int]] = set()
    for d in diags:
        key = (d.comm, d.seq)
        if d.kind in hangs and key in mism:
            used_m.add(key)
            out.append(_mismatch_diag(mism[key], d.time_ns, d.level, d.hang_times, d))
        elif d.kind in hangs and key in lost_at:
            used_l.add(key)
            out.append(_lost_diag(lost_at[key], key, d.time_ns, d.level, d.hang_times, d))
        elif d.kind in hangs:
            ev = "match" if key in unissued or _cycle_unissued(d, unissued) else "pending"
            out.append(_with_evidence(d, ev, unissued.get(key)))
        else:
            out.append(d)
    for key, f in mism.items():
        if key not in used_m:
            out.append(_mismatch_diag(f, ticks[0], Level.WARNING, 0, None))  # as the live check
    for key, f in lost_at.items():
        if key not in used_l:
            level = Level.ERROR if f["pending"] else Level.WARNING
            out.append(_lost_diag(f, key, ticks[-1], level, len(ticks) - 1 if f["pending"] else 0, None))
    for f in findings:
        if f["kind"] == "slow":
            out.append(_slow_diag(f, ticks[0]))
    out.sort(key=lambda d: d.time_ns)
    return out


def _cycle_unissued(d: Any, unissued: dict[tuple[int, int], Any]) -> bool:
    return any((m.never_entered.comm, m.never_entered.seq) in unissued for m in d.localization.cycle)


def _with_evidence(d: Any, evidence: str, f: dict[str, Any] | None) -> Any:
    loc = d.localization
    if evidence == "match":
        line = (
            "match: an op some member never issued cannot have completed, whatever its entries' state says; "
        )
    else:
        line = "pending: the dumps' pending entries; "
    detail = {**d.detail, "evidence": evidence}
    if f is not None:
        detail["never_issued"] = f["never_issued"]
        detail["marked_done_by"] = f["marked_done_by"]
    return dataclasses.replace(
        d, localization=dataclasses.replace(loc, evidence=line + loc.evidence), detail=detail
    )


def _nodes(d: Any, n: int) -> tuple[str, ...]:
    return tuple(d.nodes[:n]) if d is not None and len(d.nodes) >= n else ("?",) * n


def _mismatch_diag(f: dict[str, Any], t: int, level: Any, n: int, d: Any) -> Any:
    from c4d.engine.types import DiagKind, Diagnosis, How, Localization, Target

    ranks = tuple(f["ranks"])
    sides = "; ".join(
        f"ranks {s['ranks']}: "
        + ", ".join(f"{w}={s[w]}" for w in ("op", "count", "dtype") if s[w] is not None)
        for s in f["sides"]
    )
    ev = f"match: members of group {f['group']!r} op #{f['seq']} disagree on {', '.join(f['what'])} ({sides})"
    loc = Localization(
        how=How.match,
        target=Target.rank if f["localized"] else Target.suspects,
        ranks=ranks,
        confidence=confidence("match") if f["localized"] else 0.0,
        basis="fr-match/rank" if f["localized"] else "fr-match/suspects",
        evidence=ev,
    )
    detail: dict[str, Any] = {
        "evidence": "match",
        "what": f["what"],
        "sides": f["sides"],
        "group": f["group"],
    }
    if d is not None:
        detail["stalled_as"] = d.kind.value
        for k in ("waited_s", "victims", "waiting_ranks"):
            if k in d.detail:
                detail[k] = d.detail[k]
    op = "/".join(dict.fromkeys(s["op"] for s in f["sides"]))
    return Diagnosis(
        t,
        level,
        DiagKind.CollectiveMismatch,
        f["comm"],
        op,
        f["seq"],
        ranks,
        _nodes(d, len(ranks)),
        n,
        loc,
        detail,
    )


def _lost_diag(f: dict[str, Any], key: tuple[int, int], t: int, level: Any, n: int, d: Any) -> Any:
    from c4d.engine.types import DiagKind, Diagnosis, How, Localization, Target

    ranks = tuple(sorted(set(f["ranks"])))
    w = f["waits"][0]
    if f["pending"]:
        ev = (
            f"pending: ranks {_fmt(ranks)} left no dump and are absent from every pending op, while ranks "
            f"{_fmt(w['waiting'])} wait in {w['op']} #{w['seq']} of group {w['group']!r}"
        )
        how, conf, basis = "pending", confidence("pending"), "fr-pending/lost"
    else:
        ev = (
            f"match: ranks {_fmt(ranks)} left no dump; the last op of every other member of group "
            f"{w['group']!r} is {w['op']} #{w['seq']}, marked retired (the dumps cannot tell a completed "
            "op from a failed one)"
        )
        how, conf, basis = "match", confidence("stopped"), "fr-match/lost"
    loc = Localization(How.arrival, Target.rank, ranks, conf, basis, ev)
    detail = {"evidence": how, "no_dump": True, "waiting_ranks": w["waiting"], "group": w["group"]}
    if d is not None and "waited_s" in d.detail:
        detail["waited_s"] = d.detail["waited_s"]
    return Diagnosis(
        t, level, DiagKind.RankLost, key[0], w["op"], key[1], ranks, _nodes(d, len(ranks)), n, loc, detail
    )


def _slow_diag(f: dict[str, Any], t: int) -> Any:
    from c4d.engine.types import DiagKind, Diagnosis, How, Level, Localization, Target

    r = f["rank"]
    ev = (
        f"timing: rank {r} issued {f['share']:.0%} of the {f['ops']} complete ops of group {f['group']!r} "
        f"last (time_created_ns), by {f['median_margin_ms']:.1f} ms (median); most ops of its every group"
    )
    loc = Localization(How.arrival, Target.rank, (r,), confidence("timing"), "fr-timing/rank", ev)
    detail = {
        "evidence": "timing",
        "groups": f["groups"],
        "share": f["share"],
        "median_margin_ms": f["median_margin_ms"],
    }
    return Diagnosis(
        t, Level.INFO, DiagKind.RankNonCommSlow, f["comm"], None, None, (r,), ("?",), 0, loc, detail
    )


def _fmt(rs: Sequence[int]) -> str:
    rs = list(rs)
    return str(rs) if len(rs) <= 16 else f"{rs[:16]}… ({len(rs)})"
