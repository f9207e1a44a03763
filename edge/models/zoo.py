"""Model names -> timm ``VisionTransformer`` instances.

A model spec is one of

* a bundled name, e.g. ``fmnist-deit-tiny`` (weights shipped in the package),
* ``timm:NAME`` for any timm ViT architecture, optionally with constructor options,
  e.g. ``timm:vit_small_patch16_224,class_token=False,global_pool=avg`` (a size as
  ``img_size=224x320``).

Weights are random unless ``weights=FILE`` is given (pretrained hub weights cannot be
downloaded from inside edge; download them yourself and pass the file).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from edge._compat import ensure_torchvision_importable
from edge.data.fmnist import MEAN as FMNIST_MEAN
from edge.data.fmnist import MINI_NAME as FMNIST_MINI
from edge.data.fmnist import NAME as FMNIST
from edge.data.fmnist import STD as FMNIST_STD
from edge.errors import EdgeError
from edge.models.img_size import ImgSize, parse_img_size
from edge.models.weights_io import load_weights, read_state_dict

WEIGHTS_DIR = Path(__file__).with_name("weights")


@dataclass(frozen=True)
class Bundled:
    """A model shipped with edge: a timm architecture, its options, weights and model card."""

    name: str
    arch: str
    kwargs: dict
    data_config: dict
    description: str
    data: str                      # the data set it was trained on: every verb's images when --data is not given
    check_data: str                # the smaller set of the same images its graphs are gated and checked on
    made_by: str = "train them with the command in the model card"   # the fix when the weights are missing

    @property
    def weights(self) -> Path:
        return WEIGHTS_DIR / f"{self.name}.safetensors"

    @property
    def card(self) -> Path:
        return WEIGHTS_DIR / f"{self.name}.json"


# the reference network's geometry and input, shared by the bundled models made from it
FMNIST_DEIT_TINY = dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=192, depth=12,
                        num_heads=3, mlp_ratio=4.0)
FMNIST_DATA_CONFIG = dict(input_size=(1, 28, 28), mean=FMNIST_MEAN, std=FMNIST_STD, interpolation="bilinear",
                          crop_pct=1.0)

BUNDLED: dict[str, Bundled] = {
    "fmnist-deit-tiny": Bundled(
        name="fmnist-deit-tiny",
        arch="deit_tiny_patch16_224",
        kwargs=FMNIST_DEIT_TINY,
        data_config=FMNIST_DATA_CONFIG,
        description="DeiT-Tiny geometry (embed 192, depth 12, heads 3) on 28x28 Fashion-MNIST, patch 4",
        data=FMNIST,
        check_data=FMNIST_MINI,
    ),
    # made by scripts/make_outlier_model.py (recipe: edge/train/outliers.py; docs/outlier-model.md)
    "fmnist-deit-tiny-outliers": Bundled(
        name="fmnist-deit-tiny-outliers",
        arch="deit_tiny_patch16_224",
        kwargs=FMNIST_DEIT_TINY,
        data_config=FMNIST_DATA_CONFIG,
        description="fmnist-deit-tiny with the activation outliers of pretrained ViTs (massive residual "
                    "channels, high-norm tokens, post-LayerNorm channel spread)",
        data=FMNIST,
        check_data=FMNIST_MINI,
        made_by="make them with scripts/make_outlier_model.py (docs/outlier-model.md) and copy model.safetensors "
                "and card.json to edge/models/weights/fmnist-deit-tiny-outliers.{safetensors,json}",
    ),
}


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model name: which architecture, with which constructor options."""

    text: str
    arch: str
    kwargs: dict = field(default_factory=dict)
    bundled: Bundled | None = None


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _timm_vit_names() -> list[str]:
    ensure_torchvision_importable()
    import timm

    return [n for n in timm.list_models() if n.startswith(("vit_", "deit", "eva", "flexivit", "samvit"))]


def _unknown(name: str) -> EdgeError:
    candidates = list(BUNDLED) + [f"timm:{n}" for n in _timm_vit_names()]
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.5)
    if not close and not name.startswith("timm:"):
        close = difflib.get_close_matches(f"timm:{name}", candidates, n=5, cutoff=0.5)
    return EdgeError(f"unknown model {name!r}",
                     expected=f"a bundled model ({', '.join(BUNDLED)}) or timm:ARCH with a timm ViT architecture",
                     found=f"closest names: {', '.join(close)}" if close else "no close name",
                     fix="run `edge models` to list names")


def parse_model_spec(text: str) -> ModelSpec:
    """Parse ``fmnist-deit-tiny`` or ``timm:ARCH[,key=value...]``."""
    head, *options = [part.strip() for part in text.split(",")]
    kwargs = {}
    for option in options:
        if "=" not in option:
            raise EdgeError(f"model option {option!r} in {text!r} is not key=value",
                            expected="timm:ARCH,key=value,... e.g. timm:vit_small_patch16_224,class_token=False")
        key, value = option.split("=", 1)
        kwargs[key.strip()] = _parse_value(value.strip())
    if "img_size" in kwargs:
        try:
            kwargs["img_size"] = parse_img_size(kwargs["img_size"])
        except EdgeError as e:
            raise e.at(f"model option img_size in {text!r}") from e
    if head in BUNDLED:
        bundled = BUNDLED[head]
        return ModelSpec(text, bundled.arch, {**bundled.kwargs, **kwargs}, bundled)
    if head.startswith("timm:"):
        arch = head[len("timm:"):]
        if arch not in _timm_vit_names():
            raise _unknown(head)
        return ModelSpec(text, arch, kwargs)
    raise _unknown(head)


