"""Shared pieces of the CLI: help formatting, output, and the options many verbs take.

Every option's value is checked when the command line is parsed, by its ``type`` (edge.cli.options):
numbers against the range of their library config field, paths for what must be there, so a bad value
ends with the verb's usage, one message and exit 2 before anything is loaded or written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from edge.cli.options import Data, Model, Number, OutputFile, OutputFolder, add_field, add_number
from edge.config import MAX_SEED, MAX_THREADS
from edge.errors import EdgeError


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keep the examples' line breaks; show each option's default once, where it has a value.

    No default is shown for flags (their help says what they turn on or off), for required options,
    for options whose default is None or empty (their help says what happens without them), or where
    the help states its default itself.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        notes = [action.type.limits.describe("N")] if isinstance(action.type, Number) else []
        if shows_default(action):
            notes.append("default: %(default)s")
        return (action.help or "") + (f" ({'; '.join(notes)})" if notes else "")


def states_default(text: str | None) -> bool:
    """Whether a help text states its default itself: ``(default: ...)`` or ``...; default: ...``."""
    return re.search(r"[(;] ?default\b", text or "") is not None


def shows_default(action: argparse.Action) -> bool:
    """Whether the help of ``action`` gets ``(default: ...)`` appended by :class:`HelpFormatter`."""
    return not (action.nargs == 0 or action.required or action.default in (None, argparse.SUPPRESS)
                or action.default in ([], ()) or states_default(action.help)
                or (not action.option_strings and action.nargs not in ("?", "*")))


def add_command(subparsers, name: str, summary: str, description: str, examples: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=f"{summary}\n\n{description}".strip(),
                                   epilog=f"examples:\n{examples}", formatter_class=HelpFormatter)
    parser.add_argument("--json", action="store_true", help="print a machine-readable result on stdout (only it)")
    parser.set_defaults(verb_parser=parser)  # edge.cli.main reports an unknown option with this verb's usage
    return parser


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Model(),
                        help="fmnist-deit-tiny, timm:ARCH[,key=value...], or a compressed artifact")
    add_weights_option(parser)
    add_img_size_option(parser)


def add_weights_option(parser: argparse.ArgumentParser, flag: str = "--weights",
                       help: str = "weights: a .safetensors file, a torch state dict (also under state_dict, model or "
                                   "state_dict_ema, names under module. or model.), or a hub snapshot folder "
                                   "(model.safetensors or pytorch_model.bin)") -> None:
    from edge.cli.options import ExistingPath

    parser.add_argument(flag, type=ExistingPath(), metavar="WEIGHTS", help=help)


def add_data_option(parser: argparse.ArgumentParser, default: str | None, help: str, flag: str = "--data") -> None:
    parser.add_argument(flag, type=Data(), default=default, metavar="DATA", help=help)


def add_device_option(parser: argparse.ArgumentParser, what: str, default: str = "auto", hint: str = "") -> None:
    """``--device``: where torch computes ``what`` (auto: a CUDA GPU when torch sees one, else the CPU)."""
    from edge.cli.options import Device

    parser.add_argument("--device", type=Device(hint=hint), default=default, help=f"where torch computes {what}: cpu, "
                        f"cuda[:N] or auto (a CUDA GPU when there is one; default: {default}). Fits and "
                        "statistics stay float64 on the CPU: the results match the CPU's to float32 rounding")


def add_out_file(parser: argparse.ArgumentParser, help: str, suffix: str | None = None) -> None:
    parser.add_argument("--out", required=True, type=OutputFile(suffix), metavar="FILE", help=help)


def add_out_folder(parser: argparse.ArgumentParser, help: str = "output folder", required: bool = True) -> None:
    parser.add_argument("--out", required=required, type=OutputFolder(), metavar="DIR", help=help)


def add_threads_option(parser: argparse.ArgumentParser, help: str = "CPU threads (default: torch's)",
                       config: type | None = None) -> None:
    if config is not None:
        add_field(parser, "--threads", config, help=help)
    else:
        add_number(parser, "--threads", int, help=help, minimum=1, maximum=MAX_THREADS)


def add_seed_option(parser: argparse.ArgumentParser, config: type | None = None, help: str = "random seed",
                    default: int = 0) -> None:
    if config is not None:
        add_field(parser, "--seed", config, help=help)
    else:
        add_number(parser, "--seed", int, help=help, default=default, minimum=0, maximum=MAX_SEED)


def library_type(parse):
    """An argparse ``type`` from a library parser: its EdgeError becomes a usage error (exit 2, no traceback)."""
    def convert(text: str):
        try:
            return parse(text)
        except EdgeError as e:
            raise argparse.ArgumentTypeError(" ".join(str(e).split())) from e

    return convert


def add_img_size_option(parser: argparse.ArgumentParser) -> None:
    """--img-size N or HxW, parsed by :func:`edge.models.parse_img_size`."""
    from edge.cli.options import Text
    from edge.models import img_size

    parser.add_argument("--img-size", type=Text(img_size.parse_img_size), metavar=img_size.METAVAR,
                        help=img_size.HELP)


def emit(result: dict, as_json: bool, human: str) -> None:
    """The result on stdout: JSON or the human lines; nothing from the other processes of a torchrun job."""
    from edge.progress import main_process

    if not main_process():
        return
    if as_json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(human)


def add_calibration_options(parser: argparse.ArgumentParser, config: type, samples_default: str | None = None) -> None:
    """--data / --samples / --seed / --threads: the calibration set every method draws.

    The defaults and ranges are those of ``config``, the library config of the step (e.g. ``CompressConfig``);
    ``samples_default`` says what a ``None`` default of ``samples`` resolves to.
    """
    add_data_option(parser, config.data, "calibration images: your folder (train/ and val/, one sub-folder per "
                                         "class), fmnist or fmnist-mini; default: a bundled model's own data set, "
                                         "any other model needs it")
    add_field(parser, "--samples", config, help="calibration samples (seeded, class-balanced"
              + (f"; default: {samples_default})" if samples_default else ")"))
    add_field(parser, "--seed", config, help="seed of the calibration sample")
    add_threads_option(parser)


__all__ = ["HelpFormatter", "Number", "add_calibration_options", "add_command", "add_data_option", "add_field",
           "add_img_size_option", "add_model_options", "add_number", "add_out_file", "add_out_folder",
           "add_seed_option", "add_threads_option", "add_weights_option", "emit", "library_type", "shows_default"]
