"""A toy compression method, the way a new method is added: this one file and its registration.

``gain:blocks=1+2[:value=F]`` puts a :class:`Gain` (``y = g * x``, one trainable scalar, no
FLOPs) at ``blocks[i].mlp`` of each listed block, in place of timm's MLP. Nothing outside this
file knows it: the plan grammar, validation, the compressor, the artifact, the FLOP count, the CLI
help and the fine-tuner find it through the registry (``tests/edge/compress/test_registry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from edge.compress.method import BuildContext, Built, Method, PlanCheck
from edge.compress.options import format_options, option_defaults, parse_options, plan_option
from edge.errors import EdgeError


class Gain(nn.Module):
    def __init__(self, value: float = 1.0) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(float(value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain * x

    def flops(self, tokens: int) -> int:
        return 0


@dataclass(frozen=True)
class GainOptions:
    value: float = plan_option(1.0, minimum=-10, maximum=10)   # the gain's initial value


@dataclass(frozen=True)
class GainStep:
    blocks: tuple[int, ...]
    options: dict = field(default_factory=dict, hash=False)

    is_resolved = True

    def __str__(self) -> str:
        return "gain:blocks=" + "+".join(map(str, self.blocks)) + format_options(self.options)


class GainMethod(Method):
    name = "toy-gain"
    keywords = ("gain",)
    step_types = (GainStep,)
    module_types = (Gain,)
    order = 30
    options = GainOptions
    grammar = "Toy: gain:blocks=1+2[:value=F] scales the MLP input instead of running the MLP."

    def parse(self, keyword: str, rest: str, text: str) -> GainStep:
        where, *parts = rest.split(":")
        if not where.startswith("blocks="):
            raise EdgeError(f"plan step {text!r} names no blocks", expected="gain:blocks=1+2")
        return GainStep(tuple(sorted(int(b) for b in where.removeprefix("blocks=").split("+"))),
                        parse_options(parts, text, GainOptions))

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        for step in steps:
            for block in step.blocks:
                if block in check.removed:
                    raise EdgeError(f"plan step {step} scales block {block}, which {check.removed[block]} removes")

    def build(self, steps: tuple, context: BuildContext) -> Built:
        default = option_defaults(GainOptions)["value"]
        modules = {b: Gain(s.options.get("value", default)) for s in steps for b in s.blocks}
        return Built(steps, modules, {"gain": {str(b): m.gain.item() for b, m in modules.items()}})

    def place(self, model: nn.Module, built: Built) -> None:
        for block, module in built.modules.items():
            model.blocks[block].mlp = module

    def record(self, model: nn.Module, step: GainStep, prepared: dict) -> dict:
        return {"blocks": list(step.blocks)}

    def restore(self, model: nn.Module, records: list[dict]) -> None:
        for record in records:
            for block in record["blocks"]:
                model.blocks[block].mlp = Gain()
