"""What later steps need to know about a ViT, read from the model in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn


@dataclass(frozen=True)
class ModelInfo:
    """Geometry of a timm ``VisionTransformer`` (read from the modules, not from names)."""

    num_blocks: int
    num_prefix_tokens: int      # class token + register tokens
    has_class_token: bool
    num_reg_tokens: int
    grid: tuple[int, int]       # patch grid (rows, cols); non-square grids are allowed
    embed_dim: int
    num_heads: tuple[int, ...]  # per block (a compressed block may have fewer)
    img_size: tuple[int, int]
    patch_size: tuple[int, int]
    in_chans: int
    num_classes: int
    global_pool: str
    params: int

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_patches + self.num_prefix_tokens

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(num_patches=self.num_patches, num_tokens=self.num_tokens)
        return d


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    return (int(value[0]), int(value[1]))


def model_info(model: nn.Module) -> ModelInfo:
    patch_embed = model.patch_embed
    heads = tuple(int(getattr(getattr(block, "attn", None), "num_heads", 0) or 0) for block in model.blocks)
    return ModelInfo(
        num_blocks=len(model.blocks),
        num_prefix_tokens=int(model.num_prefix_tokens),
        has_class_token=bool(model.has_class_token),
        num_reg_tokens=int(getattr(model, "num_reg_tokens", 0)),
        grid=_pair(patch_embed.grid_size),
        embed_dim=int(model.embed_dim),
        num_heads=heads,
        img_size=_pair(patch_embed.img_size),
        patch_size=_pair(patch_embed.patch_size),
        in_chans=int(patch_embed.proj.in_channels),
        num_classes=int(model.num_classes),
        global_pool=str(model.global_pool),
        params=sum(p.numel() for p in model.parameters()),
    )


def original_block_indices(blocks: nn.Sequential) -> list[tuple[int, ...]]:
    """For each entry of a (possibly compressed) ``model.blocks``: the original blocks it stands for.

    A module that stands for several original blocks names them in ``replaced`` (a compression
    method's span); a kept block carries ``edge_original_index`` once blocks before it were replaced.
    """
    out, next_index = [], 0
    for module in blocks:
        replaced = getattr(module, "replaced", None)
        if replaced is not None:
            out.append(tuple(replaced))
            next_index = replaced[-1] + 1
        else:
            index = getattr(module, "edge_original_index", next_index)
            out.append((index,))
            next_index = index + 1
    return out
