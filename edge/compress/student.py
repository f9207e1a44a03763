"""What a fine-tune distils into: a compressed artifact, a model spec with a weights file, or a user's module.

Each becomes a :class:`Student`: the module to train and the manifest the result is saved with, so
that one recipe (:func:`edge.compress.finetune.finetune`) serves all three:

* an artifact folder of ``edge compress`` (or of an earlier fine-tune): its plan and modules are kept,
  its default teacher is its source model;
* a model spec edge knows (``fmnist-deit-tiny``, ``timm:ARCH[,key=value...]``) with ``weights`` (a
  student pruned or changed by another tool, saved as a state dict): the architecture the spec builds
  must have exactly the weights' shapes (else the error says what the weights hold and how to name
  it). A uniformly narrower model is named with model options (``fmnist-deit-tiny,embed_dim=144``,
  ``timm:vit_small_patch16_224,embed_dim=288``); per-block widths no spec can express go through the
  Python entry point. The default teacher is the bundled model the spec names, as shipped;
* a ``torch.nn.Module`` built by the user's code (:func:`module_student`): the artifact holds its
  weights and names its class; edge cannot rebuild it, so restoring it is the user's (rebuild the
  module, load ``model.safetensors``), and ``load_artifact`` refuses it with that fix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edge.check.accuracy import head_mismatch
from edge.compress.artifact import WEIGHTS, is_artifact, load_artifact, source_state_sha256
from edge.compress.load import load_model
from edge.errors import EdgeError
from edge.fileio import sha256_file
from edge.models import ImgSize, data_config, parse_model_spec
from edge.models.weights_io import load_weights, read_state_dict

ENTRY_POINT = "edge.compress.finetune.distil"


@dataclass
class Student:
    """A model to distil into, with what its fine-tuned artifact is saved with."""

    model: nn.Module
    manifest: dict               # plan steps, source, origin; the artifact's manifest for an artifact
    where: str                   # how logs and errors name it
    sha256: str                  # of its starting weights: a checkpoint of another student is refused
    record: dict                 # the fine-tune record's "student" entry (sha256 added there)
    data_config: dict | None     # its preprocessing (timm data config); None: the teacher's
    folder: Path | None = None   # the artifact folder it was read from

    @property
    def kind(self) -> str:
        return str((self.manifest.get("origin") or {}).get("kind", "artifact"))


def load_student(spec: str | Path, *, weights: str | Path | None = None,
                 img_size: ImgSize | None = None) -> Student:
    """The student ``spec`` names: an artifact folder, or a model spec (with ``weights``)."""
    if Path(spec).exists() and is_artifact(spec):
        if weights is not None or img_size is not None:
            raise EdgeError(f"{spec} is a compressed model; --weights and --img-size do not apply to it",
                            fix="drop --weights / --img-size (the artifact holds its weights and input size)")
        folder = Path(spec).parent if Path(spec).is_file() else Path(spec)
        model, manifest = load_artifact(folder)
        return Student(model, manifest, str(folder), sha256_file(folder / WEIGHTS),
                       {"artifact": str(folder), "plan": manifest.get("plan")}, data_config(model), folder)
    return _spec_student(str(spec), weights, img_size)


def _spec_student(text: str, weights: str | Path | None, img_size: ImgSize | None) -> Student:
    model = load_model(text, img_size=img_size, pretrained_weights=weights is None)  # a path is refused there
    bundled = parse_model_spec(text).bundled
    if weights is None and bundled is None:
        raise EdgeError(f"the student {text} has no weights (it would be randomly initialised)",
                        expected="a bundled model, an artifact folder, or a timm architecture with --weights",
                        fix="pass --weights with the student's weights (distilling into a random ViT is training "
                            "from scratch: `edge train`)")
    if weights is not None:
        state = read_state_dict(weights)
        try:
            load_weights(model, state, str(weights), convert=True)
        except EdgeError as e:
            raise EdgeError(f"the student {e.what}", expected=e.expected,
                            found=f"{e.found + '; ' if e.found else ''}{widths(state)}",
                            fix=narrower_fix(text, state)) from e
    reference = {"model": text, "weights": None if weights is None else str(weights), "img_size": img_size}
    manifest: dict = {"origin": {"kind": "model", "model": text, "weights": reference["weights"]},
                "source": reference, "plan": None, "steps": [],
                # unless a teacher is given, distil from the model the spec names: a bundled model as shipped
                # (without options that change its shapes), a timm architecture with --teacher-weights
                "teacher": {"model": bundled.name if bundled else text, "weights": None, "img_size": img_size}}
    name = text if weights is None else f"{text} with {weights}"
    return Student(model, manifest, name, source_state_sha256(model),
                   {"model": text, "weights": reference["weights"]}, data_config(model))


def module_student(module: nn.Module, *, name: str | None = None, data_config: dict | None = None) -> Student:
    """A student built by the user's code. Its input size and normalisation come from ``data_config``, else
    from the module itself where it is a timm ViT, else from the teacher."""
    if not isinstance(module, nn.Module):
        raise EdgeError(f"the student is a {type(module).__name__}, not a torch.nn.Module",
                        fix=f"pass the model itself to {ENTRY_POINT}(model, ...)")
    cls = f"{type(module).__module__}.{type(module).__qualname__}"
    config = data_config if data_config is not None else own_data_config(module)
    manifest: dict = {"origin": {"kind": "module", "class": cls, "name": name or cls}, "plan": None, "steps": [],
                "source": None}
    return Student(module, manifest, f"{name or cls} (a Python module)", source_state_sha256(module),
                   {"module": cls, "name": name or cls}, config)


def own_data_config(module: nn.Module) -> dict | None:
    """A timm ViT's data config (a user's pruned timm model keeps its patch embedding and pretrained_cfg)."""
    embed = getattr(module, "patch_embed", None)
    if getattr(module, "pretrained_cfg", None) is None or not hasattr(getattr(embed, "proj", None), "in_channels"):
        return None
    return data_config(module)


def check_classifier(model: nn.Module, input_size: tuple[int, ...], num_classes: int, data: str, *,
                     role: str, where: str, device: torch.device) -> None:
    """Refuse a model that cannot take the data's inputs or does not score its ``num_classes`` classes."""
    x = torch.zeros(2, *input_size, device=device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise EdgeError(f"the {role} {where} cannot run on the inputs of {data}",
                        expected=f"a classifier of float tensors [N, {', '.join(map(str, input_size))}]",
                        found=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                        fix="give the model the data's input size and channels (or pass data_config to "
                            f"{ENTRY_POINT} where the module's differs from the teacher's)") from e
    finally:
        model.train(training)
    mismatch = head_mismatch(tuple(out.shape), num_classes, data) if isinstance(out, torch.Tensor) else \
        f"output is a {type(out).__name__}, not a tensor of class scores"
    if mismatch:
        raise EdgeError(f"the {role} {where} is not a classifier of {data}: its {mismatch}",
                        expected=f"logits of shape [N, {num_classes}]",
                        fix=f"give it a head of {num_classes} classes (timm: model.reset_classifier({num_classes})) "
                            "and train it on the data, or distil on data of its own classes")


# ---------------------------------------------------------------------------- weights of another shape

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def _block_widths(state: dict[str, torch.Tensor]) -> tuple[int | None, list[int], list[int], int]:
    """Embedding width, per-block qkv and MLP hidden widths, and depth of a ViT state dict."""
    embed = state.get("patch_embed.proj.weight")
    depth = 1 + max((int(m.group(1)) for k in state if (m := _BLOCK.match(k))), default=-1)
    qkv = [int(state[k].shape[0]) for i in range(depth) if (k := f"blocks.{i}.attn.qkv.weight") in state]
    mlp = [int(state[k].shape[0]) for i in range(depth) if (k := f"blocks.{i}.mlp.fc1.weight") in state]
    return (None if embed is None else int(embed.shape[0])), qkv, mlp, depth


def widths(state: dict[str, torch.Tensor]) -> str:
    """What the weights hold, in the terms of a ViT's options."""
    embed, qkv, mlp, depth = _block_widths(state)
    if embed is None:
        return "the weights are not a timm ViT's (no patch_embed.proj.weight)"

    def show(values: list[int]) -> str:
        return str(values[0]) if len(set(values)) == 1 else "per block " + "/".join(map(str, values))
    return (f"the weights hold embed width {embed}, depth {depth}"
            + (f", qkv width {show(qkv)}" if qkv else "") + (f", MLP width {show(mlp)}" if mlp else ""))


def _mlp_ratio(embed: int, hidden: int) -> str | None:
    """An ``mlp_ratio`` text with ``int(embed * ratio) == hidden`` (timm's rounding), or None."""
    ratio = hidden / embed
    for text in (f"{ratio:g}", repr(ratio), repr(math.nextafter(ratio, math.inf))):
        if int(embed * float(text)) == hidden:
            return text
    return None


def narrower_fix(spec: str, state: dict[str, torch.Tensor]) -> str:
    """How to name the architecture of these weights, or why no spec can (then the Python entry point)."""
    embed, qkv, mlp, depth = _block_widths(state)
    entry = (f"build the model in Python (e.g. the pruning tool's own module) and distil it with "
             f"{ENTRY_POINT}(model, teacher=..., out=...)")
    uniform = bool(embed and qkv and mlp and len(set(qkv)) == 1 and len(set(mlp)) == 1 and qkv[0] == 3 * embed)
    ratio = _mlp_ratio(embed, mlp[0]) if uniform and embed else None
    if ratio is None:
        why = " (they differ between blocks, or the attention width is not the embedding width)" if qkv else ""
        return f"no model option names these widths{why}; {entry}"
    return (f"name the narrower architecture with model options (later ones replace earlier ones), e.g. "
            f"{spec},embed_dim={embed},depth={depth},mlp_ratio={ratio} and a num_heads that divides {embed}; "
            f"or {entry}")


__all__ = ["ENTRY_POINT", "Student", "check_classifier", "load_student", "module_student", "narrower_fix",
           "own_data_config", "widths"]
