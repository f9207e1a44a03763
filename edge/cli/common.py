"""Shared pieces of the CLI: help formatting, output, and the options many verbs take."""

from __future__ import annotations

import argparse
import json
import sys


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
    parser.add_argument("--img-size", type=int, help="input size for the architecture (e.g. 224 for DINOv2)")


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
