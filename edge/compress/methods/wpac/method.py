"""Width compression (SKD's WPAC, training-free) as a plan step.

``wpac:keep=0.5`` keeps half of every attention head's Q/K and V dims and half of every MLP's
hidden units, in every block; ``wpac:qk=0.5:v=0.75:mlp=0.5`` per part; ``blocks=0+1+2``
restricts the blocks. Widths are rounded to multiples of ``align`` (head dims, default 16) and
``mlp_align`` (MLP width, default 64). ``criterion=wpac|taylor|magnitude|random`` (``seed=S`` for
random) chooses how dims are ordered before truncation. The step and modules are in
:mod:`~edge.compress.methods.wpac.module`, the statistics and rotations in
:mod:`~edge.compress.methods.wpac.statistics`, the truncation in :mod:`~edge.compress.methods.wpac.build`.

In a plan the method comes after the other built-in methods (``order`` 25): a block that a span
removes, or whose attention another step replaces, is refused (a ``wpac`` step without
``blocks=`` names every block, so it is refused next to any such step; the message lists the
blocks left). Several ``wpac`` steps may give different fractions to disjoint blocks. WPAC
measures on the calibration images (default 1,024 for plans with a wpac step, the paper's
proxy-set size).
"""

from __future__ import annotations

from torch import nn

from edge.compress.method import BuildContext, Built, Method, PlanCheck, check_block_index
from edge.compress.methods.wpac.build import (
    build_wpac,
    cut_by_macs,
    place_wpac,
    positions,
    restore_wpac,
    step_blocks,
    wpac_records,
)
from edge.compress.methods.wpac.extract import (
    REQUESTS,
    check_request,
    cut_subnetwork,
    extraction_record,
    is_extraction,
    remaining,
)
from edge.compress.methods.wpac.module import PARTS, USAGE, WPAC, NarrowAttention, WpacOptions, WpacStep
from edge.compress.methods.wpac.statistics import collect_statistics
from edge.compress.methods.wpac.supernet import check_record
from edge.compress.options import option_defaults, parse_options
from edge.compress.registry import register_method
from edge.compress.moves import Move
from edge.errors import EdgeError


def _blocks(value: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(b) for b in value.split("+")}))
    except ValueError as e:
        raise EdgeError(f"blocks={value} in plan step {text!r} does not list blocks",
                        expected="blocks=0+1+2 (original block indices)") from e


def _check_options(options: dict, text: str) -> None:
    """What the options dataclass cannot say alone: which options go together."""
    if "seed" in options and options.get("criterion") != "random":
        raise EdgeError(f"seed= in plan step {text!r} applies to criterion=random only",
                        fix="add :criterion=random or drop seed")
    if "latency-ms" in options or "table" in options:
        given = [key for key in ("keep", *PARTS, "macs", "criterion", "seed") if key in options]
        if "latency-ms" not in options or "table" not in options or given:
            raise EdgeError(f"plan step {text!r}: latency-ms= and table= go together and alone",
                            expected="wpac:latency-ms=X:table=FILE (a latency table of the super-network's parts, "
                                     "e.g. `edge profile MODEL --latency-table FILE --grid full`)",
                            fix="name both, and drop " + ("/".join(given) if given else "nothing else"))
        return
    if "macs" in options:
        given = [key for key in ("keep", *PARTS) if key in options]
        if given:
            raise EdgeError(f"plan step {text!r} gives both macs= and {', '.join(f'{k}=' for k in given)}",
                            expected="macs=F alone (the ranking decides every width) or kept fractions alone",
                            fix=f"drop {'/'.join(given)}, or drop macs")
        if options.get("criterion", "wpac") != "wpac":
            raise EdgeError(f"plan step {text!r}: macs= ranks units in WPAC's order", expected="criterion=wpac",
                            fix="drop criterion=, or use keep= with the other criteria")
        return
    if not any(key in options for key in ("keep", *PARTS)):
        raise EdgeError(f"plan step {text!r} does not say how much to keep", expected=USAGE)


