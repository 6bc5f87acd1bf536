"""The live view: ``render(LiveState) -> renderable``, a pure function of a snapshot.

The master thread takes a snapshot and re-renders at most ``max_hz`` times a second
between ingestion steps, so a render can never stall the collector for long, and a
render can be tested from a state built by hand, without a terminal.

The frame always fits the terminal (80×24 upwards): the header and the rank grid first,
then one line per incident (c4d/engine/incidents.py, never one per re-count), then as many
communicators as there is room for (those in an open incident first), then the tail of
the master's log.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from c4d.engine.types import CommSnapshot
from c4d.util.stacks_view import live_lines, stacks_text

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
MAX_DIAG_LINES = 6
MAX_LOG_LINES = 4
MAX_STACK_LINES = 6


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
    diagnoses: list[str] = field(default_factory=list)  # one line per incident, open and worst first
    blacklisted: list[str] = field(default_factory=list)
    comm_alerts: dict[str, str] = field(default_factory=dict)  # comm hex → "hang" | "slow"
    log: list[str] = field(default_factory=list)  # the master's latest log lines, oldest first
    stacks: list[str] = field(default_factory=list)  # hung ranks' stacks, a line each (c4d run)


def _header(s: LiveState) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("c4d ", style="bold")
    t.append(f"{s.job}  ")
    t.append(f"ranks {s.ranks_registered}/{s.ranks_expected or '?'}  nodes {s.nodes}  ")
    t.append(f"{s.records_per_s:,.0f} rec/s  ")
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
    # the legend, wrapped by hand so its height is known
    legend = Text("\n")
    col = 0
    for name, (glyph, style) in STATE_STYLE.items():
        item = len(name) + 4
        if col and col + item > width:
            legend.append("\n")
            col = 0
        legend.append(glyph, style=style)
        legend.append(f" {name}  ", style="dim")
        col += item
    return t + legend


def _node_key(n: str) -> tuple[str, int]:
    head, _, tail = n.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (n, -1)


def _us(med: float, p99: float) -> str:
    return f"{med:,.0f}/{p99:,.0f}" if med or p99 else "-"


def _comms(s: LiveState, limit: int, width: int) -> Table:
    multi = [c for c in s.comms if c.nranks > 1]
    alert_rank = {"hang": 0, "slow": 1}
    shown = sorted(
        multi, key=lambda c: (alert_rank.get(s.comm_alerts.get(c.comm, ""), 2), -c.nranks, c.kind, c.comm)
    )
    hidden = len(s.comms) - len(shown)
    # in a narrow terminal the comm id is shortened so that every row stays one line
    id_w = max(6, min(16, width - 60))
    t = Table(box=None, pad_edge=False, expand=False, header_style="bold", padding=(0, 1, 0, 0))
    for col in ("comm", "kind", "ranks", "done", "ops/s", "wait µs m/p99", "xfer µs m/p99", "GB/s"):
        t.add_column(col, justify="left" if col in ("comm", "kind") else "right", no_wrap=True)
    for c in shown[:limit]:
        alert = s.comm_alerts.get(c.comm)
        style = "bold red" if alert == "hang" else "yellow" if alert == "slow" else ""
        p2p = c.kind == "PP"
        cid = c.comm if len(c.comm) <= id_w else c.comm[: id_w - 1] + "…"
        t.add_row(
            cid,
            c.kind + ("!" if alert else ""),
            str(c.nranks),
            f"{c.p2p_done:,}" if p2p else str(c.last_done_seq),
            f"{c.ops_per_s:,.0f}",
            "-" if p2p else _us(c.wait_med_us, c.wait_p99_us),
            _us(c.xfer_med_us, c.xfer_p99_us),
            f"{c.busbw_gbs:,.2f}",
            style=style,
        )
    more = len(shown) - min(limit, len(shown))
    notes = []
    if more:
        notes.append(f"{more} more")
    if hidden:
        notes.append(f"{hidden} single-rank not shown")
    if notes:
        t.caption = "; ".join(notes)
    return t


def _diag_style(line: str) -> str:
    if "(" in line and ("resolved" in line.rsplit("(", 1)[-1] or "superseded" in line.rsplit("(", 1)[-1]):
        return "dim"
    return "bold red" if line.startswith("ERROR") else "yellow" if line.startswith("WARNING") else ""


def _lines(text: list[tuple[str, str]], width: int) -> Text:
    return Text("\n").join(Text(t[: max(1, width)], style=st, no_wrap=True) for t, st in text)


def render(s: LiveState, width: int = 120, height: int = 40) -> Group:
    """The whole screen for one snapshot; never taller than ``height`` - 1 lines."""
    inner = max(10, width - 4)
    grid = _grid(s, inner)
    grid_h = len(grid.plain.splitlines()) + 2
    diag = [(line, _diag_style(line)) for line in s.diagnoses] or [("no diagnoses", "")]
    if s.blacklisted:
        diag.insert(0, (f"blacklisted: {', '.join(s.blacklisted)}", "bold red"))
    logs = [(line, "dim") for line in s.log]
    # rows left after the header, the grid and the panels' borders (+ the comm table's header)
    budget = height - 1 - 1 - grid_h - 2 - 3 - (2 if logs else 0) - (2 if s.stacks else 0)
    n_diag = max(1, min(len(diag), MAX_DIAG_LINES, budget - 2))
    budget -= n_diag
    n_stacks = max(1, min(len(s.stacks), MAX_STACK_LINES, budget - 2)) if s.stacks else 0
    budget -= n_stacks
    n_log = max(1, min(len(logs), MAX_LOG_LINES, budget - 2)) if logs else 0
    budget -= n_log
    comm_rows = max(1, budget - 1)  # a caption line may follow the rows
    if len(diag) > n_diag:
        cut = len(diag) - n_diag + 1
        diag = diag[: n_diag - 1] + [(f"… {cut} more incidents", "dim")]
    parts: list[RenderableType] = [
        _header(s),
        Panel(grid, title="ranks by node", title_align="left"),
        Panel(_lines(diag, inner), title="incidents", title_align="left"),
        Panel(_comms(s, comm_rows, inner), title="communicators", title_align="left"),
    ]
    if s.stacks:
        body = stacks_text(s.stacks, width, limit=n_stacks)
        parts.append(Panel(body, title="stacks of hung ranks", title_align="left"))
    if logs:
        parts.append(Panel(_lines(logs[-n_log:], inner), title="log", title_align="left"))
    return Group(*parts)


def snapshot(master: Any, now: float | None = None, log: list[str] | None = None) -> LiveState:
    """Build a LiveState from a running master (its bookkeeping plus the engine's state)."""
    now = time.time() if now is None else now
    rec = master.received
    last = max((r.last_seen_ns for r in rec.ranks.values()), default=0)
    eng = master.engine.state() if hasattr(master.engine, "state") else None
    rank_states = {r: ("done" if i.final else "computing") for r, i in rec.ranks.items()}
    comms: list[CommSnapshot] = []
    if eng is not None:
        rank_states.update(_engine_rank_states(eng))
        comms = list(getattr(eng, "comms", []))
    for node in master.blacklisted:
        for r, i in rec.ranks.items():
            if i.node == node and rank_states.get(r) not in ("hung", "lost", "slow"):
                rank_states[r] = "isolated"  # the culprit keeps its own mark
    incidents = master.incidents.current() if hasattr(master, "incidents") else []
    alerts: dict[str, str] = {}
    for inc in incidents:
        if inc.end is None:
            for c in inc.comms:
                if alerts.get(c) != "hang":
                    alerts[c] = "slow" if inc.is_slow else "hang"
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
        diagnoses=[i.line() for i in incidents],
        blacklisted=list(master.blacklisted),
        comm_alerts=alerts,
        log=list(log or []),
        stacks=live_lines(master.diagnoses),
    )


