"""A model by name or from a compressed artifact: the loader of every command that accepts either.

:func:`edge.models.create_model` knows model names only; a folder written by ``edge compress``
is restored by :func:`edge.compress.artifact.load_artifact`. ``load_model`` tells them apart.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from edge.compress.artifact import MANIFEST, is_artifact, load_artifact
from edge.errors import EdgeError
from edge.models import ImgSize, ModelSpec, create_model


def load_model(spec: str | ModelSpec, *, weights: str | Path | None = None, img_size: ImgSize | None = None,
               num_classes: int | None = None, pretrained_weights: bool = True) -> nn.Module:
    """The model ``spec`` names (see :func:`create_model`), or the compressed model of an artifact folder."""
    if isinstance(spec, str) and Path(spec).exists() and is_artifact(spec):
        if weights is not None or img_size is not None:
            raise EdgeError(f"{spec} is a compressed model; --weights and --img-size do not apply to it",
                            fix="drop --weights / --img-size (the artifact holds its weights and input size)")
        return load_artifact(spec)[0]
    if isinstance(spec, str):
        _refuse_path(spec)
    return create_model(spec, weights=weights, img_size=img_size, num_classes=num_classes,
                        pretrained_weights=pretrained_weights)


GRAPH_SUFFIXES = (".onnx", ".engine", ".plan", ".trt")


def _refuse_path(spec: str) -> None:
    """A ``spec`` that is (or looks like) a path but no compressed model: say what it is, not "unknown model"."""
    if spec.startswith("timm:"):
        return
    path = Path(spec)
    expected = f"a model name (`edge models` lists them) or a folder written by `edge compress` (holding {MANIFEST})"
    if path.is_dir():
        raise EdgeError(f"{spec} is a folder but not a compressed model: it holds no {MANIFEST}", expected=expected,
                        fix="pass the folder `edge compress --out` wrote, or a model name")
    if path.is_file():
        kind = "a graph file" if path.suffix.lower() in GRAPH_SUFFIXES else "a file"
        raise EdgeError(f"{spec} is {kind}, not a PyTorch model", expected=expected,
                        fix="ONNX graphs go to the verbs that take them (eval, profile, clean, quantize, build); "
                            "weights files go to --weights with a model name")
    if "/" in spec or path.suffix.lower() in (*GRAPH_SUFFIXES, ".safetensors", ".pt", ".pth", ".json"):
        raise EdgeError(f"{spec} does not exist", expected=expected,
                        fix="check the path (a folder written by `edge compress`), or pass a model name")