class WidthCompression(Method):
    name = WPAC
    keywords = (WPAC,)
    step_types = (WpacStep,)
    module_types = (NarrowAttention,)
    order = 25
    calibration_samples = 1024
    derivations = REQUESTS
    options = WpacOptions
    grammar = ("Width compression (WPAC, training-free): wpac:keep=F (0 < F <= 1 of the head dims and MLP width) "
               "or wpac:qk=F:v=F:mlp=F, or wpac:macs=F (F of the MACs, units ranked on the images; on a "
               "super-network artifact: a sub-network cut without data; there also wpac:latency-ms=X:table=FILE, "
               "the largest within X ms by a latency table); seed with criterion=random.")

    def parse(self, keyword: str, rest: str, text: str) -> WpacStep:
        parts = [p for p in rest.split(":") if p] if rest else []
        options = parse_options(parts, text, WpacOptions)
        blocks = _blocks(options.pop("blocks"), text) if "blocks" in options else ()
        _check_options(options, text)
        return WpacStep(blocks=blocks, options=options)

    def sort_key(self, step: WpacStep) -> tuple:
        return (step.blocks, str(step))

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        """Blocks within the model, each in one wpac step, none removed or with its attention replaced by another."""
        n = check.num_blocks
        for step in steps:
            if step.latency_ms is not None:
                raise EdgeError(f"plan step {step} cuts a sub-network from a super-network artifact by a latency "
                                "table; this model is none", expected="edge compress SUPERNET --plan "
                                "wpac:latency-ms=X:table=FILE, SUPERNET made by --plan wpac:macs=1 or edge finetune "
                                "--piad", fix="make a super-network first, or ask for wpac:macs=F here")
        ranked = [s for s in steps if s.macs is not None]
        if ranked and len(steps) > 1:
            raise EdgeError(f"plan step {ranked[0]} sets a fraction of the whole model's MACs beside other wpac "
                            f"steps ({', '.join(str(s) for s in steps if s is not ranked[0])})",
                            expected="one wpac:macs=F step as the plan's only wpac step",
                            fix="name the blocks in that step (blocks=...) and drop the other wpac steps")
        others = sorted({str(s) for s in (*check.removed.values(), *check.attention.values())})
        if ranked and others:
            raise EdgeError(f"plan step {ranked[0]} ranks units against the whole model's MACs, which other steps "
                            f"({', '.join(others)}) change", expected="wpac:macs=F as the plan's only step",
                            fix="use kept fractions (wpac:keep=F:blocks=...) beside other methods")
        mine: dict[int, WpacStep] = {}
        for step in steps:
            for block in step.blocks:
                check_block_index(step, block, n)
            for block in step_blocks(step, n):
                if block in mine:
                    raise EdgeError(f"plan steps {mine[block]} and {step} both narrow block {block}",
                                    fix="give each block to one wpac step (blocks=...)")
                mine[block] = step
        taken = {**check.removed, **{b: s for b, s in check.attention.items() if b not in check.removed}}
        for block, step in sorted(mine.items()):
            other = taken.get(block)
            if other is None or other is step:
                continue
            free = [b for b in range(n) if b not in taken]
            what = "removes" if block in check.removed else "replaces the attention of"
            raise EdgeError(f"plan step {step} narrows block {block}, which {other} {what}",
                            expected="wpac on blocks that keep their timm attention and MLP",
                            fix=f"name the other blocks: wpac...:blocks={'+'.join(map(str, free))}" if free
                            else "drop the wpac step")
        for block, step in mine.items():
            check.attention[block] = step

    def separable(self, step) -> bool:
        return step.macs is None and step.latency_ms is None   # a macs= cut ranks every block together

    def search_space(self, info) -> WidthSearch:
        return WidthSearch(self.name, info.num_blocks)

    def build(self, steps: tuple, context: BuildContext) -> Built:
        model = context.model
        statistics = None
        if context.cache is not None:   # edge plan: every block's statistics once, for every plan of the search
            statistics = context.memo(self.name, lambda: collect_statistics(
                model, positions(model), context.calibration, context.spec, batch_size=context.batch_size,
                device=context.device))
        modules, report = build_wpac(model, steps, context.calibration, context.spec,
                                     batch_size=context.batch_size, statistics=statistics, device=context.device)
        ranked = next((s for s in steps if s.macs is not None), None)
        if ranked is None:
            return Built(tuple(steps), modules, {WPAC: report})
        modules, supernet = cut_by_macs(context.model, modules, report, ranked, context.calibration, context.spec,
                                        context.batch_size, context.device)
        return Built(tuple(steps), modules, {WPAC: report}, manifest={"supernet": supernet})

    def place(self, model: nn.Module, built: Built) -> None:
        place_wpac(model, built.modules)

    def record(self, model: nn.Module, step: WpacStep, prepared: dict) -> dict:
        from edge.models.info import model_info

        return {"blocks": wpac_records(model, step_blocks(step, model_info(model).num_blocks))}

    def restore(self, model: nn.Module, records: list[dict]) -> None:
        restore_wpac(model, [b for r in records for b in r["blocks"]])

    def derives(self, step) -> bool:
        return isinstance(step, WpacStep) and is_extraction(step)

    def check_derivation(self, step: WpacStep, request: str, manifest: dict, where: str, predict) -> None:
        check_request(step, request, manifest, where, predict)

    def derive(self, model: nn.Module, manifest: dict, step: WpacStep, where: str, *, predict=None,
               predictor: dict | None = None) -> dict:
        """The sub-network of the super-network artifact at ``where`` that ``step`` asks for (see
        :mod:`edge.compress.methods.wpac.extract`): its steps, the rest of the order, the extraction."""
        record = check_record(manifest.get("supernet"), where)
        chosen, latency = cut_subnetwork(model, record, step, where, predict=predict, predictor=predictor)
        steps = [self._cut_entry(entry, step, model) if entry["method"] == self.name else entry
                 for entry in manifest["steps"]]
        return {"steps": steps, "supernet": remaining(record, chosen),
                "extracted": extraction_record(chosen, record, manifest, where, latency)}

    def _cut_entry(self, entry: dict, step: WpacStep, model: nn.Module) -> dict:
        """A wpac step entry of the super-network, rewritten for the sub-network cut by ``step``."""
        blocks = tuple(b["block"] for b in entry["record"]["blocks"])
        options = {**{k: v for k, v in entry["options"].items() if k in ("align", "mlp_align")}, **step.options}
        named = self.parse(self.name, entry["step"].partition(":")[2], entry["step"]).blocks
        return {**entry, "step": str(WpacStep(blocks=named, options=options)), "options": options,
                "record": {**entry["record"], "blocks": wpac_records(model, blocks)}}

    def training_phase(self, student: nn.Module, teacher: nn.Module, config, steps: tuple[dict, ...] = ()):
        """PIAD (progressive importance-aware dropout) of the wpac blocks when the fine-tune asks (``--piad``)."""
        if not getattr(config, "piad", False):
            return None
        from edge.compress.methods.wpac.piad import piad_phase

        options = dict(steps[0].get("options", {})) if steps else {}
        defaults = option_defaults(WpacOptions)
        return piad_phase(student, config, {k: options.get(k, defaults[k]) for k in ("align", "mlp_align")})


