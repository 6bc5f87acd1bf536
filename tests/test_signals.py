"""A SIGTERM whose KeyboardInterrupt is swallowed (pyzmq's Frame.__dealloc__ prints and drops
exceptions) still stops a command: the CI once saw `c4d agent` run on after its SIGTERM."""

import contextlib
import os
import signal

import pytest

from c4d.util import signals


@pytest.fixture
def installed():
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    signals._asked.clear()
    signals.raise_on_signals()
    yield
    for s, h in old.items():
        signal.signal(s, h)
    signals._asked.clear()


def test_a_swallowed_interrupt_is_still_asked_and_checked(installed):
    assert not signals.asked()
    signals.check()  # nothing came: no unwinding
    with contextlib.suppress(KeyboardInterrupt):  # what a destructor does with it
        os.kill(os.getpid(), signal.SIGTERM)
    assert signals.asked()
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        signals.check()


def test_sighup_unwinds_like_ctrl_c(installed):
    with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGHUP)}"):
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
