"""Imports run one way, floor by floor (c4d/*/__init__.py says what each package owns):

    util, cli_common -> record -> engine, actions -> intake, formats -> offline, master
    -> agent -> sim, run, check -> cli (and the facade c4d.analyze)

A module imports only packages on floors below its own, at module level or inside a function.
Each module named in FORBIDDEN is also imported in a fresh interpreter and what it pulled in is
checked: a loader that knows the engine, an engine that knows the trace file, or an offline
analysis that loads pyzmq fails here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import c4d_cmd

UPPER_OF_TRACE = (
    "c4d.formats",
    "c4d.engine",
    "c4d.offline.analyze",
    "c4d.master.master",
    "c4d.master.collector",
    "c4d.cli",
)
NETWORK = ("zmq", "c4d.master.collector", "c4d.master.master")
REPORTING = ("c4d.master.metrics", "c4d.offline.report", "c4d.master.live", "c4d.cli", "rich")
# what a module of a floor may not load when imported: the packages above it
ABOVE_UTIL = ("c4d.record", "c4d.engine", "c4d.intake", "c4d.formats", "c4d.offline", "c4d.master", "c4d.cli")
ABOVE_RECORD = ABOVE_UTIL[1:]
ABOVE_INTAKE = ("c4d.formats", "c4d.offline", "c4d.master", "c4d.agent", "c4d.sim", "c4d.cli")
ABOVE_MASTER = ("c4d.offline", "c4d.agent", "c4d.sim", "c4d.run", "c4d.check", "c4d.cli")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "c4d.record.schema": ("c4d.record.wire", "c4d.record.trace", *UPPER_OF_TRACE, "zmq", "pandas"),
    "c4d.record.wire": ("c4d.record.trace", *UPPER_OF_TRACE, "zmq"),
    # pandas (~0.5 s to import) only where a DataFrame is asked for, never on the replay path
    "c4d.record.trace": (*UPPER_OF_TRACE, "zmq", "pandas"),
    "c4d.formats.to_records": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.flight_recorder": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_columns": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_convert": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_limits": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.fr_load": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.inspector": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.formats.nccl_tests": ("c4d.engine", "c4d.offline.analyze", *NETWORK),
    "c4d.formats.detect": ("c4d.engine", "c4d.offline.analyze", *NETWORK, "pandas"),
    "c4d.engine": (
        "c4d.record.trace",
        "c4d.formats",
        "c4d.offline.analyze",
        *REPORTING,
        *NETWORK,
        "pandas",
        "matplotlib",
    ),
    "c4d.offline.analyze": (*REPORTING, *NETWORK, "matplotlib", "pandas"),
    "c4d.offline.report": NETWORK,
    # the live master runs the engine, not the offline analysis (c4d.engine.make_engine)
    "c4d.master.master": ("c4d.offline.analyze", "c4d.offline.report", "c4d.cli", "pandas", "matplotlib"),
    "c4d.util.ratelog": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.util.heap": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.util.native": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.util.signals": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.util.texttable": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.util.stacks": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.util.stacks_view": (*ABOVE_UTIL, "zmq", "pandas"),
    "c4d.record.names": ("c4d.record.schema", *ABOVE_RECORD, "zmq", "pandas"),
    "c4d.record.columns": ("c4d.record.trace", *ABOVE_RECORD, "zmq", "pandas"),
    "c4d.record.opstats": ("c4d.record.trace", *ABOVE_RECORD, "zmq", "pandas"),
    "c4d.record.framing": (*ABOVE_RECORD, "zmq", "pandas"),
    "c4d.engine.incidents": ("c4d.intake", *ABOVE_INTAKE, "c4d.record.trace", "zmq", "pandas", "rich"),
    "c4d.intake.validate": (*ABOVE_INTAKE, "c4d.record.trace", "zmq", "pandas", "rich"),
    "c4d.intake.ingest": (*ABOVE_INTAKE, "c4d.record.trace", "zmq", "pandas", "rich"),
    "c4d.intake.received": (*ABOVE_INTAKE, "c4d.engine", "zmq", "pandas", "rich"),
    "c4d.offline.perfetto": NETWORK,
    "c4d.master.collector": (*ABOVE_MASTER, "pandas", "matplotlib"),
    "c4d.master.engine_process": (*ABOVE_MASTER, "pandas", "matplotlib"),
    "c4d.master.metrics": (*ABOVE_MASTER, "pandas", "matplotlib"),
    "c4d.master.live": (*ABOVE_MASTER, "pandas", "matplotlib"),
    "c4d.master.curve": (*ABOVE_MASTER, "pandas", "matplotlib"),
    "c4d.master.status": (*ABOVE_MASTER, "pandas", "matplotlib"),
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
    from c4d.record import trace

    p = tmp_path / "empty.c4d"
    trace.TraceWriter(p, {"job": "t"}).close()
    runs = [["analyze", str(p), "--json"], ["report", str(p), "-o", str(tmp_path / "r")]]
    code = f"import sys\nfrom c4d import cli\nfor argv in {runs!r}:\n    assert cli.main(argv) == 0\n"
    mods = _imported(code)
    assert not [
        m for m in mods if m.split(".")[0] == "zmq" or m in ("c4d.master.master", "c4d.master.collector")
    ]


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
    from c4d.record import trace

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
    "c4d.engine.sampling",
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


# Floors, lowest first: a module imports packages of lower floors only (same package aside). The
# root, c4d/__init__.py, only hands out c4d.hang_timeout (phase); cli_common (exit statuses, the
# parser) imports nothing, so the command families start without the top command.
FLOORS = (
    ("util", "phase", "cli_common"),
    ("c4d", "record"),
    ("engine", "actions"),
    ("intake", "formats"),
    ("offline", "master"),
    ("agent",),
    ("sim", "run", "check"),
    ("cli", "__main__", "analyze"),
)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_imports_only_lower_floors():
    top, inner = _import_graph()
    floor = {p: i for i, names in enumerate(FLOORS) for p in names}
    assert sorted({_package(m) for m in top} - set(floor)) == []  # every package has its floor
    bad = sorted(
        (m, x)
        for m in top
        for x in top[m] | inner[m]
        if _package(x) != _package(m)
        and floor[_package(x)] >= floor[_package(m)]
        and not floor[_package(x)] == floor[_package(m)] == len(FLOORS) - 1  # the command line's own
    )
    assert bad == []


def test_the_analyze_facade_is_for_users_only():
    """c4d.analyze re-exports what docs/trace-api.md and the notebook use; nothing in c4d imports it."""
    import c4d.analyze as facade
    import c4d.offline.analyze as analyze

    top, inner = _import_graph()
    assert sorted(m for m in top if "c4d.analyze" in top[m] | inner[m]) == []
    assert {"load", "load_raw", "replay", "replay_chunks", "make_engine", "iter_table", "to_parquet"} <= set(
        facade.__all__
    )
    assert all(getattr(facade, n) is getattr(analyze, n) for n in facade.__all__)
