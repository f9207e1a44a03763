"""Save and restore compressed models.

An artifact is a folder:

* ``edge-model.json``  the source model reference, the resolved plan, the calibration set,
  measured fit statistics, params and FLOPs, and ``steps``: one ``{method, step, options,
  record}`` per plan step, the record written by the step's method (format version 2; version 1
  kept one key per method, ``spans``/``dwconv``/``prefix_dropped``, and still loads);
* ``model.safetensors`` the compressed model's full state dict (float32).
* ``origin`` (only when ``edge finetune`` / ``distil`` started from no artifact): ``{"kind": "model",
  "model": SPEC, ...}`` rebuilds from the spec like a source model; ``{"kind": "module", "class": ...}``
  is a module of the user's code, which edge cannot rebuild: :func:`load_artifact` refuses it and says
  how to restore it in Python.

Restoring needs neither the calibration data nor the source weights: the source
architecture is rebuilt from its name, each method rebuilds its recorded modules at their seams
(in the registry's order), and the state dict is loaded exactly. Folders are written to a
temporary name and renamed, so a failed run never leaves a half-written artifact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from edge import __version__
from edge.compress.registry import methods
from edge.errors import EdgeError, InternalError
from edge.fileio import atomic_folder
from edge.models.info import model_info
from edge.models.weights_io import load_weights, read_state_dict, save_safetensors

MANIFEST = "edge-model.json"
WEIGHTS = "model.safetensors"
FORMAT = "edge-compressed-model"
FORMAT_VERSION = 2


def is_artifact(path: str | Path) -> bool:
    path = Path(path)
    return (path / MANIFEST).is_file() or (path.name == MANIFEST and path.is_file())


def save_artifact(model: nn.Module, out: str | Path, manifest: dict, keep: tuple[str, ...] = (),
                  drop: tuple[str, ...] = ()) -> Path:
    """Write ``out/`` atomically: the manifest of :func:`~edge.compress.compress` (with each step's record)
    and the full state dict.

    Files of an existing ``out/`` named in ``keep`` (a fine-tuning checkpoint) move into the new folder;
    those named in ``drop`` may be there and go with the folder it replaces (a finished run's checkpoint).
    """
    if "steps" not in manifest:
        raise InternalError("save_artifact needs a manifest from compress() or load_artifact() (it has no 'steps')")
    out = Path(out)
    if out.exists() and not is_artifact(out) and any(p.name not in (*keep, *drop) for p in out.iterdir()):
        raise EdgeError(f"--out {out} exists and is not an edge artifact", fix="choose a new or empty folder")
    with atomic_folder(out) as tmp:
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "edge": __version__, **manifest,
                  "info": _info(model)}
        record.update(format=FORMAT, format_version=FORMAT_VERSION, edge=__version__)  # a loaded manifest's own
        save_safetensors({k: v.detach().float().cpu() for k, v in model.state_dict().items()}, tmp / WEIGHTS,
                         metadata={"format": FORMAT})
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        for name in keep:
            if (out / name).is_file():
                os.replace(out / name, tmp / name)
    return out


def _info(model: nn.Module) -> dict:
    """The ViT geometry of ``model``; only its parameter count for a module of the user's own (not a timm ViT)."""
    if all(hasattr(model, name) for name in ("patch_embed", "blocks", "num_prefix_tokens", "embed_dim")):
        return model_info(model).as_dict()
    return {"params": sum(p.numel() for p in model.parameters())}


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    folder = path.parent if path.name == MANIFEST else path
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EdgeError(f"{folder / MANIFEST} cannot be read", found=str(e),
                        fix="pass a folder written by `edge compress`") from e
    if manifest.get("format") != FORMAT or manifest.get("format_version", 0) > FORMAT_VERSION:
        raise EdgeError(f"{folder} is not an edge artifact this version can read",
                        expected=f"format {FORMAT} version <= {FORMAT_VERSION}",
                        found=f"{manifest.get('format')} version {manifest.get('format_version')}",
                        fix="re-create it with this version of edge")
    if manifest.get("format_version", 0) < 2:
        try:
            manifest = _upgrade_v1(manifest)
        except (KeyError, TypeError, AttributeError) as e:
            raise _damaged(folder, e) from e
    return manifest


def _damaged(folder: Path, error: Exception) -> EdgeError:
    return EdgeError(f"{folder / MANIFEST} does not describe a model edge can rebuild (it was edited or is "
                     "incomplete)", found=f"{type(error).__name__}: {error}",
                     fix="re-create the artifact with `edge compress`")


def _upgrade_v1(manifest: dict) -> dict:
    """A format-1 manifest in format-2 form: its per-method keys become ``steps``."""
    steps = [entry for method in methods() for entry in method.upgrade_v1(manifest)]
    old = ("spans", "dwconv", "prefix_dropped")
    return {**{k: v for k, v in manifest.items() if k not in old}, "steps": steps}


def restore_steps(model: nn.Module, steps: list[dict], where: str) -> nn.Module:
    """Rebuild the recorded modules of ``steps`` in ``model`` (weights are loaded afterwards)."""
    known = {m.name for m in methods()}
    unknown = sorted({entry["method"] for entry in steps} - known)
    if unknown:
        raise EdgeError(f"{where} uses compression method(s) {', '.join(unknown)}, which this edge does not have",
                        expected=f"methods {', '.join(sorted(known))}",
                        fix="load it with the edge version (or plugin) that wrote it")
    records = {m.name: [e["record"] for e in steps if e["method"] == m.name] for m in methods()}
    for method in methods():
        if records[method.name]:
            method.restore_prepare(model, records[method.name])
    for method in methods():
        if records[method.name]:
            method.restore(model, records[method.name])
    return model


def load_artifact(path: str | Path) -> tuple[nn.Module, dict]:
    """Rebuild a compressed model from its folder; returns ``(model, manifest)``."""
    from edge.models.zoo import create_model

    path = Path(path)
    folder = path.parent if path.name == MANIFEST else path
    manifest = read_manifest(folder)
    origin = manifest.get("origin") or {}
    if origin.get("kind") == "module":
        raise EdgeError(f"{folder} holds the weights of a model built by Python code ({origin.get('class')}); edge "
                        "cannot rebuild that module (an artifact restores from a model name and a plan)",
                        expected="an artifact of `edge compress`, or of `edge finetune` on a model edge knows",
                        fix="in Python, build the module as for distil(), load the weights with "
                            f"edge.compress.finetune.load_distilled(module, {str(folder)!r}), then evaluate or "
                            "export it there (edge.check.accuracy.evaluate, edge.export.export)")
    try:
        source = manifest["source"]
        model = create_model(source["model"], img_size=source.get("img_size"), pretrained_weights=False)
        restore_steps(model, manifest["steps"], str(folder))
    except (KeyError, TypeError, AttributeError) as e:
        raise _damaged(folder, e) from e
    load_weights(model, read_state_dict(folder / WEIGHTS), str(folder / WEIGHTS))
    model.eval()
    return model, manifest


def source_state_sha256(model: nn.Module) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


__all__ = ["is_artifact", "load_artifact", "read_manifest", "save_artifact", "source_state_sha256"]
