"""Flight Recorder dumps matched across ranks (c4d/formats/fr_match.py), on real dumps.

The dumps under tests/data/fr_gloo were written by torch 2.13 itself: small gloo jobs on CPU
(tests/fr_gloo_jobs.py remakes them; its docstring says what each case does and
MANIFEST.json what was injected), each dumped while its faulty op was pending and after gloo's
timeout retired every entry. torch's own analyzer (fr_trace's components) runs beside c4d on
the same dumps, with pg_config rewritten to name the groups (stock gloo dumps name none, and
fr_trace cannot read them).
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from pathlib import Path

import pytest

from c4d.formats import flight_recorder as fr
from c4d.formats import fr_match
from c4d.formats.detect import load_any
from c4d.offline import analyze
from tests import fr_factory as frf

DATA = Path(__file__).parent / "data" / "fr_gloo"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
HANGS = {"RankNonCommHang", "RankCommHang", "RankLost", "CollectiveMismatch"}


def _engine():
    from c4d.engine import Engine, EngineConfig

    return Engine(EngineConfig())


def _diagnose(path) -> list[dict]:
    return [d.to_json() for d in analyze.replay(load_any(path), _engine())]


def _kinds(diags: list[dict]) -> set[tuple[str, tuple[int, ...]]]:
    return {(d["kind"], tuple(d["ranks"])) for d in diags}


@pytest.mark.parametrize("mode", ["pending", "retired"])
@pytest.mark.parametrize("case, what, values", [
    ("type", "op", {"AllReduce", "Broadcast"}),
    ("size", "count", {16, 32}),
    ("dtype", "dtype", {"Float", "Double"}),
])  # fmt: skip
def test_disagreeing_members_are_a_mismatch_naming_the_minority(case, what, values, mode):
    diags = _diagnose(DATA / f"{case}-{mode}")
    assert _kinds(diags) == {("CollectiveMismatch", (3,))}, _kinds(diags)  # no hardware verdict
    last = diags[-1]
    assert last["seq"] == 2  # the fourth all_reduce (FR id 4)
    assert last["level"] == ("ERROR" if mode == "pending" else "WARNING")  # as the live check
    assert last["detail"]["evidence"] == "match" and last["localization"]["how"] == "match"
    assert last["detail"]["what"] == [what]
    sides = last["detail"]["sides"]
    assert [s["ranks"] for s in sides] == [[0, 1, 2], [3]]
    assert {s[what] for s in sides} == values
    assert last["detail"].get("isolates", False) is False  # a program bug never isolates a node
    if mode == "pending":  # stalled: counted like a hang, WARNING then ERROR, as one incident
        assert diags[0]["level"] == "WARNING" and last["hang_times"] == 18
        assert last["detail"]["stalled_as"] in ("RankCommHang", "CollectiveMismatch")  # the engine's own


@pytest.mark.parametrize("mode", ["pending", "retired"])
def test_a_rank_that_never_entered_its_tp_op_is_named_whatever_the_state_says(mode):
    """8 ranks, tp=2 x dp=4: rank 6 never enters its last tp all_reduce. Retired: every entry
    says done, but rank 7's tp op has a seq rank 6 never issued, so it cannot have completed."""
    diags = _diagnose(DATA / f"skip-{mode}")
    assert _kinds(diags) == {("RankNonCommHang", (6,))}, _kinds(diags)
    last = diags[-1]
    assert last["level"] == "ERROR" and last["hang_times"] == 18
    assert 7 in last["detail"]["victims"]  # rank 7 waits for 6; 1, 3, 5 (retired) wait for 7
    if mode == "retired":
        assert last["detail"]["evidence"] == "match"
        assert last["detail"]["never_issued"] == [6] and last["detail"]["marked_done_by"] == [7]
        assert last["localization"]["evidence"].startswith("match:")
    else:
        assert last["detail"]["evidence"] == "pending"


