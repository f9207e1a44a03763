"""FAKE `tar` of a hostile device for the deploy tests: ``tar -cf FILE results`` (what edge deploy runs to pack
the results to fetch, FILE ``-`` or a file) packs the real results altered as HOSTILE_CASE says; every other call
is the real tar's.

Cases: ``absolute-link`` (results/a.fp32.json sent as a link to HOSTILE_TARGET), ``relative-link`` (the same
as a relative link that climbs out), ``dotdot-name`` (an extra file ``results/../../../escaped.json``),
``absolute-name`` (an extra file named by the absolute path HOSTILE_TARGET), ``malformed-json``
(results/run.json is not JSON), ``wrong-type`` (a latency figure of results/a.fp32.json is text),
``result-name-dotdot`` (run.json names ``../../victim.json`` as a result).
"""

import io
import json
import os
import sys
import tarfile
from pathlib import Path


def add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def hostile_results(case: str, target: str, out) -> None:
    with tarfile.open(fileobj=out, mode="w|") as archive:
        for path in sorted(Path("results").rglob("*")):
            name = path.as_posix()
            if case in ("absolute-link", "relative-link") and name == "results/a.fp32.json":
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = target if case == "absolute-link" else "../../../../../../../.." + target
                archive.addfile(info)
            elif case == "malformed-json" and name == "results/run.json":
                add_bytes(archive, name, b'{"format": "edge-jetson-run", "variants": {half')
            elif case == "wrong-type" and name == "results/a.fp32.json":
                result = json.loads(path.read_text())
                result["latency"]["median_ms"] = "fast"
                add_bytes(archive, name, json.dumps(result).encode())
            elif case == "result-name-dotdot" and name == "results/run.json":
                summary = json.loads(path.read_text())
                summary["variants"]["a.fp32"]["result"] = "../../victim.json"
                add_bytes(archive, name, json.dumps(summary).encode())
            else:
                archive.add(str(path), arcname=name, recursive=False)
        if case == "dotdot-name":
            add_bytes(archive, "results/../../../escaped.json", b"{}")
        if case == "absolute-name":
            add_bytes(archive, target, b"{}")


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[1] == "-cf" and argv[3] == "results":
        case, target = os.environ["HOSTILE_CASE"], os.environ["HOSTILE_TARGET"]
        if argv[2] == "-":
            hostile_results(case, target, sys.stdout.buffer)
        else:
            with open(argv[2], "wb") as out:
                hostile_results(case, target, out)
        return
    os.execv("/bin/tar", ["tar", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv)
