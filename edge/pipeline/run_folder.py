"""What a pipeline run folder (``edge pipeline --out``) offers the steps after the pipeline: the graph
of each variant to deploy, and where the results of the devices it was deployed to go.

The steps after it (``edge bundle``, ``edge deploy``) know no run folder: the CLI asks this module
and hands them graphs and folders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from edge.errors import EdgeError
from edge.pipeline.layout import DEPLOYED, DEVICE_RESULTS, REPORT, VARIANTS, clean_name


class VariantGraph(NamedTuple):
    """A variant of a run, and its cleaned static-batch graph."""

    name: str
    path: Path


def _graphs_in_report(run: Path) -> list[VariantGraph]:
    report = run / REPORT
    try:
        variants = json.loads(report.read_text())["variants"]
        return [VariantGraph(v["name"], run / v["graphs"][DEPLOYED]["clean_file"]) for v in variants]
    except (ValueError, KeyError, TypeError) as e:
        raise EdgeError(f"{report} does not list the variants' graphs", found=f"{type(e).__name__}: {e}",
                        fix="rerun `edge pipeline` into this folder, or bundle the ONNX files themselves") from e


def _graphs_cleaned_so_far(run: Path) -> list[VariantGraph]:
    """An unfinished run: the graphs its clean step wrote, by variant name."""
    return [VariantGraph(p.parent.name, p) for p in sorted((run / VARIANTS).glob(f"*/{clean_name(DEPLOYED)}"))]


def deployed_graphs(run: str | Path) -> list[VariantGraph]:
    """The cleaned static-batch graph of every variant of the run ``run`` (report.json's order, else by
    name); an error when the run holds none or lists one that is missing."""
    run = Path(run)
    found = _graphs_in_report(run) if (run / REPORT).is_file() else _graphs_cleaned_so_far(run)
    if not found:
        raise EdgeError(f"{run} holds no cleaned graph", expected=f"a pipeline run folder ({VARIANTS}/NAME/"
                        f"{clean_name(DEPLOYED)}) or an .onnx file", fix="run `edge pipeline --out` into it first")
    missing = [g.path for g in found if not g.path.is_file()]
    if missing:
        raise EdgeError(f"the pipeline run {run} lists {missing[0]}, which does not exist",
                        fix="rerun `edge pipeline` to complete the run")
    return found


def device_results_folder(run: str | Path) -> Path:
    """Where the device results of the run ``run`` go (``RUN_DIR/device``); an error, before any device
    is reached, when the run has no report for them to join."""
    run = Path(run)
    if not (run / REPORT).is_file():
        raise EdgeError(f"--report {run} holds no {REPORT}", expected="the --out folder of `edge pipeline`",
                        fix="run `edge pipeline` first, or leave out --report")
    return run / DEVICE_RESULTS
