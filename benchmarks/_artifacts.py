"""Compressed artifacts the benchmarks reuse between runs (resumable benchmarks)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from edge.compress import CompressConfig, compress, is_artifact, save_artifact
from edge.compress.artifact import read_manifest
from edge.compress.load import load_model


def cached_artifact(model_name: str, config: CompressConfig, folder: Path) -> dict:
    """The artifact of ``config.plan`` in ``folder``; made unless it holds one of the same plan, config and model."""
    if is_artifact(folder):
        manifest = read_manifest(folder)
        if (manifest.get("requested_plan"), manifest.get("config"), manifest["source"].get("model")) == \
                (config.plan, asdict(config), model_name):
            return manifest
    model, manifest = compress(load_model(model_name), {"model": model_name}, config)
    save_artifact(model, folder, manifest)
    return manifest
