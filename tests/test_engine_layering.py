"""Imports run one way: schema → wire / trace (file I/O only) → formats → engine (no I/O) →
analyze → master / cli / report / live. Each module is imported in a fresh interpreter and
what it pulled in is checked: a loader that knows the engine, an engine that knows the
trace file, or an offline analysis that loads pyzmq fails here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import c4d_cmd

UPPER_OF_TRACE = ("c4d.formats", "c4d.engine", "c4d.analyze", "c4d.master", "c4d.collector", "c4d.cli")
NETWORK = ("zmq", "c4d.collector", "c4d.master")
REPORTING = ("c4d.metrics", "c4d.report", "c4d.live", "c4d.cli", "rich")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "c4d.schema": ("c4d.wire", "c4d.trace", *UPPER_OF_TRACE, "zmq", "pandas"),
    "c4d.wire": ("c4d.trace", *UPPER_OF_TRACE, "zmq"),
    # pandas (~0.5 s to import) only where a DataFrame is asked for, never on the replay path
    "c4d.trace": (*UPPER_OF_TRACE, "zmq", "pandas"),
    "c4d.formats.to_records": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.flight_recorder": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_columns": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_convert": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_limits": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_load": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.inspector": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.formats.nccl_tests": ("c4d.engine", "c4d.analyze", *NETWORK),
    "c4d.formats.detect": ("c4d.engine", "c4d.analyze", *NETWORK, "pandas"),
    "c4d.engine": ("c4d.trace", "c4d.formats", "c4d.analyze", *REPORTING, *NETWORK, "pandas", "matplotlib"),
    "c4d.analyze": (*REPORTING, *NETWORK, "matplotlib", "pandas"),
    "c4d.report": NETWORK,
    # the live master runs the engine, not the offline analysis (c4d.engine.make_engine)
    "c4d.master": ("c4d.analyze", "c4d.report", "c4d.cli", "pandas", "matplotlib"),
}


def _imported(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_module_imports_only_lower_layers(module):
    mods = _imported(f"import {module}")
    bad = sorted(m for m in mods if any(m == f or m.startswith(f + ".") for f in FORBIDDEN[module]))
    assert bad == [], f"{module} pulled in {bad}"


@pytest.mark.slow
def test_offline_analysis_does_not_load_zmq(tmp_path):
    """`c4d analyze` and `c4d report` of a trace, run in-process: no networking module loaded."""
    from c4d import trace

    p = tmp_path / "empty.c4d"
    trace.TraceWriter(p, {"job": "t"}).close()
    runs = [["analyze", str(p), "--json"], ["report", str(p), "-o", str(tmp_path / "r")]]
    code = f"import sys\nfrom c4d import cli\nfor argv in {runs!r}:\n    assert cli.main(argv) == 0\n"
    mods = _imported(code)
    assert not [m for m in mods if m.split(".")[0] == "zmq" or m in ("c4d.master", "c4d.collector")]


@pytest.mark.slow
def test_analyze_json_of_flight_recorder_dumps_loads_no_pandas(tmp_path):
    """`c4d analyze DIR --json` replays without DataFrames: pandas' import alone is ~10% of
    analyzing 256 ranks' dumps (analysis/bench_fr.py); the text report's table still uses it."""
    from tests import fr_factory as f

    f.write(f.build(f.Job(tp=2, dp=2, steps=3, hang=f.Hang(op_index=1, missing=(3,)))), tmp_path)
    code = f"from c4d import cli\nassert cli.main(['analyze', {str(tmp_path)!r}, '--json']) == 2\n"
    mods = _imported(code)
    assert "c4d.engine" in mods and "c4d.formats.flight_recorder" in mods
    assert "pandas" not in mods
    text = _imported(f"from c4d import cli\nassert cli.main(['analyze', {str(tmp_path)!r}]) == 2\n")
    assert "pandas" in text  # the summary table


def test_c4d_analyze_cli_of_an_empty_trace_says_no_diagnoses(tmp_path):
    from c4d import trace

    p = tmp_path / "empty.c4d"
    trace.TraceWriter(p).close()
    out = subprocess.run(c4d_cmd("analyze", p, "--json"), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "", out.stderr


def _import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """c4d's modules and what each imports of c4d: at module level, and inside functions."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    mods: dict[str, Path] = {}
    for p in (root / "c4d").rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    top: dict[str, set[str]] = {}
    inner: dict[str, set[str]] = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        at_top = {
            id(n)
            for b in tree.body
            for n in ast.walk(b)
            if not isinstance(b, (ast.FunctionDef, ast.ClassDef))
        }
        top[m], inner[m] = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                names = subs if len(subs) == len(node.names) else [node.module, *subs]
            else:
                continue
            for n in names:
                r = resolve(n) if n.startswith("c4d") else None
                if r and r != m and not m.startswith(r + "."):  # (a package's own modules import it first)
                    (top if id(node) in at_top else inner)[m].add(r)
    return top, inner


