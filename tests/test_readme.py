"""The commands of README.md and of every guide in docs/ run as tests, so the docs cannot drift from the code.

Every ```bash block of README.md and of docs/*.md is read into commands (``\\`` continuations joined,
comments dropped). The measured tables in docs/results/ are written by benchmarks/ and hold no
```bash block; they are not read. Each ``edge ...`` command runs for real, through the real CLI in
a fresh interpreter (``python -m edge``). Each file runs on its own, as a reader who starts with it
would: in a working folder of its own, made fresh for that file, holding only the stand-ins of the
files a reader brings (STAND_INS) and the small data set below. A guide makes what it uses: a path a
command names that no earlier command of its own file writes fails the test, naming the guide and
the path (``runs/linear-9-10`` is compressed at the top of docs/export.md, not taken from
docs/block-approximation.md). To keep it small, the command text goes through REWRITES, a table of
substitutions that keep the verb and its meaning (smaller data, fewer samples, fewer steps); the
rewritten command is printed in every failure. Commands that cannot run inside the suite are named,
with their file and the reason, in EXCLUDED, NEEDS_HARDWARE and SLOW; each of those tables is checked
to name only commands that are really in the file it names.

A test asks for its command's result; the earlier commands of its file that wrote a path it names
(its ``--out``, any other option the CLI declares as a file or folder to write, or ``> FILE``) run
first, once per file, so ``-k`` selects a single command and still works. A command of the default
run never needs a slow one.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge.cli import COMMANDS, build_parser
from tests.launch import run_edge

ROOT = Path(__file__).resolve().parents[1]
README = "README.md"
#: Guides whose commands another test runs, in order, as one scenario (with more checks than an exit status)
RUN_ELSEWHERE = {"docs/your-own-model.md": "tests/test_own_model.py (every command, Fashion-MNIST unreadable)"}
DOC_FILES = (README, *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
                             if f"docs/{p.name}" not in RUN_ELSEWHERE))


# --- reading README.md and docs/*.md ----------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """One command of a ```bash block of README.md or a guide."""

    line: int       # line of its file it starts on
    text: str       # as written: continuations joined, comment dropped, spaces collapsed
    file: str = README  # its file, relative to the repository root

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def is_edge(self) -> bool:
        return self.argv[0] == "edge"

    @property
    def key(self) -> tuple[str, str]:
        """How EXCLUDED, NEEDS_HARDWARE and SLOW name it: (file, command text)."""
        return self.file, self.text

    @property
    def id(self) -> str:
        argv = self.argv
        stem = Path(self.file).stem
        return f"{stem}-L{self.line}-{argv[0]}-{argv[1] if len(argv) > 1 else ''}".rstrip("-")


def _drop_comment(line: str) -> str:
    """The line without a shell comment: ``#`` at the start of a word, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def bash_commands(text: str, file: str = README) -> list[Command]:
    """The commands of every ```bash block of ``text`` (the contents of ``file``), in order."""
    commands: list[Command] = []
    in_bash = False
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            in_bash = not in_bash and stripped == "```bash"
            continue
        if not in_bash:
            continue
        line = raw.rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command = " ".join(_drop_comment(pending + line).split())
        pending = ""
        if command:
            commands.append(Command(start, command, file))
    return commands


DOC_COMMANDS = [c for f in DOC_FILES for c in bash_commands((ROOT / f).read_text(encoding="utf-8"), f)]


# --- what runs, what does not, and why --------------------------------------------------------

# Each table names commands by (file, command text); a command that appears in two files (README.md's
# tour repeats commands of the guides) is named once per file.
RM, REF, MODELS, DW, FT, RMV, PLAN, DIST, PREC, PIPE, CONTRIB = (
    README, "docs/reference-model.md", "docs/models-and-data.md", "docs/depthwise-attention.md",
    "docs/finetuning.md", "docs/attention-removal.md", "docs/planning.md", "docs/distributed.md",
    "docs/precision.md", "docs/pipeline.md", "docs/contributing.md")

# Commands that are not run inside the suite.
_TESTS = "the test command: it runs this suite, which cannot run itself"
EXCLUDED = {
    (RM, "bash scripts/main.sh"): "the main job: set-up, then the full built-in pipeline (minutes); its steps run "
                                  "in docs/pipeline.md",
    (RM, "bash scripts/test.sh"): _TESTS,
    (RM, "edge deploy bundles/plan2x.tar.gz --host nvidia@192.168.1.20 --accept-new-host-key"):
        "needs a Jetson reachable over SSH; tests/edge/deploy runs edge deploy over OpenSSH on 127.0.0.1",
    (CONTRIB, "bash scripts/test.sh"): _TESTS,
    (CONTRIB, "bash scripts/test.sh -m slow"): _TESTS,
    (CONTRIB, "bash scripts/test.sh tests/edge/compress -k registry"): _TESTS,
    (CONTRIB, "python -m pytest -q tests/test_readme.py -k width-compression"): _TESTS,
    (DIST, "torchrun --nproc_per_node 8 -m edge compress timm:deit_small_patch16_224 --weights deit_small.safetensors "
     "--plan attnrm:auto=4 --data ~/imagenet --samples 50000 --out runs/deit-rm4"):
        "8 processes on ImageNet; tests/edge/test_distributed.py runs edge compress and every calibration "
        "statistic under torchrun --nproc_per_node 2 on the CPU",
    (DIST, "torchrun --nproc_per_node 8 -m edge finetune runs/deit-rm4 --data ~/imagenet --dilute --epochs 30 "
     "--batch-size 1024 --out runs/deit-rm4-dil"):
        "8 GPUs and ImageNet; tests/edge/test_distributed.py runs edge finetune (and --dilute) "
        "under torchrun --nproc_per_node 2 on the CPU, on an image folder streamed from disk too",
}

# Commands that need TensorRT and a CUDA GPU (the Jetson); they run where both are present.
NEEDS_HARDWARE = {
    (PREC, "edge build runs/m.fp16.onnx --precision fp16 --out runs/m.fp16.engine --timing-cache runs/orin.cache"):
        "builds a TensorRT engine",
    (PREC, "edge profile runs/m.fp16.engine --json"): "times that engine with TensorRT and CUDA events",
}

# Commands that take minutes even on small data; run with `-m slow`.
_TABLE = "CI time: 55 part graphs exported and timed (tests/edge/latency covers tables on a tiny model)"
_PLAN = ("CI time: the search measures about 150 plans of the 12-block model (tests/edge/plan runs it on a "
         "4-block model)")
_PLANNED = "CI time: needs the plan above (slow); the same verb on a compressed artifact runs in the guides"
SLOW = {
    (PIPE, "edge pipeline --out runs/pipeline"):
        "the built-in recipe (a plan search, 6 variants, FP16/INT8 of two, a bundle, 300 profile iterations each) "
        "has no option to shrink it: minutes on 2 cores even on the small data set",
    (PIPE, "edge pipeline --recipe spans --out runs/spans"):
        "the three-span recipe (4 variants, analysis, 300 profile iterations each): about 100 s on 2 cores even on "
        "the small data set",
    (PIPE, "edge pipeline --recipe recipe.yaml --out runs/mine --json"): "the built-in recipe again, in a new folder",
    (PIPE, "edge pipeline --out runs/pipeline --redo profile"): "needs the built-in recipe's run (see above)",
    # CI must finish in 20 minutes on 2 cores; these repeat a verb another command already runs
    # by default, and each costs 20-90 s there (measured in a clean-clone run): they run with -m slow.
    (REF, "edge train fmnist-deit-tiny --init-weights runs/stage1/model.safetensors --data fmnist --epochs 12 "
     "--lr 5e-4 --warmup-steps 200 --label-smoothing 0 --seed 1 --out runs/stage2"):
        "CI time: a second train (stage 1 runs)",
    (REF, "edge train fmnist-deit-tiny --init-weights runs/stage2/model.safetensors --data fmnist --epochs 3 "
     "--lr 1e-4 --warmup-steps 50 --label-smoothing 0 --seed 2 --out runs/stage3"):
        "CI time: a third train (stage 1 runs)",
    (MODELS, "edge train fmnist-deit-tiny --data fmnist --epochs 10 --seed 0 --out runs/fmnist-deit-tiny"):
        "CI time: stage 1's command again (docs/reference-model.md), in another folder",
    (MODELS, "edge eval fmnist-deit-tiny --data fmnist-mini"):
        "CI time: 2,000 images (the full-data eval runs on the small set)",
    (MODELS, "edge eval timm:deit_small_patch16_224 --weights deit_small.safetensors --data ~/my-images --probe"):
        "CI time: a DeiT-Small at 224 on the CPU",
    (RMV, "edge analyze fmnist-deit-tiny --data fmnist --samples 500 --entropy --nose 4 --out runs/entropy"):
        "CI time: a third analyze (two run in other guides; tests/edge/analysis/test_entropy.py covers --entropy "
        "and --nose)",
    (RMV, "edge compress fmnist-deit-tiny --plan attnrm:auto=4:init=affine --out runs/rm4-affine"):
        "CI time: the NOSE search again (the identity command above runs it; tests/edge/compress covers affine)",
    ("docs/block-approximation.md", "edge compress fmnist-deit-tiny --plan auto-linear:3 --out runs/auto3"):
        "CI time: the planner fits 33 candidates (tests/edge/compress covers it on a tiny model)",
    (FT, "edge finetune runs/dw6 --train replaced --alpha 0.2 --out runs/dw6-ft-replaced"):
        "CI time: a second finetune (the train=all one runs)",
    (FT, "edge compress fmnist-deit-tiny --plan dwconv:auto=6 --finetune-epochs 1 --out runs/dw6-tuned"):
        "CI time: compress then finetune, both run on their own at the top of this guide",
    (PLAN, "edge profile fmnist-deit-tiny --latency-table tables/cpu-b1.json --threads 2 --iterations 100"): _TABLE,
    (PLAN, "edge plan fmnist-deit-tiny --budget 0.5x --table tables/cpu-b1.json --data fmnist --out runs/plan2x"):
        _PLAN,
    (PLAN, "edge finetune runs/plan2x/model --data fmnist --epochs 3 --out runs/plan2x-ft"): _PLANNED,
    # README.md's tour starts from that plan: the same commands, then the path to a bundle.
    (RM, "edge profile fmnist-deit-tiny --latency-table tables/cpu-b1.json --threads 2 --iterations 100"): _TABLE,
    (RM, "edge plan fmnist-deit-tiny --budget 0.5x --table tables/cpu-b1.json --data fmnist --out runs/plan2x"):
        _PLAN,
    (RM, "edge finetune runs/plan2x/model --data fmnist --epochs 3 --out runs/plan2x-ft"): _PLANNED,
    (RM, "edge export runs/plan2x-ft --out runs/plan2x.onnx"): _PLANNED,
    (RM, "edge clean runs/plan2x.onnx --out runs/plan2x.clean.onnx"): _PLANNED,
    (RM, "edge quantize runs/plan2x.clean.onnx --precision int8 --data fmnist --samples 500 "
     "--out runs/plan2x.int8.onnx"): _PLANNED,
    (RM, "edge eval runs/plan2x.int8.onnx --data fmnist"): _PLANNED,
    (RM, "edge bundle runs/plan2x.clean.onnx --out bundles/plan2x --precision fp32,fp16 --tar"): _PLANNED,
    ("docs/width-compression.md", "edge finetune runs/wfull --data fmnist --piad --piad-target 0.75 --epochs 3 "
     "--piad-epochs 2 --piad-samples 256 --out runs/wsuper"):
        "CI time: a PIAD fine-tune, 97 s in a clean run (tests/edge/compress/test_piad.py covers PIAD)",
    ("docs/width-compression.md", "edge compress runs/wsuper --plan wpac:macs=0.5 --out runs/w-macs50"):
        "CI time: needs the PIAD super-network above (slow)",
}

# Files a user would bring get small stand-ins made by the test: token in a command -> maker(path).
# STAND_INS and REWRITES apply wherever they match, in any file; each is checked to match some command.
def _random_deit_small_weights(path: Path) -> None:
    """The random weights of timm:deit_small_patch16_224 as safetensors (the user's pretrained file)."""
    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    save_safetensors(create_model("timm:deit_small_patch16_224").state_dict(), path)


def _pruned_weights(path: Path) -> None:
    """Seeded weights of fmnist-deit-tiny narrowed to embed 144 (a peer tool's uniformly pruned model)."""
    import torch

    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    torch.manual_seed(0)
    model = create_model("fmnist-deit-tiny,embed_dim=144", pretrained_weights=False)
    save_safetensors({k: v.float() for k, v in model.state_dict().items()}, path)


def _image_folder(path: Path) -> None:
    """An ImageFolder with train/ and val/ splits of 2 classes x 2 random RGB PNGs of 64 x 64 (the user's images)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in ("cat", "dog"):
            (path / split / label).mkdir(parents=True)
            for i in range(2):
                image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
                Image.fromarray(image).save(path / split / label / f"{i}.png")


def _foreign_vit(path: Path) -> None:
    """A small timm ViT exported by torch.onnx, not by edge export (the user's own graph; docs/precision.md)."""
    from tests.edge.test_foreign_graphs import export_timm_vit

    export_timm_vit(path)


STAND_INS = {
    "deit_small.safetensors": _random_deit_small_weights,
    "their_vit.onnx": _foreign_vit,
    "~/my-images": _image_folder,
    "pruned.safetensors": _pruned_weights,
}


@dataclass(frozen=True)
class Rewrite:
    """A substitution on the command text that makes a command small and keeps its meaning."""

    verbs: tuple[str, ...]      # the edge verbs it applies to
    pattern: str                # regular expression on the command text
    replacement: str
    why: str


# The data the commands run on: Fashion-MNIST as a folder of IDX files (a form --data accepts),
# 50 training and 10 test images per class drawn from the shipped fmnist-mini; made by the test.
SMALL_FMNIST = "fmnist-500"
SMALL_FMNIST_PER_CLASS = {"train": 50, "test": 10}

REWRITES = (
    Rewrite(("train", "eval", "analyze", "compress", "finetune", "quantize", "pipeline", "plan"),
            r"--data fmnist(?= |$)",
            f"--data {SMALL_FMNIST}", "Fashion-MNIST, 500 training and 100 test images instead of 60,000 and 10,000"),
    Rewrite(("train", "analyze", "compress", "finetune"), r"^(?!.* --data )(.*)$", rf"\1 --data {SMALL_FMNIST}",
            "the default data (fmnist) made explicit, as the small set above"),
    Rewrite(("pipeline",), r"^(?!.* --data |.*--print-recipe)(.*)$", rf"\1 --data {SMALL_FMNIST}",
            "the recipe's data (fmnist) overridden by the small set above (the verb's own --data)"),
    Rewrite(("analyze", "quantize"), r"--samples 500(?= |$)", "--samples 64", "64 calibration images, not 500"),
    Rewrite(("compress",), r"^(?!.* --samples )(.*)$", r"\1 --samples 64",
            "64 calibration images, not the default 500"),
    Rewrite(("quantize",), r"^(?!.* --samples )(.*)$", r"\1 --samples 64",
            "64 images for the FP16 range check, not the default 500"),
    Rewrite(("quantize",), r"^(?!.* --gate-images )(.*)$", r"\1 --gate-images 100",
            "the accuracy gate on 100 test images, not the default 500"),
    Rewrite(("plan",), r"^(?!.* --samples )(.*)$", r"\1 --samples 64 --holdout 64",
            "64 calibration and 64 held-out images, not 512 each (the small set has 500 training images)"),
    Rewrite(("train", "finetune"), r"^(?!.*--dilute)(.*)$", r"\1 --max-steps 1",
            "the same schedule, stopped after its first step (the verb's own --max-steps)"),
    Rewrite(("finetune",), r"^(.*--dilute.*)$", r"\1 --steps 2",
            "a whole 2-step schedule: dilution writes only its final (M = 0) model, so it cannot stop early"),
    Rewrite(("profile",), r"--iterations \d+", "--iterations 20", "20 timed iterations"),
)


def rewrite(command: Command) -> str:
    """The command text the test runs."""
    text = command.text
    verb = command.argv[1]
    for r in REWRITES:
        if verb in r.verbs:
            text = re.sub(r.pattern, r.replacement, text)
    return text


def _tensorrt_and_gpu() -> str | None:
    """Why the TensorRT commands cannot run here, or None."""
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT is not installed"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU"


def skip_reason(command: Command) -> str | None:
    if command.key in EXCLUDED:
        return f"excluded: {EXCLUDED[command.key]}"
    if command.key in NEEDS_HARDWARE:
        missing = _tensorrt_and_gpu()
        return f"{NEEDS_HARDWARE[command.key]}, which needs TensorRT and a CUDA GPU: {missing}" if missing else None
    return None


# --- which commands need which, and what a guide uses ---------------------------------------------

@functools.cache
def _writing_options() -> dict[str, frozenset[str]]:
    """Per verb, the options whose value the CLI declares as a file or folder to write (``--out``,
    ``edge profile --latency-table``, ``edge build --timing-cache``, ...)."""
    from edge.cli.options import OutputFile, OutputFolder

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {verb: frozenset(o for a in sub._actions if isinstance(a.type, (OutputFile, OutputFolder))
                            for o in a.option_strings)
            for verb, sub in verbs.items()}


def written_paths(command: Command) -> set[str]:
    """What a command writes: its ``--out`` (and ``--out``.tar.gz with ``--tar``), any other option its verb
    declares as a file or folder to write, and the file its stdout is sent to."""
    argv = command.argv
    writing = {"--out", *_writing_options().get(argv[1], ())} if command.is_edge and len(argv) > 1 else {"--out"}
    written = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in writing or a == ">"}
    if "--tar" in argv and "--out" in argv[:-1]:
        written.add(argv[argv.index("--out") + 1] + ".tar.gz")
    return written


def _names(command: Command, path: str) -> bool:
    return any(t == path or t.startswith(path + "/") for t in command.argv)


#: how the name of a file a command reads ends (a token without a "/" is a path only with one of these)
FILE_SUFFIXES = (".onnx", ".json", ".yaml", ".yml", ".safetensors", ".pt", ".pth", ".bin", ".engine", ".cache",
                 ".gz", ".tar", ".txt", ".csv")


def used_paths(command: Command) -> list[str]:
    """The paths in the working folder a command names: arguments and option values with a ``/`` or a file
    suffix, other than what it writes itself, its verb, model and plan specifications (``timm:...``,
    ``linear:9-10``), the reader's own files under ``~`` and the stand-ins the test makes."""
    written = written_paths(command)
    paths = []
    for token in command.argv[2:]:
        if token.startswith(("-", "~", "/")) or ":" in token or "=" in token or token in STAND_INS:
            continue
        if ("/" in token or token.endswith(FILE_SUFFIXES)) and not any(
                token == w or token.startswith(w + "/") for w in written):
            paths.append(token)
    return paths


def unmade_paths(commands: list[Command], index: int) -> list[str]:
    """The paths command ``index`` uses that no earlier command of its own file writes: a guide runs on its
    own, so it must make them itself."""
    command = commands[index]
    made = {p for other in commands[:index] if other.file == command.file for p in written_paths(other)}
    return [p for p in used_paths(command) if not any(p == m or p.startswith(m + "/") for m in made)]


def unmade_message(commands: list[Command], index: int) -> str:
    """What is wrong with command ``index`` using paths its guide does not make, and where they are made."""
    command = commands[index]
    lines = []
    for path in unmade_paths(commands, index):
        elsewhere = sorted({other.file for other in commands if other.file != command.file
                            and any(path == w or path.startswith(w + "/") for w in written_paths(other))})
        lines.append(f"{command.file} uses {path}, which no earlier command of {command.file} makes"
                     + (f" (made in {', '.join(elsewhere)})" if elsewhere else ""))
    return (f"{command.file} line {command.line}: `{command.text}`\n" + "\n".join(lines)
            + "\nEach guide runs on its own in a fresh folder: give it, before this line, the short command that "
              "makes the path (e.g. the cheapest `edge compress` or `edge export` of the bundled model).")


def direct_needs(commands: list[Command], index: int) -> list[int]:
    """The earlier commands of the same file that wrote a path command ``index`` names, or a path inside one.

    A command of the same text is the same run, never its own need, and an EXCLUDED command never runs, so
    it is no need.
    """
    command = commands[index]
    return [i for i, other in enumerate(commands[:index])
            if other.file == command.file and other.text != command.text and other.key not in EXCLUDED
            and any(_names(command, p) for p in written_paths(other))]


def needs(commands: list[Command], index: int) -> list[int]:
    """Every command that command ``index`` needs, directly or through another, each after its own needs.

    A command written twice in the file is listed once.
    """
    order: list[int] = []

    def visit(i: int) -> None:
        for j in direct_needs(commands, i):
            if commands[j].text not in {commands[k].text for k in order}:   # the same command runs once
                visit(j)
                order.append(j)

    visit(index)
    return order


# --- running them ------------------------------------------------------------------------------

def _argv_and_redirect(text: str, home: Path) -> tuple[list[str], str | None]:
    """``edge ...`` -> ``python -m edge ...``, ``~`` expanded as the shell would; ``> FILE`` split off."""
    argv = shlex.split(text)
    redirect = None
    if ">" in argv:
        at = argv.index(">")
        assert at == len(argv) - 2, f"only `COMMAND > FILE` is understood: {text}"
        argv, redirect = argv[:at], argv[at + 1]
    shell = {"|", "||", "&&", ";", "<", ">>", "&"}
    assert not shell & set(argv), f"a documented command the test cannot run without a shell: {text}"
    argv = [str(home) + a[1:] if a == "~" or a.startswith("~/") else a for a in argv]
    return [sys.executable, "-m", "edge", *argv[1:]], redirect


@dataclass
class Outcome:
    command: Command
    ran: str                            # the rewritten command text
    result: subprocess.CompletedProcess

    def explain(self) -> str:
        return (f"{self.command.file} line {self.command.line}: {self.command.text}\nran: {self.ran}\n"
                f"exit {self.result.returncode}\n--- stderr (end) ---\n{self.result.stderr[-3000:]}\n"
                f"--- stdout (end) ---\n{self.result.stdout[-1500:]}")


class StandIns:
    """The files a reader brings (STAND_INS) and the small data set, each made once for the module and copied
    into the folders of the files that use them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _made(self, name: str, make) -> Path:
        path = self.root / name.removeprefix("~/")
        if not path.exists():
            make(path)
        return path

    def copy(self, token: str, cwd: Path, home: Path) -> None:
        source = self._made(token, STAND_INS[token])
        target = home / token[2:] if token.startswith("~/") else cwd / token
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)

    def copy_small_fmnist(self, cwd: Path) -> None:
        shutil.copytree(self._made(SMALL_FMNIST, _make_small_fmnist), cwd / SMALL_FMNIST)


def _make_small_fmnist(folder: Path) -> None:
    """SMALL_FMNIST_PER_CLASS images of each class of fmnist-mini, class-balanced and seeded, as IDX files."""
    from edge.data import load_dataset
    from edge.data.fmnist import SPLITS
    from edge.data.idx import write_idx
    from edge.data.sampler import balanced_indices

    folder.mkdir(parents=True)
    for split, per_class in SMALL_FMNIST_PER_CLASS.items():
        data = load_dataset("fmnist-mini", split)
        index = balanced_indices(data.labels, per_class * data.num_classes, seed=0).sort().values
        write_idx(folder / f"{SPLITS[split]}-images-idx3-ubyte.gz", data.images[index].numpy())
        write_idx(folder / f"{SPLITS[split]}-labels-idx1-ubyte.gz", data.labels[index].numpy().astype("uint8"))


class DocSession:
    """The working folder of one file (README.md or a guide), made fresh for it; each command runs there once."""

    def __init__(self, root: Path, file: str, stand_ins: StandIns) -> None:
        self.file = file
        self.cwd = root / "work"
        self.home = root / "home"
        self.cwd.mkdir()
        self.home.mkdir()
        # This checkout's edge; a private $HOME (stand-ins, calibration cache). OpenMP threads that
        # wait sleep instead of spinning: on a shared CPU, spinning made the planner 4x slower
        # (auto-linear:3: 153 s against 36 s wall beside one busy process); results do not change.
        self.env = {**os.environ, "EDGE_NO_PROGRESS": "1", "HOME": str(self.home),
                    "XDG_CACHE_HOME": str(self.home / ".cache"), "OMP_WAIT_POLICY": "PASSIVE",
                    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.env.pop("EDGE_CACHE_DIR", None)
        self.outcomes: dict[str, Outcome] = {}      # by command text: a command written twice runs once
        tokens = {t for c in DOC_COMMANDS if c.file == file for t in c.argv}
        for token in sorted(tokens & set(STAND_INS)):
            stand_ins.copy(token, self.cwd, self.home)
        stand_ins.copy_small_fmnist(self.cwd)

    def outcome(self, index: int) -> Outcome:
        """The result of command ``index`` of DOC_COMMANDS, after the commands of its file it needs."""
        assert DOC_COMMANDS[index].file == self.file, (DOC_COMMANDS[index].file, self.file)
        for i in needs(DOC_COMMANDS, index):
            if skip_reason(DOC_COMMANDS[i]) is None:
                self._run(i)
        return self._run(index)

    def _run(self, index: int) -> Outcome:
        command = DOC_COMMANDS[index]
        if command.text not in self.outcomes:
            ran = rewrite(command)
            argv, redirect = _argv_and_redirect(ran, self.home)
            assert argv[:3] == [sys.executable, "-m", "edge"], argv
            result = run_edge(argv[3:], cwd=self.cwd, env=self.env, timeout=900)
            if redirect is not None:
                (self.cwd / redirect).write_text(result.stdout, encoding="utf-8")
            self.outcomes[command.text] = Outcome(command, ran, result)
        return self.outcomes[command.text]

    def failed_needs(self, index: int) -> str:
        failed = [DOC_COMMANDS[i].id for i in needs(DOC_COMMANDS, index)
                  if DOC_COMMANDS[i].text in self.outcomes
                  and self.outcomes[DOC_COMMANDS[i].text].result.returncode != 0]
        return f"\n(it needs documented commands of {self.file} that failed: {', '.join(failed)})" if failed else ""


class DocSessions:
    """One DocSession per file, made when its first command runs."""

    def __init__(self, tmp_path_factory) -> None:
        self.factory = tmp_path_factory
        self.stand_ins = StandIns(tmp_path_factory.mktemp("stand-ins"))
        self.by_file: dict[str, DocSession] = {}

    def of(self, file: str) -> DocSession:
        if file not in self.by_file:
            self.by_file[file] = DocSession(self.factory.mktemp(Path(file).stem), file, self.stand_ins)
        return self.by_file[file]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> DocSessions:
    return DocSessions(tmp_path_factory)


# Files the guides say a command's --out folder holds.
NAMED_OUTPUTS = {
    "train": ("model.safetensors", "card.json"),
    "analyze": ("analysis.json",),
    "compress": ("edge-model.json", "model.safetensors"),
    "finetune": ("edge-model.json", "model.safetensors"),
    "pipeline": ("report.json", "report.md", "report.html"),
    "bundle": ("manifest.json",),
}


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def check_outputs(outcome: Outcome, cwd: Path) -> None:
    argv = shlex.split(outcome.ran)
    verb = argv[1]
    if "--json" in argv:
        try:
            json.loads(outcome.result.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"--json printed no JSON ({e})\n{outcome.explain()}") from e
    if ">" in argv:
        assert (cwd / argv[-1]).stat().st_size > 0, f"{argv[-1]} is empty\n{outcome.explain()}"
    out = _option(argv, "--out")
    if out is None:
        return
    if verb == "build" and "--trtexec" in argv:
        from edge.trt.trtexec_command import find_trtexec

        if find_trtexec() is None:     # then it prints the equivalent command and writes nothing
            assert "trtexec --onnx=" in outcome.result.stdout, outcome.explain()
            return
    names = NAMED_OUTPUTS.get(verb, ())
    if verb == "analyze" and "--attention" in argv:
        names = (*names, "attention.json")
    assert (cwd / out).exists(), f"{out} was not written\n{outcome.explain()}"
    if out.endswith(".onnx"):
        check_tensorrt_rules(cwd / out, outcome)
    missing = [n for n in names if not (cwd / out / n).exists()]
    assert not missing, f"{out} lacks {missing}\n{outcome.explain()}"


def check_tensorrt_rules(graph: Path, outcome: Outcome) -> None:
    """A graph a documented command writes breaks none of the rules of TensorRT 10.3's and 10.16's ONNX parsers
    (edge.check.tensorrt_rules)."""
    from edge.check.tensorrt_rules import check_file

    for tensorrt in ("10.3", "10.16"):
        report = check_file(graph, tensorrt)
        broken = [f"[{f['rule']}] {f['node']}: {f['what']}" for f in report["findings"] if f["severity"] == "error"]
        assert not broken, f"{graph.name} breaks TensorRT {tensorrt}'s rules: {broken[:5]}\n{outcome.explain()}"


def _param(index: int, command: Command):
    marks = [pytest.mark.slow] if command.key in SLOW else []
    return pytest.param(index, id=command.id, marks=marks)


@pytest.mark.parametrize("index", [_param(i, c) for i, c in enumerate(DOC_COMMANDS)])
def test_documented_command(index, sessions):
    command = DOC_COMMANDS[index]
    reason = skip_reason(command)
    if reason:
        pytest.skip(f"{command.file}: {command.text}: {reason}")
    assert command.is_edge, (f"{command.file} line {command.line}: `{command.text}` is not an edge command; "
                             "add it to EXCLUDED")
    assert not unmade_paths(DOC_COMMANDS, index), unmade_message(DOC_COMMANDS, index)
    session = sessions.of(command.file)
    outcome = session.outcome(index)
    assert outcome.result.returncode == 0, outcome.explain() + session.failed_needs(index)
    check_outputs(outcome, session.cwd)


# --- the tables and the files agree ---------------------------------------------------------------

def test_every_documented_command_is_edge_or_excluded():
    assert any(c.file == README for c in DOC_COMMANDS), "no ```bash commands found in README.md"
    other = [f"{c.file} line {c.line}: {c.text}" for c in DOC_COMMANDS if not c.is_edge and c.key not in EXCLUDED]
    assert not other, f"documented commands this test cannot run: add them to EXCLUDED with the reason: {other}"


@pytest.mark.parametrize("table", ["EXCLUDED", "NEEDS_HARDWARE", "SLOW"])
def test_tables_name_real_commands_of_their_files(table):
    keys = {c.key for c in DOC_COMMANDS}
    stale = [k for k in globals()[table] if k not in keys]
    assert not stale, f"{table} names (file, command) pairs that are not in that file (any more): {stale}"


def test_stand_ins_and_rewrites_are_used():
    tokens = {t for c in DOC_COMMANDS for t in c.argv}
    assert set(STAND_INS) <= tokens, set(STAND_INS) - tokens
    for r in REWRITES:
        assert any(c.is_edge and c.argv[1] in r.verbs and re.search(r.pattern, c.text) for c in DOC_COMMANDS), \
            f"rewrite {r.pattern!r} -> {r.replacement!r} matches no documented command"


def test_rewrites_keep_the_verb_and_the_options():
    """A rewrite changes values or adds options; it never drops an option or changes the verb."""
    for command in DOC_COMMANDS:
        if not command.is_edge:
            continue
        before, after = command.argv, shlex.split(rewrite(command))
        assert after[:2] == before[:2], (command.text, after)
        options = [a for a in before if a.startswith("--")]
        assert all(o in after for o in options), (command.text, after)


def test_documented_verbs_exist():
    verbs = {c.__name__.rsplit(".", 1)[1].removesuffix("_cmd") for c in COMMANDS}
    unknown = [f"{c.file} line {c.line}: {c.text}" for c in DOC_COMMANDS if c.is_edge and c.argv[1] not in verbs]
    assert not unknown, f"documented commands whose verb is not in edge.cli.COMMANDS ({sorted(verbs)}): {unknown}"


@pytest.mark.parametrize("index", [pytest.param(i, id=c.id) for i, c in enumerate(DOC_COMMANDS) if c.is_edge])
def test_documented_command_parses(index, capsys):
    """Every documented edge command, skipped ones included, has options the CLI accepts.

    Paths are checked when the command line is parsed; an input that an earlier command of its file
    writes does not exist here, so "does not exist" is the one refusal accepted (the commands
    themselves run above, after the commands they need).
    """
    command = DOC_COMMANDS[index]
    argv, _ = _argv_and_redirect(command.text, Path.home())
    try:
        build_parser().parse_args(argv[3:])
    except SystemExit as e:
        err = capsys.readouterr().err
        if e.code == 2 and err.count("error:") == 1 and "does not exist" in err:
            return
        raise AssertionError(f"{command.file} line {command.line}: `{command.text}` does not parse (exit {e.code})"
                             f"\n{err}") from e


@pytest.mark.parametrize("file", DOC_FILES)
def test_each_guide_makes_what_it_uses(file):
    """A guide runs on its own in a fresh folder: every path its edge commands read, one of its own earlier
    commands writes (excluded commands too: a reader runs them)."""
    unmade = [unmade_message(DOC_COMMANDS, i) for i, c in enumerate(DOC_COMMANDS)
              if c.file == file and c.is_edge and unmade_paths(DOC_COMMANDS, i)]
    assert not unmade, "\n\n".join(unmade)


def test_default_commands_need_no_slow_command():
    """The default run stays short: a command it runs never pulls in one marked slow."""
    slow_texts = {text for _, text in SLOW}
    mixed = sorted({c.text for c in DOC_COMMANDS if c.text in slow_texts and c.key not in SLOW})
    assert not mixed, f"commands slow in one file and not in another (mark them in both): {mixed}"
    pulled = {c.id: [DOC_COMMANDS[i].id for i in needs(DOC_COMMANDS, n) if DOC_COMMANDS[i].key in SLOW]
              for n, c in enumerate(DOC_COMMANDS) if c.key not in SLOW and skip_reason(c) is None}
    pulled = {k: v for k, v in pulled.items() if v}
    assert not pulled, f"default commands that need slow ones (mark them slow too): {pulled}"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of the headings of a markdown text."""
    heads = [m.group(1) for m in re.finditer(r"^#+\s+(.*?)\s*$", text, flags=re.M)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("file", [*DOC_FILES, "docs/results/README.md"])
def test_links_resolve(file):
    """Every relative link of README.md and the guides names a file that exists, and a heading there."""
    text = (ROOT / file).read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (ROOT / file).parent / path if path else ROOT / file
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text(encoding="utf-8")):
            broken.append(target)
    assert not broken, f"{file}: links to files or headings that do not exist: {broken}"


def test_results_hold_no_commands():
    """docs/results/ holds measured tables that benchmarks/ write; commands to run belong in a guide, where they run."""
    with_commands = [p.name for p in sorted((ROOT / "docs" / "results").glob("*.md"))
                     if bash_commands(p.read_text(encoding="utf-8"), str(p))]
    assert not with_commands, f"docs/results files with ```bash blocks, which this test does not run: {with_commands}"


def test_readme_links_every_guide():
    """README.md is the front door: every guide in docs/ is linked from it."""
    readme = (ROOT / README).read_text(encoding="utf-8")
    unlinked = [f for f in DOC_FILES[1:] if f"({f})" not in readme and f"({f}#" not in readme]
    assert not unlinked, f"guides README.md does not link: {unlinked}"


def test_reader_joins_continuations_and_drops_comments():
    text = ("prose\n```bash\n# a comment line\nedge a --x 1 \\\n    --y '#not a comment'  # a comment\n\n"
            "edge b\n```\n```python\nedge c\n```\n```bash\nbash scripts/x.sh   # why\n```\n")
    assert bash_commands(text) == [Command(4, "edge a --x 1 --y '#not a comment'"), Command(7, "edge b"),
                                   Command(13, "bash scripts/x.sh")]


def test_needs_follows_written_paths():
    commands = bash_commands("\n".join([
        "```bash", "edge compress m --out runs/a", "edge info", "edge export runs/a --out runs/a.onnx",
        "edge pipeline --print-recipe > r.yaml", "edge clean runs/a.onnx --out runs/b.onnx",
        "edge train --init-weights runs/a/model.safetensors --out runs/t", "```"]))
    assert [needs(commands, i) for i in range(len(commands))] == [[], [], [0], [], [0, 2], [0]]


def test_needs_stay_within_a_file_and_a_path_made_elsewhere_is_named():
    readme = bash_commands("```bash\nedge clean runs/a.onnx --out runs/b.onnx\nedge compress m --out runs/a\n```",
                           README)
    guide = bash_commands("```bash\nedge compress m --out runs/a\nedge export runs/a --out runs/a.onnx\n"
                          "edge compress m --out runs/a\nedge eval runs/a.onnx\n```", "docs/guide.md")
    commands = readme + guide
    # README's clean reads runs/a.onnx, which only the guide writes: no need across files, and the path is named
    assert needs(commands, 0) == [] and unmade_paths(commands, 0) == ["runs/a.onnx"]
    message = unmade_message(commands, 0)
    assert "README.md uses runs/a.onnx" in message and "made in docs/guide.md" in message
    # a later command of the same file does not make it either
    assert unmade_paths(bash_commands("```bash\nedge export runs/a --out x.onnx\nedge compress m --out runs/a\n```",
                                      "docs/later.md"), 0) == ["runs/a"]
    # within the guide: the export needs the compress before it, and the eval the export (after its own need)
    assert needs(commands, 3) == [2] and unmade_paths(commands, 3) == []
    assert needs(commands, 5) == [2, 3] and unmade_paths(commands, 5) == []


def test_written_paths_come_from_the_cli():
    """Options the CLI declares as files to write count as written, as ``--out`` and ``> FILE`` do."""
    profile, plan, bundle = bash_commands(
        "```bash\nedge profile m --latency-table t/cpu.json\nedge plan m --budget 0.5x --table t/cpu.json --out p\n"
        "edge bundle x.onnx --out b/x --tar\n```")
    assert written_paths(profile) == {"t/cpu.json"}
    assert written_paths(bundle) == {"b/x", "b/x.tar.gz"}
    assert needs([profile, plan], 1) == [0] and unmade_paths([profile, plan], 1) == []
    assert used_paths(bundle) == ["x.onnx"]


def test_guides_run_elsewhere_are_run_there():
    """A guide left out of this test is run, command by command, by the test RUN_ELSEWHERE names."""
    for guide, runner in RUN_ELSEWHERE.items():
        test_file = ROOT / runner.split()[0]
        assert (ROOT / guide).is_file() and test_file.is_file()
        assert guide in test_file.read_text(encoding="utf-8"), f"{test_file} does not read {guide}"
        assert bash_commands((ROOT / guide).read_text(encoding="utf-8"), guide), f"{guide} has no commands"