def _engine_rank_states(eng: Any) -> dict[int, str]:
    out = {}
    for r, st in getattr(eng, "rank_states", {}).items():
        name = getattr(st, "value", st)
        out[int(r)] = str(name) if str(name) in STATE_STYLE else "unknown"
    return out


class LogTail(logging.Handler):
    """Keeps the latest log lines for the live view's log panel (instead of printing them
    through the frame)."""

    def __init__(self, keep: int = 200) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=keep)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).splitlines():
                self.lines.append(line)
        except Exception:  # a logging handler must never raise into the master
            self.handleError(record)


class LiveView:
    """Drives rich.live from the master thread, at most ``max_hz`` renders a second.

    With ``log_level`` the root logger's output goes to the view's log panel while it runs
    (and back to stderr when it closes).
    """

    def __init__(
        self, master: Any, console: Console | None = None, max_hz: float = 4.0, log_level: int | None = None
    ):
        self.master = master
        self.console = console or Console()
        self.period = 1.0 / max_hz
        self._next = 0.0
        self.renders = 0
        self.render_s = 0.0
        self.tail: LogTail | None = None
        self._saved: tuple[list[logging.Handler], int] | None = None
        if log_level is not None:
            root = logging.getLogger()
            self._saved = (list(root.handlers), root.level)
            self.tail = LogTail()
            root.handlers = [self.tail]
            root.setLevel(log_level)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def update(self, _job: Any = None) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.period
        t0 = time.perf_counter()
        size = self.console.size
        log = list(self.tail.lines) if self.tail is not None else None
        self.live.update(render(snapshot(self.master, log=log), size.width, size.height), refresh=True)
        self.render_s += time.perf_counter() - t0
        self.renders += 1

    def close(self) -> None:
        self._next = 0.0
        self.update()
        self.live.stop()
        if self._saved is not None:
            root = logging.getLogger()
            root.handlers, level = self._saved
            root.setLevel(level)
            self._saved = None
