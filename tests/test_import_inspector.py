"""NCCL Inspector import: JSON lines written here with the keys the plugin documents."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from c4d.formats import inspector
from c4d.formats.detect import detect, load_any
from c4d.formats.to_records import FormatError
from c4d.offline import analyze
from c4d.record import schema

T0_US = 1_748_030_377_000_000
WORLD = "0x7f8c496ae9f661"
PAIR = {0: "0xa1", 1: "0xa1", 2: "0xb2", 3: "0xb2"}  # two 2-rank communicators


def _line(rank, crank, nranks, cid, host, coll, sn, size, start_us, exec_us, verbose):
    perf = {
        "coll": coll,
        "coll_sn": sn,
        "coll_msg_size_bytes": size,
        "coll_exec_time_us": exec_us,
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": size / exec_us / 1e3,
        "coll_busbw_gbs": size / exec_us / 1e3 * 1.5,
    }
    dump_us = start_us + exec_us + 300  # the dump thread writes a little after the end
    if verbose:
        perf["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": []}
        perf["event_trace_ts"] = {
            "coll_start_ts": start_us - 5,
            "coll_stop_ts": start_us - 2,
            "kernel_events": [
                {
                    "channel_id": ch,
                    "kernel_start_ts": start_us + ch,
                    "kernel_stop_ts": start_us + exec_us - ch,
                    "kernel_record_ts": start_us + exec_us,
                }
                for ch in range(2)
            ],
        }
    obj = {
        "header": {"id": cid, "rank": crank, "n_ranks": nranks, "nnodes": 2},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": dump_us,
            "hostname": host,
            "pid": 1000 + rank,
        },
        "coll_perf": perf,
    }
    return json.dumps(obj)


def write_logs(d: Path, verbose: bool, steps: int = 4) -> dict[int, list[str]]:
    """4 processes on 2 hosts; per step: world AllReduce, pair AllGather, world AllReduce."""
    d.mkdir(parents=True, exist_ok=True)
    lines: dict[int, list[str]] = {r: [] for r in range(4)}
    for s in range(steps):
        t = T0_US + s * 100_000
        for r in range(4):
            host = f"host-{r // 2}"
            # global rank order differs from (host, pid) order on purpose: world comm rank = 3 - r
            lines[r].append(_line(r, 3 - r, 4, WORLD, host, "AllReduce", 2 * s + 1, 1 << 20, t, 800, verbose))
            lines[r].append(
                _line(r, r % 2, 2, PAIR[r], host, "AllGather", s + 1, 1 << 16, t + 2000, 50, verbose)
            )
            lines[r].append(
                _line(r, 3 - r, 4, WORLD, host, "AllReduce", 2 * s + 2, 1 << 10, t + 4000, 20, verbose)
            )
    for r, ls in lines.items():
        (d / f"host-{r // 2}-pid{1000 + r}.log").write_text("\n".join(ls) + "\n")
    return lines


@pytest.mark.parametrize("verbose", [True, False])
def test_ops_sizes_times_and_ranks(tmp_path, verbose):
    d = tmp_path / "insp"
    write_logs(d, verbose)
    assert detect(d) == "inspector"
    rt = load_any(d)
    k = rt.kinds
    regs, ops = k[schema.Kind.REGISTER], k[schema.Kind.OP]
    # global rank = rank in the communicator that spans every process; node = hostname
    g_of_pid = {int(p): int(r) for p, r in zip(regs["pid"], regs["rank"], strict=True)}
    assert g_of_pid == {1000: 3, 1001: 2, 1002: 1, 1003: 0}
    nodes = {int(r): n.decode() for r, n in zip(regs["rank"], regs["node"], strict=True)}
    assert nodes == {3: "host-0", 2: "host-0", 1: "host-1", 0: "host-1"}
    assert len(ops) == 4 * 4 * 3
    world = ops[ops["comm_id"] == int(WORLD, 16)]
    assert set(world["comm_nranks"].tolist()) == {4}
    # one world seq per (coll, sn), equal on every rank, in time order: 6 per rank in 0..7
    for r in range(4):
        w = world[world["rank"] == r]
        assert sorted(w["seq"].tolist()) == list(range(8))
    big = world[world["bytes"] == 1 << 20]
    assert np.all(big["seq"] % 2 == 0)  # the first AllReduce of each step comes first
    ag = ops[ops["op"] == schema.Op.AllGather]
    assert set(ag["bytes"].tolist()) == {1 << 16} and set(ag["comm_nranks"].tolist()) == {2}
    dur_us = (ops["end_ns"].astype(np.int64) - ops["start_ns"].astype(np.int64)) / 1000
    if verbose:  # kernel span of the channels: exec_us - 2 (channel 1 starts 1 µs late, stops 1 µs early)
        assert set(np.round(dur_us[ops["bytes"] == 1 << 20]).tolist()) == {800.0}
        assert ((ops["flags"] & schema.OpFlag.DEVICE_TIMING) != 0).all()
        assert (ops["issue_ns"] < ops["start_ns"]).all()
    else:  # end = dump time, start = end - exec time, no device-timing claim
        assert set(np.round(dur_us[ops["bytes"] == 1 << 20]).tolist()) == {800.0}
        assert ((ops["flags"] & schema.OpFlag.DEVICE_TIMING) == 0).all()
    assert set(ops["dtype"].tolist()) == {255} and set(ops["count"].tolist()) == {0}
    # heartbeats: everything logged is done, nothing pending; replay finds no hang
    hb = k[schema.Kind.HEARTBEAT]
    hb = hb[hb["comm_id"] == int(WORLD, 16)]
    assert set(hb["n_done"].tolist()) == {8} and (hb["pend_seq"] == schema.UINT64_MAX).all()
    from c4d.engine import Engine, EngineConfig

    diags = analyze.replay(rt, Engine(EngineConfig()))
    assert not [x for x in diags if x.kind.value.endswith("Hang") or x.kind.value == "RankLost"]
    # through the edge as `c4d analyze` reads it: the dtype the plugin does not log (255, unknown)
    # is not a reason to drop the records
    assert len(analyze.load(d).ops) == 4 * 4 * 3


def test_single_file_gzip_and_bad_lines(tmp_path):
    d = tmp_path / "insp"
    lines = write_logs(d, verbose=False, steps=2)
    gz = tmp_path / "rank0.log.gz"
    gz.write_bytes(gzip.compress(("\n".join(lines[0]) + '\nnot json\n{"x": 1}\n').encode()))
    assert detect(gz) == "inspector"
    warnings: list[str] = []
    rt = load_any(gz, on_warning=warnings.append)
    assert len(rt.kinds[schema.Kind.OP]) == 6
    assert warnings and "2 lines are not Inspector records (first at line 7)" in warnings[0]
    # one process of four: no communicator spans the input, so ranks are numbered in (host, pid) order
    assert rt.kinds[schema.Kind.REGISTER]["rank"].tolist() == [0]


def test_nothing_usable_is_one_line(tmp_path):
    p = tmp_path / "x.log"
    p.write_text('{"header": {"id": "0x1"}, "coll_perf": {"coll": "Nope"}}\n')
    with pytest.raises(FormatError) as ei:
        inspector.read(p)
    assert "no NCCL Inspector records" in str(ei.value) and "\n" not in str(ei.value)
