"""Shared fixtures: paths of the native artifacts and small waiting helpers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from c4d import native


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
    """The captured nccl-tests outputs: $C4D_NCCL_TESTS_DATA, else shared/data/nccl-tests in the
    checkout's folder or any folder above it (a worktree sits deeper than the main checkout)."""
    env = os.environ.get("C4D_NCCL_TESTS_DATA")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents[1:]:
        d = parent / "shared" / "data" / "nccl-tests"
        if d.is_dir():
            return d
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "nccl-tests"


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
