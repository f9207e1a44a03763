"""Dilution learning (Eq. 9 of mlp-only-nose-dilution): an attention sub-layer faded out during distillation.

During the fine-tune each MLP-only block of the student (:class:`~edge.compress.methods.attnrm.module.MLPOnlyBlock`)
is replaced at ``blocks[i]`` by a :class:`DilutedBlock` that holds a copy of the ORIGINAL block's
attention (``norm1``, ``attn``, ``ls1``, taken from the teacher) next to the student's own MLP
half, and computes

    x = M * ls1(attn(norm1(x))) + (2 - M) * x
    x = x + ls2(mlp(norm2(x)))

with one scalar mask ``M`` for all diluted blocks. At ``M = 1`` this is the original block; at
``M = 0`` it is exactly ``MLPOnlyBlock(scale=2)`` (``x = 2x; x = x + MLP(LN(x))``). The paper's M is
a tensor the shape of the block output, initialised to 1 and decayed by hand; all its entries
stay equal, so a scalar is the same thing.

The schedule (:func:`mask_value`) sets M every iteration: from 1 to 0 over the first ``fraction``
of the steps (``linear`` or ``cosine`` in the step index), then a plateau at exactly 0. With ``T``
steps the decay spans the first ``K = ceil(fraction T)`` steps: step 0 trains at M = 1, step
``K - 1`` is the first at M = 0, and steps ``K - 1 .. T - 1`` (at least one) train the final
structure. The authors decay per epoch, ``lambda = 1 - epoch / 299`` over a 300-epoch run, so only
the last epoch sees M = 0, and keep the best checkpoint by accuracy, which is one with M > 0 (a
bug their README admits). Here the model written at the end is only ever the M = 0 structure,
converted by :meth:`DilutionPhase.finish` to ``MLPOnlyBlock(scale=2)`` with no attention weights.

The fine-tune's default ``fraction`` is 0.75 (``FinetuneConfig.dilution_fraction``): the paper
(Tab. 4) finds a slower decay slightly better (decay over 200 / 300 / 400 epochs: 81.4 / 81.8 /
82.0 % on ImageNet), which argues for a long decay; a quarter of the schedule at M = 0 lets the
MLPs settle on exactly the structure that is saved (with the learning rate in its cosine tail)
rather than on one that still has some attention.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from edge.compress.methods.attnrm.module import MLPOnlyBlock
from edge.errors import EdgeError, InternalError

SCHEDULES = ("linear", "cosine")


class DilutedBlock(nn.Module):
    """``x = M attn(x) + (2 - M) x; x = x + MLP(LN(x))``: an MLP-only block with its attention fading in/out."""

    m: torch.Tensor

    def __init__(self, norm1: nn.Module, attn: nn.Module, ls1: nn.Module | None, drop_path1: nn.Module | None,
                 norm2: nn.Module, mlp: nn.Module, ls2: nn.Module | None = None,
                 drop_path2: nn.Module | None = None, m: float = 1.0, index: int | None = None) -> None:
        super().__init__()
        self.norm1 = norm1
        self.attn = attn
        self.ls1 = ls1 if ls1 is not None else nn.Identity()
        self.drop_path1 = drop_path1 if drop_path1 is not None else nn.Identity()
        self.norm2 = norm2
        self.mlp = mlp
        self.ls2 = ls2 if ls2 is not None else nn.Identity()
        self.drop_path2 = drop_path2 if drop_path2 is not None else nn.Identity()
        self.register_buffer("m", torch.tensor(float(m)))
        self.index = index

    @classmethod
    def from_blocks(cls, mlp_only: MLPOnlyBlock, original: nn.Module, m: float = 1.0) -> DilutedBlock:
        """The student's MLP half (its own modules) with copies of ``original``'s attention half."""
        half = [copy.deepcopy(getattr(original, name, None)) for name in ("norm1", "attn", "ls1", "drop_path1")]
        for module in half:
            if module is not None:
                module.requires_grad_(True)
        block = cls(*half, mlp_only.norm2, mlp_only.mlp, mlp_only.ls2, mlp_only.drop_path2, m=m,
                    index=mlp_only.index)
        return block.to(mlp_only.scale.device)

    def set_mask(self, value: float) -> None:
        self.m.fill_(float(value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        if float(m) == 0.0:
            x = x * (2 - m)        # the attention contributes exactly nothing: skip it (no gradient either)
        else:
            x = m * self.drop_path1(self.ls1(self.attn(self.norm1(x)))) + (2 - m) * x
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def to_mlp_only(self) -> MLPOnlyBlock:
        """The block at M = 0 without its attention: ``MLPOnlyBlock(scale=2)`` sharing this block's MLP modules."""
        if float(self.m) != 0.0:
            raise InternalError(f"DilutedBlock {self.index} converted at M = {float(self.m):g}; only M = 0 "
                                "equals the MLP-only block")
        return MLPOnlyBlock(self.norm2, self.mlp, self.ls2, self.drop_path2, scale=2.0,
                            index=self.index).to(self.m.device)

    def extra_repr(self) -> str:
        return f"index={self.index}, m={float(self.m):g}"


