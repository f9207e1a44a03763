"""Shared pieces of the CLI: help formatting, output, and the options many verbs take."""

from __future__ import annotations

import argparse
import json
import sys

from edge.errors import EdgeError


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the examples' line breaks and show defaults."""


def add_command(subparsers, name: str, summary: str, description: str, examples: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=f"{summary}\n\n{description}".strip(),
                                   epilog=f"examples:\n{examples}", formatter_class=HelpFormatter)
    parser.add_argument("--json", action="store_true", help="print a machine-readable result on stdout")
    return parser


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="fmnist-deit-tiny, timm:ARCH[,key=value...], or a compressed artifact")
    parser.add_argument("--weights", help="weights file (.safetensors, or a weights-only torch state dict)")
    add_img_size_option(parser)


def library_type(parse):
    """An argparse ``type`` from a library parser: its EdgeError becomes a usage error (exit 2, no traceback)."""
    def convert(text: str):
        try:
            return parse(text)
        except EdgeError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    return convert


def add_img_size_option(parser: argparse.ArgumentParser) -> None:
    """--img-size N or HxW, parsed by :func:`edge.models.parse_img_size`."""
    from edge.models import img_size

    parser.add_argument("--img-size", type=library_type(img_size.parse_img_size), metavar=img_size.METAVAR,
                        help=img_size.HELP)


def emit(result: dict, as_json: bool, human: str) -> None:
    if as_json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(human)


def add_calibration_options(parser: argparse.ArgumentParser, config: type) -> None:
    """--data / --samples / --seed / --threads: the calibration set every method draws.

    The defaults are those of ``config``, the library config of the step (e.g. ``CompressConfig``).
    """
    parser.add_argument("--data", default=config.data, help="calibration data: fmnist, fmnist-mini, or a folder")
    parser.add_argument("--samples", type=int, default=config.samples,
                        help="calibration samples (seeded, class-balanced)")
    parser.add_argument("--seed", type=int, default=config.seed)
    parser.add_argument("--threads", type=int, help="CPU threads")