@pytest.mark.parametrize("mode", ["pending", "retired"])
def test_a_rank_without_a_dump_that_peers_wait_for_is_lost(mode):
    d = DATA / f"lost-{mode}"
    warnings: list[str] = []
    rt = load_any(d, on_warning=warnings.append)
    assert any("no dump for ranks [2]" in w for w in warnings)  # gloo: pg_config names no group
    diags = [x.to_json() for x in analyze.replay(rt, _engine())]
    assert _kinds(diags) == {("RankLost", (2,))}, _kinds(diags)
    last = diags[-1]
    assert last["detail"]["waiting_ranks"] == [0, 1, 3] and last["detail"]["no_dump"]
    if mode == "pending":
        assert last["level"] == "ERROR" and last["detail"]["evidence"] == "pending"
        assert "no dump and are absent from every pending op" in last["localization"]["evidence"]
    else:  # rank 2's exit failed the others' op at once: retired, like a completed one
        assert last["level"] == "WARNING" and last["detail"]["evidence"] == "match"
        # the dumps cannot tell a lost rank from a dump not collected: measured, about a coin flip
        assert last["localization"]["confidence"] == fr_match.confidence("stopped") < 0.5


@pytest.mark.parametrize("mode", ["pending", "retired"])
def test_a_rank_30x_slower_in_compute_is_slow_by_timing(mode):
    diags = _diagnose(DATA / f"slow-{mode}")
    slow = [x for x in diags if x["kind"] == "RankNonCommSlow"]
    assert len(slow) == 1 and slow[0]["ranks"] == [1] and slow[0]["level"] == "INFO"
    assert slow[0]["detail"]["evidence"] == "timing" and slow[0]["detail"]["share"] >= 0.6
    assert slow[0]["detail"]["median_margin_ms"] > 30  # 60 ms of compute against 2 ms
    others = _kinds([x for x in diags if x["kind"] != "RankNonCommSlow"])
    # pending: the dump caught rank 1 computing while the others wait in the last all_reduce
    assert others == ({("RankNonCommHang", (1,))} if mode == "pending" else set()), others


# ------------------------------------------------------------------------------ torch's fr_trace
def _with_pg_config(src: Path, dst: Path) -> Path:
    """The dumps as torch would write them with a pg_config naming every group (as on NCCL)."""
    groups = MANIFEST[src.name]["groups"]
    dst.mkdir()
    for p in src.iterdir():
        dump = pickle.loads(p.read_bytes())
        r = int(p.name.rsplit("_", 1)[1])
        dump["pg_config"] = {
            g: {"name": g, "desc": "default_pg" if g == "0" else "undefined", "ranks": str(m)}
            for g, m in groups.items()
            if r in m
        }
        (dst / p.name).write_bytes(pickle.dumps(dump, protocol=2))
    return dst


def _fr_trace(d: Path) -> list[tuple]:
    """fr_trace's findings: (group, c4d seq, "missing", ranks) and (group, c4d seq, "mismatch", what)."""
    pytest.importorskip("torch")
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    out: list[tuple] = []
    logging.disable(logging.CRITICAL)  # it logs every finding with its stack
    try:
        args = JobConfig().parse_args([str(d), "-p", "rank_"])
        try:  # its first check: a member without a dump file
            details, version = read_dir(args)
            build_db(details, args, version)
        except AssertionError as e:
            if "Missing dump files from ranks" not in str(e):
                raise
            missing = str(e).rsplit("{", 1)[1].rstrip("}")
            out.append((None, None, "no dump", frozenset(int(x) for x in missing.split(","))))
        args = JobConfig().parse_args([str(d), "-p", "rank_", "--allow-incomplete-ranks"])
        details, version = read_dir(args)
        db = build_db(details, args, version)
    finally:
        logging.disable(logging.NOTSET)
    for c in db.collectives:
        if c.missing_ranks:
            out.append((c.group_id, c.collective_seq_id - 1, "missing", frozenset(c.missing_ranks)))
        if not c.pass_check and c.mismatch_collectives:
            out.append((c.group_id, c.collective_seq_id - 1, "mismatch", None))
    return out