def decay_steps(total_steps: int, fraction: float) -> int:
    """``K``: the steps of the decay, from step 0 at M = 1 to step ``K - 1``, the first at M = 0."""
    return math.ceil(fraction * total_steps - 1e-9)


def check_schedule(total_steps: int, fraction: float, shape: str) -> None:
    """Refuse a mask schedule that does not end at M = 0 with at least one step trained there."""
    if shape not in SCHEDULES:
        raise EdgeError(f"--dilution-schedule {shape} is not a mask schedule", expected=" or ".join(SCHEDULES),
                        fix="pass --dilution-schedule linear or cosine")
    if not 0 < fraction <= 1:
        found = None
        if fraction > 1 and total_steps > 1:
            k = decay_steps(total_steps, fraction)
            last = _shape(shape, (total_steps - 1) / (k - 1))
            found = f"M = {last:.3f} at the last of the {total_steps} steps (the decay would end at step {k - 1})"
        raise EdgeError(f"--dilution-fraction {fraction:g} is not a part of the schedule", expected="a fraction in "
                        "(0, 1]: M decays from 1 to 0 over that part of the steps, then stays at 0", found=found,
                        fix="pass --dilution-fraction in (0, 1], e.g. 0.75 (the saved model must be at M = 0)")
    if decay_steps(total_steps, fraction) < 2:
        raise EdgeError(f"--dilution-fraction {fraction:g} of a {total_steps}-step schedule leaves no step between "
                        "M = 1 and M = 0", expected="a decay of at least 2 steps (M = 1 at step 0, 0 at the last)",
                        fix="train more steps (--epochs/--steps) or pass a larger --dilution-fraction")


def _shape(shape: str, progress: float) -> float:
    progress = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def mask_value(step: int, total_steps: int, fraction: float, shape: str = "linear") -> float:
    """M at (0-based) training step ``step`` of ``total_steps``: 1 at step 0, exactly 0 from step ``K - 1`` on."""
    check_schedule(total_steps, fraction, shape)
    last = decay_steps(total_steps, fraction) - 1
    if step >= last:
        return 0.0
    return _shape(shape, step / last)