class WidthSearch:
    """``edge plan``'s walk: one block's attention (Q/K and V dims together) or MLP narrower by a level, or to the last.

    The state holds each block's (attention level, MLP level), indices into :attr:`LEVELS`; blocks
    of equal widths share one ``wpac:qk=F:v=F:mlp=F:blocks=...`` step.
    """

    LEVELS = (1.0, 0.75, 0.5, 0.25)

    def __init__(self, method: str, num_blocks: int) -> None:
        self.method, self.num_blocks = method, num_blocks

    def initial(self) -> tuple[tuple[int, int], ...]:
        return ((0, 0),) * self.num_blocks

    def moves(self, state) -> list[Move]:
        out = []
        for block, (attn, mlp) in enumerate(state):
            for level in self._deeper(attn):
                after = state[:block] + ((level, mlp),) + state[block + 1:]
                out.append(Move(f"wpac-attn:{block}:{level}", f"block {block}: head dims kept "
                                f"{self.LEVELS[attn]:g} -> {self.LEVELS[level]:g}", after, (block,)))
            for level in self._deeper(mlp):
                after = state[:block] + ((attn, level),) + state[block + 1:]
                out.append(Move(f"wpac-mlp:{block}:{level}", f"block {block}: MLP width kept "
                                f"{self.LEVELS[mlp]:g} -> {self.LEVELS[level]:g}", after, (block,)))
        return out

    def release(self, state, blocks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        return tuple((0, 0) if b in blocks else levels for b, levels in enumerate(state))

    def _deeper(self, level: int) -> list[int]:
        """The next level and the last (the two ends of what one move may narrow)."""
        last = len(self.LEVELS) - 1
        return sorted({min(level + 1, last), last} - {level})

    def steps(self, state) -> str:
        groups: dict[tuple[int, int], list[int]] = {}
        for block, levels in enumerate(state):
            if levels != (0, 0):
                groups.setdefault(levels, []).append(block)
        return ",".join(f"wpac:qk={self.LEVELS[a]:g}:v={self.LEVELS[a]:g}:mlp={self.LEVELS[m]:g}:"
                        f"blocks={'+'.join(map(str, blocks))}" for (a, m), blocks in sorted(groups.items()))


register_method(WidthCompression())
