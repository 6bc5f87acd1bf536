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
