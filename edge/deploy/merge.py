"""The device results of a pipeline run folder merged into its report: ``report.json`` gains
``device`` (edge.pipeline.device_report), ``report.md`` and ``report.html`` are rendered again with
the device section after the pipeline's own. Every device folder under ``RUN_DIR/device`` counts, so
deploying to one device after another builds up one section; ``edge pipeline`` run again rewrites
the report without it, and a deploy run again (its results are kept on the devices) puts it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edge.deploy.device_deploy import RECORD, RESULTS
from edge.errors import EdgeError
from edge.fileio import write_atomic, write_json_atomic
from edge.pipeline import device_report


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def device_entries(folder: Path, run_dir: Path) -> list[dict]:
    """One entry per device folder (``*/deploy.json``) under ``folder``, paths relative to ``run_dir``."""
    entries = []
    for record_path in sorted(folder.glob(f"*/{RECORD}")):
        record = _read(record_path)
        if record is None:
            continue
        device = record_path.parent
        run = _read(device / RESULTS / "run.json")
        results = {i: _read(device / RESULTS / e["result"]) for i, e in ((run or {}).get("variants") or {}).items()
                   if e.get("result")}
        entries.append(device_report.device_entry(record, run, results, os.path.relpath(device, run_dir)))
    return entries


def merge_report(run_dir: Path, device_folder: Path) -> str:
    """Add the device section to the run's report.json and render report.md and report.html again; the report's path."""
    from edge.pipeline.report import html_report, markdown

    path = run_dir / "report.json"
    report = _read(path)
    if report is None:
        raise EdgeError(f"{path} cannot be read as JSON", fix="run `edge pipeline` into the folder again")
    report["device"] = device_report.device_section(device_entries(device_folder, run_dir))
    pipeline_only = {k: v for k, v in report.items() if k != "device"}
    md = markdown(pipeline_only).rstrip("\n") + "\n\n" + "\n".join(device_report.device_markdown(report["device"]))
    page = html_report(pipeline_only, run_dir)
    head, tail = page.rsplit("</body>", 1)
    section = device_report.device_html(report["device"])
    write_atomic(f"{head}{section}\n</body>{tail}".encode(), run_dir / "report.html")
    write_atomic(md.encode(), run_dir / "report.md")
    write_json_atomic(report, path)
    return str(path)
