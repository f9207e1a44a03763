"""Artifacts written by format version 1 (before the method registry) still load, as the same function.

``tests/golden/v1/`` holds two real version-1 artifacts of a tiny model, written by edge 0.1.0
before issue 12, and the logits they gave then on four seeded inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edge.compress.artifact import load_artifact

GOLDEN = Path(__file__).parents[2] / "golden" / "v1"


@pytest.mark.parametrize("name", ["mixed", "dropped"])
def test_version_1_artifacts_load_as_the_same_function(name):
    manifest = json.loads((GOLDEN / name / "edge-model.json").read_text())
    assert manifest["format_version"] == 1
    model, loaded = load_artifact(GOLDEN / name)
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(x)
    expected = torch.tensor(json.loads((GOLDEN / "logits.json").read_text())[name])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    assert loaded["plan"] == manifest["plan"]


@pytest.mark.parametrize("damage", ["no steps", "no record", "no source", "format 1 without spans"])
def test_a_damaged_manifest_is_bad_input_not_a_crash(tmp_path, damage):
    import shutil

    from edge.errors import EdgeError

    folder = tmp_path / "art"
    shutil.copytree(GOLDEN / "mixed", folder)
    _, manifest = load_artifact(folder)   # the format-2 form of the recorded format-1 manifest
    manifest["format_version"] = 2
    if damage == "no steps":
        del manifest["steps"]
    elif damage == "no record":
        del manifest["steps"][0]["record"]
    elif damage == "no source":
        del manifest["source"]
    else:
        manifest = {k: v for k, v in manifest.items() if k != "steps"} | {"format_version": 1}
    (folder / "edge-model.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgeError, match="does not describe a model edge can rebuild"):
        load_artifact(folder)
