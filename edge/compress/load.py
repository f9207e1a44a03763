"""A model by name or from a compressed artifact: the loader of every command that accepts either.

:func:`edge.models.create_model` knows model names only; a folder written by ``edge compress``
is restored by :func:`edge.compress.artifact.load_artifact`. ``load_model`` tells them apart.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from edge.compress.artifact import is_artifact, load_artifact
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
    return create_model(spec, weights=weights, img_size=img_size, num_classes=num_classes,
                        pretrained_weights=pretrained_weights)
