"""Turn a finished `edge train` run into the bundled reference model (how the shipped files were made).

    python scripts/release_reference.py runs/fmnist-deit-tiny [--note "..."]

1. copies RUN/model.safetensors to edge/models/weights/fmnist-deit-tiny.safetensors;
2. runs the shortened run of the same recipe (the first --short-steps steps, same seed) and
   records its accuracy, which CI reproduces (tests/test_train.py);
3. writes the model card edge/models/weights/fmnist-deit-tiny.json (RUN/card.json plus the
   reproduction figures and notes).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--short-steps", type=int, default=60)
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args()
    card = json.loads((args.run / "card.json").read_text())
    bundled = BUNDLED[NAME]
    recipe = {k: v for k, v in card["recipe"].items() if k != "max_steps"}
    with tempfile.TemporaryDirectory() as tmp:
        short = train(TrainConfig(**recipe, max_steps=args.short_steps), tmp)
    command = " ".join(card["command"])
    card["reproduce"] = {
        "full_run": {"command": command, "accuracy": card["eval"]["accuracy"],
                     "test": "pytest -m slow tests/test_train.py::test_full_recipe_reproduces_the_shipped_accuracy"},
        "short_run": {"command": f"{command} --max-steps {args.short_steps}", "max_steps": args.short_steps,
                      "accuracy": short["eval"]["accuracy"], "samples": short["eval"]["samples"],
                      "test": "tests/test_train.py::"
                              "test_short_run_of_the_documented_recipe_reproduces_the_recorded_figure"},
        "tolerance_pt": 0.5,
    }
    card["notes"] = card.get("notes", []) + args.note
    shutil.copyfile(args.run / "model.safetensors", bundled.weights)
    bundled.card.write_text(json.dumps(card, indent=2) + "\n")
    print(f"wrote {bundled.weights} and {bundled.card}: accuracy {card['eval']['accuracy']:.4f}, "
          f"short run ({args.short_steps} steps) {short['eval']['accuracy']:.4f}")


if __name__ == "__main__":
    main()
