"""A real ``c4d master`` process for tests: started on a free port, its stdout (JSON lines) and
stderr in files, its Prometheus counters scraped over HTTP, stopped by SIGTERM or SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from tests.conftest import c4d_cmd, free_port, wait_for

_SAMPLE = re.compile(r'^(\w+)\{reason="([^"]*)"\} ([0-9.e+]+)$')


class MasterProc:
    def __init__(
        self,
        tmp: Path,
        *args: object,
        port: int | None = None,
        name: str = "master",
        env: dict[str, str] | None = None,
        preexec_fn=None,
        trace: Path | None = None,
        metrics: bool = True,
    ):
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.trace = trace if trace is not None else tmp / f"{name}.c4d"
        self.out_path, self.err_path = tmp / f"{name}.out", tmp / f"{name}.err"
        self.metrics_port = free_port() if metrics else None
        argv = c4d_cmd("master", "--bind", self.endpoint, "--json", "--log-level", "info", *args)
        if self.trace:
            argv += ["--trace", str(self.trace)]
        if self.metrics_port:
            argv += ["--metrics-port", str(self.metrics_port)]
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=self._err, env=env or dict(os.environ), preexec_fn=preexec_fn
        )
        wait_for(
            lambda: "listening on" in self.stderr() or self.proc.poll() is not None,
            120,
            "the master to listen",
        )
        if self.proc.poll() is not None:
            raise AssertionError(f"c4d master exited with {self.proc.returncode}:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.err_path.read_text()

    def diagnoses(self) -> list[dict]:
        return [json.loads(ln) for ln in self.out_path.read_text().splitlines() if ln.startswith("{")]

    def counters(self, metric: str) -> dict[str, float]:
        """``{reason: value}`` of a labelled Prometheus counter (``_total`` samples)."""
        assert self.metrics_port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m and m[1] == f"{metric}_total":
                out[m[2]] = float(m[3])
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._out.close()
            self._err.close()
        return rc


def descendants_named(pid: int, text: str) -> list[int]:
    """Descendants of ``pid`` whose command line holds ``text``."""
    from c4d.run import proctree

    out = []
    for k in proctree.descendants([pid]):
        try:
            if text in Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                out.append(k)
        except OSError:
            continue
    return out


def hang_named_live(m: MasterProc, rank: int = 3) -> tuple[list[dict], list[dict]]:
    """A 4-rank sim job (2 a node) whose ``rank`` stops computing at step 5, against master
    ``m``, until the master names the hang; then ``m`` stopped (exit 2: it diagnosed a WARNING or
    above, no traceback). Returns its RankNonCommHang JSON lines and those a replay of its trace
    in one engine gives."""
    from c4d.offline import analyze
    from c4d.record import trace

    try:
        sim = subprocess.Popen(
            [*c4d_cmd("sim", "--quick", "--ranks", 4, "--ranks-per-node", 2, "--fault",
                      f"noncomm-hang@rank={rank},step=5", "--master", m.endpoint), "--max-seconds", "60"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: any(d["kind"] == "RankNonCommHang" for d in m.diagnoses()), 90,
                     "the master to name the hang")  # fmt: skip
        finally:
            sim.kill()
            sim.wait()
    finally:
        assert m.stop() == 2, m.stderr()
    assert "Traceback" not in m.stderr()
    live = [d for d in m.diagnoses() if d["kind"] == "RankNonCommHang"]
    replayed = [d.to_json() for d in analyze.replay(trace.read_raw(m.trace), analyze.make_engine())]
    return live, [d for d in replayed if d["kind"] == "RankNonCommHang"]


def replay_killing(ep, rt, kill) -> None:
    """A trace's rows and ticks through an engine process ``ep`` as the master drives it (rows
    between ticks fed, each tick at its time), ``kill()`` called halfway, then ``ep.drain()``."""
    import numpy as np

    from c4d.record import schema

    ticks = np.flatnonzero(rt.raw["kind"] == schema.Kind.TICK).tolist()
    prev, last = 0, int(rt.meta.get("created_ns", 0))
    for n, i in enumerate(ticks):
        if i > prev:
            ep.feed(rt.raw[prev:i], last)
        if n == len(ticks) // 2:
            kill()
        last = int(rt.raw["time_ns"][i])
        ep.tick(last)
        prev = i + 1
    ep.drain()
