"""Load and save weights safely: safetensors, or torch files read with ``weights_only=True``.

Weights as users have them: a ``.safetensors`` file, a torch file holding a state dict (alone, or under
``state_dict``, ``model``, ``model_state_dict``, ``state_dict_ema`` or ``model_ema``), with every name under a
wrapper's ``module.`` (DistributedDataParallel) or ``model.`` (Lightning and others) prefix, or a hub snapshot
folder holding ``model.safetensors`` or ``pytorch_model.bin``. A timm ViT's checkpoint then goes through timm's
own ``checkpoint_filter_fn`` (position embeddings resampled to the model's grid when ``--img-size`` differs,
other layouts of timm's models converted) before the exact load, whose error lists every missing and
unexpected name.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from edge.errors import EdgeError
from edge.fileio import replace_atomic

#: What a hub snapshot folder holds, in the order they are looked for.
SNAPSHOT_FILES = ("model.safetensors", "pytorch_model.bin")
#: Keys a training checkpoint keeps its weights under, in the order they are looked for.
CHECKPOINT_KEYS = ("state_dict", "model", "model_state_dict", "state_dict_ema", "model_ema")
#: Prefixes a wrapper puts before every name.
WRAPPER_PREFIXES = ("module.", "model.")
SHOWN = 6   # names listed in an error, then "and N more"


def _file_of(path: Path) -> Path:
    """``path``, or the weights file inside a hub snapshot folder."""
    if not path.is_dir():
        return path
    for name in SNAPSHOT_FILES:
        if (path / name).is_file():
            return path / name
    raise EdgeError(f"weights folder {path} holds no weights file", expected=" or ".join(SNAPSHOT_FILES) +
                    " (a hub snapshot)", fix="pass the weights file itself with --weights FILE")


def _unwrapped(obj, path: Path):
    """The state dict inside a training checkpoint (``{"state_dict": {...}, "epoch": ...}``)."""
    if isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        for key in CHECKPOINT_KEYS:
            if isinstance(obj.get(key), dict):
                return obj[key]
        raise EdgeError(f"weights file {path} is a checkpoint without a state dict edge knows",
                        expected=f"tensors by name, or under one of: {', '.join(CHECKPOINT_KEYS)}",
                        found=f"keys {', '.join(sorted(map(str, obj))[:SHOWN])}",
                        fix="save the model's state_dict() alone (torch.save or safetensors)")
    return obj


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors``, a weights-only torch file or a hub snapshot folder; never unpickle
    objects. A file that is no weights file at all is refused naming it (exit 2), whatever the reader raised."""
    path = Path(path)
    if not path.exists():
        raise EdgeError(f"weights file {path} does not exist", fix="check the --weights path")
    path = _file_of(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise EdgeError(f"weights file {path} is not a readable safetensors file", found=str(e),
                            fix="re-export the weights, or pass a .pt/.pth state dict") from e
    with open(path, "rb") as f:
        head = f.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):   # torch.save's zip, or a pickle (protocol 2+)
        raise _not_weights(path, ValueError(f"it starts with {head!r}, not a zip archive or a pickle"))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise EdgeError(f"weights file {path} holds pickled Python objects, which edge refuses to load",
                        expected="a safetensors file, or a torch file holding only tensors (a state dict)",
                        found=str(e).splitlines()[0][:300],
                        fix="in a trusted environment, re-save it with torch.save(model.state_dict(), ...) or "
                            "safetensors.torch.save_file(...)") from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise EdgeError(f"weights file {path} is corrupt or not a torch file", found=str(e)[:300],
                        fix="check the file, or re-save the state dict") from e
    except Exception as e:  # noqa: BLE001 - torch's unpickler raises IndexError, KeyError, ... on other files
        raise _not_weights(path, e) from e
    obj = _unwrapped(obj, path)
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise EdgeError(f"weights file {path} is not a state dict", expected="a mapping of names to tensors",
                        found=type(obj).__name__)
    return obj


def _not_weights(path: Path, error: BaseException) -> EdgeError:
    return EdgeError(f"weights file {path} is not a weights file edge can read",
                     expected="a .safetensors file, a torch file holding a state dict, or a hub snapshot folder",
                     found=f"{type(error).__name__}: {str(error)[:200]}",
                     fix="pass the model's weights (e.g. model.safetensors or pytorch_model.bin)")


def _without_wrapper(state: dict[str, torch.Tensor], own: set[str]) -> dict[str, torch.Tensor]:
    """``state`` with a wrapper's prefix taken off every name, when every name has it and the model's have not."""
    for prefix in WRAPPER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in own):
            return {k[len(prefix):]: v for k, v in state.items()}
    return state


def _timm_filtered(model: nn.Module, own: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                   source: str) -> dict[str, torch.Tensor]:
    """timm's own conversion of a ViT checkpoint for ``model`` (its state ``own``: position embeddings resampled
    to its grid, other layouts of timm's ViTs); ``state`` itself for any other module, or when it already fits."""
    from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

    if not isinstance(model, VisionTransformer) or all(k in own and tuple(v.shape) == tuple(own[k].shape)
                                                       for k, v in state.items()):
        return state
    try:
        return checkpoint_filter_fn(dict(state), model)
    except Exception as e:  # noqa: BLE001 - timm's conversions raise whatever a foreign layout makes them
        raise EdgeError(f"weights {source} do not fit {type(model).__name__} and timm could not convert them",
                        found=f"{type(e).__name__}: {str(e)[:200]}",
                        fix="pass weights saved from the same architecture (and --img-size / model options)") from e


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) if "'" not in n else n for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str, convert: bool = False) -> None:
    """Copy ``state`` into ``model`` exactly: same names, same shapes, or a message listing every missing and
    unexpected name and the first shape that differs. ``convert`` (a user's file): first take off a wrapper's
    prefix and let timm convert a ViT checkpoint (:func:`_timm_filtered`)."""
    own = model.state_dict()
    if convert:
        state = _timm_filtered(model, own, _without_wrapper(state, set(own)), source)
    missing = [name for name in own if name not in state]
    extra = sorted(set(state) - set(own))
    shapes = [f"{name!r}: {tuple(state[name].shape)} where the model has {tuple(t.shape)}" for name, t in own.items()
              if name in state and tuple(state[name].shape) != tuple(t.shape)]
    if missing or extra or shapes:
        parts = (f"missing {len(missing)}: {_names(missing)}" if missing else "",
                 f"unexpected {len(extra)}: {_names(extra)}" if extra else "",
                 f"other shapes {len(shapes)}: {_names(shapes)}" if shapes else "")
        found = "; ".join(part for part in parts if part)
        raise EdgeError(f"weights {source} do not match the architecture", expected="the model's tensor names and "
                        "shapes", found=found, fix="pass weights saved from the same architecture (and --img-size, "
                                                   "num_classes= or other model options as they were saved)")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(state[name].to(tensor.dtype))


def save_safetensors(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (temporary file, then rename)."""
    from safetensors.torch import save_file

    replace_atomic(path, lambda tmp: save_file({k: v.contiguous() for k, v in state.items()}, tmp, metadata=metadata))
