"""What the host accepts from a device: nothing it sends back is trusted.

A device's results come back as a tar stream of ``results/``. Before anything is written here, every
member is checked: a relative name inside ``results/`` without a ``..`` part, a regular file or a
folder (a link, hard or symbolic, a device or a FIFO is refused), of a bounded size. Then the files
are unpacked into a fresh staging folder inside the device's own folder, and the JSON the host will
read is checked (:func:`check_results`): ``run.json`` an object of the runner's format whose
variants name their result files by plain names, each result file an object. Any refusal names the
member or file and leaves the device's folder as it was (the staging folder is removed).
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path, PurePosixPath

from edge.deploy.ssh import DeployError

REFUSED = "refused results"  # the DeployError kind: ``edge deploy`` exits 2 when a device's results are refused
RUN_SUMMARY = "run.json"
RUN_FORMAT, RESULT_FORMAT = "edge-jetson-run", "edge-jetson-result"
MAX_MEMBER_BYTES = 256 * 2**20  # a result or a log; a tegrastats log of an hour at 100 ms is about 2 MiB
RESULT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*\.json")


def refused(host: object, what: str, **parts: str | None) -> DeployError:
    return DeployError(REFUSED, f"{host}: {what}: refused, nothing of it was written", **parts)


def checked_members(archive: tarfile.TarFile, top: str, host: object) -> list[tarfile.TarInfo]:
    """Every member of ``archive``, each a file or folder named inside ``top/``; else a refusal naming it."""
    members = archive.getmembers()
    for member in members:
        name = member.name
        parts = PurePosixPath(name).parts
        if name.startswith("/") or ".." in parts or not parts or parts[0] != top or "\\" in name:
            raise refused(host, f"the device sent {name!r}, a name outside {top}/",
                          expected=f"relative names inside {top}/ without '..'",
                          fix="check the device: a runner of edge writes nothing else")
        if member.issym() or member.islnk():
            raise refused(host, f"the device sent {name!r} as a link to {member.linkname!r}",
                          expected="regular files and folders only (a link could read or write outside the run "
                                   "folder)", fix="check the device's results folder; remove the link and deploy again")
        if not (member.isfile() or member.isdir()):
            raise refused(host, f"the device sent {name!r}, which is neither a file nor a folder",
                          expected="regular files and folders only", fix="check the device's results folder")
        if member.size > MAX_MEMBER_BYTES:
            raise refused(host, f"the device sent {name!r} of {member.size:,} bytes",
                          expected=f"at most {MAX_MEMBER_BYTES:,} bytes per file", fix="check the device's results")
    return members


def _json_object(path: Path, relative: str, host: object) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise refused(host, f"{relative} is not valid JSON", found=str(e)[:200],
                      fix="look at the file on the device; deploy again to rerun the variant (--force on the runner)") \
            from e
    if not isinstance(value, dict):
        raise refused(host, f"{relative} is not a JSON object", found=type(value).__name__)
    return value


def check_results(folder: Path, host: object) -> None:
    """The JSON files the host reads in a staged ``results`` folder: ``run.json`` (when there is one) of the
    runner's format, its variants naming plain result file names, and every named file an object."""
    summary_path = folder / RUN_SUMMARY
    if not summary_path.exists():
        return  # a runner that refused its bundle may write none; its log says why
    summary = _json_object(summary_path, f"results/{RUN_SUMMARY}", host)
    if summary.get("format") != RUN_FORMAT:
        raise refused(host, f"results/{RUN_SUMMARY} is not a run summary of the device runner",
                      expected=f"format {RUN_FORMAT!r}", found=repr(summary.get("format"))[:100])
    variants = summary.get("variants")
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise refused(host, f"results/{RUN_SUMMARY}: 'variants' is not an object of objects",
                      found=type(variants).__name__)
    for variant_id, entry in variants.items():
        _expect_verdict(entry.get("accuracy"), f"results/{RUN_SUMMARY}: variants.{variant_id}.accuracy", host)
        name = entry.get("result")
        if name is None:
            continue
        if not isinstance(name, str) or not RESULT_NAME.fullmatch(name):
            raise refused(host, f"results/{RUN_SUMMARY} names {name!r} as the result of {variant_id!r}",
                          expected="a plain file name NAME.json inside results/ (no folder, no '..')")
        if (folder / name).exists():
            result = _json_object(folder / name, f"results/{name}", host)
            if result.get("format") != RESULT_FORMAT:
                raise refused(host, f"results/{name} is not a variant result of the device runner",
                              expected=f"format {RESULT_FORMAT!r}", found=repr(result.get("format"))[:100])
            check_fields(result, RESULT_FIELDS, f"results/{name}", host)
    check_fields(summary, RUN_FIELDS, f"results/{RUN_SUMMARY}", host)