def _covered(finding: tuple, diags: list[dict], comms: dict[str, dict]) -> bool:
    group, seq, what, ranks = finding
    named = {r for d in diags if d["kind"] in HANGS for r in d["ranks"]}
    victims = {r for d in diags for r in d["detail"].get("victims", [])}
    if what == "no dump":
        return any(d["kind"] == "RankLost" and set(d["ranks"]) == ranks for d in diags)
    if what == "mismatch":
        return any(
            d["kind"] == "CollectiveMismatch" and comms[d["comm"]]["name"] == group and d["seq"] == seq
            for d in diags
        )
    # a member that did not join: named as the culprit, or told as the consequence of one
    return all(r in named or r in victims for r in ranks)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in MANIFEST if MANIFEST[n]["case"] != "slow"))
def test_every_fr_trace_finding_is_a_c4d_finding_too(tmp_path, name):
    src = DATA / name
    with pytest.raises(Exception):  # noqa: B017 - stock gloo dumps: fr_trace cannot read them
        _fr_trace(src)
    d = _with_pg_config(src, tmp_path / name)
    theirs = _fr_trace(d)
    assert theirs, "fr_trace found nothing: the case is not a fault it sees"
    rt = load_any(d)
    ours = [x.to_json() for x in analyze.replay(rt, _engine())]
    for f in theirs:
        assert _covered(f, ours, rt.meta["comms"]), (f, _kinds(ours))
    # on the dumps fr_trace cannot read (pg_config names no group), the same findings
    assert _kinds(_diagnose(src)) == _kinds(ours)


# ------------------------------------------------------------------------ the match on its own
def _write(tmp_path: Path, dumps: dict[int, dict], name: str = "d") -> Path:
    d = tmp_path / name
    frf.write(dumps, d)
    return d


def test_clean_job_retired_or_not_finds_nothing(tmp_path):
    for timing in (True, False):
        rt = fr.read(_write(tmp_path, frf.build(frf.Job(tp=2, dp=4, steps=8, timing=timing)), f"t{timing}"))
        assert rt.meta["fr"]["findings"] == []
        assert [x for x in analyze.replay(rt, _engine()) if x.kind.value in HANGS] == []


def test_a_tie_names_suspects_not_a_culprit(tmp_path):
    dumps = frf.build(frf.Job(tp=2, dp=2, steps=3))
    for r in (2, 3):  # two of four members send a different count in the last world all_reduce
        dumps[r]["entries"][-1]["input_sizes"] = [[7]]
    diags = [x.to_json() for x in analyze.replay(fr.read(_write(tmp_path, dumps)), _engine())]
    mm = [x for x in diags if x["kind"] == "CollectiveMismatch"]
    assert len(mm) == 1 and mm[0]["ranks"] == [0, 1, 2, 3]
    assert mm[0]["localization"]["target"] == "suspects" and mm[0]["detail"]["what"] == ["count"]


def test_all_to_all_sizes_may_differ(tmp_path):
    job = frf.Job(tp=2, dp=2, steps=3, step_ops=(("all_to_all", "world"),))
    dumps = frf.build(job)
    dumps[1]["entries"][-1]["input_sizes"] = [[5, 5]]
    assert fr.read(_write(tmp_path, dumps)).meta["fr"]["findings"] == []


def test_a_wrapped_buffer_without_the_group_says_nothing_about_it(tmp_path):
    """A rank whose ring buffer dropped every entry of a group did not necessarily skip it."""
    job = frf.Job(
        tp=2, dp=2, steps=4, timing=False, step_ops=(("all_reduce", "tp"),) * 3 + (("all_reduce", "world"),)
    )
    dumps = frf.build(job)
    ents = dumps[0]["entries"]
    dumps[0]["entries"] = [e for e in ents if e["process_group"][1] != "default_pg"][-3:]
    findings = fr.read(_write(tmp_path, dumps)).meta["fr"]["findings"]
    assert [f for f in findings if f["kind"] == "unissued"] == []


