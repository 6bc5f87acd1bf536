"""Parse what NVIDIA's nccl-tests (``all_reduce_perf`` and friends) print.

Entry points, all pure functions::

    runs = parse_text(text)      # stdout of one or more runs -> list[NcclTestsRun]
    runs = parse_file(path)      # text or the ``-J file.json`` report, detected
    run  = parse_json(text)      # the ``-J`` report only

What the text reader copes with (facts from nccl-tests' ``src/util.cu``; samples: the captures
the tests read, ``$C4D_NCCL_TESTS_DATA``):

* every table layout the header line can describe: the ``#wrong`` column (v2.13+) or the older
  ``error`` column, with or without ``root``, ``cputime`` (``-C 1``), per-iteration columns
  (``-I 1``), a trailing timestamp (``-S 1``), rows with no out-of-place block;
* launcher prefixes (``[1,0]<stdout>:`` from ``mpirun --tag-output``, ``0: `` from
  ``srun --label``, ``[default0]:`` from ``torchrun --tee``): lines are split into one stream per
  launcher rank, so two processes that each print a table (a non-MPI build started by mpirun)
  give two runs instead of one garbled one;
* NCCL ``INFO``/``WARN`` lines interleaved with the table, shell prompts, blank lines;
* several runs in one file (a script that calls several binaries): a new preamble starts a run.

A run is reported only if it has at least one table row or an ``Avg bus bandwidth`` trailer.
Without launcher prefixes, interleaved output of concurrent processes cannot be separated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from c4d.formats.budget import Budget, BudgetError, LineReader, human

# memory a parsed line holds until its run's DataFrame is built (a row is a dict of ~15 values)
ROW_COST = 1536
DEVICE_COST = 512
LINE_COST = 128
STREAM_COST = 4096
JSON_COST = 16  # json.loads of a document: Python objects per byte of text, at worst


class NcclTestsError(ValueError):
    """The input holds no nccl-tests result (or is malformed JSON)."""


@dataclass(frozen=True)
class Device:
    """One ``#  Rank  0 Group  0 Pid 6899 on host device  0 [0000:04:00] NVIDIA H100`` line."""

    rank: int
    group: int
    pid: int
    host: str
    device: int
    pci: str
    name: str

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "group": self.group,
            "pid": self.pid,
            "host": self.host,
            "device": self.device,
            "pci": self.pci,
            "name": self.name,
        }


# Program name -> the collective it measures (for callers that map runs to NCCL ops).
COLLECTIVES = {
    "all_reduce_perf": "AllReduce",
    "all_gather_perf": "AllGather",
    "reduce_scatter_perf": "ReduceScatter",
    "broadcast_perf": "Broadcast",
    "reduce_perf": "Reduce",
    "alltoall_perf": "AllToAll",
    "gather_perf": "Gather",
    "scatter_perf": "Scatter",
    "sendrecv_perf": "SendRecv",
    "hypercube_perf": "HyperCube",
}

# DataFrame columns of ``NcclTestsRun.rows``. Per block (``oop`` = out-of-place, ``ip`` =
# in-place): time_us, algbw_gbs, busbw_gbs, wrong (count of wrong elements; NaN when not checked
# or when the build prints the older ``error`` column instead, then in ``error``), and, with
# ``-I 1``, imin_us, imax_us, ip99_us, icv_pct. ``root`` is <NA> when the build has no root column.
PREFIX_COLUMNS = ("size", "count", "type", "redop", "root")
BLOCK_FIELDS = ("time_us", "algbw_gbs", "busbw_gbs", "wrong")
_HEADER_TO_FIELD = {
    "time": "time_us",
    "cputime": "time_us",
    "algbw": "algbw_gbs",
    "busbw": "busbw_gbs",
    "#wrong": "wrong",
    "error": "error",
    "i_min": "imin_us",
    "i_max": "imax_us",
    "i_p99": "ip99_us",
    "i_cv%": "icv_pct",
}


