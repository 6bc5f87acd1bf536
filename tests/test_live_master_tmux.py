"""`c4d master --live` in a real terminal (tmux, 80×24: the smallest common size), fed by a
`c4d sim --master` started from another process, read with capture-pane."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from c4d.actions import blacklist
from tests.conftest import c4d_cmd, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is installed by the README's commands"
)


def _tmux(server: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True, check=True).stdout


class Pane:
    """A tmux session on a tmux server of its own (``-L``): tests on other workers start and
    stop theirs at the same time, and a session started on a server whose last session was
    just killed finds it gone ("server exited unexpectedly")."""

    def __init__(self, cmd: str, width: int = 80, height: int = 24):
        self.session = f"c4d-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "TERM": "xterm-256color"}
        subprocess.run(
            ["tmux", "-L", self.session, "new-session", "-d", "-s", self.session, "-x", str(width),
             "-y", str(height), "bash"],
            check=True,
            env=env,
        )  # fmt: skip
        _tmux(self.session, "set-option", "-t", self.session, "remain-on-exit", "on")
        _tmux(self.session, "send-keys", "-t", self.session, cmd, "Enter")

    def screen(self) -> str:
        return _tmux(self.session, "capture-pane", "-p", "-t", self.session)

    def keys(self, *keys: str) -> None:
        _tmux(self.session, "send-keys", "-t", self.session, *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.session, "kill-server"], capture_output=True)


def _master(tmp_path: Path, ep: str) -> Pane:
    cmd = (
        f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m c4d master --bind {ep} "
        f"--trace {tmp_path}/job.c4d --blacklist {tmp_path}/bad.txt --live; echo EXIT=$?"
    )
    return Pane(cmd)


def _sim(ep: str, *args: object, seconds: int = 60) -> subprocess.Popen:
    argv = c4d_cmd("sim", "--quick", "--ranks", 8, "--ranks-per-node", 4, *args, "--master", ep)
    return subprocess.Popen(
        [*argv, "--max-seconds", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _stacks() -> str:
    """Where each `c4d master` process is, for a failure message (py-spy when installed)."""
    pids = subprocess.run(["pgrep", "-f", "c4d master"], capture_output=True, text=True).stdout.split()
    out = [f"master pids: {pids}"]
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        if status.exists():
            out += [line for line in status.read_text().splitlines() if line.startswith(("State", "Threads"))]
        if shutil.which("py-spy"):
            dump = subprocess.run(["py-spy", "dump", "--pid", pid], capture_output=True, text=True)
            out.append(dump.stdout + dump.stderr)
    return "\n".join(out)


def _grid(screen: str) -> list[str]:
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if "ranks by node" in line)
    return lines[start + 1].strip().strip("│").strip().split()


@pytest.mark.slow
def test_master_live_view_shows_a_hang_from_another_process(tmp_path, libc4d, simtrain):
    ep = f"tcp://127.0.0.1:{free_port()}"
    pane = _master(tmp_path, ep)
    sim = None
    try:
        wait_for(lambda: "ranks by node" in pane.screen(), timeout=60, what="the live view to appear")
        sim = _sim(ep, "--fault", "noncomm-hang@rank=3,step=5")

        def blacklisted() -> str | None:
            s = pane.screen()
            return s if "blacklisted: node-0" in s and "ERROR #1 RankNonCommHang" in s else None

        screen = wait_for(blacklisted, timeout=90, what="the ERROR and the blacklist in the live view")
        lines = screen.splitlines()
        assert len(lines) <= 24 and max(len(line) for line in lines) <= 80, screen
        groups = _grid(screen)
        assert [len(g) for g in groups] == [4, 4], screen
        assert groups[0][3] == "H" and sum(g.count("H") for g in groups) == 1, screen  # rank 3 = node-0's 4th
        inc = [line for line in lines if "RankNonCommHang" in line and "│" in line]
        assert any("rank 3 [node-0]" in line for line in inc), screen
        assert "master listening on" in screen or "blacklisted node-0" in screen  # the log panel
        assert "communicators" in screen and "╭─ log" in screen
        assert blacklist.read_nodes(tmp_path / "bad.txt") == ["node-0"]
        sim.kill()
        sim.wait(timeout=30)
        pane.keys("C-c")
        try:

            def exited() -> str | None:
                # the status on a line of its own: the typed command line ("...; echo EXIT=$?")
                # may be on screen too, and matched before the master had exited (ci24)
                s = pane.screen()
                return s if re.search(r"^EXIT=\d+\s*$", s, re.M) else None

            done = wait_for(exited, timeout=30, what="the master to exit")
        except AssertionError as e:
            raise AssertionError(f"{e}; last screen:\n{pane.screen()}\n{_stacks()}") from None
        assert re.search(r"^EXIT=2\s*$", done, re.M), done  # it diagnosed a problem
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        pane.close()
    assert (tmp_path / "job.c4d").stat().st_size > 0


@pytest.mark.slow
def test_master_live_view_shows_slow_ranks_by_default(tmp_path, libc4d, simtrain):
    """INFO findings (the slow kinds) are visible without any --log-level."""
    ep = f"tcp://127.0.0.1:{free_port()}"
    pane = _master(tmp_path, ep)
    sim = None
    try:
        wait_for(lambda: "ranks by node" in pane.screen(), timeout=60, what="the live view to appear")
        sim = _sim(ep, "--tp", 2, "--pp", 2, "--fault", "comm-slow@rank=5,step=20,factor=4")

        seen: list[str] = []

        def slow() -> str | None:
            s = pane.screen()
            seen[:] = [s]
            return s if re.search(r"INFO #\d+ RankCommSlow: rank 5 \[node-1\]", s) else None

        try:
            screen = wait_for(slow, timeout=90, what="the RankCommSlow incident in the live view")
        except AssertionError as e:
            raise AssertionError(f"{e}; last screen:\n{seen[0] if seen else ''}") from None
        assert "INFO" in screen.split("╭─ log", 1)[-1], screen  # logged too, at the default level
        sim.wait(timeout=90)
        assert "blacklisted" not in pane.screen()  # slow findings never isolate
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        pane.keys("C-c")
        pane.close()
