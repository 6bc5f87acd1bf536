"""``c4d run`` trusts no file: a diagnoses file (``--diagnoses-from``) written by anyone cannot make
it write outside its run directory, write raw control characters to the terminal, or report an
isolation it refused as done (issue 41's probes).

Real processes and files: ``c4d run --master EP --no-agent --diagnoses-from FILE`` around a job
that writes the hostile diagnosis into FILE (nothing listens at EP: no rank reports here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import c4d_cmd, free_port

from c4d.run.diagnoses import JsonFollower, sanitize
from c4d.run.evidence import evidence_path, hang_key
from c4d.run.summary import render, safe

ROOT = Path(__file__).resolve().parents[1]
FORGED = "c4d run: all clear, nothing found"
ESC_NODE = f"evil\x1b[2J\n{FORGED}"


def _diagnosis(nodes: list, **over) -> dict:
    d = {
        "time": 1.0,
        "level": "ERROR",
        "kind": "RankNonCommHang",
        "comm": "00000000000000aa",
        "op": "AllReduce",
        "seq": 7,
        "ranks": [1],
        "nodes": nodes,
        "hang_times": 3,
        "detail": {"localized": True, "victims": [0]},
    }
    d.update(over)
    return d


def test_a_hostile_diagnoses_file_cannot_escape_the_run_dir_reach_the_terminal_or_fake_an_isolation(tmp_path):
    run = tmp_path / "run"
    diag = tmp_path / "diagnoses.jsonl"
    diag.write_text("")
    hostile = [  # the old path resolved to tmp_path/escaped.json; the second one writes the terminal
        _diagnosis(["../../../../escaped"]),
        _diagnosis([ESC_NODE], kind="RankNonCommHang\x1b[31m", seq=8),
    ]
    # the job: once started (the follower reads only what is written after it began), writes the
    # hostile diagnosis, then waits to be stopped
    job = textwrap.dedent(f"""
        import json, time
        with open({str(diag)!r}, "a") as f:
            f.write("".join(json.dumps(d) + "\\n" for d in {hostile!r}))
        time.sleep(60)
    """)
    cmd = c4d_cmd("run", "--run-dir", run, "--master", f"tcp://127.0.0.1:{free_port()}", "--no-agent",
                  "--no-preload", "--diagnoses-from", diag, "--max-restarts", "0", "--evidence-wait", "1",
                  "--grace-period", "2", "--", sys.executable, "-c", job)  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    # 1. nothing written outside the run directory
    assert not (tmp_path / "escaped.json").exists()
    outside = [f for f in tmp_path.rglob("*") if f.is_file() and run not in f.parents and f != diag]
    assert outside == [], outside
    s = json.loads((run / "summary.json").read_text())
    [a] = s["attempts"]
    assert a["ended"] == "c4d-error", p.stderr[-2000:]
    assert len(a["evidence"]) == 2
    assert all(Path(ev).resolve().parent == (run / "evidence").resolve() for ev in a["evidence"])
    # 2. no raw control character and no forged line on the terminal
    assert "\x1b" not in p.stderr
    assert not any(line.startswith(FORGED) for line in p.stderr.splitlines()), p.stderr[-2000:]
    assert "evil__2J_c4d_run:_all_clear" in p.stderr  # the node is named, in c4d.record.names' safe form
    # 3. refused is reported as refused: nothing isolated, nothing blacklisted
    assert a["isolated"] == [] and s["nodes_isolated"] == []
    assert not (run / "blacklist.txt").exists() or (run / "blacklist.txt").read_text() == ""
    journal = [json.loads(x) for x in (run / "actions.jsonl").read_text().splitlines()]
    assert {j["status"] for j in journal if j["action"] == "blacklist"} == {"refused"}, journal
    assert len(journal) == 2
    assert {act["status"] for act in a["actions"]} == {"refused"}


def test_the_follower_sanitizes_every_field_it_hands_on(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("")
    fol = JsonFollower(f)
    lines = [
        _diagnosis(["node-1", "../../x", ESC_NODE, 7], ranks=[1, "2; rm -rf /", True, 3.5, 4],
                   comm=["unhashable"], seq="7", detail={"localized": "yes", "victims": ["0", 2],
                   "evidence_file": "/etc/passwd", "stacks": {"1": {"native": "forged"}}}),
        "x" * (2 << 20),  # one line over the limit: dropped whole
        _diagnosis(["node-2"]),
    ]  # fmt: skip
    with open(f, "a") as out:
        for x in lines:
            out.write((json.dumps(x) if isinstance(x, dict) else x) + "\n")
    got = fol.poll(0)
    assert len(got) == 2
    d, ok = got
    assert d["nodes"][0] == "node-1" and all("/" not in n and "\x1b" not in n for n in d["nodes"])
    assert d["detail"]["refused_nodes"] == d["nodes"][1:]
    assert d["ranks"] == [1, 4] and d["seq"] is None and isinstance(d["comm"], str)
    assert d["detail"]["localized"] is False and d["detail"]["victims"] == [2]
    assert "evidence_file" not in d["detail"] and "stacks" not in d["detail"]
    hash(hang_key(d))  # every field a key is made of is hashable
    assert ok["nodes"] == ["node-2"] and "refused_nodes" not in ok["detail"]


def test_a_line_longer_than_the_limit_is_never_held(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("")
    fol = JsonFollower(f)
    with open(f, "ab") as out:  # a line that never ends, written in pieces
        for _ in range(40):
            out.write(b"y" * (1 << 20))
            out.flush()
            assert fol.poll(0) == []
            assert len(fol._buf) <= 1 << 20
        out.write(b"\n" + json.dumps(_diagnosis(["node-3"])).encode() + b"\n")
    [d] = fol.poll(0)
    assert d["nodes"] == ["node-3"]


def test_evidence_paths_stay_in_the_run_dir(tmp_path):
    for nodes in (["../../../../../../tmp/x"], ["a/b", ".hidden", "-rf"], [f"n{i}" * 30 for i in range(50)]):
        p = evidence_path(tmp_path / "run", 1, "Rank/../Kind", nodes)
        assert p.resolve().parent == (tmp_path / "run" / "evidence").resolve()
        assert len(p.name) < 255


def test_the_summary_escapes_what_it_prints():
    data = {
        "node": "here",
        "attempts": [{"attempt": 1, "ended": "c4d-error", "exit_status": None, "seconds": 1.0,
                      "detail": "x\n" + FORGED, "isolated": [], "evidence": ["/r/e\x1b.json"],
                      "decision": {"restart": False, "why": "w\x1b[0m"},
                      "errors": [{"level": "ERROR", "kind": "K\x1b[31m", "ranks": [1], "nodes": [ESC_NODE],
                                  "stacks_of_ranks": []}],
                      "actions": [{"action": "blacklist", "node": ESC_NODE, "status": "refused",
                                   "message": "m\r\n" + FORGED}]}],
        "nodes_isolated": [], "log": "l", "exit_status": 2,
    }  # fmt: skip
    text = render(data)
    assert "\x1b" not in text and "\r" not in text
    assert not any(line.startswith(FORGED) for line in text.splitlines())
    assert safe("a\u202eb") == "a\\u202eb"
    sanitize({"level": "ERROR"})  # a diagnosis with nothing else in it
