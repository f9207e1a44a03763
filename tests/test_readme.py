"""README.md's commands run as tests, so the README cannot drift from the code.

Every ```bash block of README.md is read into commands (``\\`` continuations joined, comments
dropped). Each ``edge ...`` command runs for real, in README order, through the real CLI in a
fresh interpreter (``python -m edge``), in one temporary working folder shared by the module
(later commands use what earlier ones wrote: ``runs/linear-9-10`` is compressed, then exported).
To keep it small, the command text goes through REWRITES, a table of substitutions that keep
the verb and its meaning (smaller data, fewer samples, fewer steps); the rewritten command is
printed in every failure. Files a user would bring get stand-ins (STAND_INS). Commands that
cannot run inside the suite are named, with the reason, in EXCLUDED, NEEDS_HARDWARE and SLOW;
each of those tables is checked to name only commands that are really in README.md.

A test asks for its command's result; the earlier commands that wrote a path it names (its
``--out`` or ``> FILE``) run first, once per module, so ``-k`` selects a single command and
still works.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


# --- reading README.md ------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """One command of a README ```bash block."""

    line: int       # README line it starts on
    text: str       # as written: continuations joined, comment dropped, spaces collapsed

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def is_edge(self) -> bool:
        return self.argv[0] == "edge"

    @property
    def id(self) -> str:
        argv = self.argv
        return f"L{self.line}-{argv[0]}-{argv[1] if len(argv) > 1 else ''}".rstrip("-")


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


def readme_commands(text: str) -> list[Command]:
    """The commands of every ```bash block of ``text``, in order."""
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
            commands.append(Command(start, command))
    return commands


COMMANDS_IN_README = readme_commands(README.read_text(encoding="utf-8"))


# --- what runs, what does not, and why --------------------------------------------------------

# The top-level commands are not run inside the suite.
EXCLUDED = {
    "bash scripts/main.sh": "the main job: set-up, then the full built-in pipeline (minutes); its steps run below",
    "bash scripts/test.sh": "the test command: it runs this suite, which cannot run itself",
    "torchrun --nproc_per_node 8 -m edge finetune runs/rm4 --data ~/imagenet --dilute --epochs 30 --batch-size 1024 "
    "--out runs/rm4-dil": "8 GPUs and ImageNet; tests/edge/test_distributed.py runs edge finetune (and --dilute) "
                          "under torchrun --nproc_per_node 2 on the CPU",
    "torchrun --nproc_per_node 8 -m edge compress timm:deit_small_patch16_224 --weights deit_small.safetensors "
    "--plan dwconv:auto=6:init=lsq --data ~/imagenet --samples 50000 --out runs/deit-dw6":
        "8 processes on ImageNet; tests/edge/test_distributed.py runs edge compress and every calibration "
        "statistic under torchrun --nproc_per_node 2 on the CPU",
}

# Commands that need TensorRT and a CUDA GPU (the Jetson); they run where both are present.
NEEDS_HARDWARE = {
    "edge build runs/m.fp16.onnx --precision fp16 --out runs/m.fp16.engine --timing-cache runs/orin.cache":
        "builds a TensorRT engine",
    "edge profile runs/m.fp16.engine --json": "times that engine with TensorRT and CUDA events",
}

# Commands that take minutes even on small data; run with `-m slow`.
SLOW = {
    "edge pipeline --out runs/pipeline":
        "the built-in recipe (4 variants, 500 calibration images, analysis, 300 profile iterations each) has no "
        "option to shrink it: about 100 s on 2 cores even on the small data set",
    "edge pipeline --recipe recipe.yaml --out runs/mine --json": "the built-in recipe again, in a new folder",
    "edge pipeline --out runs/pipeline --redo profile": "needs the built-in recipe's run (see above)",
    # CI must finish in 20 minutes on 2 cores; these repeat a verb another README command already runs
    # by default, and each costs 20-90 s there (measured in a clean-clone run): they run with -m slow.
    "edge train fmnist-deit-tiny --init-weights runs/stage1/model.safetensors --data fmnist --epochs 12 --lr 5e-4 "
    "--warmup-steps 200 --label-smoothing 0 --seed 1 --out runs/stage2": "CI time: a second train (stage 1 runs)",
    "edge train fmnist-deit-tiny --init-weights runs/stage2/model.safetensors --data fmnist --epochs 3 --lr 1e-4 "
    "--warmup-steps 50 --label-smoothing 0 --seed 2 --out runs/stage3": "CI time: a third train (stage 1 runs)",
    "edge train fmnist-deit-tiny --data fmnist --epochs 10 --seed 0 --out runs/fmnist-deit-tiny":
        "CI time: stage 1's command again, in another folder",
    "edge eval fmnist-deit-tiny --data fmnist-mini": "CI time: 2,000 images (the full-data eval runs on the small set)",
    "edge eval timm:deit_small_patch16_224 --weights deit_small.safetensors --data ~/my-images":
        "CI time: a DeiT-Small at 224 on the CPU",
    "edge analyze fmnist-deit-tiny --data fmnist --samples 500 --entropy --nose 4 --out runs/entropy":
        "CI time: a third analyze (two run above; tests/edge/analysis/test_entropy.py covers --entropy and --nose)",
    "edge compress fmnist-deit-tiny --plan attnrm:auto=4:init=affine --out runs/rm4-affine":
        "CI time: the NOSE search again (the identity command above runs it; tests/edge/compress covers affine)",
    "edge compress fmnist-deit-tiny --plan auto-linear:3 --out runs/auto3":
        "CI time: the planner fits 33 candidates (tests/edge/compress covers it on a tiny model)",
    "edge finetune runs/dw6 --train replaced --alpha 0.2 --out runs/dw6-ft-replaced":
        "CI time: a second finetune (the train=all one runs)",
    "edge compress fmnist-deit-tiny --plan dwconv:auto=6 --finetune-epochs 1 --out runs/dw6-tuned":
        "CI time: compress then finetune, both run on their own above",
    "edge profile fmnist-deit-tiny --latency-table tables/cpu-b1.json --threads 2 --iterations 100":
        "CI time: 55 part graphs exported and timed (tests/edge/latency covers tables on a tiny model)",
    "edge plan fmnist-deit-tiny --budget 0.5x --table tables/cpu-b1.json --data fmnist --out runs/plan2x":
        "CI time: the search measures about 150 plans of the 12-block model (tests/edge/plan runs it on a "
        "4-block model)",
    "edge finetune runs/plan2x/model --data fmnist --epochs 3 --out runs/plan2x-ft":
        "CI time: needs the plan above; edge finetune of an artifact runs above",
}

# Files a user would bring get small stand-ins made by the test: README token -> maker(path).
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
    """An ImageFolder of 2 classes x 2 random RGB PNGs of 64 x 64 (the user's own images)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (path / label).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path / label / f"{i}.png")


STAND_INS = {
    "deit_small.safetensors": _random_deit_small_weights,
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
    Rewrite(("train", "eval", "analyze", "compress", "finetune", "quantize", "pipeline"), r"--data fmnist(?= |$)",
            f"--data {SMALL_FMNIST}", "Fashion-MNIST, 500 training and 100 test images instead of 60,000 and 10,000"),
    Rewrite(("train", "analyze", "compress", "finetune"), r"^(?!.* --data )(.*)$", rf"\1 --data {SMALL_FMNIST}",
            "the default data (fmnist) made explicit, as the small set above"),
    Rewrite(("pipeline",), r"^(?!.* --data |.*--print-recipe)(.*)$", rf"\1 --data {SMALL_FMNIST}",
            "the recipe's data (fmnist) overridden by the small set above (the verb's own --data)"),
    Rewrite(("analyze", "quantize"), r"--samples 500(?= |$)", "--samples 64", "64 calibration images, not 500"),
    Rewrite(("compress",), r"^(?!.* --samples )(.*)$", r"\1 --samples 64",
            "64 calibration images, not the default 500"),
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
    if command.text in EXCLUDED:
        return f"excluded: {EXCLUDED[command.text]}"
    if command.text in NEEDS_HARDWARE:
        missing = _tensorrt_and_gpu()
        return f"{NEEDS_HARDWARE[command.text]}, which needs TensorRT and a CUDA GPU: {missing}" if missing else None
    return None


# --- which commands need which ---------------------------------------------------------------

def written_paths(command: Command) -> set[str]:
    """What a command writes: its ``--out`` and the file its stdout is sent to."""
    argv = command.argv
    return {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--out", ">")}


def needs(commands: list[Command], index: int) -> list[int]:
    """The earlier commands that command ``index`` needs, directly or through another, in order.

    A command needs an earlier one when it names a path the earlier one wrote, or a path inside it.
    """
    wanted, frontier = set(), [index]
    while frontier:
        later = frontier.pop()
        tokens = commands[later].argv
        for i in range(later):
            if i not in wanted and any(t == p or t.startswith(p + "/") for p in written_paths(commands[i])
                                       for t in tokens):
                wanted.add(i)
                frontier.append(i)
    return sorted(wanted)


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
    assert not shell & set(argv), f"a README command the test cannot run without a shell: {text}"
    argv = [str(home) + a[1:] if a == "~" or a.startswith("~/") else a for a in argv]
    return [sys.executable, "-m", "edge", *argv[1:]], redirect


@dataclass
class Outcome:
    command: Command
    ran: str                            # the rewritten command text
    result: subprocess.CompletedProcess

    def explain(self) -> str:
        return (f"README.md line {self.command.line}: {self.command.text}\nran: {self.ran}\n"
                f"exit {self.result.returncode}\n--- stderr (end) ---\n{self.result.stderr[-3000:]}\n"
                f"--- stdout (end) ---\n{self.result.stdout[-1500:]}")


class ReadmeSession:
    """One working folder; the README commands run there once each, in README order."""

    def __init__(self, root: Path) -> None:
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
        self.outcomes: dict[int, Outcome] = {}
        self._make_stand_ins()

    def _make_stand_ins(self) -> None:
        for token, make in STAND_INS.items():
            make(self.home / token[2:] if token.startswith("~/") else self.cwd / token)
        self._make_small_fmnist()

    def _make_small_fmnist(self) -> None:
        from edge.data import load_dataset
        from edge.data.fmnist import SPLITS
        from edge.data.idx import write_idx
        from edge.data.sampler import balanced_indices

        folder = self.cwd / SMALL_FMNIST
        folder.mkdir()
        for split, per_class in SMALL_FMNIST_PER_CLASS.items():
            data = load_dataset("fmnist-mini", split)
            index = balanced_indices(data.labels, per_class * data.num_classes, seed=0).sort().values
            write_idx(folder / f"{SPLITS[split]}-images-idx3-ubyte.gz", data.images[index].numpy())
            write_idx(folder / f"{SPLITS[split]}-labels-idx1-ubyte.gz", data.labels[index].numpy().astype("uint8"))

    def outcome(self, index: int) -> Outcome:
        """The result of README command ``index``, after the earlier commands it needs."""
        for i in needs(COMMANDS_IN_README, index):
            if skip_reason(COMMANDS_IN_README[i]) is None:
                self._run(i)
        return self._run(index)

    def _run(self, index: int) -> Outcome:
        if index not in self.outcomes:
            command = COMMANDS_IN_README[index]
            ran = rewrite(command)
            argv, redirect = _argv_and_redirect(ran, self.home)
            result = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=900)
            if redirect is not None:
                (self.cwd / redirect).write_text(result.stdout, encoding="utf-8")
            self.outcomes[index] = Outcome(command, ran, result)
        return self.outcomes[index]

    def failed_needs(self, index: int) -> str:
        failed = [self.outcomes[i].command.id for i in needs(COMMANDS_IN_README, index)
                  if i in self.outcomes and self.outcomes[i].result.returncode != 0]
        return f"\n(it needs README commands that failed: {', '.join(failed)})" if failed else ""


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> ReadmeSession:
    return ReadmeSession(tmp_path_factory.mktemp("readme"))


# Files the README says a command's --out folder holds.
NAMED_OUTPUTS = {
    "train": ("model.safetensors", "card.json"),
    "analyze": ("analysis.json",),
    "compress": ("edge-model.json", "model.safetensors"),
    "finetune": ("edge-model.json", "model.safetensors"),
    "pipeline": ("report.json", "report.md", "report.html"),
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
    """A graph a README command writes breaks none of the rules of TensorRT 10.3's and 10.16's ONNX parsers
    (edge.graph.tensorrt_rules; issue 29, point 9)."""
    from edge.graph.tensorrt_rules import check_file

    for tensorrt in ("10.3", "10.16"):
        report = check_file(graph, tensorrt)
        broken = [f"[{f['rule']}] {f['node']}: {f['what']}" for f in report["findings"] if f["severity"] == "error"]
        assert not broken, f"{graph.name} breaks TensorRT {tensorrt}'s rules: {broken[:5]}\n{outcome.explain()}"


def _param(index: int, command: Command):
    marks = [pytest.mark.slow] if command.text in SLOW else []
    return pytest.param(index, id=command.id, marks=marks)


@pytest.mark.parametrize("index", [_param(i, c) for i, c in enumerate(COMMANDS_IN_README)])
def test_readme_command(index, session):
    command = COMMANDS_IN_README[index]
    reason = skip_reason(command)
    if reason:
        pytest.skip(f"{command.text}: {reason}")
    assert command.is_edge, f"line {command.line}: `{command.text}` is not an edge command; add it to EXCLUDED"
    outcome = session.outcome(index)
    assert outcome.result.returncode == 0, outcome.explain() + session.failed_needs(index)
    check_outputs(outcome, session.cwd)


# --- the tables and the README agree ------------------------------------------------------------

def test_every_readme_command_is_edge_or_excluded():
    assert COMMANDS_IN_README, "no ```bash commands found in README.md"
    other = [f"line {c.line}: {c.text}" for c in COMMANDS_IN_README if not c.is_edge and c.text not in EXCLUDED]
    assert not other, f"README commands this test cannot run: add them to EXCLUDED with the reason: {other}"


@pytest.mark.parametrize("table", ["EXCLUDED", "NEEDS_HARDWARE", "SLOW"])
def test_tables_name_real_readme_commands(table):
    texts = {c.text for c in COMMANDS_IN_README}
    stale = [t for t in globals()[table] if t not in texts]
    assert not stale, f"{table} names commands that are not in README.md (any more): {stale}"


def test_stand_ins_and_rewrites_are_used():
    tokens = {t for c in COMMANDS_IN_README for t in c.argv}
    assert set(STAND_INS) <= tokens, set(STAND_INS) - tokens
    for r in REWRITES:
        assert any(c.is_edge and c.argv[1] in r.verbs and re.search(r.pattern, c.text) for c in COMMANDS_IN_README), \
            f"rewrite {r.pattern!r} -> {r.replacement!r} matches no README command"


def test_rewrites_keep_the_verb_and_the_options():
    """A rewrite changes values or adds options; it never drops an option or changes the verb."""
    for command in COMMANDS_IN_README:
        if not command.is_edge:
            continue
        before, after = command.argv, shlex.split(rewrite(command))
        assert after[:2] == before[:2], (command.text, after)
        options = [a for a in before if a.startswith("--")]
        assert all(o in after for o in options), (command.text, after)


def test_readme_verbs_exist():
    verbs = {c.__name__.rsplit(".", 1)[1].removesuffix("_cmd") for c in COMMANDS}
    unknown = [f"line {c.line}: {c.text}" for c in COMMANDS_IN_README if c.is_edge and c.argv[1] not in verbs]
    assert not unknown, f"README commands whose verb is not in edge.cli.COMMANDS ({sorted(verbs)}): {unknown}"


@pytest.mark.parametrize("index", [pytest.param(i, id=c.id) for i, c in enumerate(COMMANDS_IN_README) if c.is_edge])
def test_readme_command_parses(index, capsys):
    """Every edge command of the README, skipped ones included, has options the CLI accepts.

    Paths are checked when the command line is parsed; an input that an earlier README command
    writes does not exist here, so "does not exist" is the one refusal accepted (the commands
    themselves run in README order above).
    """
    command = COMMANDS_IN_README[index]
    argv, _ = _argv_and_redirect(command.text, Path.home())
    try:
        build_parser().parse_args(argv[3:])
    except SystemExit as e:
        err = capsys.readouterr().err
        if e.code == 2 and err.count("error:") == 1 and "does not exist" in err:
            return
        raise AssertionError(f"README.md line {command.line}: `{command.text}` does not parse (exit {e.code})"
                             f"\n{err}") from e


def test_reader_joins_continuations_and_drops_comments():
    text = ("prose\n```bash\n# a comment line\nedge a --x 1 \\\n    --y '#not a comment'  # a comment\n\n"
            "edge b\n```\n```python\nedge c\n```\n```bash\nbash scripts/x.sh   # why\n```\n")
    assert readme_commands(text) == [Command(4, "edge a --x 1 --y '#not a comment'"), Command(7, "edge b"),
                                     Command(13, "bash scripts/x.sh")]


def test_needs_follows_written_paths():
    commands = readme_commands("\n".join([
        "```bash", "edge compress m --out runs/a", "edge info", "edge export runs/a --out runs/a.onnx",
        "edge pipeline --print-recipe > r.yaml", "edge clean runs/a.onnx --out runs/b.onnx",
        "edge train --init-weights runs/a/model.safetensors --out runs/t", "```"]))
    assert [needs(commands, i) for i in range(len(commands))] == [[], [], [0], [], [0, 2], [0]]