class DilutionPhase:
    """The dilution of every MLP-only block of a student, as a :class:`~edge.compress.method.TrainingPhase`."""

    name = "dilution"
    module_types = (DilutedBlock,)

    def __init__(self, student: nn.Module, originals: dict[int, nn.Module], total_steps: int, fraction: float,
                 shape: str) -> None:
        check_schedule(total_steps, fraction, shape)
        self.student = student
        self.originals = originals           # position in student.blocks -> the teacher's block
        self.total_steps = total_steps
        self.fraction = fraction
        self.shape = shape
        self.value = 1.0

    def blocks(self) -> list[DilutedBlock]:
        return [b for b in self.student.blocks if isinstance(b, DilutedBlock)]

    def start(self) -> None:
        """Put a :class:`DilutedBlock` (at M = 1) at each MLP-only block's place."""
        for position, original in self.originals.items():
            self.student.blocks[position] = DilutedBlock.from_blocks(self.student.blocks[position], original)
        self.value = 1.0

    def step(self, step: int, total: int) -> dict[str, float]:
        """Set M for training step ``step`` (0-based) in every diluted block; returns ``{"M": M}`` to log."""
        self.value = mask_value(step, total, self.fraction, self.shape)
        for block in self.blocks():
            block.set_mask(self.value)
        return {"M": self.value}

    @property
    def final(self) -> bool:
        """Whether the student already computes what :meth:`finish` leaves (M = 0)."""
        return self.value == 0.0

    def finish(self) -> None:
        """Replace every DilutedBlock by ``MLPOnlyBlock(scale=2)`` (no attention weights left)."""
        if not self.final:
            raise InternalError(f"dilution finished at M = {self.value:g}; the model is kept only at M = 0")
        for position, block in enumerate(self.student.blocks):
            if isinstance(block, DilutedBlock):
                self.student.blocks[position] = block.to_mlp_only()

    def state_dict(self) -> dict:
        return {"M": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["M"])
        for block in self.blocks():
            block.set_mask(self.value)

    def manifest(self, manifest: dict) -> dict:
        """The manifest the diluted model is saved with: unchanged."""
        return manifest

    def record(self) -> dict:
        """What the manifest keeps of the dilution."""
        k = decay_steps(self.total_steps, self.fraction)
        return {"schedule": self.shape, "fraction": self.fraction, "decay_steps": k, "first_zero_step": k - 1,
                "steps_at_zero": self.total_steps - k + 1, "total_steps": self.total_steps,
                "blocks": [b.index for b in self.blocks()] or [self.student.blocks[p].index for p in self.originals],
                "M": self.value}


def dilution_phase(student: nn.Module, teacher: nn.Module, config) -> DilutionPhase:
    """The dilution of ``student``'s MLP-only blocks from ``teacher``'s attention, or a clear refusal.

    ``config`` is the resolved fine-tuning recipe: ``steps`` (the schedule length),
    ``dilution_fraction`` and ``dilution_schedule``. Nothing in ``student`` changes until ``start()``.
    """
    fraction, shape = config.dilution_fraction, config.dilution_schedule
    check_schedule(config.steps, fraction, shape)
    mlp_only = {p: b for p, b in enumerate(student.blocks) if isinstance(b, MLPOnlyBlock)}
    if not mlp_only:
        raise EdgeError("--dilute: the compressed model has no MLP-only blocks (its plan removes no attention)",
                        expected="an artifact whose plan removes attention sub-layers (attnrm steps)",
                        fix="compress with an attnrm step (e.g. --plan attnrm:auto=4), or fine-tune without --dilute")
    originals = {}
    for position, block in mlp_only.items():
        index = position if block.index is None else block.index
        if float(block.scale) != 1.0:
            raise EdgeError(f"--dilute: block {index} is already diluted (its MLP-only block scales by "
                            f"{float(block.scale):g}, not 1)", fix="fine-tune it without --dilute")
        originals[position] = _original_block(teacher, index, block)
    return DilutionPhase(student, originals, config.steps, fraction, shape)


def _original_block(teacher: nn.Module, index: int, block: MLPOnlyBlock) -> nn.Module:
    """The teacher's block ``index``, checked to have an attention half the student's block can take."""
    blocks = getattr(teacher, "blocks", None)
    original = blocks[index] if blocks is not None and index < len(blocks) else None
    if original is None or not hasattr(original, "attn") or not hasattr(original, "norm1"):
        raise EdgeError(f"--dilute: the teacher has no attention block {index} to dilute from",
                        expected="the teacher to be the model the artifact was compressed from",
                        fix="drop --teacher (the artifact's source model is the teacher) or fine-tune without --dilute")
    width = getattr(block.norm2, "normalized_shape", None)
    if getattr(original.norm1, "normalized_shape", width) != width:
        raise EdgeError(f"--dilute: the teacher's block {index} has width {original.norm1.normalized_shape}, "
                        f"the student's {width}", fix="dilute from the artifact's own source model (drop --teacher)")
    return original


__all__ = ["SCHEDULES", "DilutedBlock", "DilutionPhase", "check_schedule", "decay_steps",
           "dilution_phase", "mask_value"]
