"""What every latency benchmark records about its run, and where it writes its JSON and markdown."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from edge.progress import log
from edge.runtime import hardware


def realisation(latency_c: float, latency_o: float, flops_c: float, flops_o: float) -> float:
    """The share of the FLOP saving that shows up as time: (1 - latency_c/latency_o) / (1 - flops_c/flops_o)."""
    return (1.0 - latency_c / latency_o) / (1.0 - flops_c / flops_o)


RECORDED = ("onnx", "onnxruntime", "onnx_graphsurgeon", "onnxslim", "onnxsim", "torch", "timm")


def in_fresh_process(function: Callable, *args, **kwargs):
    """``function(*args, **kwargs)`` in a newly spawned interpreter, its result returned here.

    For timing after training: a process that has just trained for an hour (torch's thread pools,
    a grown heap) timed the same ONNX graphs slower, and the smaller ones more so (issue 16: side by
    side realisation 0.87-0.91 there, 0.93-0.98 in fresh processes). ``function`` and its arguments
    must pickle (a module-level function, plain data and paths).
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args, **kwargs).result()


def versions() -> dict:
    """Versions of edge and of the packages a result depends on that are installed (absent ones are left out)."""
    from importlib import metadata

    from edge import __version__

    found = {"edge": __version__}
    for name in RECORDED:
        try:
            found[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            continue
    return found


def command_line(script: str, args: argparse.Namespace, parser: argparse.ArgumentParser,
                 skip: tuple[str, ...] = ()) -> str:
    """``python benchmarks/SCRIPT`` with every option of ``args`` that differs from its default."""
    parts = ["python", f"benchmarks/{script}"]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", *skip):
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if value is True:
            parts.append(flag)
        else:
            parts += [flag, *map(str, value if isinstance(value, list | tuple) else [value])]
    return shlex.join(parts)


def provenance(script: str, args: argparse.Namespace, parser: argparse.ArgumentParser, *, started: float,
               load_before: tuple[float, float, float], skip: tuple[str, ...] = ()) -> dict:
    """Versions, hardware, load average before/after, wall seconds since ``started`` and the command."""
    return {"versions": versions(), "hardware": hardware(),
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "seconds": round(time.perf_counter() - started, 1),
            "command": command_line(script, args, parser, skip)}


def read_results(parser: argparse.ArgumentParser, path: str | Path) -> dict:
    """For ``--render``: the record a benchmark wrote to ``path``; a missing file exits 2, naming it."""
    path = Path(path)
    if not path.is_file():
        parser.error(f"--render: {path} does not exist; run the benchmark first to measure its figures")
    return json.loads(path.read_text())


def write_results(record: dict, json_out: str | Path, md_out: str | Path, markdown: Callable[[dict], str]) -> None:
    for path, text in ((Path(json_out), json.dumps(record, indent=1) + "\n"), (Path(md_out), markdown(record))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    log(f"wrote {json_out} and {md_out}")
