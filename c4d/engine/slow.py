"""Slow kinds, judged per check window (C4D_CONN_BW_CHECK_PERIOD) from complete collectives.

Each complete op (C, k) was reduced (state.Comm._reduce) to: last arrival L (aligned),
margin = L - next-to-last arrival, the last arriver's compute gap before the op and the
others' median gap, transfer = median end - L, and busbw. Window w holds the ops whose L
falls in [w·P, (w+1)·P) (master clock); it is judged ``slow_grace_ms`` after it closed.

RankNonCommSlow (per comm, then merged per rank): op (C, k) is *late because of r* when r
arrived last with ``margin >= max(slow_arrival_min_ms, slow_arrival_rel x others' gap)`` and
r's own gap exceeds the others' by ``slow_own_share`` of the margin (r computed longer; a
rank that is late only because its previous op ended late — a victim waiting elsewhere —
has a normal gap). r is reported when it is late in ``slow_last_frac`` of C's ops (at least
``slow_min_ops``).

RankCommSlow (per comm): the median busbw of C's most frequent (op, bytes) in the window,
against its siblings, the other communicators with the same op, size, rank count and node
span in the same window (at least two), else against C's own baseline, the median of up
to ``slow_baseline_windows`` earlier windows that were not slow. Slow when below
``slow_bw_ratio`` of that reference. A slowdown every sibling shares is not a rank's.
Localized by PEER link rates (peer.localize_slow), else by cross-comm evidence (the one
rank the slow communicators have in common), else every member is a suspect.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from c4d.engine.config import EngineConfig, ResolvedThresholds
from c4d.engine.peer import link_rates, localize_slow
from c4d.engine.state import COMPLETED, Comm, RankTable
from c4d.engine.types import DiagKind


@dataclass
class SlowFinding:
    kind: DiagKind
    comm: Comm
    op: int
    seq: int
    ranks: tuple[int, ...]
    localized: bool
    detail: dict = field(default_factory=dict)


class SlowJudge:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.next_window: int | None = None
        self.baseline: dict[tuple[int, int, int], deque[float]] = {}
        self.link_base: dict[tuple[int, int, int], deque[float]] = {}  # (comm idx, src, dst) -> window rates
        self.slow_ranks: dict[int, int] = {}  # global rank -> last window it was reported slow in
        self.late_ops = 0  # ops that completed after their window was judged

    def judge(
        self, ranks: RankTable, comms: list[Comm], th: ResolvedThresholds, now: int
    ) -> list[SlowFinding]:
        P = th.period_ns
        closed = (now - int(self.cfg.slow_grace_ms * 1e6)) // P - 1  # last window that may be judged
        per_comm: dict[int, np.ndarray] = {}
        lo = None
        for c in comms:
            if not c.pending:
                continue
            ops = np.concatenate(c.pending) if len(c.pending) > 1 else c.pending[0]
            win = ops["last_arrive"] // P
            keep = win > closed
            c.pending = [ops[keep]] if keep.any() else []
            ops, win = ops[~keep], win[~keep]
            if self.next_window is not None:
                late = win < self.next_window
                self.late_ops += int(late.sum())
                ops = ops[~late]
            ops = ops[ops["aligned"]]  # reduced before the members' clocks were known
            if len(ops):
                per_comm[c.idx] = ops
                w0 = int((ops["last_arrive"] // P).min())
                lo = w0 if lo is None else min(lo, w0)
        out: list[SlowFinding] = []
        if per_comm and lo is not None:
            wins = np.unique(np.concatenate([o["last_arrive"] // P for o in per_comm.values()]))
            for w in wins.tolist():
                sel = {i: o[o["last_arrive"] // P == w] for i, o in per_comm.items()}
                sel = {i: o for i, o in sel.items() if len(o)}
                out += self._window(ranks, comms, sel, int(w), P)
        if closed >= (self.next_window if self.next_window is not None else closed):
            self.next_window = int(closed) + 1
        return out

    # -- one window --------------------------------------------------------------------
    def _window(self, ranks: RankTable, comms: list[Comm], sel: dict[int, np.ndarray], w: int, P: int):
        cfg = self.cfg
        win = {"window_start_s": round(w * P / 1e9, 3), "window_s": round(P / 1e9, 3)}
        out: list[SlowFinding] = []

        # RankNonCommSlow
        late_by: dict[int, list[tuple[Comm, float, np.ndarray]]] = {}
        for i, o in sel.items():
            c = comms[i]
            if c.n < 2 or len(o) < cfg.slow_min_ops:
                continue
            gap_o = o["gap_others"]
            need = np.maximum(cfg.slow_arrival_min_ms * 1e6, cfg.slow_arrival_rel * np.nan_to_num(gap_o))
            own = o["gap_last"] - gap_o
            late = (
                (o["margin"] >= need)
                & (o["gap_last"] >= 0)
                & ~np.isnan(gap_o)
                & (own >= cfg.slow_own_share * o["margin"])
            )
            if not late.any():
                continue
            counts = np.bincount(o["last"][late], minlength=c.n)
            r = int(counts.argmax())
            share = counts[r] / len(o)
            if share >= cfg.slow_last_frac and c.grank[r] >= 0:
                mine = o[late & (o["last"] == r)]
                late_by.setdefault(int(c.grank[r]), []).append((c, float(share), mine))
        for g, items in sorted(late_by.items()):
            items.sort(key=lambda x: (-x[1], x[0].idx))
            c, share, mine = items[0]
            margins = np.concatenate([m["margin"] for _, _, m in items])
            d = {
                "localized_by": "arrival",
                "localized": True,
                "confidence": round(min(0.95, share), 2),
                "suspects": [g],
                "last_share": round(share, 3),
                "margin_ms": round(float(np.median(margins)) / 1e6, 3),
                "others_wait_ms": round(float(np.median(mine["wait_med"])) / 1e6, 3),
                "comms": [f"{x.id:016x}" for x, _, _ in items],
                **win,
            }
            self.slow_ranks[g] = w
            out.append(
                SlowFinding(DiagKind.RankNonCommSlow, c, int(np.bincount(mine["op"]).argmax()),
                            int(mine["seq"][-1]), (g,), True, d)
            )  # fmt: skip

        # RankCommSlow
        stats: dict[int, tuple[int, int, float, np.ndarray]] = {}
        for i, o in sel.items():
            if comms[i].n < 2:
                continue
            o = o[np.isfinite(o["busbw"])]  # an end before the last arrival is timer noise
            if len(o) < cfg.slow_min_ops:
                continue
            keys = o["op"].astype(np.int64) * (1 << 48) + o["bytes"]
            uk, cnt = np.unique(keys, return_counts=True)
            kmain = uk[cnt.argmax()]
            om = o[keys == kmain]
            if len(om) < cfg.slow_min_ops:
                continue
            stats[i] = (int(om["op"][0]), int(om["bytes"][0]), float(np.median(om["busbw"])), om)
        sib: dict[tuple, list[tuple[int, float]]] = {}
        for i, (op, nb, bw, _) in stats.items():
            c = comms[i]
            span = len(set(ranks.node[c.grank[c.grank >= 0]].tolist()))
            sib.setdefault((op, nb, c.n, span), []).append((i, bw))
        slow: dict[int, dict] = {}
        for (op, nb, _, _), members in sib.items():
            for i, bw in members:
                base_q = self.baseline.get((i, op, nb))
                own = float(np.median(base_q)) if base_q else None
                others = [b for j, b in members if j != i]
                sref = float(np.median(others)) if len(others) >= 2 else None
                r_own = bw / own if own else None
                r_sib = bw / sref if sref else None
                # With siblings, only a slowdown they do not share is this communicator's
                # (a shift all of them share is the network's or the host's, not a rank's).
                ratio = r_sib if r_sib is not None else r_own
                is_slow = ratio is not None and ratio < cfg.slow_bw_ratio
                if is_slow:
                    slow[i] = {
                        "busbw_gbs": round(bw, 6),
                        "baseline_gbs": None if own is None else round(own, 6),
                        "siblings_gbs": None if sref is None else round(sref, 6),
                        "ratio": round(ratio, 3),
                        "compared_with": "siblings" if r_sib is not None else "own baseline",
                    }
                else:
                    q = self.baseline.setdefault((i, op, nb), deque(maxlen=cfg.slow_baseline_windows))
                    q.append(bw)
                    for (a, b), v in link_rates(comms[i], stats[i][3]["seq"]).items():
                        lq = self.link_base.setdefault((i, a, b), deque(maxlen=cfg.slow_baseline_windows))
                        lq.append(v)
        if slow:
            count: dict[int, int] = {}
            for i in slow:
                c = comms[i]
                for g in set(c.grank[c.grank >= 0].tolist()):
                    count[g] = count.get(g, 0) + 1
            groups: dict[tuple, list[tuple[int, dict]]] = {}
            for i in sorted(slow):
                c = comms[i]
                op, nb, bw, om = stats[i]
                d = dict(slow[i])
                rates = link_rates(c, om["seq"])
                base = {
                    k: float(np.median(self.link_base[(i, *k)])) for k in rates if (i, *k) in self.link_base
                }
                v = localize_slow(rates, base, cfg.slow_link_ratio)
                members_g = sorted(int(g) for g in c.grank if g >= 0)
                if v is not None:
                    culprit = tuple(int(c.grank[r]) for r in v.ranks)
                    d.update(
                        localized_by="peer-progress", localized=True, confidence=v.confidence, **v.evidence
                    )
                    if v.is_link:
                        d["link"] = list(culprit)
                else:
                    multi = sorted(g for g in members_g if count.get(g, 0) > 1)
                    if len(multi) in (1, 2) and len(slow) > 1:
                        culprit = tuple(multi)
                        d.update(localized_by="cross-comm", localized=True, confidence=0.6)
                        if len(multi) == 2:
                            d["link"] = list(culprit)
                    else:
                        culprit = tuple(members_g)
                        d.update(localized_by="heartbeat", localized=False,
                                 confidence=round(1 / max(len(members_g), 1), 2))  # fmt: skip
                d["suspects"] = list(culprit)
                groups.setdefault(culprit if d["localized"] else ("comm", i), []).append((i, d))
            for _key, items in groups.items():
                i, d = min(items, key=lambda x: (x[1]["ratio"], x[0]))
                c = comms[i]
                op, nb, bw, om = stats[i]
                d = {**d, "comms": [f"{comms[j].id:016x}" for j, _ in items], **win}
                culprit = tuple(d["suspects"])
                for g in culprit if d["localized"] else ():
                    self.slow_ranks[g] = w
                out.append(
                    SlowFinding(DiagKind.RankCommSlow, c, op, int(om["seq"][-1]), culprit, d["localized"], d)
                )
        return out


__all__ = ["COMPLETED", "SlowFinding", "SlowJudge"]