@dataclass(frozen=True, eq=False)
class NcclTestsRun:
    """One run of one nccl-tests binary, as printed.

    ``avg_busbw_gbs`` is the trailer's ``# Avg bus bandwidth`` (GB/s, 1e9 B/s): the arithmetic
    mean of every busbw printed, out-of-place and in-place; ``None`` when the output was cut off
    before the trailer. ``avg_busbw_flag`` is the ``OK``/``FAILED`` word nccl-tests adds when
    ``NCCL_TESTS_MIN_BW`` is set. ``failures`` holds the ``Test failure`` and ``# error:`` lines.
    """

    program: str | None
    version: str | None
    nccl_version: str | None
    params: dict[str, str]
    devices: tuple[Device, ...]
    rows: pd.DataFrame
    avg_busbw_gbs: float | None
    avg_busbw_flag: str | None
    out_of_bounds: int | None
    failures: tuple[str, ...]
    wrong_column: str = "#wrong"
    cputime: bool = False

    @property
    def collective(self) -> str | None:
        return COLLECTIVES.get(self.program or "")

    @property
    def hosts(self) -> list[str]:
        """Host names of the devices, in rank order, each once."""
        return list(dict.fromkeys(d.host for d in self.devices))

    @property
    def wrong_total(self) -> int | None:
        """Wrong elements over every size and both blocks; None if the build did not count them."""
        if self.wrong_column != "#wrong" or self.rows.empty:
            return None
        vals = pd.concat([self.rows["oop_wrong"], self.rows["ip_wrong"]]).dropna()
        return int(vals.sum()) if len(vals) else None

    @property
    def computed_avg_busbw_gbs(self) -> float | None:
        """The trailer's figure recomputed from the rows (a check on the parse and the source)."""
        vals = pd.concat([self.rows["oop_busbw_gbs"], self.rows["ip_busbw_gbs"]]).dropna()
        return float(vals.mean()) if len(vals) else None

    def to_dict(self) -> dict:
        """JSON-ready view: ``rows`` carry nested ``out_of_place``/``in_place`` objects."""
        return {
            "program": self.program,
            "collective": self.collective,
            "version": self.version,
            "nccl_version": self.nccl_version,
            "params": dict(self.params),
            "avg_busbw_gbs": self.avg_busbw_gbs,
            "avg_busbw_flag": self.avg_busbw_flag,
            "out_of_bounds": self.out_of_bounds,
            "wrong_total": self.wrong_total,
            "rows": [_row_dict(r) for r in self.rows.to_dict("records")],
            "devices": [d.to_dict() for d in self.devices],
            "failures": list(self.failures),
        }


def _clean(v):
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):  # numpy scalar
        return v.item()
    return v


def _row_dict(r: dict) -> dict:
    out = {k: _clean(r.get(k)) for k in PREFIX_COLUMNS}
    for prefix, key in (("oop", "out_of_place"), ("ip", "in_place")):
        block = {f: _clean(r.get(f"{prefix}_{f}")) for f in BLOCK_FIELDS}
        if block["wrong"] is not None and float(block["wrong"]).is_integer():
            block["wrong"] = int(block["wrong"])
        for extra in ("error", "imin_us", "imax_us", "ip99_us", "icv_pct"):
            if f"{prefix}_{extra}" in r:
                block[extra] = _clean(r[f"{prefix}_{extra}"])
        out[key] = None if block["time_us"] is None else block
    if "timestamp" in r:
        out["timestamp"] = _clean(r["timestamp"])
    return out


# ---------------------------------------------------------------- text


