"""`c4d export --format perfetto`: a trace's timeline as Chrome trace-event JSON, which
ui.perfetto.dev (and chrome://tracing) opens.

Layout: one process per rank (``rank R (node)``, sorted by rank), in it one thread per
communicator the rank used (and per peer, for p2p: a send and a recv of a group overlap), and on
it one slice per op from the rank's arrival to the op's end, with two slices nested in it: ``wait``
(own arrival → the last member's arrival) and ``transfer`` (→ done). All times are the engine's:
the master's clock, the nodes' offsets applied (docs/engine.md), in µs since the trace started.
Ops the engine could not split (never completed on every member) have no slice. The incidents
(c4d/engine/incidents.py, as `c4d analyze` lists them) are markers: a global instant at each one's
first report, an instant on each culprit rank's first track, and a slice per incident on the
``c4d incidents`` process from its start to its last report.

The events are written as the trace is read (``c4d.analyze.StreamPass``): memory does not grow
with the trace; the file does, so ``--ranks``, ``--comms`` and ``--start``/``--end`` select.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from c4d.offline import analyze
from c4d.record import schema

INCIDENTS_PID = 0  # the incidents' process; a rank's is rank + 1
LEVEL_COLOR = {"ERROR": "terrible", "WARNING": "bad", "INFO": "good"}  # trace-viewer colour names


class _Out:
    """Events written one by one into ``{"traceEvents": [...], ...}``."""

    def __init__(self, f: IO[str]):
        self.f = f
        self.n = 0
        f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')

    def event(self, ev: dict[str, Any]) -> None:
        self.f.write((",\n" if self.n else "") + json.dumps(ev, separators=(",", ":")))
        self.n += 1

    def close(self, other: dict[str, Any]) -> None:
        self.f.write("\n], " + json.dumps({"otherData": other})[1:])


def _us(ns: float) -> float:
    return round(ns / 1e3, 3)


def write(
    path: str | os.PathLike,
    out: str | os.PathLike,
    select: analyze.Selection | None = None,
    overrides: dict[str, Any] | None = None,
    chunk_bytes: int | None = None,
) -> dict[str, int]:
    """Write the timeline of a c4d trace (or a directory of node traces) to ``out`` (gzip when it
    ends in .gz); returns counts: events, ops (with a slice), ranks, incidents, unsplit (ops
    without one)."""
    from c4d.engine.incidents import Incidents

    watch = analyze.RawWatch()
    cols = ["rank", "comm_id", "seq", "op_name", "peer", "flags", "bytes", "arrive_ns", "wait_ns",
            "transfer_ns", "busbw_gbs"]  # fmt: skip
    sp = analyze.StreamPass(path, ("ops",), select, overrides, chunk_bytes, on_raw=watch.add, columns=cols)
    base = sp.created_ns
    watch.tick_ns = base
    tracks: dict[tuple[int, int, int], int] = {}  # (rank, comm, peer) -> tid
    counts = {"ops": 0, "unsplit": 0}
    gz = str(out).endswith(".gz")
    raw_f = open(out, "wb")  # noqa: SIM115 (closed below, through the text wrapper)
    f: IO[str] = io.TextIOWrapper(gzip.GzipFile(fileobj=raw_f, mode="wb") if gz else raw_f, encoding="utf-8")
    try:
        w = _Out(f)
        for _, df in sp.frames():
            ok = df["arrive_ns"].notna().to_numpy()
            counts["unsplit"] += int((~ok).sum())
            df = df[ok]
            counts["ops"] += len(df)
            p2p = (df["flags"].to_numpy().astype(int) & int(schema.OpFlag.P2P)) != 0
            peer = np.where(p2p, df["peer"].to_numpy(), -1)
            wait = np.nan_to_num(df["wait_ns"].to_numpy(dtype=float))
            xfer = np.nan_to_num(df["transfer_ns"].to_numpy(dtype=float))
            start = df["arrive_ns"].to_numpy(dtype=float) - base
            for rank, cid, seq, name, pr, nbytes, a, wt, x, bw in zip(
                df["rank"].tolist(), df["comm_id"].tolist(), df["seq"].tolist(), df["op_name"].tolist(),
                peer.tolist(), df["bytes"].tolist(), start.tolist(), wait.tolist(), xfer.tolist(),
                df["busbw_gbs"].tolist(), strict=True,
            ):  # fmt: skip
                key = (int(rank), int(cid), int(pr))
                tid = tracks.get(key)
                if tid is None:
                    tid = tracks[key] = len(tracks) + 1
                pid = int(rank) + 1
                t_a, t_w, t_x = _us(a), _us(wait_ := max(wt, 0.0)), _us(max(x, 0.0))
                args = {"comm": f"{int(cid):016x}", "seq": int(seq), "bytes": int(nbytes), "wait_us": t_w,
                        "transfer_us": t_x}  # fmt: skip
                if pr >= 0:
                    args["peer"] = int(pr)
                if isinstance(bw, float) and math.isfinite(bw):
                    args["busbw_gbs"] = round(bw, 3)
                w.event({"ph": "X", "name": f"{name} #{seq}", "cat": "op", "pid": pid, "tid": tid, "ts": t_a,
                         "dur": round(t_w + t_x, 3), "args": args})  # fmt: skip
                if wait_ > 0:
                    w.event({"ph": "X", "name": "wait", "cat": "wait", "pid": pid, "tid": tid, "ts": t_a,
                             "dur": t_w, "cname": "bad"})  # fmt: skip
                if x > 0:
                    w.event({"ph": "X", "name": "transfer", "cat": "transfer", "pid": pid, "tid": tid,
                             "ts": round(t_a + t_w, 3), "dur": t_x, "cname": "good"})  # fmt: skip
        incidents = Incidents.fold(sp.diagnoses, watch.end_ns, watch.heard_ns)
        first_tid: dict[int, int] = {}
        for (rank, _, _), tid in sorted(tracks.items(), key=lambda kv: kv[1]):
            first_tid.setdefault(rank, tid)
        for inc in incidents:
            t0 = t_first = _us(inc.first.time_ns - base)
            win = inc.first.detail.get("window_s") if inc.is_slow else None  # a slow finding's window
            if isinstance(win, int | float) and win > 0:
                t0 = max(round(t0 - win * 1e6, 3), 0.0)
            t1 = _us(inc.last.time_ns - base)
            row = {k: v for k, v in inc.row(base / 1e9 if base else None).items() if v}
            label = f"#{inc.id} {inc.kind} {inc.level.name}"
            color = LEVEL_COLOR.get(inc.level.name, "grey")
            w.event({"ph": "i", "s": "g", "name": label, "cat": "incident", "pid": INCIDENTS_PID, "tid": 0,
                     "ts": t_first, "args": row, "cname": color})  # fmt: skip
            w.event({"ph": "X", "name": label, "cat": "incident", "pid": INCIDENTS_PID, "tid": inc.id,
                     "ts": t0, "dur": round(max(t1 - t0, 0.0), 3), "args": row, "cname": color})  # fmt: skip
            w.event({"ph": "M", "name": "thread_name", "pid": INCIDENTS_PID, "tid": inc.id,
                     "args": {"name": f"#{inc.id} {inc.kind}"}})  # fmt: skip
            for r in inc.ranks:
                if select and select.ranks is not None and r not in select.ranks:
                    continue
                w.event({"ph": "i", "s": "t", "name": label, "cat": "incident", "pid": r + 1,
                         "tid": first_tid.get(r, 0), "ts": t_first, "args": row, "cname": color})  # fmt: skip
        # names and order of the tracks
        w.event({"ph": "M", "name": "process_name", "pid": INCIDENTS_PID, "args": {"name": "c4d incidents"}})
        w.event({"ph": "M", "name": "process_sort_index", "pid": INCIDENTS_PID, "args": {"sort_index": -1}})
        ranks = sorted({k[0] for k in tracks} | {r for i in incidents for r in i.ranks})
        if select and select.ranks is not None:
            ranks = [r for r in ranks if r in select.ranks]
        for r in ranks:
            node = watch.nodes.get(r, "")
            w.event({"ph": "M", "name": "process_name", "pid": r + 1,
                     "args": {"name": f"rank {r}" + (f" ({node})" if node else "")}})  # fmt: skip
            w.event({"ph": "M", "name": "process_sort_index", "pid": r + 1, "args": {"sort_index": r}})
        for (r, cid, pr), tid in tracks.items():
            what = f"comm {cid:016x}" + (f" peer {pr}" if pr >= 0 else "")
            w.event({"ph": "M", "name": "thread_name", "pid": r + 1, "tid": tid, "args": {"name": what}})
            w.event(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": r + 1,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        w.close(
            {
                "c4d_source": Path(path).name,
                "clock": "master, µs since the trace started",
                "trace_start_ns": base,
                "ops": counts["ops"],
                "ops_without_split": counts["unsplit"],
                "incidents": len(incidents),
            }
        )
        f.close()
    except BaseException:
        f.close()
        raise
    return {
        "events": w.n,
        "ops": counts["ops"],
        "unsplit": counts["unsplit"],
        "ranks": len(ranks),
        "incidents": len(incidents),
    }