def test_late_only_after_waiting_for_a_slow_peer_is_not_slow(tmp_path):
    """tp x dp without device timing: rank 1 issues every op 50 ms late. Rank 0, blocked on its
    tp op with rank 1, issues its dp op late too (a blocking backend): only rank 1 is named."""
    job = frf.Job(tp=2, dp=2, steps=8, timing=False, step_ops=(("all_reduce", "tp"), ("all_reduce", "dp")))
    dumps = frf.build(job)
    for r, dump in dumps.items():
        for e in dump["entries"]:
            late = r == 1 or (r == 0 and e["process_group"][1] == "dp")
            e["time_created_ns"] += 50_000_000 if late else 0
    findings = fr.read(_write(tmp_path, dumps)).meta["fr"]["findings"]
    assert [(f["kind"], f["rank"]) for f in findings] == [("slow", 1)]


@pytest.mark.slow
def test_findings_are_fast_on_a_large_clean_import(tmp_path):
    """The match is vectorised: 64 ranks x 2000 entries add little to the import."""
    import time

    d = _write(tmp_path, frf.build(frf.Job(tp=8, dp=8, steps=400, timing=False)))
    t0 = time.perf_counter()
    rt = fr.read(d)
    took = time.perf_counter() - t0
    assert rt.meta["fr"]["findings"] == [] and took < 30


@pytest.mark.slow
def test_the_generator_makes_the_same_dumps_today(tmp_path):
    """tests/fr_gloo_jobs.py still makes dumps that give the fixtures' findings (torch installed)."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    gen = Path(__file__).parent / "fr_gloo_jobs.py"
    cmd = [sys.executable, str(gen), str(tmp_path), "--case", "type", "--mode", "retired"]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    fresh = _diagnose(tmp_path / "type-retired")
    assert _kinds(fresh) == _kinds(_diagnose(DATA / "type-retired"))
    shutil.rmtree(tmp_path / "type-retired")


def test_fr_confidences_are_the_measured_shares(tmp_path):
    """fr_match.MEASURED is what analysis/calibrate_fr.py measures: on a fresh seed, every match,
    pending and timing finding names exactly the culprit; a dump missing where nothing is pending is
    right for a lost rank, wrong for a dump that was not collected (the dumps cannot tell)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
    import calibrate_fr

    out = tmp_path / "cal.json"
    calibrate_fr.main(["--jobs", "1", "--seed", "3", "--json-out", str(out)])
    fresh = json.loads(out.read_text())["measured"]
    for ev in ("match", "pending", "timing"):
        n, right = fresh[ev]
        assert n > 0 and right == n, (ev, fresh)
        assert fr_match.MEASURED[ev][0] == fr_match.MEASURED[ev][1]
    assert 0 < fresh["stopped"][1] < fresh["stopped"][0], fresh  # right for lost, wrong for gone
    assert fr_match.confidence("stopped") < 0.5 < fr_match.confidence("pending")


def test_a_recv_whose_sender_never_sent_is_not_done_whatever_retired_says(tmp_path):
    """tp=2 x dp=2 with pipeline pairs (0->2, 1->3): rank 0 skips its last tp reduce_scatter, so
    rank 1 waits in it and never sends to rank 3, which waits in its recv. Dumped after the timeout
    (every entry retired), rank 3's recv must not read as completed: then rank 3 would look like
    the rank that never joined the world all_reduce, blocked in nothing (it was named)."""
    dumps = frf.build(frf.Job(tp=2, dp=2, steps=8, skip=frf.Skip(rank=0, op_index=1)))
    for d in dumps.values():
        for e in d["entries"]:
            e["retired"] = True
    rt = fr.read(_write(tmp_path, dumps, "skip-retired"))
    assert any("by its peer" in w for w in rt.meta["import"]["warnings"])
    diags = [x.to_json() for x in analyze.replay(rt, _engine())]
    named = {r for x in diags for r in x["ranks"]}
    assert diags and named == {0, 1}, _kinds(diags)  # the culprit and the tp partner it blocks
    assert diags[-1]["level"] == "ERROR"