_LAUNCHER_PREFIXES = (
    re.compile(r"^\[(\d+,\d+)\]<std(?:out|err)>:"),  # mpirun --tag-output
    re.compile(r"^\[([A-Za-z]\w*\d+)\]:"),  # torchrun --tee (``[default0]:``)
    re.compile(r"^\s*(\d+): "),  # srun --label
)
_RE_VERSION = re.compile(r"^#\s*nccl-tests version (\S+)")
_RE_LIBRARY = re.compile(r"nccl-library=(\d+)")
_RE_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_RE_CONCLUDED = re.compile(r"^#\s*Collective test concluded:\s*(\S+)")
_RE_PARAMS = re.compile(r"^#\s*nThread\s")
_RE_PARAM_ITEM = re.compile(
    r"(warmup iters|agg iters|iters|nThread|nGpus|minBytes|maxBytes|step|validation|graph|unalign):?\s+(\S+)"
)
_PARAM_KEYS = {
    "nThread": "threads",
    "nGpus": "gpus",
    "minBytes": "min_bytes",
    "maxBytes": "max_bytes",
    "step": "step",
    "warmup iters": "warmup_iters",
    "iters": "iters",
    "agg iters": "agg_iters",
    "validation": "validation",
    "graph": "graph",
    "unalign": "unalign",
}
_RE_DEVICE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_RE_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_RE_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_RE_ERROR = re.compile(r"^#\s*error:\s*(.+)")
_RE_NCCL_BANNER = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_RE_PROGRAM_HINT = re.compile(r"\b(\w+_perf)\b")
_INT = re.compile(r"^-?\d+$")


