"""Node isolation actions (c4d/actions/): the exact argv given to kubectl, scontrol and an
operator's executable, never through a shell, refused node names, --dry-run, idempotence.

kubectl and scontrol cannot run here (no cluster): tests/fake_bin/record-args stands in for
them, linked under their names on PATH; it records its argv and stdin and changes nothing.
Everything else (argv building, subprocess, the ledger, the journal) is the real code.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from c4d.actions import factory, isolate
from c4d.actions.command import CommandAction
from c4d.actions.kubernetes import Kubernetes
from c4d.actions.node_name import BadNodeName, check, is_valid
from c4d.actions.slurm import Slurm

FAKE = Path(__file__).resolve().parent / "fake_bin" / "record-args"

DIAG = {
    "time": 1732270000.123,
    "level": "ERROR",
    "kind": "RankNonCommHang",
    "comm": "00000000000000ab",
    "op": "AllReduce",
    "seq": 41,
    "ranks": [4, 5],
    "nodes": ["node-1"],
    "hang_times": 3,
    "detail": {"localized": True, "stacks": {"4": {"native": "#0 hung_kernel ()"}}},
}


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """kubectl and scontrol on PATH, both recording into one file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("kubectl", "scontrol"):
        (bin_dir / name).symlink_to(FAKE)
    rec = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RECORD_FILE", str(rec))
    monkeypatch.delenv("FAKE_RC", raising=False)

    def calls() -> list[dict]:
        return [json.loads(line) for line in rec.read_text().splitlines()] if rec.exists() else []

    return calls


def isolator(tmp_path, actions, **kw) -> isolate.Isolator:
    return isolate.Isolator(actions, tmp_path / "isolated.json", tmp_path / "actions.jsonl", **kw)


def test_kubernetes_cordons_taints_and_annotates_with_the_diagnosis(tmp_path, fakes):
    [o] = isolator(tmp_path, [Kubernetes()]).isolate("node-1", DIAG)
    assert o.status == "isolated", o
    argvs = [c["argv"] for c in fakes()]
    assert argvs[0] == ["kubectl", "cordon", "node-1"]
    assert argvs[1] == ["kubectl", "taint", "nodes", "node-1", "c4d.io/isolated=RankNonCommHang:NoSchedule",
                        "--overwrite"]  # fmt: skip
    assert argvs[2][:5] == ["kubectl", "annotate", "nodes", "node-1", "--overwrite"]
    key, _, value = argvs[2][5].partition("=")
    assert key == "c4d.io/diagnosis" and json.loads(value) == DIAG
    assert len(argvs) == 3


def test_slurm_drains_with_the_diagnosis_as_reason(tmp_path, fakes):
    [o] = isolator(tmp_path, [Slurm()]).isolate("gpu-017", DIAG)
    assert o.status == "isolated"
    assert [c["argv"] for c in fakes()] == [
        ["scontrol", "update", "NodeName=gpu-017", "State=DRAIN",
         "Reason=c4d: ERROR RankNonCommHang ranks 4,5 AllReduce #41"]
    ]  # fmt: skip


def test_command_gets_node_and_diagnosis_as_arguments_and_stdin(tmp_path, fakes):
    script = tmp_path / "notify"
    script.symlink_to(FAKE)
    act = CommandAction.from_spec(str(script))
    [o] = isolator(tmp_path, [act]).isolate("node-1", DIAG)
    assert o.status == "isolated"
    [call] = fakes()
    assert call["argv"][:2] == ["notify", "node-1"]
    assert json.loads(call["argv"][2]) == DIAG and json.loads(call["stdin"]) == DIAG


def test_command_spec_must_name_an_executable_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        CommandAction.from_spec(str(tmp_path / "missing"))
    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    with pytest.raises(ValueError, match="not executable"):
        CommandAction.from_spec(str(plain))
    with pytest.raises(ValueError, match="kubernetes, slurm or cmd:PATH"):
        factory.parse_actions(["ansible"])


@pytest.mark.parametrize(
    "name", ["node-1; rm -rf /", "../x", "node\x1b[2J", "a\nb", "-rf", "", "x/y", "a..b"]
)
def test_bad_node_names_are_refused_and_nothing_runs(tmp_path, fakes, name):
    iso = isolator(tmp_path, [Kubernetes(), Slurm()])
    outs = iso.isolate(name, DIAG)
    assert [o.status for o in outs] == ["refused", "refused"]
    assert fakes() == []
    with pytest.raises(BadNodeName):
        check(name)
    journal = [json.loads(x) for x in (tmp_path / "actions.jsonl").read_text().splitlines()]
    assert [j["status"] for j in journal] == ["refused", "refused"]


def test_plain_node_names_pass():
    for name in ("node-1", "gpu001.cluster.local", "n", "Node_7", "a" * 253):
        assert is_valid(name), name
    assert not is_valid("a" * 254)


def test_isolating_twice_is_a_logged_no_op(tmp_path, fakes, caplog):
    iso = isolator(tmp_path, [Kubernetes()])
    assert iso.isolate("node-1", DIAG)[0].status == "isolated"
    n = len(fakes())
    caplog.set_level("INFO", logger="c4d.actions")
    again = isolator(tmp_path, [Kubernetes()])  # a new process reading the same ledger
    assert again.isolate("node-1", DIAG)[0].status == "already-isolated"
    assert len(fakes()) == n
    assert any("already-isolated" in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / "isolated.json").read_text()) == {"kubernetes": ["node-1"]}


def test_dry_run_prints_the_argv_and_runs_nothing(tmp_path, fakes):
    out = io.StringIO()
    [o] = isolator(tmp_path, [Slurm()], dry_run=True, out=out).isolate("node-1", DIAG)
    assert o.status == "dry-run" and fakes() == []
    line = out.getvalue().strip()
    assert line.startswith("c4d run: dry run: would run ")
    assert json.loads(line.split("would run ", 1)[1])[:4] == [
        "scontrol",
        "update",
        "NodeName=node-1",
        "State=DRAIN",
    ]
    assert not (tmp_path / "isolated.json").exists()  # nothing was isolated


def test_a_failing_tool_is_reported_and_not_recorded(tmp_path, fakes, monkeypatch):
    monkeypatch.setenv("FAKE_RC", "1")
    monkeypatch.setenv("FAKE_STDERR", 'Error from server (NotFound): nodes "node-1" not found')
    [o] = isolator(tmp_path, [Kubernetes()]).isolate("node-1", DIAG)
    assert o.status == "failed" and "NotFound" in o.message and "exited with 1" in o.message
    assert len(fakes()) == 1  # stopped at the first failing command
    assert not (tmp_path / "isolated.json").exists()  # a later attempt tries again


def test_a_missing_tool_is_one_clear_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    [o] = isolator(tmp_path, [Kubernetes()]).isolate("node-1", DIAG)
    assert o.status == "failed" and o.message == "kubectl not found on PATH"


def test_oversized_evidence_drops_stacks_from_argv_only(tmp_path, fakes):
    big = dict(DIAG, detail={"localized": True, "stacks": {"4": {"native": "x" * 200_000}}})
    script = tmp_path / "notify"
    script.symlink_to(FAKE)
    isolator(tmp_path, [CommandAction.from_spec(str(script))]).isolate("node-1", big)
    [call] = fakes()
    assert len(call["argv"][2]) < 100_000
    assert json.loads(call["argv"][2])["detail"]["stacks"].startswith("omitted")
    assert json.loads(call["stdin"]) == big  # the whole evidence on stdin
