"""Help that tells the truth (issue 19): each default shown once and as it is, and every example runs.

The default checks walk every option of every verb's parser. The examples are read from each verb's
``--help`` epilog; every one parses in the default run, and every one runs, on small data, in the slow
run (``-m slow``: about 10 minutes on 2 cores) with the substitutions listed in ``SMALL``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from edge.cli import COMMANDS, build_parser, main
from edge.cli.common import shows_default, states_default
from edge.cli.options import Number, PathKind
from tests.edge.cli.test_json import tiny_idx
from tests.edge.cli.test_options import Place, group_choices, valid_value, value_actions, verb_parsers


def expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return " ".join(parser._get_formatter()._expand_help(action).split())


def parsed_defaults(verb: str, parser: argparse.ArgumentParser, place: Place) -> argparse.Namespace:
    """The namespace of ``verb`` given only its required arguments (so every other option has its default)."""
    argv = [verb]
    for action in value_actions(parser):
        if not action.option_strings and action.nargs not in ("?", "*"):
            argv.append(valid_value(action, place))
        elif action.required:
            argv += [action.option_strings[0], valid_value(action, place)]
    return parser.parse_args(argv[1:] + group_choices(parser, place))


def test_every_default_is_shown_once_and_as_it_is(tmp_path):
    place = Place(tmp_path)
    checked = 0
    for verb, parser in verb_parsers().items():
        namespace = parsed_defaults(verb, parser, place)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"edge {verb} {action.option_strings or action.dest}"
            text = expanded_help(parser, action)
            stated = re.findall(r"[(;] ?default\b", text)
            assert len(stated) <= 1, f"{where}: the default is stated {len(stated)} times: {text}"
            for wrong in ("default: None", "default: True", "default: False", "default: []", "default: ()"):
                assert wrong not in text, f"{where}: {text}"
            if action.nargs == 0 or action.required:
                assert not shows_default(action), where
            if shows_default(action):
                shown = re.search(r"[(;] ?default: (.*)\)$", text).group(1)
                assert shown == " ".join(str(action.default).split()), f"{where}: shows {shown}"
                value = getattr(namespace, action.dest)
                expected = action.type(action.default) if isinstance(action.default, str) and action.type \
                    else action.default
                assert value == expected, f"{where}: help shows {shown}, the parser gives {value!r}"
                checked += 1
            elif action.default not in (None, False, True, [], argparse.SUPPRESS) and action.nargs != 0:
                assert states_default(action.help), f"{where}: default {action.default!r} neither shown nor stated"
            source = getattr(action.type, "source", None)
            if isinstance(action.type, Number) and source and action.default is not None:
                config, name = source
                assert action.default == getattr(config, name), f"{where}: default differs from {config.__name__}"
    assert checked > 60, checked  # options whose default the formatter shows (79 when written)


# --------------------------------------------------------------------------------------------- examples

#: The order the slow test runs the verbs' examples in: an example reads what an earlier one wrote.
ORDER = ("info", "models", "train", "export", "compress", "finetune", "analyze", "eval", "clean", "verify",
         "quantize", "check", "build", "profile", "plan", "pipeline", "bundle", "deploy")


def examples() -> list[tuple[str, list[str]]]:
    """(help it is in, argv) of every example in every verb's --help, in :data:`ORDER`."""
    modules = {m.__name__.rsplit(".", 1)[1].removesuffix("_cmd"): m for m in COMMANDS}
    assert set(ORDER) == set(modules)
    found = []
    for verb in ORDER:
        for line in modules[verb].EXAMPLES.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("edge "):
                found.append((verb, shlex.split(line)[1:]))
    return found


def test_every_help_example_parses(monkeypatch):
    """Flags, choices and numbers of every example are valid (paths are not looked at here)."""
    for kind in PathKind.__subclasses__():
        monkeypatch.setattr(kind, "problem", lambda self, path: None)
    parser = build_parser()
    seen = set()
    for verb, argv in examples():
        parser.parse_args(argv[: argv.index(">")] if ">" in argv else argv)  # `... --print-recipe > recipe.yaml`
        seen.add(verb)
    assert seen == {m.__name__.rsplit(".", 1)[1].removesuffix("_cmd") for m in COMMANDS}