NUMBER = (int, float)
TEXT = (str, type(None))
OBJECT = (dict, type(None))
#: what the host reads of the runner's files (edge.deploy, the pipeline's device report), by type; a field may
#: be absent, never of another type
RUN_FIELDS = {"error": TEXT, "device": OBJECT, "settings": OBJECT, "partial": (bool,), "exit_code": (int, type(None)),
              "backend": TEXT, "finished": TEXT}
RESULT_FIELDS = {"variant": TEXT, "precision": TEXT, "backend": TEXT, "partial": (bool,), "error": TEXT,
                 "latency": OBJECT, "gpu_latency": OBJECT, "power": OBJECT, "engine": OBJECT,
                 "peak_rss_mb": (int, float, type(None)), "device_memory": (int, float, dict, type(None)),
                 "accuracy": OBJECT}
LATENCY_FIELDS = ("iterations", "median_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "cv")
POWER_FIELDS = {"total_rail": TEXT, "rails": (dict,), "calls": (int,), "batch": (int,), "samples_timed": (int,),
                "reliable": (bool,), "unreliable": TEXT, "peak_ram_used_mb": NUMBER, "ram_total_mb": NUMBER,
                "tegrastats_log": TEXT}


def check_fields(data: dict, fields: dict[str, tuple], where: str, host: object) -> None:
    """Each of ``fields`` present in ``data`` of its type (a bool is no number), latency figures numbers and
    power rails objects of numbers; else a refusal naming the file and the field."""
    for name, types in fields.items():
        if name in data:
            _expect(data[name], types, f"{where}: {name}", host)
    for name in ("latency", "gpu_latency"):
        if isinstance(data.get(name), dict):
            for key in LATENCY_FIELDS:
                _expect(data[name].get(key), NUMBER + (type(None),), f"{where}: {name}.{key}", host)
    if isinstance(data.get("power"), dict):
        power = data["power"]
        for key, types in POWER_FIELDS.items():
            if key in power:
                _expect(power[key], types, f"{where}: power.{key}", host)
        for rail, figures in (power.get("rails") or {}).items():
            _expect(figures, (dict,), f"{where}: power.rails.{rail}", host)
            for key, value in figures.items():
                if key != "rail":
                    _expect(value, NUMBER + (type(None),), f"{where}: power.rails.{rail}.{key}", host)
    if isinstance(data.get("accuracy"), dict):
        check_accuracy(data["accuracy"], f"{where}: accuracy", host)


#: the accuracy gate's verdict (jetson.accuracy_gate): a variant's result holds it, run.json its status
VERDICTS = ("pass", "wrong")
ACCURACY_FIELDS = {"top1_agreement": NUMBER + (type(None),), "max_abs_error": NUMBER + (type(None),),
                   "max_rel_error": NUMBER + (type(None),), "images": (int,), "batch": (int,), "data": TEXT,
                   "reference": TEXT, "failures": (list,), "thresholds": (dict,), "outputs": (dict,)}
OUTPUT_FIGURES = {"top1_agreement": NUMBER + (type(None),), "max_abs_error": NUMBER, "max_rel_error": NUMBER,
                  "non_finite": (int,), "reference_max_abs": NUMBER}


def check_accuracy(accuracy: dict, where: str, host: object) -> None:
    """The gate's verdict of one variant: its status one of :data:`VERDICTS`, its figures numbers, its
    failures text, per output an object of numbers."""
    _expect_verdict(accuracy.get("status"), f"{where}.status", host, required=True)
    for key, types in ACCURACY_FIELDS.items():
        if key in accuracy:
            _expect(accuracy[key], types, f"{where}.{key}", host)
    for n, line in enumerate(accuracy.get("failures") or []):
        _expect(line, (str,), f"{where}.failures[{n}]", host)
    for key, value in (accuracy.get("thresholds") or {}).items():
        _expect(value, NUMBER + (type(None),), f"{where}.thresholds.{key}", host)
    for output, figures in (accuracy.get("outputs") or {}).items():
        _expect(figures, (dict,), f"{where}.outputs.{output}", host)
        for key, types in OUTPUT_FIGURES.items():
            if key in figures:
                _expect(figures[key], types, f"{where}.outputs.{output}.{key}", host)


def _expect_verdict(value: object, where: str, host: object, required: bool = False) -> None:
    if (value is None and not required) or value in VERDICTS:
        return
    raise refused(host, f"{where} is {type(value).__name__} {str(value)[:60]!r}",
                  expected=" or ".join(repr(v) for v in VERDICTS) + ("" if required else " or null"))


def _expect(value: object, types: tuple, where: str, host: object) -> None:
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise refused(host, f"{where} is {type(value).__name__} {str(value)[:60]!r}", expected=names)


def plain_result_file(folder: Path, name: object) -> Path | None:
    """``folder/name`` when ``name`` is a plain result file name and that file is no link; else None."""
    if not isinstance(name, str) or not RESULT_NAME.fullmatch(name):
        return None
    path = folder / name
    return None if path.is_symlink() else path
