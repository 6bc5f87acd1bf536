"""The README's examples, run exactly as written: one `c4d sim --quick` per fault kind must name the
kind and the culprit it says, within the time it says. The commands and the expectations are
read from the README's code block, so the README and this test cannot drift apart."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
EXPECT = re.compile(
    r"^# (Rank\w+|CollectiveMismatch): (rank \d+|link \d+<->\d+|ranks \d+-\d+) \[(node-\d+(?:, node-\d+)*)\]"
    r" within (\d+) s(.*)$"
)
OPENED = re.compile(r"^c4d (INFO|WARNING|ERROR) #\d+ (Rank\w+|CollectiveMismatch): ")
HANG_KINDS = {"RankNonCommHang", "RankCommHang", "RankLost", "CollectiveMismatch"}


@dataclass(frozen=True)
class Example:
    command: str
    kind: str
    culprit: str
    node: str
    within_s: float
    note: str

    @property
    def pure_dp(self) -> bool:
        return "--tp" not in self.command and "--pp" not in self.command

    def names(self, line: str, level: str = "") -> bool:
        """Whether a log line (after ``c4d LEVEL #N ``) gives this kind and culprit. A cycle's line
        gives each of its ranks with the op it is in: ``rank 2 in ..., never entered ...; rank 3
        in ... [node-0]``."""
        head = f"c4d {level} #" if level else "c4d "
        if not line.startswith(head) or f" {self.kind}: " not in line:
            return False
        body = line.split(f" {self.kind}: ", 1)[1]
        if not self.culprit.startswith("ranks "):
            return body.startswith(f"{self.culprit} [{self.node}]")
        lo, hi = map(int, self.culprit.split()[1].split("-"))
        cycle = body.split(" [", 1)[0]
        named = sorted(int(r) for r in re.findall(r"(?:^|; )rank (\d+) in ", cycle))
        return named == list(range(lo, hi + 1)) and f"[{self.node}]" in body


def examples() -> list[Example]:
    text = README.read_text()
    section = text.split("### No GPU", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.strip().splitlines()
    out = []
    for comment, cmd in zip(lines[::2], lines[1::2], strict=True):
        m = EXPECT.match(comment)
        assert m, f"README example comment not in the expected shape: {comment!r}"
        assert cmd.startswith("c4d sim "), cmd
        out.append(Example(cmd, m[1], m[2], m[3], float(m[4]), m[5].strip()))
    return out


EXAMPLES = examples()


def test_every_kind_has_an_example():
    assert {e.kind for e in EXAMPLES} == {
        "CollectiveMismatch",
        "RankNonCommHang",
        "RankCommHang",
        "RankNonCommSlow",
        "RankCommSlow",
        "RankLost",
    }
    assert {e.kind for e in EXAMPLES if e.pure_dp} == {"RankNonCommSlow", "RankCommSlow", "RankCommHang"}
    # users run tensor-parallel groups inside nodes, and rings whose edges are partly inside nodes
    natural = [e for e in EXAMPLES if "--ranks-per-node 4" in e.command]
    assert {e.kind for e in natural} >= {"RankCommSlow", "RankCommHang"}


def _run(cmd: str, deadline_s: float) -> tuple[list[tuple[float, str]], int | None]:
    """Run a README command; every stderr line with the seconds since start it arrived at."""
    argv = [sys.executable, "-m", "c4d", *shlex.split(cmd)[1:]]
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    th = threading.Thread(target=read, daemon=True)
    th.start()
    try:
        p.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        p.terminate()  # a slow-kind job may run on after its diagnosis; enough was seen
        p.wait(timeout=30)
    th.join(timeout=10)
    return lines, p.returncode


def _params() -> list:
    return [pytest.param(e, id=f"{e.kind}{'-pure-dp' if e.pure_dp else ''}") for e in EXAMPLES]


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("ex", _params())
def test_readme_example(ex: Example, libc4d, simtrain):
    lines, rc = _run(ex.command, deadline_s=ex.within_s + 60)
    log = "\n".join(f"{t:6.1f} {s}" for t, s in lines)
    opened = [(t, s) for t, s in lines if OPENED.match(s)]
    assert opened, f"no diagnosis at all:\n{log}"
    t, first = opened[0]
    assert ex.names(first), f"expected {ex.kind} on {ex.culprit}:\n{log}"
    assert t <= ex.within_s, f"came after {t:.1f} s, the README says within {ex.within_s:g} s:\n{log}"
    if ex.kind in HANG_KINDS:
        err = [t for t, s in lines if s.startswith("c4d ERROR #1 ") and ex.names(s, "ERROR")]
        assert err and err[0] <= ex.within_s, log
        assert rc == 2 and any("stopped on an ERROR" in s for _, s in lines), log
    # nothing else was blamed
    others = [s for _, s in opened if not ex.names(s) and f": {ex.culprit} [{ex.node}]" not in s]
    assert not others, log
