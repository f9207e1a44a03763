"""The results ``edge deploy`` fetched into a folder, read back as data: one :class:`FetchedDevice` per
device folder (``OUT/LABEL/deploy.json`` and ``results/``). Every device folder counts, so deploying
to one device after another into the same folder gathers them all. Whoever reports them renders them
(``edge deploy --report`` hands them to the pipeline's report writer); edge.deploy renders nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edge.deploy.device_deploy import RECORD, RESULTS
from edge.deploy.untrusted import plain_result_file

RUN_SUMMARY = "run.json"  # results/run.json: the device runner's summary, naming each variant's result file


@dataclass(frozen=True)
class FetchedDevice:
    """One device folder: edge deploy's record, the runner's run summary (None when it wrote none) and
    its result per variant id (None where the file cannot be read)."""

    folder: Path
    record: dict
    run: dict | None
    results: dict[str, dict | None]


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _variant_results(results: Path, run: dict | None) -> dict[str, dict | None]:
    """Each variant's result; only plain file names inside ``results`` are read, never a link."""
    variants = (run or {}).get("variants") or {}
    return {i: _read_json(path) if (path := plain_result_file(results, e["result"])) else None
            for i, e in variants.items() if isinstance(e, dict) and e.get("result")}


def fetched_devices(folder: str | Path) -> list[FetchedDevice]:
    """Every device folder under ``folder`` with a readable record, by folder name."""
    fetched = []
    for record_path in sorted(Path(folder).glob(f"*/{RECORD}")):
        record = _read_json(record_path)
        if record is None:
            continue
        device = record_path.parent
        run = _read_json(device / RESULTS / RUN_SUMMARY)
        fetched.append(FetchedDevice(device, record, run, _variant_results(device / RESULTS, run)))
    return fetched
