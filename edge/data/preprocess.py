"""Turn stored images into what a model expects, from the model's own timm data config."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class InputSpec:
    """The input a model expects: ``(C, H, W)`` and per-channel mean/std (timm's data config)."""

    channels: int
    height: int
    width: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    crop_pct: float = 1.0

    @classmethod
    def from_data_config(cls, config: dict) -> InputSpec:
        c, h, w = config["input_size"]
        return cls(int(c), int(h), int(w), tuple(float(m) for m in config["mean"]),
                   tuple(float(s) for s in config["std"]), str(config.get("interpolation", "bilinear")),
                   float(config.get("crop_pct") or 1.0))

    def normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Mean and std per input channel: RGB statistics on a one-channel model are averaged (a timm
        architecture built with ``in_chans=1`` keeps ImageNet's three-channel mean and std)."""
        if self.channels == 1 and len(self.mean) != 1:
            return (sum(self.mean) / len(self.mean),), (sum(self.std) / len(self.std),)
        return self.mean, self.std

    def as_dict(self) -> dict:
        return {"input_size": [self.channels, self.height, self.width], "mean": list(self.mean),
                "std": list(self.std), "interpolation": self.interpolation, "crop_pct": self.crop_pct}


class ArrayPreprocess:
    """uint8 ``[N,H,W]`` or ``[N,C,H,W]`` -> normalised float ``[N,C',H',W']`` for the model.

    Gray images are repeated to the model's channel count; images are resized (bilinear or
    bicubic as the config says) when the model's size differs. Fashion-MNIST into a 224x224
    RGB ImageNet ViT therefore works with the model's own mean and std.
    """

    def __init__(self, spec: InputSpec) -> None:
        self.spec = spec
        channels = spec.channels
        mean, std = (torch.tensor(v, dtype=torch.float32) for v in spec.normalisation())
        self.mean = mean.expand(channels).reshape(1, channels, 1, 1).clone()
        self.std = std.expand(channels).reshape(1, channels, 1, 1).clone()

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(torch.float32).div_(255.0)
        if x.ndim == 3:
            x = x.unsqueeze(1)
        size = (self.spec.height, self.spec.width)
        if tuple(x.shape[-2:]) != size:
            mode = "bicubic" if self.spec.interpolation == "bicubic" else "bilinear"
            x = F.interpolate(x, size=size, mode=mode, align_corners=False)
        if x.shape[1] != self.spec.channels:
            if x.shape[1] != 1:
                raise ValueError(f"cannot map {x.shape[1]}-channel images to a {self.spec.channels}-channel model")
            x = x.expand(-1, self.spec.channels, -1, -1)
        return (x - self.mean) / self.std
