"""The live view: ``render(LiveState) -> renderable``, a pure function of a snapshot.

The master thread takes a snapshot and re-renders at most ``max_hz`` times a second
between ingestion steps, so a render can never stall the collector for long, and a
render can be tested from a state built by hand, without a terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from c4d.engine.types import CommSnapshot
from c4d.run.stacks_view import live_lines, stacks_text

# state → (glyph, style); one character per rank so 1,024 ranks fit a 120×40 terminal
STATE_STYLE: dict[str, tuple[str, str]] = {
    "computing": ("■", "green"),
    "in-collective": ("■", "cyan"),
    "waiting": ("■", "yellow"),
    "hung": ("H", "bold white on red"),
    "slow": ("S", "bold black on yellow"),
    "lost": ("X", "bold white on magenta"),
    "isolated": ("I", "bold white on blue"),
    "done": ("·", "dim"),
    "unknown": ("?", "dim"),
}


@dataclass(frozen=True)
class LiveState:
    job: str
    ranks_registered: int
    ranks_expected: int
    nodes: int
    records_per_s: float
    dropped: int
    since_last_record_s: float
    rank_nodes: dict[int, str] = field(default_factory=dict)  # rank → node
    rank_states: dict[int, str] = field(default_factory=dict)  # rank → key of STATE_STYLE
    comms: list[CommSnapshot] = field(default_factory=list)
    diagnoses: list[str] = field(default_factory=list)  # one line each, ERROR first
    blacklisted: list[str] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)  # hung ranks' stacks, a line each (c4d run)


def _header(s: LiveState) -> Text:
    t = Text()
    t.append("c4d ", style="bold")
    t.append(f"job {s.job}  ")
    t.append(f"ranks {s.ranks_registered}/{s.ranks_expected or '?'}  nodes {s.nodes}  ")
    t.append(f"records/s {s.records_per_s:,.0f}  ")
    t.append(f"dropped {s.dropped:,}  ", style="red" if s.dropped else "")
    t.append(
        f"last record {s.since_last_record_s:.1f}s ago", style="red" if s.since_last_record_s > 5 else ""
    )
    return t


def _grid(s: LiveState, width: int) -> Text:
    by_node: dict[str, list[int]] = {}
    for r in sorted(s.rank_nodes):
        by_node.setdefault(s.rank_nodes[r], []).append(r)
    t = Text()
    col = 0
    for node in sorted(by_node, key=_node_key):
        ranks = by_node[node]
        cell = len(ranks) + 1
        if col and col + cell > width:
            t.append("\n")
            col = 0
        for r in ranks:
            glyph, style = STATE_STYLE.get(s.rank_states.get(r, "unknown"), STATE_STYLE["unknown"])
            t.append(glyph, style=style)
        t.append(" ")
        col += cell
    legend = Text("\n")
    for name, (glyph, style) in STATE_STYLE.items():
        legend.append(glyph, style=style)
        legend.append(f" {name}  ", style="dim")
    return t + legend


def _node_key(n: str) -> tuple[str, int]:
    head, _, tail = n.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (n, -1)


def _comms(s: LiveState, limit: int) -> Table:
    shown = sorted((c for c in s.comms if c.nranks > 1), key=lambda c: (-c.nranks, c.kind, c.comm))
    hidden = len(s.comms) - len(shown)
    t = Table(box=None, pad_edge=False, expand=False, header_style="bold")
    for col in (
        "comm",
        "kind",
        "ranks",
        "done seq",
        "ops/s",
        "wait med/p99 µs",
        "xfer med/p99 µs",
        "busbw GB/s",
    ):
        t.add_column(col, justify="left" if col in ("comm", "kind") else "right")
    for c in shown[:limit]:
        t.add_row(
            c.comm,
            c.kind,
            str(c.nranks),
            str(c.last_done_seq),
            f"{c.ops_per_s:,.0f}",
            f"{c.wait_med_us:,.0f}/{c.wait_p99_us:,.0f}",
            f"{c.xfer_med_us:,.0f}/{c.xfer_p99_us:,.0f}",
            f"{c.busbw_gbs:,.2f}",
        )
    if len(shown) > limit:
        t.add_row(f"… {len(shown) - limit} more", "", "", "", "", "", "", "")
    if hidden:
        t.caption = f"{hidden} single-rank communicators not shown"
    return t


def render(s: LiveState, width: int = 120, height: int = 40) -> Group:
    """The whole screen for one snapshot."""
    lines = [(line[: width - 4], _diag_style(line)) for line in s.diagnoses[:6] or ["no diagnoses"]]
    if s.blacklisted:
        lines.append((f"blacklisted: {', '.join(s.blacklisted)}", "bold red"))
    diag = Text("\n").join(Text(t, style=st) for t, st in lines)
    grid = _grid(s, width - 4)
    used = 1 + (len(grid.plain.splitlines()) + 2) + (len(lines) + 2) + 4  # header, panels, table head+caption
    if s.stacks:
        used += len(s.stacks[:6]) + 2
    comm_rows = max(1, height - used)
    panels: list[RenderableType] = [
        _header(s),
        Panel(grid, title="ranks by node", title_align="left"),
        Panel(_comms(s, comm_rows), title="communicators", title_align="left"),
        Panel(diag, title="diagnoses", title_align="left"),
    ]
    if s.stacks:
        panels.append(Panel(stacks_text(s.stacks, width), title="stacks of hung ranks", title_align="left"))
    return Group(*panels)


def _diag_style(line: str) -> str:
    return "bold red" if line.startswith("ERROR") else "yellow" if line.startswith("WARNING") else ""


def snapshot(master: Any, now: float | None = None) -> LiveState:
    """Build a LiveState from a running master (its bookkeeping plus the engine's state)."""
    now = time.time() if now is None else now
    rec = master.received
    last = max((r.last_seen_ns for r in rec.ranks.values()), default=0)
    eng = master.engine.state() if hasattr(master.engine, "state") else None
    rank_states = {r: ("done" if i.final else "computing") for r, i in rec.ranks.items()}
    comms: list[CommSnapshot] = []
    if eng is not None:
        rank_states.update(_engine_rank_states(eng))
        comms = _engine_comm_rows(eng)
    for node in master.blacklisted:
        for r, i in rec.ranks.items():
            if i.node == node and rank_states.get(r) not in ("hung", "lost", "slow"):
                rank_states[r] = "isolated"  # the culprit keeps its own mark
    diags = sorted(master.diagnoses, key=lambda d: (-d.level, -d.time))
    job = str(master.cfg.meta.get("job") or master.cfg.meta.get("command", "?"))
    return LiveState(
        job=job,
        ranks_registered=sum(1 for i in rec.ranks.values() if i.node != "?"),
        ranks_expected=rec.world_size,
        nodes=len({i.node for i in rec.ranks.values()}),
        records_per_s=master.records_per_s(),
        dropped=rec.dropped,
        since_last_record_s=(now - last / 1e9) if last else 0.0,
        rank_nodes={r: i.node for r, i in rec.ranks.items()},
        rank_states=rank_states,
        comms=comms,
        diagnoses=[d.summary() for d in diags],
        blacklisted=list(master.blacklisted),
        stacks=live_lines(diags),
    )


def _engine_rank_states(eng: Any) -> dict[int, str]:
    out = {}
    for r, st in getattr(eng, "rank_states", {}).items():
        name = getattr(st, "value", st)
        out[int(r)] = str(name) if str(name) in STATE_STYLE else "unknown"
    return out


def _engine_comm_rows(eng: Any) -> list[CommSnapshot]:
    return list(getattr(eng, "comms", []))


class LiveView:
    """Drives rich.live from the master thread, at most ``max_hz`` renders a second."""

    def __init__(self, master: Any, console: Console | None = None, max_hz: float = 4.0):
        self.master = master
        self.console = console or Console()
        self.period = 1.0 / max_hz
        self._next = 0.0
        self.renders = 0
        self.render_s = 0.0
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def update(self, _job: Any = None) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.period
        t0 = time.perf_counter()
        size = self.console.size
        self.live.update(render(snapshot(self.master), size.width, size.height), refresh=True)
        self.render_s += time.perf_counter() - t0
        self.renders += 1

    def close(self) -> None:
        self._next = 0.0
        self.update()
        self.live.stop()
