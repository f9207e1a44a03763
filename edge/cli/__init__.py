"""The ``edge`` command line: one verb per pipeline step, each a thin layer over one library call."""

from __future__ import annotations

import argparse
import sys
import traceback

from edge import __version__
from edge.cli import (
    analyze,
    build,
    bundle,
    check,
    clean,
    compress,
    deploy,
    export,
    info,
    models,
    pipeline,
    plan,
    profile,
    quantize,
    train,
    verify,
)
from edge.cli import eval as eval_cmd
from edge.cli import finetune as finetune_cmd
from edge.errors import PLEASE_REPORT, EdgeError, InternalError
from jetson.errors import JetsonError

COMMANDS = (info, models, train, eval_cmd, analyze, compress, finetune_cmd, plan, export, clean, verify, quantize, check,
            build, profile, pipeline, bundle, deploy)


def verb_of(command) -> str:
    """The verb a command module registers: its module's name (``edge.cli.eval`` -> ``eval``)."""
    return command.__name__.rsplit(".", 1)[-1]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given ``argv`` whose first word is a verb, only that verb's options are built:
    every verb's options read their defaults from the library, which imports torch and timm, and one verb needs
    only its own (a fresh ``edge deploy --help``: 3.6-4.5 s against 4.9-5.4 s here, three runs each; its --latency-table defaults still
    import torch). Anything else (``edge --help``, no verb, an unknown one) gets every verb, for the list and
    argparse's "invalid choice"."""
    parser = argparse.ArgumentParser(
        prog="edge", description="Make Vision Transformers fast on NVIDIA Jetson Orin Nano.",
        epilog="run `edge COMMAND --help` for a command's options and examples")
    parser.add_argument("--version", action="version", version=f"edge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    first = argv[0] if argv else None
    chosen = [c for c in COMMANDS if verb_of(c) == first]
    for command in chosen or COMMANDS:
        command.register(subparsers)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line; an unknown option is reported with the usage of the verb it was given to.

    Every value is checked here by its option's type (:mod:`edge.cli.options`): a bad one exits 2
    before anything is loaded or written.
    """
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "verb_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status: 0 done, 1 a verification that disagrees (edge verify, edge
    pipeline), 2 bad input (:class:`EdgeError`, or a bad command line: argparse's usage message), 3 a
    bug in edge, 130 interrupted. ``--help`` returns 0 (argparse's SystemExit becomes the status).

    A bug is an :class:`InternalError` (a broken invariant, its message says which) or any other
    exception edge did not raise on purpose: the latter's traceback is printed too, since the
    report needs it. Both end with a line asking for a report.
    """
    try:
        args = parse_args(build_parser(sys.argv[1:] if argv is None else argv), argv)
    except SystemExit as e:  # --help, --version (0) and bad usage (2, the message printed): its status
        return e.code if isinstance(e.code, int) else 2
    finished = False   # the verb returned on this process: every process can meet at the final barrier
    try:
        status = int(args.run(args) or 0)
        finished = True
    except EdgeError as e:
        print(f"edge {args.command}: error: {e}", file=sys.stderr)
        status = e.exit_code
    except JetsonError as e:  # the device-side code edge shares (jetson/) reports bad input its own way
        print(f"edge {args.command}: error: {e}", file=sys.stderr)
        status = EdgeError.exit_code
    except KeyboardInterrupt:
        print(f"edge {args.command}: interrupted", file=sys.stderr)
        status = 130
    except InternalError as e:
        _report_bug(args.command, str(e))
        status = e.exit_code
    except Exception as e:  # noqa: BLE001 - not swallowed: printed with its traceback, exit 3
        traceback.print_exc()
        _report_bug(args.command, f"{type(e).__name__}: {e}")
        status = InternalError.exit_code
    finally:
        from edge import distributed
        from edge.check.compare import log_ort_messages

        log_ort_messages(f"edge {args.command}")  # ONNX Runtime's notes: to a log file, with their count
        several = distributed.shutdown(synchronise=finished)  # under torchrun: all leave the group together
    if several:   # one of torchrun's processes: end it without a finalisation that can abort it
        distributed.end_process(status)
    return status


def _report_bug(command: str, message: str) -> None:
    print(f"edge {command}: internal error: {message}", file=sys.stderr)
    print(f"edge {command}: {PLEASE_REPORT}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
