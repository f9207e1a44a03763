"""The reports' one writer: ``edge pipeline`` writes them (:func:`write_reports`) and ``edge deploy --report``
hands it the fetched device results (:func:`add_device_results`), rendered after the pipeline's own sections
(edge.pipeline.device_report).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from edge.errors import EdgeError
from edge.fileio import write_atomic, write_json_atomic
from edge.pipeline import device_report
from edge.pipeline.layout import REPORT
from edge.pipeline.report.html_page import html_report
from edge.pipeline.report.markdown import markdown


def write_reports(out: Path, report: dict) -> None:
    """report.json, report.md and report.html, each written atomically."""
    write_atomic(html_report(report, out).encode(), out / "report.html")
    write_atomic(markdown(report).encode(), out / "report.md")
    write_json_atomic(report, out / REPORT)


def add_device_results(run_dir: str | Path, fetched: Iterable[device_report.FetchedDevice]) -> Path:
    """The run's report with its device section (``device``) set to the ``fetched`` devices, written
    again (json, md, html); the report's path. ``edge pipeline`` run again writes it without one."""
    run_dir = Path(run_dir)
    path = run_dir / REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EdgeError(f"{path} cannot be read as JSON", found=f"{type(e).__name__}: {e}",
                        fix="run `edge pipeline` into the folder again") from e
    report["device"] = device_report.device_section(fetched, run_dir)
    write_reports(run_dir, report)
    return path