def create_model(spec: str | ModelSpec, *, weights: str | Path | None = None,
                 img_size: ImgSize | str | list[int] | None = None,
                 num_classes: int | None = None, pretrained_weights: bool = True) -> nn.Module:
    """Build the model a spec names, in eval mode, with bundled, given or random weights.

    ``pretrained_weights=False`` skips the bundled weights (random init, used by ``edge train``).
    ``img_size`` (as the ``img_size=`` model option): N, ``"HxW"`` or ``(H, W)``, see :func:`parse_img_size`.
    Names only: :func:`edge.compress.load.load_model` also accepts a folder written by ``edge compress``.
    """
    if isinstance(spec, str):
        spec = parse_model_spec(spec)
    ensure_torchvision_importable()
    import timm
    from timm.models.vision_transformer import VisionTransformer

    kwargs = dict(spec.kwargs)
    if img_size is not None:
        kwargs["img_size"] = parse_img_size(img_size)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    if spec.bundled is not None:
        kwargs["pretrained_cfg_overlay"] = dict(spec.bundled.data_config, num_classes=kwargs["num_classes"])
    try:
        model = timm.create_model(spec.arch, pretrained=False, **kwargs)
    except TypeError as e:
        raise EdgeError(f"model {spec.text!r} does not accept these options", found=str(e),
                        fix="check the option names against timm's VisionTransformer arguments") from e
    if not isinstance(model, VisionTransformer):
        raise EdgeError(f"model {spec.text!r} is a {type(model).__name__}",
                        expected="a timm VisionTransformer (ViT, DeiT, DeiT-III, DINOv2, CLIP-ViT...)")
    if weights is not None:
        load_weights(model, read_state_dict(weights), str(weights), convert=True)
    elif spec.bundled is not None and pretrained_weights:
        if not spec.bundled.weights.is_file():
            raise EdgeError(f"the bundled weights of {spec.bundled.name} are missing ({spec.bundled.weights})",
                            fix=f"reinstall edge, or {spec.bundled.made_by}")
        load_weights(model, read_state_dict(spec.bundled.weights), spec.bundled.name)
    model.eval()
    return model


def data_config(model: nn.Module) -> dict:
    """timm's resolved data config of a model (input size, mean/std, interpolation, crop).

    The input size is the one the model was built for (``--img-size``), which can differ from
    the size in its pretrained config (DINOv2 defaults to 518).
    """
    ensure_torchvision_importable()
    from timm.data import resolve_data_config

    config = resolve_data_config({}, model=model)
    patch_embed = model.patch_embed
    size = patch_embed.img_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    config["input_size"] = (int(patch_embed.proj.in_channels), int(size[0]), int(size[1]))
    return config


def model_card(name: str) -> dict | None:
    bundled = BUNDLED.get(name)
    if bundled is None or not bundled.card.is_file():
        return None
    return json.loads(bundled.card.read_text())


def bundled_source(model: str | Path | None, depth: int = 0) -> Bundled | None:
    """The bundled model that ``model`` is or was made from: a bundled name (with options), an artifact folder
    of ``edge compress`` / ``edge finetune`` (its recorded source), or a graph of ``edge export`` (its
    ``edge.source_model``); None for every other model (the user's own)."""
    if model is None or depth > 8:
        return None
    text = str(model)
    head = text.split(",")[0].strip()
    if head in BUNDLED:
        return BUNDLED[head]
    path = Path(text).expanduser()
    source = None
    if path.is_dir() and (path / "edge-model.json").is_file():   # edge.compress.artifact.MANIFEST
        try:
            source = json.loads((path / "edge-model.json").read_text())["source"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    elif path.suffix == ".onnx" and path.is_file():
        import onnx

        from edge.onnx_metadata import SOURCE_MODEL, metadata_of

        try:
            source = metadata_of(onnx.load(str(path), load_external_data=False)).get(SOURCE_MODEL)
        except Exception:  # noqa: BLE001 - an unreadable graph is reported by the verb that reads it
            return None
    return bundled_source(source, depth + 1) if source else None


def data_for(given: str | None, model: str | Path | None, flag: str = "--data", check: bool = False,
             fix_also: str = "") -> str:
    """The images a verb reads: ``given`` if set, else (a bundled model, or one made from it) the data set it was
    trained on (``check``: the smaller set its graphs are checked on); an EdgeError naming ``flag`` for any other
    model: edge has no images of its own for it and never guesses."""
    if given:
        return given
    bundled = bundled_source(model)
    if bundled is not None:
        return bundled.check_data if check else bundled.data
    raise EdgeError(f"{flag} is needed for {model}: it is not a model bundled with edge, so edge has no images of "
                    "its own for it", expected="your images: a folder with train/ and val/ (or test/), one "
                                               "sub-folder per class, e.g. ~/images/train/cat/1.jpg",
                    fix=" ".join(filter(None, (f"pass {flag} DIR", fix_also, "(docs/your-own-model.md)"))))
