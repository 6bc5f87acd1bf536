"""`c4d report`: the pictures operators look at before they read.

Four PNGs (matplotlib, Agg) and one self-contained HTML page that embeds them:
per-rank extra compute before each collective over time, collective time split into wait and
transfer, bus bandwidth by message size against the median per size, and the diagnosis
timeline.

The lateness picture uses each rank's *compute gap* (its arrival at a collective minus the end
of its own previous op, one clock, no alignment needed) against the median gap of the op's
members: a rank that computes longer is red, and the ranks that merely arrive late because they
waited for it elsewhere (its pipeline partners, say) are not — the same distinction the engine
draws for RankNonCommSlow (docs/engine.md).
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from c4d.engine.types import Level
from c4d.run.stacks_view import html_section, load_sidecar

LEVEL_COLOR = {"ERROR": "#c0392b", "WARNING": "#e67e22", "INFO": "#2980b9"}


@dataclass
class ReportInput:
    ops: pd.DataFrame  # ops with the wait/transfer split
    nodes: dict[int, str]
    diagnoses: list[dict[str, Any]]  # Diagnosis.to_json() objects
    title: str
    stacks: list[dict[str, Any]] = field(default_factory=list)  # hung ranks' stacks kept by c4d run


def from_trace(tr: Any, diagnoses: list[Any] | None = None) -> ReportInput:
    """Report input from a ``c4d.analyze.load``-ed trace: its ops with the engine's wait/transfer
    split, and its diagnoses (the replay's, unless given)."""
    if diagnoses is None:
        diagnoses = tr.diagnoses_list()
    return ReportInput(
        ops=tr.ops_split,
        nodes=tr.nodes,
        diagnoses=[d.to_json() if hasattr(d, "to_json") else d for d in diagnoses],
        title=Path(tr.raw.path).name or "trace",
        stacks=load_sidecar(tr.raw.path) if tr.raw.path else [],
    )


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


def lateness_heatmap_figure(inp: ReportInput, bins: int = 60):
    ops = extra_compute(inp.ops)
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(12.0, 0.12 * len(inp.nodes) + 2))))
    if len(ops):
        t = ops["arrive_s"] - ops["arrive_s"].min()
        edges = np.linspace(0, max(float(t.max()), 1e-6), bins + 1)
        ranks = sorted(ops["rank"].unique())
        grid = np.full((len(ranks), bins), np.nan)
        idx = {r: i for i, r in enumerate(ranks)}
        b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
        g = pd.DataFrame({"r": ops["rank"].map(idx), "b": b, "ms": ops["extra_ms"]})
        m = g.groupby(["r", "b"])["ms"].mean()
        grid[m.index.get_level_values(0), m.index.get_level_values(1)] = m.to_numpy()
        lim = max(float(np.nanpercentile(np.abs(grid), 99)), 1e-3) if np.isfinite(grid).any() else 1.0
        im = ax.imshow(
            grid,
            aspect="auto",
            cmap="RdBu_r",
            vmin=-lim,
            vmax=lim,
            interpolation="nearest",
            extent=(0, edges[-1], len(ranks) - 0.5, -0.5),
        )
        fig.colorbar(im, ax=ax, label="compute before the op vs. the op's median (ms)")
        if len(ranks) <= 64:
            ax.set_yticks(range(len(ranks)), [f"{r} {inp.nodes.get(r, '')}" for r in ranks], fontsize=7)
        ax.set_ylabel("rank")
    ax.set_xlabel("time (s)")
    ax.set_title(
        "Who computes longer: red = this rank's extra compute before a collective, others wait for it"
    )
    return fig


