"""The manifest written beside every engine, and the check that refuses an engine built elsewhere.

TensorRT engines are tied to the TensorRT version and the GPU they were built on (hardware
compatibility modes do not cover JetPack), so ``edge build`` records what it built with and
``edge profile`` refuses an engine whose manifest does not match the running TensorRT and device.
The GPU name and compute capability do not tell Orin modules apart (every one says "Orin", 8.7):
the SM count, the memory and the board's device-tree model do, so an engine tuned on an AGX Orin
is refused on an Orin Nano.
"""

from __future__ import annotations

import json
from pathlib import Path

from edge.errors import EdgeError
from edge.fileio import sha256_file
from jetson.device import IDENTITY

MANIFEST_VERSION = 2  # 2: SM count, memory and board in the identity; CUDA versions labelled


def manifest_path(engine: str | Path) -> Path:
    return Path(f"{engine}.json")


def layers_path(engine: str | Path) -> Path:
    return Path(f"{engine}.layers.json")


def read_manifest(engine: str | Path) -> dict:
    path = manifest_path(engine)
    if not path.is_file():
        raise EdgeError(f"{engine} has no manifest ({path.name} is missing)",
                        expected="an engine written by `edge build`, with its manifest beside it",
                        fix=f"rebuild it on this device: edge build MODEL.onnx --out {engine}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EdgeError(f"{path} is not a readable manifest", found=str(e)[:200], fix="rebuild the engine") from e
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise EdgeError(f"{path} has manifest version {manifest.get('manifest_version')!r}",
                        expected=f"version {MANIFEST_VERSION}", fix="rebuild the engine with this edge")
    return manifest


def mismatches(manifest: dict, running: dict) -> list[tuple[str, str, str]]:
    """(field, built with, running) for every identity field that differs."""
    built = manifest.get("runtime", {})
    return [(f, str(built.get(f)), str(running.get(f))) for f in IDENTITY
            if running.get(f) is not None and built.get(f) != running.get(f)]


def describe_device(identity: dict) -> str:
    """ "NVIDIA Jetson Orin Nano Developer Kit (Orin, sm 8.7, 8 SMs, 7 GiB)" from an identity."""
    board = identity.get("device_model") or identity.get("gpu")
    return (f"{board} ({identity.get('gpu')}, sm {identity.get('compute_capability')}, "
            f"{identity.get('sm_count')} SMs, {identity.get('memory_gib')} GiB)")


def check_compatible(engine: str | Path, manifest: dict, running: dict) -> None:
    """Refuse an engine built with another TensorRT version or on another device."""
    different = mismatches(manifest, running)
    if different:
        onnx = manifest.get("onnx", {}).get("path", "MODEL.onnx")
        built = manifest.get("runtime", {})
        raise EdgeError(f"{engine} was built for another TensorRT or GPU and cannot run here: built on "
                        f"{describe_device(built)} with TensorRT {built.get('tensorrt')}, this is "
                        f"{describe_device(running)} with TensorRT {running.get('tensorrt')}",
                        expected=", ".join(f"{f} {b}" for f, b, _ in different),
                        found=", ".join(f"{f} {r}" for f, _, r in different),
                        fix=f"engines are not portable: rebuild on this device with `edge build {onnx} --out {engine}`")
    engine_sha = manifest.get("engine", {}).get("sha256")
    if engine_sha and Path(engine).is_file() and sha256_file(engine) != engine_sha:
        raise EdgeError(f"{engine} does not match its manifest (sha256 differs)",
                        fix="the engine was replaced or corrupted; rebuild it with `edge build`")
