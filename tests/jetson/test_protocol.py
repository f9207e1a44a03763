"""The benchmark protocol, like trtexec's (samples/common/sampleOptions.h at TensorRT 10.3: defaultWarmUp 200 ms,
defaultDuration 3 s, defaultIterations 10): warm-up by time, a timed window by duration with the iterations as a
minimum too, and a longer window when energy is measured (issue 29, D4 and point 6)."""

import time
from dataclasses import replace

import pytest

from edge.pipeline import device_report
from jetson.bundle import ENERGY_DURATION_S, Protocol, read_bundle
from jetson.energy import MIN_ENERGY_SAMPLES
from jetson.errors import JetsonError
from jetson.runner import Measurement, Runner, RunOptions


class OneMillisecondBackend:
    """A backend whose every call takes about 1 ms, as a small engine's does."""

    def __init__(self) -> None:
        self.calls = 0

    def infer(self) -> None:
        self.calls += 1
        time.sleep(0.001)


def test_the_default_protocol_is_trtexecs_and_longer_with_energy():
    protocol = Protocol()
    assert protocol.warmup_s == 0.2 and protocol.duration_s == 3.0 and protocol.iterations == 10
    assert protocol.timed_s(energy=False) == 3.0
    assert protocol.timed_s(energy=True) == ENERGY_DURATION_S == 10.0
    # 10 s at tegrastats' 100 ms: about 100 samples, well above the minimum for trusted energy
    assert ENERGY_DURATION_S * 1000 / protocol.tegrastats_interval_ms >= 5 * MIN_ENERGY_SAMPLES
    assert device_report.MIN_SAMPLES == MIN_ENERGY_SAMPLES  # the report's * and the device's flag agree


def test_the_default_protocol_warms_up_at_least_0_2_s_and_times_at_least_3_s(bundle):
    """A 1 ms engine: trtexec's protocol warms it up for 200 ms (about 200 calls, not 20) and times it for 3 s
    (about 3000 calls, not 200). The bounds asserted are the protocol's, not a speed."""
    runner = Runner(RunOptions(bundle=bundle, backend="ort", energy="off"))
    runner.protocol = Protocol()
    backend, measured = OneMillisecondBackend(), Measurement()
    start, end = runner._timed(backend, measured)
    assert measured.warmup_seconds >= 0.2 and measured.warmup_calls >= 1
    assert measured.seconds >= 3.0 and end - start >= 3.0
    assert len(measured.latencies_ms) >= 10
    assert backend.calls == measured.warmup_calls + len(measured.latencies_ms)


def test_explicit_options_override_the_bundles_protocol(bundle):
    base = replace(read_bundle(bundle).protocol, duration_s=3.0, energy_duration_s=10.0, warmup_s=0.2)
    # --duration is the whole timed window, with energy too (then flagged if too few samples)
    options = RunOptions(bundle=bundle, duration_s=0.5, warmup_s=0.5)
    protocol = options.protocol(replace(read_bundle(bundle), protocol=base))
    assert protocol.timed_s(energy=True) == 0.5 and protocol.warmup_s == 0.5 and protocol.iterations == 1
    # --iterations alone: a count only, no duration
    protocol = RunOptions(bundle=bundle, iterations=50).protocol(replace(read_bundle(bundle), protocol=base))
    assert protocol.timed_s(energy=True) == 0.0 and protocol.iterations == 50
    # nothing given: the bundle's trtexec-like protocol
    protocol = RunOptions(bundle=bundle).protocol(replace(read_bundle(bundle), protocol=base))
    assert (protocol.timed_s(energy=False), protocol.timed_s(energy=True)) == (3.0, 10.0)


@pytest.mark.parametrize("changes, named", [
    ({"warmup_s": -1.0}, "warm-up time -1.0 s"),
    ({"duration_s": 0.0}, "duration 0.0 s"),
    ({"energy_duration_s": -2.0}, "energy duration -2.0 s"),
])
def test_a_bad_protocol_is_refused_naming_the_value(changes, named):
    with pytest.raises(JetsonError, match=named):
        Protocol(**changes)
