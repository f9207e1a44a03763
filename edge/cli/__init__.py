"""The ``edge`` command line: one verb per pipeline step, each a thin layer over one library call."""

from __future__ import annotations

import argparse
import sys

from edge import __version__
from edge.cli import analyze, build, clean, compress, export, info, models, pipeline, profile, quantize, train, verify
from edge.cli import eval as eval_cmd
from edge.cli import finetune as finetune_cmd
from edge.errors import EdgeError

COMMANDS = (info, models, train, eval_cmd, analyze, compress, finetune_cmd, export, clean, verify, quantize, build,
            profile, pipeline)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge", description="Make Vision Transformers fast on NVIDIA Jetson Orin Nano.",
        epilog="run `edge COMMAND --help` for a command's options and examples")
    parser.add_argument("--version", action="version", version=f"edge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except EdgeError as e:
        print(f"edge {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"edge {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
