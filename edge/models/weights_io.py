"""Load and save weights safely: safetensors, or torch files read with ``weights_only=True``."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from edge.errors import EdgeError
from edge.fileio import replace_atomic


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or a weights-only torch file; never unpickle objects."""
    path = Path(path)
    if not path.is_file():
        raise EdgeError(f"weights file {path} does not exist", fix="check the --weights path")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise EdgeError(f"weights file {path} is not a readable safetensors file", found=str(e),
                            fix="re-export the weights, or pass a .pt/.pth state dict") from e
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
    for key in ("state_dict", "model", "model_state_dict", "state_dict_ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise EdgeError(f"weights file {path} is not a state dict", expected="a mapping of names to tensors",
                        found=type(obj).__name__)
    return obj


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``state`` into ``model`` exactly: same names, same shapes, or a message naming the first mismatch."""
    own = model.state_dict()
    for name, tensor in own.items():
        if name not in state:
            raise EdgeError(f"weights {source} do not match the architecture: tensor {name!r} is missing",
                            expected=f"{name} with shape {tuple(tensor.shape)}",
                            fix="pass weights saved from the same architecture (and --img-size / model options)")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise EdgeError(f"weights {source} do not match the architecture at tensor {name!r}",
                            expected=f"shape {tuple(tensor.shape)}", found=f"shape {tuple(state[name].shape)}",
                            fix="pass weights saved from the same architecture (and --img-size / model options)")
    extra = sorted(set(state) - set(own))
    if extra:
        raise EdgeError(f"weights {source} do not match the architecture: unexpected tensor {extra[0]!r}"
                        + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""),
                        fix="pass weights saved from the same architecture")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(state[name].to(tensor.dtype))


def save_safetensors(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (temporary file, then rename)."""
    from safetensors.torch import save_file

    replace_atomic(path, lambda tmp: save_file({k: v.contiguous() for k, v in state.items()}, tmp, metadata=metadata))
