"""Inside a container the board reads differently (Docker masks /sys/firmware, and /proc/device-tree links into
it): whether the runner runs in one is recorded and is part of the device identity, so engines built inside
and outside a container are never taken for each other (issue 29)."""

from jetson import device
from jetson.bundle import BuildSpec
from jetson.engine import cache_key


def test_the_container_is_recorded_and_part_of_the_identity(tmp_path, monkeypatch):
    marker = tmp_path / ".dockerenv"
    monkeypatch.setattr(device, "CONTAINER_MARKERS", (str(marker),))
    monkeypatch.setattr(device, "DEVICE_TREE_MODEL", str(tmp_path / "masked" / "model"))  # as Docker shows it
    outside = device.device_record(None, "10.3.0.30")
    marker.touch()
    inside = device.device_record(None, "10.3.0.30")
    assert "container" in device.IDENTITY
    assert (outside["container"], inside["container"]) == (False, True)
    assert inside["identity"]["container"] is True and inside["identity"]["device_model"] is None
    spec = BuildSpec(precision="fp16")
    assert cache_key("g" * 64, spec, {}, outside["identity"], "python") != cache_key(
        "g" * 64, spec, {}, inside["identity"], "python")
