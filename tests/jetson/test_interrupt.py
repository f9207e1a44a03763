"""jetson.interrupt: a signal is noted, raised where Python sees it, and raised once (real signals, this process)."""

import signal

import pytest

from jetson.interrupt import Interruptions
from jetson.power import Interrupted


def test_the_first_signal_raises_and_a_second_is_only_noted():
    """A terminal's Ctrl-C reaches a build process twice (the terminal's and the runner's forward): the second must
    not land, raised again, in what the first one's stop is doing."""
    interruptions = Interruptions()
    before = signal.getsignal(signal.SIGINT)     # Python's own, or SIG_IGN in a pytest-xdist worker
    with interruptions.handling():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)          # noted, not raised: the stop goes on
        signal.raise_signal(signal.SIGTERM)
        assert interruptions.signum == signal.SIGINT  # the first one is kept
    assert signal.getsignal(signal.SIGINT) == before                # put back


def test_a_signal_inside_deferred_is_raised_when_the_block_ends():
    interruptions = Interruptions()
    with interruptions.handling(), pytest.raises(Interrupted):
        with interruptions.deferred():
            signal.raise_signal(signal.SIGTERM)       # inside a TensorRT call: only noted
            assert interruptions.noted
    assert interruptions.signum == signal.SIGTERM
