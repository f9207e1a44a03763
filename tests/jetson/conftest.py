import pytest

from tests.jetson.fakes import FakeJetson, install_fakes


@pytest.fixture
def fake_jetson(tmp_path, monkeypatch) -> FakeJetson:
    """The fakes on this process's PATH under the real names (so jetson's code calls them)."""
    fakes = install_fakes(tmp_path / "device")
    for name, value in fakes.variables().items():
        monkeypatch.setenv(name, value)
    return fakes
