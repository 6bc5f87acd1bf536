"""What c4d writes and reads on disk, and what it runs: file modes of the trace and the blacklist,
Flight Recorder pickles only through the restricted unpickler (malicious pickles through the real
CLI), and a source audit that no module runs a shell, evaluates text or unpickles freely."""

from __future__ import annotations

import ast
import os
import pickle
import stat
import subprocess
from pathlib import Path

import pytest

from c4d.actions.blacklist import append_nodes
from c4d.formats import flight_recorder as fr
from c4d.record import trace
from tests import fr_factory as frf
from tests.conftest import c4d_cmd

PACKAGE = Path(__file__).resolve().parents[1] / "c4d"


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_trace_is_0640_new_or_narrowed(tmp_path, umask022):
    new = tmp_path / "new.c4d"
    trace.TraceWriter(new).close()
    assert _mode(new) == 0o640
    old = tmp_path / "old.c4d"
    old.write_bytes(b"x")
    os.chmod(old, 0o666)
    trace.TraceWriter(old).close()
    assert _mode(old) == 0o640
    strict = tmp_path / "strict.c4d"
    os.umask(0o077)
    trace.TraceWriter(strict).close()
    assert _mode(strict) == 0o600  # the umask can only narrow it


def test_blacklist_is_0644_new_and_keeps_an_operators_mode(tmp_path, umask022):
    new = tmp_path / "bad-nodes.txt"
    assert append_nodes(new, ["node-3"]) == ["node-3"]
    assert _mode(new) == 0o644 and new.read_text() == "node-3\n"
    mine = tmp_path / "mine.txt"
    mine.write_text("node-1\n")
    os.chmod(mine, 0o600)
    append_nodes(mine, ["node-2"])
    assert _mode(mine) == 0o600 and mine.read_text() == "node-1\nnode-2\n"


# ------------------------------------------------------------ Flight Recorder pickles


def _evil_pickles(marker: Path) -> dict[str, bytes]:
    """Pickles that run a command when loaded by ``pickle.load``, by every opcode that imports."""
    cmd = f"touch {marker}".encode()

    class Reduce:
        def __reduce__(self):
            return (os.system, (cmd.decode(),))

    return {
        "reduce-p2": pickle.dumps({"version": "2.10", "entries": [Reduce()]}, protocol=2),
        "stack-global-p4": pickle.dumps({"version": "2.10", "entries": [Reduce()]}, protocol=4),
        "global-p0": b"cos\nsystem\n(S'" + cmd + b"'\ntR.",
        "inst-p0": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "builtins-eval": b'c__builtin__\neval\n(S\'__import__("os").system("' + cmd + b"\")'\ntR.",
        "persistent-id": b"\x80\x02Pxyz\n.",
    }


@pytest.mark.parametrize("name", list(_evil_pickles(Path("/x"))))
def test_malicious_flight_recorder_pickles_run_nothing_through_the_cli(tmp_path, name):
    """Rank 0 a real dump, rank 1 a malicious pickle: `c4d analyze` reads rank 0, refuses rank 1
    with one line (protocol-0 text pickles are not even taken for dumps), and the command inside
    was never run; the loader itself, handed the file, refuses it through its unpickler."""
    marker = tmp_path / "pwned"
    d = tmp_path / "dumps"
    d.mkdir()
    dumps = frf.build(frf.Job(tp=1, dp=2, steps=3))
    (d / "nccl_trace_rank_0").write_bytes(pickle.dumps(dumps[0], protocol=2))
    (d / "nccl_trace_rank_1").write_bytes(_evil_pickles(marker)[name])
    r = subprocess.run(c4d_cmd("analyze", d, "--format", "fr", "--json"), capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert not marker.exists(), f"{name}: the pickle ran its command"
    assert r.returncode in (0, 2), r.stderr
    said = [ln for ln in r.stderr.splitlines() if "nccl_trace_rank_1" in ln]
    refused = ("was not loaded", "persistent id", "not a pickle")
    assert len(said) == 1 and any(w in said[0] for w in refused), r.stderr
    with pytest.raises(fr.FormatError) as e:
        fr.load_dump(d / "nccl_trace_rank_1")
    assert not marker.exists() and ("was not loaded" in str(e.value) or "persistent id" in str(e.value))


# ------------------------------------------------------------------------ source audit


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                yield node, f"{f.value.id}.{f.attr}"
            elif isinstance(f, ast.Name):
                yield node, f.id


FORBIDDEN = {
    "os.system": "runs a shell",
    "os.popen": "runs a shell",
    "subprocess.getoutput": "runs a shell",
    "subprocess.getstatusoutput": "runs a shell",
    "eval": "evaluates text",
    "exec": "evaluates text",
    "pickle.load": "unpickles without restriction",
    "pickle.loads": "unpickles without restriction",
    "marshal.loads": "loads code objects",
}


# modules whose Unpickler subclass refuses every global it does not name (find_class): the
# Flight Recorder loader (plain data), the engine process's answers and the engine shards'
# messages (the engine's types, numpy)
GUARDED_UNPICKLERS = ("c4d/formats/fr_load.py", "c4d/master/engine_process.py", "c4d/engine/shards.py")


def _audit(source: str, rel: str) -> list[str]:
    """What in one module's source runs a shell, evaluates text or unpickles outside the guard."""
    found = []
    tree = ast.parse(source, rel)
    for node, name in _calls(tree):
        if name in FORBIDDEN:
            found.append(f"{rel}:{node.lineno} {name}: {FORBIDDEN[name]}")
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"{rel}:{node.lineno} shell=: may run a shell")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("recv_pyobj", "recv_serialized"):
            found.append(f"{rel}:{node.lineno} {node.attr}: unpickles from the wire")
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(b) for b in node.bases}
            if bases & {"pickle.Unpickler", "Unpickler"}:
                overrides = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                if rel not in GUARDED_UNPICKLERS or "find_class" not in overrides:
                    found.append(f"{rel}:{node.lineno} {node.name}: an unpickler outside the guarded loaders")
    return found


def test_the_audit_finds_what_it_looks_for():
    bad = """
import os, pickle, subprocess
subprocess.run(cmd, shell=True)
subprocess.Popen(cmd, shell=flag)
os.system("x")
pickle.loads(b)
eval(text)
sock.recv_pyobj()
class U(pickle.Unpickler):
    pass
"""
    found = _audit(bad, "c4d/formats/fr_load.py")
    assert len(found) == 7, found
    assert _audit("subprocess.run(argv, shell=False)\n", "c4d/x.py") == []


def test_no_module_runs_a_shell_evaluates_text_or_unpickles_freely():
    """Every c4d module, parsed: no shell=True (nor a shell= that isn't the constant False), no
    os.system/popen, eval/exec, pickle.load(s), recv_pyobj; an Unpickler only in the guarded
    loaders (the Flight Recorder dumps', the engine process's answers), overriding find_class."""
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = [f for p in files for f in _audit(p.read_text(), str(p.relative_to(PACKAGE.parent)))]
    assert found == []


def test_isolation_ledger_is_0600(tmp_path, umask022):
    from c4d.actions.isolate import Ledger

    led = Ledger(tmp_path / "isolated.json")
    led.add("slurm", "node-3")
    assert _mode(tmp_path / "isolated.json") == 0o600 and led.has("slurm", "node-3")