def _library_version(code: int) -> str:
    """NCCL_VERSION_CODE -> "2.29.2" (codes from 2.9 on are major*10000+minor*100+patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


@dataclass
class _Layout:
    """Column layout taken from the header line (default: the current nccl-tests layout)."""

    prefix: list[str] = field(default_factory=lambda: list(PREFIX_COLUMNS))
    block: list[str] = field(default_factory=lambda: ["time_us", "algbw_gbs", "busbw_gbs", "wrong"])
    timestamp: bool = False
    wrong_column: str = "#wrong"
    cputime: bool = False

    @classmethod
    def from_header(cls, tokens: list[str]) -> _Layout | None:
        time_idx = [i for i, t in enumerate(tokens) if t in ("time", "cputime")]
        if len(time_idx) != 2:
            return None
        prefix = tokens[: time_idx[0]]
        block_tokens = tokens[time_idx[0] : time_idx[1]]
        rest = tokens[time_idx[1] :]
        if rest[: len(block_tokens)] != block_tokens or any(t not in _HEADER_TO_FIELD for t in block_tokens):
            return None
        if not {"size", "count"} <= set(prefix) or any(t not in PREFIX_COLUMNS for t in prefix):
            return None
        trailing = rest[len(block_tokens) :]
        return cls(
            prefix=prefix,
            block=[_HEADER_TO_FIELD[t] for t in block_tokens],
            timestamp=trailing == ["timestamp"],
            wrong_column="error" if "error" in block_tokens else "#wrong",
            cputime=block_tokens[0] == "cputime",
        )

    def parse_row(self, tokens: list[str]) -> dict | None:
        if len(tokens) < 2 or not (_INT.match(tokens[0]) and _INT.match(tokens[1])):
            return None
        n_prefix, n_block = len(self.prefix), len(self.block)
        ts = None
        if self.timestamp and len(tokens) >= 2 and re.match(r"^\d\d:\d\d:\d\d$", tokens[-1]):
            ts = " ".join(tokens[-2:])
            tokens = tokens[:-2]
        if len(tokens) == n_prefix + 2 * n_block:
            blocks: dict[str, list[str] | None] = {
                "oop": tokens[n_prefix : n_prefix + n_block],
                "ip": tokens[n_prefix + n_block :],
            }
        elif len(tokens) == n_prefix + n_block:  # no out-of-place body (trace replay)
            blocks = {"oop": None, "ip": tokens[n_prefix:]}
        else:
            return None
        row: dict = {"root": pd.NA}
        try:
            for name, tok in zip(self.prefix, tokens[:n_prefix], strict=True):
                row[name] = int(tok) if name in ("size", "count", "root") else tok
            for b, vals in blocks.items():
                for f in ("time_us", "algbw_gbs", "busbw_gbs", "wrong"):
                    row[f"{b}_{f}"] = math.nan
                toks: list[str | None] = list(vals) if vals else [None] * n_block
                for f, val in zip(self.block, toks, strict=True):
                    row[f"{b}_{f}"] = _num(val)
        except ValueError:
            return None
        if ts is not None:
            row["timestamp"] = ts
        return row


def _num(tok: str | None) -> float:
    if tok is None or tok in ("N/A", "-"):
        return math.nan
    return float(tok)


class _Builder:
    """Accumulates one run of one stream."""

    def __init__(self, layout: _Layout | None = None, program_hint: str | None = None):
        self.version: str | None = None
        self.library: str | None = None
        self.program: str | None = None
        self.program_hint = program_hint
        self.params: dict[str, str] = {}
        self.devices: list[Device] = []
        self.layout = layout or _Layout()
        self.rows: list[dict] = []
        self.avg: float | None = None
        self.avg_flag: str | None = None
        self.oob: int | None = None
        self.failures: list[str] = []
        self.nccl_banner: str | None = None
        self.header_seen = False

    def past_preamble(self) -> bool:
        return bool(self.devices or self.header_seen or self.rows or self.avg is not None)

    def has_result(self) -> bool:
        return bool(self.rows) or self.avg is not None

    def build(self) -> NcclTestsRun:
        rows = pd.DataFrame(self.rows)
        for c in PREFIX_COLUMNS:
            if c not in rows:
                rows[c] = pd.Series(dtype="object")
        for b in ("oop", "ip"):
            for f in BLOCK_FIELDS:
                if f"{b}_{f}" not in rows:
                    rows[f"{b}_{f}"] = pd.Series(dtype="float64")
        rows = rows[[*PREFIX_COLUMNS, *(c for c in rows.columns if c not in PREFIX_COLUMNS)]]
        if len(rows):
            rows["size"] = rows["size"].astype("int64")
            rows["count"] = rows["count"].astype("int64")
            rows["root"] = rows["root"].astype("Int64")
        return NcclTestsRun(
            program=self.program or self.program_hint,
            version=self.version,
            nccl_version=self.library or self.nccl_banner,
            params=self.params,
            devices=tuple(self.devices),
            rows=rows,
            avg_busbw_gbs=self.avg,
            avg_busbw_flag=self.avg_flag,
            out_of_bounds=self.oob,
            failures=tuple(self.failures),
            wrong_column=self.layout.wrong_column,
            cputime=self.layout.cputime,
        )


def _split_line(raw: str) -> tuple[str | None, str]:
    """(launcher rank prefix or None, the line without it)."""
    line = raw.rstrip("\r\n")
    for rx in _LAUNCHER_PREFIXES:
        m = rx.match(line)
        if m:
            return m.group(1), line[m.end() :]
    return None, line


class _StreamParser:
    """The runs of one stream (one launcher rank's lines), fed a line at a time."""

    def __init__(self, budget: Budget | None = None):
        self.runs: list[NcclTestsRun] = []
        self.hint: str | None = None
        self.orphan_failures: list[str] = []
        self.b = _Builder()
        self.budget = budget

    def _charge(self, n: int, what: str) -> None:
        if self.budget is not None:
            self.budget.charge(n, what)

    def finish(self, new_layout: _Layout | None = None) -> _Builder:
        b = self.b
        if b.has_result():
            self.runs.append(b.build())
        else:
            self.orphan_failures.extend(b.failures)
        self.b = _Builder(new_layout, self.hint)
        return self.b

    def feed(self, line: str) -> None:
        b = self.b
        s = line.strip()
        if not s:
            return
        if s.startswith("#"):
            if m := _RE_VERSION.match(s):
                if b.past_preamble() or b.version or b.program or b.params:
                    b = self.finish()
                b.version = m.group(1)
                if lib := _RE_LIBRARY.search(s):
                    b.library = _library_version(int(lib.group(1)))
            elif m := _RE_STARTING.match(s):
                if b.past_preamble() or b.program or b.params:
                    b = self.finish()
                b.program = m.group(1)
            elif _RE_PARAMS.match(s):
                if b.past_preamble() or b.params:
                    b = self.finish()
                b.params = {_PARAM_KEYS[k]: v for k, v in _RE_PARAM_ITEM.findall(s)}
            elif m := _RE_DEVICE.match(s):
                if b.header_seen or b.rows:
                    b = self.finish()
                g = m.groups()
                self._charge(DEVICE_COST + len(s), "device lines")
                b.devices.append(Device(int(g[0]), int(g[1]), int(g[2]), g[3], int(g[4]), g[5], g[6]))
            elif m := _RE_OOB.match(s):
                b.oob = int(m.group(1))
            elif m := _RE_AVG.match(s):
                b.avg = float(m.group(1))
                b.avg_flag = m.group(2)
            elif m := _RE_CONCLUDED.match(s):
                b.program = b.program or m.group(1)
            elif m := _RE_ERROR.match(s):
                self._charge(LINE_COST + len(s), "error lines")
                b.failures.append(m.group(1).strip())
            else:
                tokens = s.lstrip("#").split()
                if "size" in tokens and "busbw" in tokens:
                    layout = _Layout.from_header(tokens)
                    if layout is not None:
                        if b.rows or b.avg is not None:
                            keep = b
                            b = self.finish(layout)
                            b.params, b.devices = keep.params, list(keep.devices)
                            b.version, b.program, b.library = keep.version, keep.program, keep.library
                        b.layout = layout
                        b.header_seen = True
            return
        if "Test failure" in s or "NCCL failure" in s or "Cuda failure" in s:
            self._charge(LINE_COST + len(s), "failure lines")
            b.failures.append(s.lstrip(". ").strip())
            return
        if (m := _RE_NCCL_BANNER.search(s)) and b.nccl_banner is None:
            b.nccl_banner = m.group(1)
        row = b.layout.parse_row(s.split())
        if row is not None:
            if b.avg is not None:  # a table after a trailer without a new preamble: a new run
                b = self.finish(b.layout)
            self._charge(ROW_COST, "table rows")
            b.rows.append(row)
            return
        if hm := _RE_PROGRAM_HINT.search(s):
            self.hint = hm.group(1)
            if not b.past_preamble() and b.program_hint is None:
                b.program_hint = self.hint


def _parse_stream(lines: Iterable[str]) -> tuple[list[NcclTestsRun], list[str]]:
    """Runs of one stream, and failure lines that belong to no run."""
    sp = _StreamParser()
    for line in lines:
        sp.feed(line)
    sp.finish()
    return sp.runs, sp.orphan_failures


def parse_lines(lines: Iterable[str], budget: Budget | None = None) -> list[NcclTestsRun]:
    """Every run in nccl-tests stdout given line by line (raw, or as captured by a launcher);
    memory holds the runs' rows, not the text. Raises :class:`NcclTestsError` if there is none."""
    streams: dict[str | None, _StreamParser] = {}
    for raw in lines:
        key, line = _split_line(raw)
        sp = streams.get(key)
        if sp is None:
            if budget is not None:
                budget.charge(STREAM_COST, "a launcher rank's stream")
            sp = streams[key] = _StreamParser(budget)
        sp.feed(line)
        if budget is not None:
            budget.tick("nccl-tests text")
    runs: list[NcclTestsRun] = []
    orphans: list[str] = []
    for sp in streams.values():
        sp.finish()
        runs.extend(sp.runs)
        orphans.extend(sp.orphan_failures)
    if not runs:
        raise NcclTestsError("no nccl-tests result table or 'Avg bus bandwidth' line found")
    if orphans:  # e.g. another rank's "Test failure" line under its own launcher prefix
        last = runs[-1]
        runs[-1] = dataclasses.replace(last, failures=last.failures + tuple(orphans))
    return runs


def parse_text(text: str) -> list[NcclTestsRun]:
    """Every run in nccl-tests stdout (raw, or as captured by a launcher). Raises
    :class:`NcclTestsError` if there is none."""
    return parse_lines(text.splitlines())


# ---------------------------------------------------------------- JSON (-J)


def parse_json(text: str) -> NcclTestsRun:
    """The report ``-J file.json`` writes (JSON_FILE_VERSION 2 and its predecessors)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise NcclTestsError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict) or "results" not in doc:
        raise NcclTestsError("JSON has no 'results' list: not an nccl-tests -J report")
    try:
        return _from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise NcclTestsError(f"not an nccl-tests -J report ({what})") from None


def _from_json(doc: dict) -> NcclTestsRun:
    cfg = doc.get("config") or {}
    params = {k: str(v) for k, v in cfg.items()}
    devices = tuple(
        Device(
            int(d.get("rank", -1)),
            int(d.get("group", 0)),
            int(d.get("pid", 0)),
            str(d.get("hostname", "")),
            int(d.get("device", -1)),
            str(d.get("device_hex", "")),
            str(d.get("device_info", "")),
        )
        for d in (cfg.get("devices") or doc.get("devices") or [])
    )
    rows = []
    cputime = False
    for r in doc.get("results") or []:
        row: dict = {
            "size": int(r["size"]),
            "count": int(r["count"]),
            "type": r.get("type"),
            "redop": r.get("redop"),
            "root": int(str(r.get("root", "")).strip() or -1),
        }
        for b, key in (("oop", "out_of_place"), ("ip", "in_place")):
            blk = r.get(key) or {}
            cputime = cputime or "cpu_time" in blk
            row[f"{b}_time_us"] = _num(_s(blk.get("time", blk.get("cpu_time"))))
            row[f"{b}_algbw_gbs"] = _num(_s(blk.get("alg_bw")))
            row[f"{b}_busbw_gbs"] = _num(_s(blk.get("bus_bw")))
            row[f"{b}_wrong"] = _num(_s(blk.get("nwrong")))
        rows.append(row)
    builder = _Builder()
    builder.rows = rows
    avg = doc.get("average_bus_bandwidth") or {}
    oob = doc.get("out_of_bounds") or {}
    okay = avg.get("okay")
    run = builder.build()
    args = doc.get("args") or []
    program = Path(args[0]).name if args else None
    code = doc.get("nccl_version")
    return NcclTestsRun(
        program=program,
        version=None,
        nccl_version=_library_version(int(code)) if isinstance(code, int) and code > 0 else None,
        params=params,
        devices=devices,
        rows=run.rows,
        avg_busbw_gbs=_num(_s(avg.get("bandwidth"))) if "bandwidth" in avg else None,
        avg_busbw_flag={"true": "OK", "false": "FAILED", True: "OK", False: "FAILED"}.get(okay),
        out_of_bounds=int(oob["count"]) if "count" in oob else None,
        failures=tuple(str(e) for e in doc.get("errors") or [] if e),
        cputime=cputime,
    )


def _s(v) -> str | None:
    return None if v is None else str(v)


def parse_file(
    path: str | Path, budget: Budget | None = None, warns: list[str] | None = None
) -> list[NcclTestsRun]:
    """A saved output: nccl-tests stdout (any launcher) or a ``-J`` JSON report. Text is read
    line by line under ``budget`` (lines over its limit skipped, one line in ``warns``); a JSON
    report is parsed whole, so its size times JSON_COST must fit the budget."""
    p = Path(path)
    budget = budget or Budget()
    with open(p, "rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"{"):
        size = p.stat().st_size
        budget.fits(size * JSON_COST, f"{p}: a {human(size)} JSON report")
        return [parse_json(p.read_text(encoding="utf-8", errors="replace"))]
    reader = LineReader(p, budget)
    try:
        runs = parse_lines((ln.decode("utf-8", errors="replace") for ln in reader), budget)
    except BudgetError as e:
        raise BudgetError(f"{p}, line {reader.lines}: {e}") from None
    if warns is not None and (w := reader.warning()):
        warns.append(w)
    return runs
