"""The live view in a real terminal: `c4d sim --live` inside tmux (120×40), read with capture-pane."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]


def _tmux(server: str, *args: str) -> str:
    """tmux on a server of its own (``-L``): a session started on the default server while
    another test kills that server's last session finds it gone."""
    return subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True, check=True).stdout


def _grid_groups(screen: str) -> list[str]:
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if "ranks by node" in line)
    row = lines[start + 1].strip().strip("│").strip()
    return row.split()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is installed by the README's commands")
def test_live_view_marks_the_culprit(tmp_path, libc4d, simtrain):
    session = f"c4d-{uuid.uuid4().hex[:8]}"
    cmd = (
        f"cd {shlex.quote(str(ROOT))} && C4D_HANG_TIMEOUT=1000000 C4D_HANG_TIMES=3 "
        f"{shlex.quote(sys.executable)} -m c4d sim --ranks 8 --ranks-per-node 4 --steps 400 "
        f"--fault noncomm-hang@rank=3,step=5 --live --max-seconds 90 --blacklist {tmp_path}/bl.txt"
    )
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run(
        ["tmux", "-L", session, "new-session", "-d", "-s", session, "-x", "120", "-y", "40", "bash"],
        check=True,
        env=env,
    )
    try:
        _tmux(session, "set-option", "-t", session, "remain-on-exit", "on")
        _tmux(session, "send-keys", "-t", session, cmd, "Enter")

        def screen_with_diagnosis() -> str | None:
            s = _tmux(session, "capture-pane", "-p", "-t", session)
            return s if ("RankNonCommHang" in s and "c4d sim: stopped on an ERROR" in s) else None

        # the live view's last frame, drawn when the sim stops on the ERROR
        screen = wait_for(screen_with_diagnosis, timeout=120, what="an ERROR RankNonCommHang on screen")
        groups = _grid_groups(screen)
        assert len(groups) == 2 and all(len(g) == 4 for g in groups), screen
        assert groups[0][3] == "H", screen  # rank 3 = node-0's 4th cell, marked hung
        assert sum(g.count("H") for g in groups) == 1, screen
        diag_lines = [line for line in screen.splitlines() if "RankNonCommHang" in line]
        assert any("3" in line and "node-0" in line for line in diag_lines), screen
        assert max(len(line) for line in screen.splitlines()) <= 120
    finally:
        subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True)
