"""Save and restore compressed models.

An artifact is a folder:

* ``edge-model.json``  the source model reference, the resolved plan, how each replaced span
  is built, the calibration set, measured fit statistics, params and FLOPs;
* ``model.safetensors`` the compressed model's full state dict (float32).

Restoring needs neither the calibration data nor the source weights: the source
architecture is rebuilt from its name, the plan's modules are put at their seams, and the
state dict is loaded exactly. Folders are written to a temporary name and renamed, so a
failed run never leaves a half-written artifact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from torch import nn

from edge import __version__
from edge.compress.block_approx import ApproximatedSpan, replace_spans
from edge.compress.dwconv import drop_prefix_tokens
from edge.compress.dwconv_apply import dwconv_records, restore_dwconv
from edge.errors import EdgeError
from edge.models.info import model_info
from edge.models.weights_io import load_weights, read_state_dict, save_safetensors

MANIFEST = "edge-model.json"
WEIGHTS = "model.safetensors"
FORMAT = "edge-compressed-model"
FORMAT_VERSION = 1


def is_artifact(path: str | Path) -> bool:
    path = Path(path)
    return (path / MANIFEST).is_file() or (path.name == MANIFEST and path.is_file())


def span_records(model: nn.Module) -> list[dict]:
    records = []
    for module in model.blocks:
        if isinstance(module, ApproximatedSpan):
            records.append({"replaced": list(module.replaced), "method": module.method,
                            "own_prefix_map": module.prefix_map is not None,
                            "bias": isinstance(module.map, nn.Linear) and module.map.bias is not None})
    return records


def save_artifact(model: nn.Module, out: str | Path, manifest: dict, keep: tuple[str, ...] = ()) -> Path:
    """Write ``out/`` atomically: manifest (plus the span structure) and the full state dict.

    Files of an existing ``out/`` named in ``keep`` (a fine-tuning checkpoint) move into the new folder.
    """
    out = Path(out)
    if out.exists() and not is_artifact(out) and any(p.name not in keep for p in out.iterdir()):
        raise EdgeError(f"--out {out} exists and is not an edge artifact", fix="choose a new or empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "edge": __version__, **manifest,
                  "spans": span_records(model), "dwconv": dwconv_records(model),
                  "prefix_dropped": bool(manifest.get("fit", {}).get("dwconv", {}).get("prefix_dropped", False)),
                  "info": model_info(model).as_dict()}
        save_safetensors({k: v.detach().float().cpu() for k, v in model.state_dict().items()}, tmp / WEIGHTS,
                         metadata={"format": FORMAT})
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        for name in keep:
            if (out / name).is_file():
                os.replace(out / name, tmp / name)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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
    return manifest


def load_artifact(path: str | Path) -> tuple[nn.Module, dict]:
    """Rebuild a compressed model from its folder; returns ``(model, manifest)``."""
    from edge.models.zoo import create_model

    path = Path(path)
    folder = path.parent if path.name == MANIFEST else path
    manifest = read_manifest(folder)
    source = manifest["source"]
    model = create_model(source["model"], img_size=source.get("img_size"), pretrained_weights=False)
    if manifest.get("prefix_dropped"):
        drop_prefix_tokens(model)
    info = model_info(model)
    spans = {}
    for record in manifest["spans"]:
        replaced = tuple(record["replaced"])
        spans[replaced] = ApproximatedSpan(record["method"], replaced, info.embed_dim, info.num_prefix_tokens,
                                           own_prefix_map=record["own_prefix_map"], bias=record["bias"])
    replace_spans(model, spans)
    restore_dwconv(model, manifest.get("dwconv", []))
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
