"""`c4d report`: the pictures operators look at before they read.

Four PNGs (matplotlib, Agg) and one self-contained HTML page that embeds them:
per-rank extra compute before each collective over time, collective time split into wait and
transfer, bus bandwidth by message size against the median per size, and the incident
timeline. The page lists one row per incident (c4d/engine/incidents.py, as `c4d analyze` prints them):
the engine re-reports a hang every T, and those re-counts are one incident with its count.

The lateness picture uses each rank's *compute gap* (its arrival at a collective minus the end
of its own previous op, one clock, no alignment needed) against the median gap of the op's
members: a rank that computes longer is red, and the ranks that merely arrive late because they
waited for it elsewhere (its pipeline partners, say) are not — the same distinction the engine
draws for RankNonCommSlow (docs/engine.md). A rank that never arrives (a RankNonCommHang
culprit) has no op to measure: from the start of the wait to its last report its cells hold the
wait so far, and the time axis runs that far, so the hung rank is the red row however short the
job ran before it.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from c4d.engine.incidents import COLUMNS, Incident
from c4d.engine.types import Diagnosis
from c4d.record import schema
from c4d.util.stacks_view import html_section, load_sidecar

LEVEL_COLOR = {"ERROR": "#c0392b", "WARNING": "#e67e22", "INFO": "#2980b9"}
DPI = 110


@dataclass
class ReportInput:
    ops: pd.DataFrame  # ops with the wait/transfer split
    nodes: dict[int, str]
    diagnoses: list[dict[str, Any]]  # Diagnosis.to_json() objects
    title: str
    stacks: list[dict[str, Any]] = field(default_factory=list)  # hung ranks' stacks kept by c4d run
    incidents: list[Incident] = field(default_factory=list)  # the diagnoses folded, first seen first
    start_s: float | None = None  # when the trace was started (the table's "first seen" is since then)
    stats: ReportStats | None = None  # what the pictures draw (from ``ops`` unless given: from_stream)
    n_ops: int | None = None  # op records (``len(ops)`` unless given)

    def __post_init__(self) -> None:
        if self.stats is None:
            self.stats = ReportStats(keep=None)
            self.stats.add(self.ops)
        if self.n_ops is None:
            self.n_ops = len(self.ops)


def from_trace(tr: Any, diagnoses: list[Diagnosis] | None = None) -> ReportInput:
    """Report input from a ``c4d.analyze.load``-ed trace: its ops with the engine's wait/transfer
    split, its diagnoses (the replay's, unless given) and their incidents."""
    from c4d.offline import analyze

    if diagnoses is None:
        diagnoses = tr.diagnoses_list()
    return ReportInput(
        ops=tr.ops_split,
        nodes=tr.nodes,
        diagnoses=[d.to_json() for d in diagnoses],
        title=Path(tr.raw.path).name or "trace",
        stacks=load_sidecar(tr.raw.path) if tr.raw.path else [],
        incidents=analyze.incidents(tr.raw, diagnoses),
        start_s=analyze.start_s(tr.raw),
    )


KEEP_ROWS = 100_000  # op rows a streamed report holds before it keeps histograms instead
_STAT_COLUMNS = ("rank", "comm_id", "seq", "op", "bytes", "arrive_ns", "compute_ns", "wait_ns",
                 "transfer_ns", "busbw_gbs")  # fmt: skip


class LogHist:
    """Counts per key in log-spaced bins (``per_decade`` a decade from ``lo``, 12 decades; the
    last cell counts values at or below zero): quantiles within half a bin (about 3.7% at 32 per
    decade), in memory that grows with the keys, not the values."""

    DECADES = 12

    def __init__(self, lo: float, per_decade: int = 32):
        self.lo, self.per_decade = lo, per_decade
        self.nb = self.DECADES * per_decade
        self.keys: dict[Any, int] = {}
        self.counts = np.zeros((0, self.nb + 1), np.int32)  # 16,384 ranks x 385: 25 MiB

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        ok = ~np.isnan(values)
        keys, values = keys[ok], values[ok]
        if not len(values):
            return
        uniq, inv = np.unique(keys, return_inverse=True)
        ids = np.array([self.keys.setdefault(k, len(self.keys)) for k in uniq.tolist()], np.int64)
        inv = inv.ravel()
        if len(self.keys) > len(self.counts):
            grow = np.zeros((max(len(self.keys), 2 * len(self.counts)), self.nb + 1), np.int32)
            grow[: len(self.counts)] = self.counts
            self.counts = grow
        pos = values > 0
        b = np.floor(np.log10(np.maximum(values, self.lo) / self.lo) * self.per_decade)
        b = np.where(pos, np.clip(b, 0, self.nb - 1), self.nb).astype(np.int64)
        # counted per key present (a temporary of those keys' rows, not of every key's)
        flat = np.bincount(inv * (self.nb + 1) + b, minlength=len(uniq) * (self.nb + 1))
        self.counts[ids] += flat.reshape(len(uniq), self.nb + 1).astype(np.int32)

    def quantile(self, key: Any, q: float) -> float:
        """numpy's linear interpolation between order statistics, each its bin's middle (0 for the
        zero cell)."""
        i = self.keys.get(key)
        if i is None:
            return math.nan
        h = self.counts[i]
        n = int(h.sum(dtype=np.int64))
        if not n:
            return math.nan
        mid = np.r_[0.0, self.lo * 10 ** ((np.arange(self.nb) + 0.5) / self.per_decade)]
        cum = np.cumsum(np.r_[h[-1], h[:-1]].astype(np.int64))  # the zero cell first: the smallest

        def order_stat(k: int) -> float:
            return float(mid[np.searchsorted(cum, k + 1)])

        pos = q * (n - 1)
        lo = math.floor(pos)
        a = order_stat(lo)
        return a + (pos - lo) * (order_stat(min(lo + 1, n - 1)) - a)


class ReportStats:
    """What the pictures draw, accumulated from the engine's split rows (``add``: ``ops_split``
    rows, or ``add_split``: OP_SPLIT arrays as the engine hands them out), each add holding
    every member row of its ops.

    Exact while at most ``keep`` rows came (None: always): then the pictures are drawn from the
    rows themselves. Past that the rows are folded as they come, into what the pictures need and
    no more: each rank's extra compute per time cell (the cells double in width to stay between
    ``bins`` and twice that), each rank's wait and transfer as a log histogram (medians within
    4%), each op's bus bandwidth as a sample of at most ``max_points`` dots per op kind and a
    log histogram per op kind and size (medians within 2%). Memory then grows with ranks, op
    kinds and sizes, not with the trace."""

    def __init__(self, keep: int | None = KEEP_ROWS, bins: int = 60, max_points: int = 20_000):
        self.keep, self.bins, self.max_points = keep, bins, max_points
        self.folded = False
        self.rows = 0
        self.max_buffered = 0  # most rows held unfolded at once (the bound the tests check)
        self._buf: list[pd.DataFrame] = []
        self._n = 0
        self._origin = 0.0
        self._w = 1e-3  # cell width (s)
        self._lat = pd.DataFrame({"rank": [], "cell": [], "sum": [], "n": []})
        self._wait = LogHist(1.0)  # ns
        self._xfer = LogHist(1.0)
        self._bw = LogHist(1e-6, per_decade=64)  # GB/s, by (op, bytes)
        self._pts: dict[int, pd.DataFrame] = {}
        self._p: dict[int, float] = {}
        self._rng = np.random.default_rng(0)

    def add_split(self, split: np.ndarray) -> None:
        self.add(pd.DataFrame({c: split[c] for c in _STAT_COLUMNS}))

    def add(self, rows: pd.DataFrame) -> None:
        if not len(rows):
            return
        rows = rows[[c for c in _STAT_COLUMNS if c in rows]]
        self.rows += len(rows)
        self._buf.append(rows)
        self._n += len(rows)
        self.max_buffered = max(self.max_buffered, self._n)
        if self.keep is not None and self._n > self.keep:
            self._fold()

    def frame(self) -> pd.DataFrame:
        """The rows (unfolded), op_name added."""
        if self.folded:
            raise ValueError("the rows were folded into histograms (more than `keep`)")
        if not self._buf:
            df = pd.DataFrame({c: pd.Series(dtype="float64") for c in _STAT_COLUMNS})
        else:
            df = pd.concat(self._buf, ignore_index=True) if len(self._buf) > 1 else self._buf[0]
            self._buf = [df]
        return df.assign(op_name=pd.Series(schema.OP_NAMES[df["op"].to_numpy().astype(int)], index=df.index))

    def _fold(self) -> None:
        df = pd.concat(self._buf, ignore_index=True)
        self._buf, self._n = [], 0
        if not self.folded:
            ok = df["arrive_ns"].notna()
            self._origin = math.floor(float(df.loc[ok, "arrive_ns"].min()) / 1e9) if ok.any() else 0.0
            self.folded = True
        # lateness: extra compute per (rank, cell)
        ex = extra_compute(df)
        if len(ex):
            cell = np.floor((ex["arrive_s"].to_numpy() - self._origin) / self._w).astype(np.int64)
            new = pd.DataFrame({"rank": ex["rank"].to_numpy(), "cell": cell, "sum": ex["extra_ms"].to_numpy(),
                                "n": 1})  # fmt: skip
            lat = pd.concat([self._lat, new], ignore_index=True)
            while len(lat) and lat["cell"].max() - lat["cell"].min() + 1 > 2 * self.bins:
                self._w *= 2
                lat["cell"] = lat["cell"] // 2
            self._lat = lat.groupby(["rank", "cell"], as_index=False)[["sum", "n"]].sum()
        # wait and transfer per rank (rows with a wait, as the exact picture takes them)
        w = df[df["wait_ns"].notna()]
        r = w["rank"].to_numpy()
        self._wait.add(r, w["wait_ns"].to_numpy(dtype=float))
        self._xfer.add(r, w["transfer_ns"].to_numpy(dtype=float))
        # bus bandwidth: one dot per op (its slowest member), a sample per op kind
        b = df[np.isfinite(df["busbw_gbs"]) & (df["busbw_gbs"] > 0)]
        per_op = b.groupby(["op", "comm_id", "seq", "bytes"])["busbw_gbs"].min().reset_index()
        for op, g in per_op.groupby("op"):
            self._bw.add(
                np.array([f"{op}:{n}" for n in g["bytes"].tolist()], dtype=object), g["busbw_gbs"].to_numpy()
            )
            k = int(op)
            p = self._p.get(k, 1.0)
            pts = g[["bytes", "busbw_gbs"]]
            pts = pts[self._rng.random(len(pts)) < p] if p < 1 else pts
            have = self._pts.get(k)
            pts = pts if have is None else pd.concat([have, pts], ignore_index=True)
            while len(pts) > self.max_points:  # thin: every dot kept with probability p
                p /= 2
                pts = pts[self._rng.random(len(pts)) < 0.5]
            self._pts[k], self._p[k] = pts, p

    def finish(self) -> None:
        if self.folded and self._buf:
            self._fold()

    # -- what the pictures draw ---------------------------------------------------------
    def wait_transfer(self) -> pd.DataFrame:
        """Median wait and transfer per rank (µs), index rank."""
        if not self.folded:
            ops = self.frame().dropna(subset=["wait_ns"])
            return ops.groupby("rank")[["wait_ns", "transfer_ns"]].median() / 1e3
        ranks = sorted(self._wait.keys)
        return pd.DataFrame(
            {
                "wait_ns": [self._wait.quantile(r, 0.5) / 1e3 for r in ranks],
                "transfer_ns": [self._xfer.quantile(r, 0.5) / 1e3 for r in ranks],
            },
            index=pd.Index(ranks, name="rank"),
        )

    def busbw(self) -> list[tuple[str, pd.DataFrame, pd.Series]]:
        """Per op kind: its dots (bytes, busbw_gbs: one per op) and the median per size."""
        out = []
        if not self.folded:
            ops = self.frame()
            ops = ops[ops["busbw_gbs"].notna() & np.isfinite(ops["busbw_gbs"]) & (ops["busbw_gbs"] > 0)]
            for name, g in ops.groupby("op_name"):
                per_op = g.groupby(["comm_id", "seq", "bytes"])["busbw_gbs"].min().reset_index()
                out.append((str(name), per_op, per_op.groupby("bytes")["busbw_gbs"].median()))
            return out
        for k in sorted(self._pts, key=lambda k: str(schema.OP_NAMES[k])):
            sizes = sorted(int(key.split(":")[1]) for key in self._bw.keys if key.startswith(f"{k}:"))
            base = pd.Series(
                [self._bw.quantile(f"{k}:{n}", 0.5) for n in sizes], index=pd.Index(sizes, name="bytes")
            )
            out.append((str(schema.OP_NAMES[k]), self._pts[k], base))
        return out

    def lateness_cells(self) -> tuple[float, float, pd.DataFrame]:
        """(origin s, cell width s, rows rank, cell, sum (ms), n) of the folded extra compute."""
        return self._origin, self._w, self._lat


def from_stream(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    chunk_bytes: int | None = None,
    keep: int | None = KEEP_ROWS,
) -> tuple[ReportInput, Any]:
    """Report input from a c4d trace (or a directory of node traces) read and replayed piece by
    piece: memory does not grow with the trace (``ReportStats`` past ``keep`` rows). Also
    returns the pass (``c4d.analyze.StreamPass``: its stream's damage, its ingest)."""
    from c4d.engine.incidents import Incidents
    from c4d.offline import analyze

    stats = ReportStats(keep)
    watch = analyze.RawWatch()
    sp = analyze.StreamPass(
        path, (), None, overrides, chunk_bytes, on_split=stats.add_split, on_raw=watch.add
    )
    watch.tick_ns = sp.created_ns
    for _ in sp.frames():
        pass
    stats.finish()
    diags = sp.diagnoses
    created = sp.meta.get("created_ns")
    inp = ReportInput(
        ops=pd.DataFrame(),
        nodes=dict(sorted(watch.nodes.items())),
        diagnoses=[d.to_json() for d in diags],
        title=Path(path).name or "trace",
        stacks=load_sidecar(str(path)) if Path(path).is_file() else [],
        incidents=Incidents.fold(diags, watch.end_ns, watch.heard_ns),
        start_s=int(created) / 1e9 if created else None,
        stats=stats,
        n_ops=watch.n_ops,
    )
    return inp, sp


def hang_spans(inp: ReportInput) -> list[tuple[int, float, float, Incident]]:
    """(rank, from, to) in master seconds for every RankNonCommHang culprit: from the start of
    the wait its first report measured to its last report (the rank never arrived meanwhile)."""
    out = []
    for inc in inp.incidents:
        if inc.kind != "RankNonCommHang":
            continue
        waited = inc.first.detail.get("waited_s")
        start = inc.first.time - (float(waited) if isinstance(waited, int | float) else 0.0)
        out += [(r, start, max(inc.last.time, start), inc) for r in inc.ranks]
    return out


def extra_compute(ops: pd.DataFrame) -> pd.DataFrame:
    """Per collective op row: ``arrive_s`` (master clock, s) and ``extra_ms``, the rank's compute
    before the op minus the median of the op's members. ``ops`` is ``ops_split`` (the engine's
    own numbers: its compute since its previous op of that communicator, docs/engine.md;
    NaN where unknown: a rank's first op)."""
    if ops.empty or "compute_ns" not in ops:
        return pd.DataFrame({"rank": [], "arrive_s": [], "extra_ms": []})
    df = ops[ops["compute_ns"].notna() & ops["arrive_ns"].notna()]
    med = df.groupby(["comm_id", "seq"])["compute_ns"].transform("median")
    return pd.DataFrame(
        {"rank": df["rank"], "arrive_s": df["arrive_ns"] / 1e9, "extra_ms": (df["compute_ns"] - med) / 1e6}
    ).reset_index(drop=True)


def _lateness_grid(inp: ReportInput, hangs: list, bins: int):
    """(ranks, t0, cell edges since t0, grid ranks x cells of mean extra ms; NaN: nothing)."""
    st = inp.stats
    assert st is not None
    hang_ranks = {r for r, *_ in hangs}
    if not st.folded:
        ops = extra_compute(st.frame())
        ranks = sorted(set(ops["rank"].astype(int).tolist()) | hang_ranks)
        if not ranks:
            return ranks, 0.0, np.zeros(1), np.zeros((0, 0))
        # the time axis covers the ops and the hangs: a hang stops the ops, so it runs past them
        lo = [float(ops["arrive_s"].min())] if len(ops) else []
        hi = [float(ops["arrive_s"].max())] if len(ops) else []
        t0 = min(lo + [s for _, s, _, _ in hangs])
        t1 = max(hi + [e for *_, e, _ in hangs])
        edges = np.linspace(0, max(t1 - t0, 1e-6), bins + 1)
        grid = np.full((len(ranks), bins), np.nan)
        idx = {r: i for i, r in enumerate(ranks)}
        if len(ops):
            t = ops["arrive_s"] - t0
            b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
            g = pd.DataFrame({"r": ops["rank"].map(idx), "b": b, "ms": ops["extra_ms"]})
            m = g.groupby(["r", "b"])["ms"].mean()
            grid[m.index.get_level_values(0), m.index.get_level_values(1)] = m.to_numpy()
        return ranks, t0, edges, grid
    # folded: the cells, widened (by powers of two) until they and the hangs fit in ``bins``
    origin, w, lat = st.lateness_cells()
    ranks = sorted(set(lat["rank"].astype(int).tolist()) | hang_ranks)
    if not ranks:
        return ranks, 0.0, np.zeros(1), np.zeros((0, 0))
    lo = [origin + w * float(lat["cell"].min())] if len(lat) else []
    hi = [origin + w * float(lat["cell"].max() + 1)] if len(lat) else []
    t0 = min(lo + [s for _, s, _, _ in hangs])
    t1 = max(hi + [e for *_, e, _ in hangs])
    while (t1 - t0) / w > bins:  # half to all of ``bins`` columns
        w *= 2
    n = max(1, math.ceil((t1 - t0) / w - 1e-9))
    edges = np.arange(n + 1) * w
    grid = np.full((len(ranks), n), np.nan)
    if len(lat):
        mid = origin + (lat["cell"].to_numpy() + 0.5) * st.lateness_cells()[1] - t0
        c = np.clip((mid // w).astype(np.int64), 0, n - 1)
        row = lat["rank"].map({r: i for i, r in enumerate(ranks)})
        g = pd.DataFrame({"r": row, "c": c, "sum": lat["sum"], "n": lat["n"]})
        g = g.groupby(["r", "c"])[["sum", "n"]].sum()
        grid[g.index.get_level_values(0), g.index.get_level_values(1)] = (g["sum"] / g["n"]).to_numpy()
    return ranks, t0, edges, grid


def lateness_heatmap_figure(inp: ReportInput, bins: int = 60):
    hangs = hang_spans(inp)
    ranks, t0, edges, grid = _lateness_grid(inp, hangs, bins)
    fig, ax = plt.subplots(figsize=(11, max(3.5, min(12.0, 0.12 * len(ranks) + 2))), dpi=DPI)
    if ranks:
        idx = {r: i for i, r in enumerate(ranks)}
        measured = grid[np.isfinite(grid)]
        # the colour range is the measured ops' (a hang's seconds would wash them out): a hung
        # rank's cells are past it, at the darkest red
        lim = max(float(np.percentile(np.abs(measured), 99)), 1e-3) if len(measured) else None
        for r, s, e, _ in hangs:
            # cells the wait overlaps: the wait so far at the cell's end (or at the last report)
            cells = np.flatnonzero((edges[1:] > s - t0) & (edges[:-1] <= e - t0))
            so_far = (np.minimum(edges[1:][cells], e - t0) - (s - t0)) * 1e3
            grid[idx[r], cells] = np.fmax(grid[idx[r], cells], so_far)
        if lim is None:
            lim = max(float(np.nanmax(np.abs(grid))), 1e-3)
        im = ax.imshow(
            grid,
            aspect="auto",
            cmap="RdBu_r",
            vmin=-lim,
            vmax=lim,
            interpolation="nearest",
            extent=(0, edges[-1], len(ranks) - 0.5, -0.5),
        )
        fig.colorbar(im, ax=ax, label="extra compute (ms)\nvs. the op's median")
        for r, s, e, inc in hangs:
            mid = ((s + e) / 2 - t0) / max(edges[-1], 1e-9)
            ax.text(
                (s + e) / 2 - t0,
                idx[r],
                f"rank {r}: no arrival for {e - s:.1f} s ({inc.kind} #{inc.id})",
                ha="center" if 0.25 < mid < 0.75 else ("left" if mid <= 0.25 else "right"),
                va="center",
                fontsize=8,
                color="white",
                clip_on=True,
            )
        if len(ranks) <= 64:
            ax.set_yticks(range(len(ranks)), [f"{r} {inp.nodes.get(r, '')}" for r in ranks], fontsize=7)
        ax.set_ylabel("rank")
    ax.set_xlabel("time since the first op (s)")
    ax.set_title("Who computes longer: red = extra compute before a collective, others wait for it")
    return fig


def wait_transfer_split_figure(inp: ReportInput):
    assert inp.stats is not None
    g = inp.stats.wait_transfer()
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=DPI)
    if len(g):
        x = np.arange(len(g))
        ax.bar(x, g["transfer_ns"], label="transfer (last arrival → done)", color="#2980b9")
        ax.bar(
            x,
            g["wait_ns"],
            bottom=g["transfer_ns"],
            label="wait (own arrival → last arrival)",
            color="#e67e22",
        )
        if len(g) <= 64:
            ax.set_xticks(x, [str(r) for r in g.index], fontsize=7)
        ax.set_xlabel("rank")
        ax.legend()
    ax.set_ylabel("median µs per collective")
    ax.set_title("Collective time split into wait and transfer")
    return fig


def busbw_by_size_figure(inp: ReportInput):
    assert inp.stats is not None
    kinds = inp.stats.busbw()
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=DPI)
    for i, (name, per_op, base) in enumerate(kinds):
        color = f"C{i % 10}"
        ax.scatter(per_op["bytes"], per_op["busbw_gbs"], s=6, alpha=0.4, label=name, color=color)
        # a marker per size, joined where there are several sizes: visible with one size too
        ax.plot(base.index, base.to_numpy(), marker="D", markersize=7, linewidth=1.5, color=color,
                markeredgecolor="black", label=f"{name} median")  # fmt: skip
    if kinds:
        ax.set_xscale("log")
        ax.legend(markerscale=1.5, fontsize=8)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Bus bandwidth by size (dots: ops; diamonds and lines: median per size)")
    return fig


def _span_start(inc: Incident) -> float:
    """Where an incident's bar starts: its first report, or for a slow kind the start of the
    window that report measured."""
    w = inc.first.detail.get("window_s") if inc.is_slow else None
    return inc.first.time - (float(w) if isinstance(w, int | float) and w > 0 else 0.0)


def diagnosis_timeline_figure(inp: ReportInput):
    """One bar per incident and culprit rank, from its first report to its last, coloured by
    level (WARNING, then ERROR from where it escalated; a dot where each level began)."""
    fig, ax = plt.subplots(figsize=(11, 3.5), dpi=DPI)
    ds = inp.diagnoses
    if inp.incidents:
        t0 = min(_span_start(i) for i in inp.incidents)
        for inc in inp.incidents:
            reps = sorted(
                (d["time"], d["level"])
                for d in ds
                if d["kind"] == inc.kind
                and sorted(d.get("ranks") or []) == sorted(inc.ranks)
                and inc.first.time <= d["time"] <= inc.last.time
            ) or [(inc.first.time, inc.level.name)]
            # one segment per level: from the first report at it to the next level's first (a
            # slow finding's from the start of the window it measured)
            runs = [rep for i, rep in enumerate(reps) if i == 0 or rep[1] != reps[i - 1][1]]
            runs[0] = (_span_start(inc), runs[0][1])
            ends = [t for t, _ in runs[1:]] + [reps[-1][0]]
            for r in inc.ranks or (-1,):
                for (a, lvl), b in zip(runs, ends, strict=True):
                    ax.plot([a - t0, b - t0], [r, r], color=LEVEL_COLOR.get(lvl, "grey"), linewidth=6,
                            solid_capstyle="butt")  # fmt: skip
                for a, lvl in runs:  # a dot where it opened and where it escalated
                    ax.scatter([a - t0], [r], color=LEVEL_COLOR.get(lvl, "grey"), s=40, zorder=3)
                ax.annotate(
                    f"#{inc.id} {inc.kind} (count {inc.count})",
                    (inc.last.time - t0, r),
                    xytext=(4, 6),
                    textcoords="offset points",
                    fontsize=7,
                )
        for lvl, c in LEVEL_COLOR.items():
            ax.scatter([], [], color=c, label=lvl)
        ax.legend(fontsize=8)
        kinds = sorted({i.kind for i in inp.incidents})
        ax.set_title(f"{len(inp.incidents)} incident(s) from {len(ds)} diagnoses: " + ", ".join(kinds))
        culprits = sorted({r for i in inp.incidents for r in (i.ranks or (-1,))})
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if len(culprits) <= 20:
            ax.set_yticks(culprits)
        ax.set_ylim(min(culprits) - 0.6, max(culprits) + 0.6)
        right = max(1.0, max(i.last.time for i in inp.incidents) - t0)
        ax.set_xlim(-0.02 * right, 1.25 * right)  # room for the labels
    else:
        ax.text(0.5, 0.5, "no diagnoses", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Diagnoses")
    ax.set_xlabel("time since the first incident began (s)")
    ax.set_ylabel("culprit rank")
    return fig


def lateness_heatmap(inp: ReportInput, path: Path) -> Path:
    return _save(lateness_heatmap_figure(inp), path)


def wait_transfer_split(inp: ReportInput, path: Path) -> Path:
    return _save(wait_transfer_split_figure(inp), path)


def busbw_by_size(inp: ReportInput, path: Path) -> Path:
    return _save(busbw_by_size_figure(inp), path)


def diagnosis_timeline(inp: ReportInput, path: Path) -> Path:
    return _save(diagnosis_timeline_figure(inp), path)


def _save(fig, path: Path, close: bool = True) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    if close:
        plt.close(fig)
    return path


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def incident_table(inp: ReportInput) -> str:
    """One row per incident, the columns of `c4d analyze`'s table (count: the re-counts folded)."""
    if not inp.incidents:
        return "<p>No diagnoses.</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    rows = []
    for inc in inp.incidents:
        row = inc.row(inp.start_s)
        cells = "".join(f"<td>{html.escape(row[c])}</td>" for c in COLUMNS)
        rows.append(f'<tr class="incident level-{html.escape(inc.level.name)}">{cells}</tr>')
    note = (
        f"<p>{len(inp.incidents)} incident(s) from {len(inp.diagnoses)} diagnoses; first seen since "
        "the trace started (<code>c4d analyze --all</code> lists every diagnosis).</p>"
    )
    return f"{note}<table><tr>{head}</tr>{''.join(rows)}</table>"


def write(inp: ReportInput, out_dir: Path) -> dict[str, Path]:
    """Write the PNGs and report.html into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = {
        "lateness": lateness_heatmap(inp, out_dir / "lateness.png"),
        "wait_transfer": wait_transfer_split(inp, out_dir / "wait_transfer.png"),
        "busbw": busbw_by_size(inp, out_dir / "busbw.png"),
        "diagnoses": diagnosis_timeline(inp, out_dir / "diagnoses.png"),
    }
    table = incident_table(inp)
    title = html.escape(inp.title)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>c4d report: {title}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:auto}}img{{max-width:100%}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head><body>
<h1>c4d report: {html.escape(inp.title)}</h1>
<p>{len(inp.nodes)} ranks, {inp.n_ops} op records.</p>
<h2>Incidents</h2>{table}{_img(pngs["diagnoses"])}
{html_section(inp.stacks + inp.diagnoses)}
<h2>Who arrives late</h2>{_img(pngs["lateness"])}
<h2>Wait vs. transfer</h2>{_img(pngs["wait_transfer"])}
<h2>Bus bandwidth</h2>{_img(pngs["busbw"])}
</body></html>"""
    page_path = out_dir / "report.html"
    page_path.write_text(page)
    return {**pngs, "html": page_path}