def wait_transfer_split_figure(inp: ReportInput):
    ops = inp.ops.dropna(subset=["wait_ns"])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    if len(ops):
        g = ops.groupby("rank")[["wait_ns", "transfer_ns"]].median() / 1e3
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
    ops = inp.ops.dropna(subset=["busbw_gbs"])
    ops = ops[np.isfinite(ops["busbw_gbs"]) & (ops["busbw_gbs"] > 0)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for i, (name, g) in enumerate(ops.groupby("op_name")):
        color = f"C{i % 10}"
        per_op = g.groupby(["comm_id", "seq", "bytes"])["busbw_gbs"].min().reset_index()
        ax.scatter(per_op["bytes"], per_op["busbw_gbs"], s=6, alpha=0.4, label=name, color=color)
        base = per_op.groupby("bytes")["busbw_gbs"].median()
        # a marker per size, joined where there are several sizes: visible with one size too
        ax.plot(base.index, base.to_numpy(), marker="D", markersize=7, linewidth=1.5, color=color,
                markeredgecolor="black", label=f"{name} median")  # fmt: skip
    if len(ops):
        ax.set_xscale("log")
        ax.legend(markerscale=1.5, fontsize=8)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Bus bandwidth by size (dots: ops; diamonds and lines: median per size)")
    return fig


def diagnosis_timeline_figure(inp: ReportInput):
    fig, ax = plt.subplots(figsize=(11, 3.5))
    ds = inp.diagnoses
    if ds:
        t0 = min(d["time"] for d in ds)
        for d in ds:
            for r in d.get("ranks") or [-1]:
                ax.scatter(d["time"] - t0, r, color=LEVEL_COLOR.get(d["level"], "grey"), s=40)
        for lvl, c in LEVEL_COLOR.items():
            ax.scatter([], [], color=c, label=lvl)
        ax.legend(fontsize=8)
        kinds = sorted({d["kind"] for d in ds})
        ax.set_title("Diagnoses: " + ", ".join(kinds))
        culprits = sorted({r for d in ds for r in (d.get("ranks") or [-1])})
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if len(culprits) <= 20:
            ax.set_yticks(culprits)
        ax.set_ylim(min(culprits) - 0.6, max(culprits) + 0.6)
    else:
        ax.text(0.5, 0.5, "no diagnoses", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Diagnoses")
    ax.set_xlabel("time since first diagnosis (s)")
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


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def write(inp: ReportInput, out_dir: Path) -> dict[str, Path]:
    """Write the PNGs and report.html into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = {
        "lateness": lateness_heatmap(inp, out_dir / "lateness.png"),
        "wait_transfer": wait_transfer_split(inp, out_dir / "wait_transfer.png"),
        "busbw": busbw_by_size(inp, out_dir / "busbw.png"),
        "diagnoses": diagnosis_timeline(inp, out_dir / "diagnoses.png"),
    }
    rows = []
    for d in sorted(inp.diagnoses, key=lambda d: (-Level[d["level"]], d["time"])):
        culprit = ", ".join(
            f"rank {r} ({n})" for r, n in zip(d.get("ranks", []), d.get("nodes", []), strict=False)
        )
        rows.append(
            f"<tr><td>{html.escape(d['level'])}</td><td>{html.escape(d['kind'])}</td>"
            f"<td>{html.escape(culprit)}</td><td>{html.escape(str(d.get('op', '')))} #{d.get('seq', '')}</td>"
            f"<td>{html.escape(str(d.get('detail', {}).get('localized_by', '')))}</td></tr>"
        )
    table = (
        "<table><tr><th>level</th><th>kind</th><th>culprit</th><th>op</th><th>localized by</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else "<p>No diagnoses.</p>"
    )
    title = html.escape(inp.title)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>c4d report: {title}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:auto}}img{{max-width:100%}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head><body>
<h1>c4d report: {html.escape(inp.title)}</h1>
<p>{len(inp.nodes)} ranks, {inp.ops["seq"].size if len(inp.ops) else 0} op records.</p>
<h2>Diagnoses</h2>{table}{_img(pngs["diagnoses"])}
{html_section(inp.stacks + inp.diagnoses)}
<h2>Who arrives late</h2>{_img(pngs["lateness"])}
<h2>Wait vs. transfer</h2>{_img(pngs["wait_transfer"])}
<h2>Bus bandwidth</h2>{_img(pngs["busbw"])}
</body></html>"""
    page_path = out_dir / "report.html"
    page_path.write_text(page)
    return {**pngs, "html": page_path}
