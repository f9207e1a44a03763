"""Torch-Pruning, its timm ViT example's configuration, as plan_peers runs it (the pinned version, found lazily).

Torch-Pruning is not a dependency of edge: ``scripts/peers-venv.sh`` installs the pinned version into
``.venv-peers-site/`` and only this process puts that folder on ``sys.path``, when it prunes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from edge.errors import EdgeError
from edge.models import data_config

ROOT = Path(__file__).resolve().parents[1]
TORCH_PRUNING = "1.6.1"
PEERS_SITE = Path(os.environ.get("EDGE_PEERS_SITE", ROOT / ".venv-peers-site"))
SETUP = "bash scripts/peers-venv.sh"
ROUND_TO = 8
TAYLOR_BATCH = 64   # the example's --train_batch_size


def import_torch_pruning(site: Path = PEERS_SITE):
    """``torch_pruning`` from ``site`` (or wherever it is installed), the pinned version, or an EdgeError."""
    if site.is_dir() and str(site) not in sys.path:
        sys.path.append(str(site))
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    try:
        import torch_pruning
    except ImportError as e:
        raise EdgeError(f"Torch-Pruning is not installed (looked in {site} and the environment)",
                        expected=f"torch-pruning=={TORCH_PRUNING} in {site}",
                        fix=f"run `{SETUP}` (pip --target, nothing goes into .venv)") from e
    from importlib import metadata

    try:   # the installed distribution's version (1.6.1's own __version__ still says 1.6.0)
        version = metadata.version("torch-pruning")
    except metadata.PackageNotFoundError:
        version = getattr(torch_pruning, "__version__", "unknown")
    if version != TORCH_PRUNING:
        raise EdgeError(f"Torch-Pruning {version} is installed", expected=f"version {TORCH_PRUNING}",
                        fix=f"run `{SETUP}`")
    return torch_pruning


@dataclass(frozen=True)
class PruneConfig:
    """Torch-Pruning's timm ViT example, as this benchmark runs it (see the module docstring)."""

    ratio: float
    global_pruning: bool
    data: str = "fmnist"
    taylor_batches: int = 10
    seed: int = 0
    round_to: int = ROUND_TO


def taylor_batches(data: str, batches: int, seed: int, spec_config: dict):
    """``batches`` seeded, class-balanced training batches of 64, preprocessed as the model takes them."""
    from edge.data import calibration_set
    from edge.data.preprocess import ArrayPreprocess, InputSpec

    images = calibration_set(data, batches * TAYLOR_BATCH, seed)
    return list(images.batches(TAYLOR_BATCH, ArrayPreprocess(InputSpec.from_data_config(spec_config))))


def prune(model: nn.Module, config: PruneConfig, batches: list | None = None) -> tuple[nn.Module, dict]:
    """``model`` (a timm ViT) pruned in place by Torch-Pruning; returns it and a record of its widths."""
    tp = import_torch_pruning()
    if not 0 <= config.ratio < 1:
        raise EdgeError(f"pruning ratio {config.ratio}", expected="a ratio in [0, 1)")
    spec = data_config(model)
    batches = batches if batches is not None else taylor_batches(config.data, config.taylor_batches, config.seed, spec)
    example = torch.zeros(1, *spec["input_size"])
    heads = {block.attn.qkv: block.attn.num_heads for block in model.blocks}
    model.eval()
    pruner = tp.pruner.MetaPruner(model, example, importance=tp.importance.GroupTaylorImportance(),
                                  global_pruning=config.global_pruning, pruning_ratio=config.ratio,
                                  ignored_layers=[model.head], num_heads=heads, prune_num_heads=False,
                                  prune_head_dims=True, round_to=config.round_to)
    model.zero_grad()
    for x, y in batches:
        nn.functional.cross_entropy(model(x), y).backward()
    pruner.step()
    model.zero_grad(set_to_none=True)
    set_pruned_metadata(model, {block.attn.qkv: pruner.num_heads[block.attn.qkv] for block in model.blocks})
    return model, {"config": asdict(config), "widths": widths(model), "params": sum(p.numel() for p in
                                                                                  model.parameters())}


def set_pruned_metadata(model: nn.Module, num_heads: dict) -> None:
    """Make every attention's and the model's width attributes true to the pruned weights (and check them)."""
    embed = model.patch_embed.proj.out_channels
    for name in ("embed_dim", "num_features", "head_hidden_size"):
        if hasattr(model, name):
            setattr(model, name, embed)
    for i, block in enumerate(model.blocks):
        attn = block.attn
        heads = int(num_heads[attn.qkv])
        if attn.qkv.out_features % (3 * heads):
            raise RuntimeError(f"block {i}: qkv width {attn.qkv.out_features} is not 3 x {heads} heads")
        attn.num_heads, attn.head_dim = heads, attn.qkv.out_features // (3 * heads)
        attn.attn_dim = heads * attn.head_dim
        attn.scale = attn.head_dim ** -0.5
        assert attn.proj.in_features == attn.attn_dim and attn.qkv.in_features == embed, f"block {i}"


def widths(model: nn.Module) -> dict:
    """The embedding width and, per block, the attention's heads x head dim and the MLP's hidden width."""
    return {"embed": int(model.patch_embed.proj.out_channels),
            "blocks": [{"heads": int(b.attn.num_heads), "head_dim": int(b.attn.head_dim),
                        "mlp": int(b.mlp.fc1.out_features)} for b in model.blocks]}


def widths_text(w: dict) -> str:
    heads = sorted({b["heads"] * b["head_dim"] for b in w["blocks"]})
    mlps = sorted({b["mlp"] for b in w["blocks"]})
    span = lambda v: str(v[0]) if len(v) == 1 else f"{v[0]}-{v[-1]}"  # noqa: E731
    return f"embed {w['embed']}, attn {span(heads)}, MLP {span(mlps)}"