def _reaches(g: dict[str, set[str]], a: str, b: str) -> bool:
    seen, todo = {a}, [a]
    while todo:
        x = todo.pop()
        if x == b:
            return True
        for y in g.get(x, ()):
            if y not in seen:
                seen.add(y)
                todo.append(y)
    return False


def test_no_import_circles_and_no_import_inside_a_function_that_would_close_one():
    """Imports run one way. An import inside a function is for start-up time or an optional
    dependency, never to dodge a circle: with every such import counted, the graph has none."""
    top, inner = _import_graph()
    assert len(top) > 50  # every module was read
    full = {m: top[m] | inner[m] for m in top}
    circles = sorted((a, b) for a in full for b in full[a] if _reaches(full, b, a))
    assert circles == []


# The engine's memory, lowest first: each module imports only those before it (the pool and the
# reduction reach a communicator through the protocols they name, Pooled and Reducible).
ENGINE_MEMORY = (
    "c4d.engine.rows",
    "c4d.engine.ranks",
    "c4d.engine.compute",
    "c4d.engine.pool",
    "c4d.engine.reduce",
    "c4d.engine.comm",
    "c4d.engine.p2p_pairs",
)


def test_the_engine_memory_modules_import_only_the_ones_below_them():
    top, inner = _import_graph()
    bad = {
        m: sorted(x for x in top[m] | inner[m] if x.startswith("c4d.engine.") and x not in ENGINE_MEMORY[:i])
        for i, m in enumerate(ENGINE_MEMORY)
    }
    assert {m: b for m, b in bad.items() if b} == {}
    assert "c4d.engine.state" not in top  # split by concern into the modules above


# The parts under the Engine facade (engine.py): the input side (batches cut into chunks, chunks
# into the memory) and the output side (a tick's diagnoses, the live view) read the memory and
# the judges; neither imports the facade, nor the other side.
ENGINE_INPUT = (
    "c4d.engine.chunking",
    "c4d.engine.comm_index",
    "c4d.engine.ingest",
    "c4d.engine.ingest_ops",
    "c4d.engine.ingest_summaries",
)
ENGINE_OUTPUT = ("c4d.engine.emission", "c4d.engine.snapshot")


def test_the_engine_parts_import_neither_the_facade_nor_the_other_side():
    top, inner = _import_graph()
    bad = {}
    for side, other in ((ENGINE_INPUT, ENGINE_OUTPUT), (ENGINE_OUTPUT, ENGINE_INPUT)):
        for m in side:
            got = (top[m] | inner[m]) & {"c4d.engine.engine", *other}
            if got:
                bad[m] = sorted(got)
    assert bad == {}
    assert {"c4d.engine.chunking", "c4d.engine.ingest", "c4d.engine.emission"} <= top["c4d.engine.engine"]
