"""Turn finished `edge train` runs into the bundled reference model (how the shipped files were made).

    python scripts/release_reference.py RUN [RUN2 ...] [--note "..."]

One RUN per stage of the recipe, in order; stage k+1 was trained with ``--init-weights`` pointing to
stage k's ``model.safetensors``. The script

1. copies the last RUN's model.safetensors to edge/models/weights/fmnist-deit-tiny.safetensors;
2. runs the shortened run of the first stage (its first --short-steps steps, same seed) and records
   its accuracy, which CI reproduces (tests/edge/test_train.py);
3. writes the model card edge/models/weights/fmnist-deit-tiny.json: the last RUN's card.json, plus
   ``stages`` (each stage's command, recipe, per-epoch accuracy, wall time and hardware), the
   reproduction figures and notes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from edge.models.zoo import BUNDLED
from edge.train import TrainConfig, train

NAME = "fmnist-deit-tiny"
PREVIOUS = "{previous stage}/model.safetensors"  # init_weights of stage k+1, as recorded in the card


def stage_record(index: int, card: dict) -> dict:
    recipe = {k: v for k, v in card["recipe"].items() if k != "max_steps"}
    if index > 0:
        recipe["init_weights"] = PREVIOUS
    return {"stage": index + 1, "command": " ".join(card["command"]), "recipe": recipe,
            "accuracy": card["eval"]["accuracy"], "history": card["history"], "steps": card["steps"],
            "wall_time_s": card["wall_time_s"], "hardware": card["hardware"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="the stages' output folders, in order")
    parser.add_argument("--short-steps", type=int, default=60)
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args()
    cards = [json.loads((run / "card.json").read_text()) for run in args.runs]
    stages = [stage_record(i, c) for i, c in enumerate(cards)]
    card = dict(cards[-1])
    card["recipe"] = stages[-1]["recipe"]
    card["stages"] = stages
    first = stages[0]["recipe"]
    with tempfile.TemporaryDirectory() as tmp:
        short = train(TrainConfig(**first, max_steps=args.short_steps), tmp)
    card["reproduce"] = {
        "full_run": {"commands": [s["command"] for s in stages], "accuracy": card["eval"]["accuracy"],
                     "test": "pytest -m slow "
                             "tests/edge/test_train.py::test_full_recipe_reproduces_the_shipped_accuracy"},
        "short_run": {"command": f"{stages[0]['command']} --max-steps {args.short_steps}", "recipe": first,
                      "max_steps": args.short_steps, "accuracy": short["eval"]["accuracy"],
                      "samples": short["eval"]["samples"],
                      "test": "tests/edge/test_train.py::"
                              "test_short_run_of_the_documented_recipe_reproduces_the_recorded_figure"},
        "tolerance_pt": 0.5,
    }
    card["notes"] = card.get("notes", []) + args.note
    bundled = BUNDLED[NAME]
    shutil.copyfile(args.runs[-1] / "model.safetensors", bundled.weights)
    bundled.card.write_text(json.dumps(card, indent=2) + "\n")
    print(f"wrote {bundled.weights} and {bundled.card}: accuracy {card['eval']['accuracy']:.4f} after "
          f"{len(stages)} stage(s), short run ({args.short_steps} steps) {short['eval']['accuracy']:.4f}")


if __name__ == "__main__":
    main()