#: What the slow test changes to run the examples on small data (each value of these options).
SMALL = {"--samples": "10", "--iterations": "5", "--duration": "0.2", "--max-steps": "1"}
#: Verbs whose examples get `--data` (a 20-image IDX folder cut from fmnist-mini) where they name none.
DATA_VERBS = ("train", "finetune", "analyze", "compress", "eval", "export", "verify", "plan")
#: Examples that cannot run here, and why.
NOT_HERE = {
    "build": "needs TensorRT (only the --trtexec one runs: it prints the trtexec command)",
    "deploy": "needs a Jetson over SSH (tests/edge/deploy runs deploy against a local sshd)",
    "eval timm:deit_small_patch16_224": "needs the user's weights file and image folder",
    "plan --budget-ms": "needs a table measured on a Jetson (tests/edge/plan checks a device "
                        "table's target is accepted and another target's refused)",
}
#: Inputs examples name that no earlier example writes: made first.
SETUP = [["compress", "fmnist-deit-tiny", "--plan", "linear:9-10", "--out", "runs/linear-9-10", "--data",
          "fmnist-mini", "--samples", "200"]]


def small(verb: str, argv: list[str], data: str, recipe: str) -> list[str]:
    """``argv`` on small data: --data the tiny folder, few samples and steps, pipeline on a tiny recipe."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token in ("--data", "--recipe", *SMALL) and i + 1 < len(argv):
            value = {"--data": data, "--recipe": recipe}.get(token) or SMALL[token]
            out += [token, value]
            i += 2
        else:
            out.append(token)
            i += 1
    if verb == "pipeline" and "--print-recipe" not in out and "--recipe" not in out:
        out += ["--recipe", recipe]
    if verb in DATA_VERBS and "--data" not in out:
        out += ["--data", data]
    if verb in ("compress", "analyze") and "--samples" not in out:
        out += ["--samples", "10"]
    if verb in ("train", "finetune"):
        out += (["--max-steps", "1"] if "--max-steps" not in out else []) + ["--batch-size", "20"]
    if verb == "profile":
        out += ["--warmup", "2"]
    if verb == "plan":
        out += ["--samples", "10", "--holdout", "10", "--iterations", "5"] + (
            ["--finetune-max-steps", "1"] if "--finetune" in out else [])
    return out


def reason_not_here(verb: str, argv: list[str]) -> str | None:
    if verb == "build" and "--trtexec" not in argv:
        return NOT_HERE["build"]
    if verb == "deploy":
        return NOT_HERE["deploy"]
    if verb == "plan" and "--budget-ms" in argv:
        return NOT_HERE["plan --budget-ms"]
    key = " ".join(argv[:2])
    return NOT_HERE.get(key)


@pytest.mark.slow
def test_every_help_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = str(tiny_idx(tmp_path / "tiny"))
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(f"data: {data}\nanalysis: {{enabled: true, samples: 10}}\ncalibration: {{samples: 10}}\n"
                      "evaluate: {batch_size: 20}\nprofile: {warmup: 1, rounds: 2, sessions: 1, iterations: 2}\n"
                      "variants:\n  - name: original\n  - name: linear-9-10\n    plan: linear:9-10\n")
    for argv in SETUP:
        assert main(argv) == 0, argv
    failures, ran, skipped = [], 0, []
    for _, argv in examples():
        argv, redirect = (argv[: argv.index(">")], argv[-1]) if ">" in argv else (argv, None)
        verb = argv[0]
        why = reason_not_here(verb, argv)
        if why:
            skipped.append(f"edge {' '.join(argv)}: {why}")
            continue
        if verb == "bundle":  # bundle reads a pipeline run folder runs/demo and a second graph runs/small.onnx
            Path("runs/demo").exists() or Path("runs/demo").symlink_to(Path("runs/pipeline").absolute())
            Path("runs/small.onnx").exists() or Path("runs/small.onnx").write_bytes(Path("runs/ref.onnx").read_bytes())
        run = small(verb, argv, data, str(recipe))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = main(run)
        if redirect:
            Path(redirect).write_text(stdout.getvalue())
        ran += 1
        if code != 0:
            failures.append(f"edge {' '.join(argv)} (run as edge {' '.join(run)}): exit {code}")
    print(f"{ran} examples ran; not here: {len(skipped)}\n" + "\n".join(skipped))
    assert not failures, "\n".join(failures)
