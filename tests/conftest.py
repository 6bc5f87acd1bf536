"""Shared fixtures: paths of the native artifacts and small waiting helpers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from c4d.util import native


@pytest.fixture(scope="session")
def libc4d():
    return native.lib_path()


@pytest.fixture(scope="session")
def simnccl_dir():
    return native.simnccl_dir()


@pytest.fixture(scope="session")
def simtrain():
    return native.simtrain_path()


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Poll ``cond`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_text(port: int, *want: str) -> str | None:
    """The Prometheus text served on 127.0.0.1:``port`` once it holds every ``want`` (None before
    that, or while nothing answers there)."""
    import urllib.request

    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    return body if all(w in body for w in want) else None


def c4d_cmd(*args: object) -> list[str]:
    """argv for running the c4d CLI of this checkout in a subprocess."""
    import sys

    return [sys.executable, "-m", "c4d", *(str(a) for a in args)]


def nccl_tests_data() -> Path:
    """The captured nccl-tests outputs: $C4D_NCCL_TESTS_DATA, else tests/data/nccl-tests (public
    runs, each file's first line names its source)."""
    env = os.environ.get("C4D_NCCL_TESTS_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "data" / "nccl-tests"


@pytest.fixture
def master():
    """A test master on a free port (tests/test_shim.py: Master); no errors by the end."""
    from tests.test_shim import Master

    m = Master()
    yield m
    m.close()
    assert not m.errors, m.errors


@pytest.fixture
def jobs():
    """Simulated rank processes started by a test (tests/test_shim.py: Job), killed at its end."""
    started: list = []
    yield started
    for j in started:
        j.kill()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all", action="store_true", help="run the tests marked slow too")


_LEFT_OUT = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    """A run that names no path and no ``-m`` (the README's ``python -m pytest -q``) leaves out
    the tests marked slow, so that a developer waits minutes, not a quarter of an hour. ``-m
    slow`` runs only those, ``--all`` everything, and a run that names files or tests runs all of
    them. xdist's workers get the same arguments, so they decide the same."""
    if config.getoption("--all") or config.option.markexpr:
        return
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        config.option.markexpr = "not slow"
        config.stash[_LEFT_OUT] = True


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if config.stash.get(_LEFT_OUT, False) and not hasattr(config, "workerinput"):
        n = len(terminalreporter.stats.get("deselected", []))
        terminalreporter.write_line(f"{n} slow tests left out: `python -m pytest -q -m slow` runs them")
