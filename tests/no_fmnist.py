"""Run the ``edge`` CLI with Fashion-MNIST unreadable: ``python -m tests.no_fmnist ARGS...`` is ``edge ARGS...``.

The tests of a user's own model and images check that no verb reads the bundled data behind their back.
Permissions cannot show it (the tests run as root, which reads any file), so a Python audit hook
(PEP 578) refuses every ``open`` of a file under Fashion-MNIST's folders (Debian's package, ``$EDGE_FMNIST_DIR``,
the subset shipped in edge/data/fmnist_mini) and every listing of them, records the path on stderr with a
marker line the test looks for, and the verb fails as it would on a machine without the files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MARKER = "NO-FMNIST: refused to open"


def _guarded() -> tuple[str, ...]:
    from edge.data.fmnist import DEBIAN_DIR, MINI_DIR

    roots = [DEBIAN_DIR, MINI_DIR]
    if os.environ.get("EDGE_FMNIST_DIR"):
        roots.append(Path(os.environ["EDGE_FMNIST_DIR"]))
    return tuple(str(Path(r).resolve()) for r in roots)


def install() -> None:
    roots = _guarded()

    def hook(event: str, args: tuple) -> None:
        if event not in ("open", "os.listdir", "os.scandir") or not args or not isinstance(args[0], (str, Path)):
            return
        path = os.path.realpath(os.fspath(args[0]))
        if any(path == r or path.startswith(r + os.sep) for r in roots):
            print(f"{MARKER} {path}", file=sys.stderr, flush=True)
            raise PermissionError(13, "Permission denied (tests/no_fmnist.py)", path)

    sys.addaudithook(hook)


if __name__ == "__main__":
    install()
    from edge.cli import main

    sys.exit(main(sys.argv[1:]))
