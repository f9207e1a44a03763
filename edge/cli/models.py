"""``edge models``: list bundled models, or show one model's geometry."""

from __future__ import annotations

from edge.cli.common import add_command, add_img_size_option, add_weights_option, emit
from edge.cli.options import Model

EXAMPLES = """  edge models
  edge models fmnist-deit-tiny --json
  edge models timm:vit_small_patch14_dinov2 --img-size 224
  edge models timm:vit_small_patch16_224 --img-size 224x320       # non-square: 224 rows, 320 columns
  edge models timm:vit_small_patch16_224,class_token=False,global_pool=avg"""


def register(subparsers) -> None:
    parser = add_command(subparsers, "models", "list bundled models, or show a model's blocks, tokens and grid",
                         "Any timm VisionTransformer works as timm:ARCH (random weights unless --weights).",
                         EXAMPLES)
    parser.add_argument("model", nargs="?", type=Model(), help="a model to describe (default: list the bundled ones)")
    add_weights_option(parser, help="weights file to load")
    add_img_size_option(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.compress.load import load_model
    from edge.models import BUNDLED, data_config, model_card, model_info

    if not args.model:
        rows = {name: {"architecture": b.arch, "description": b.description,
                       "accuracy": (model_card(name) or {}).get("eval", {}).get("accuracy")}
                for name, b in BUNDLED.items()}
        width = max(len(n) for n in rows)
        human = "\n".join(f"{n:<{width}}  {r['description']}" for n, r in rows.items())
        human += "\n\nand any timm ViT as timm:ARCH (e.g. timm:deit_small_patch16_224)"
        emit({"bundled": rows}, args.json, human)
        return 0
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    info = model_info(model).as_dict()
    info["data_config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in data_config(model).items()}
    emit({"model": args.model, **info}, args.json, "\n".join(f"{k:<18} {v}" for k, v in info.items()))
    return 0
