"""Writing files so that a failure never leaves a half-written one, and hashing them.

Every file edge writes goes through a temporary name beside its destination and a rename
(``os.replace`` is atomic within a folder): a reader sees the old file or the new one, never a
part. Folders are filled under a temporary name and renamed the same way. Base layer: imports
only the standard library and :mod:`edge.errors`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from edge.errors import EdgeError
from jetson.bundle import sha256_file as sha256_file  # one implementation, shared with the device side


def _temporary_beside(path: Path) -> str:
    """A new empty file in ``path``'s folder (created if missing), named ``.NAME.XXXX``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    return tmp


def _fill_and_rename(tmp: str, path: Path, write: Callable[[str], None]) -> None:
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_atomic(path: str | Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` fills a temporary file beside ``path``, which then replaces ``path``.

    For writers that take a file name (``torch.save``, ``safetensors``' ``save_file``); on any
    failure the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    _fill_and_rename(_temporary_beside(path), path, write)


def write_atomic(data: bytes, out: Path) -> None:
    """Write ``out`` through a temporary file and a rename: never a half-written file."""
    try:
        tmp = _temporary_beside(out)
    except OSError as e:
        raise EdgeError(f"cannot write {out}", found=str(e), fix="choose a writable --out path") from e
    _fill_and_rename(tmp, out, lambda name: Path(name).write_bytes(data))


def write_text_atomic(text: str, out: Path) -> None:
    """:func:`replace_atomic` for text (the platform's default encoding, as ``open(..., "w")``)."""
    replace_atomic(out, lambda name: Path(name).write_text(text))


def write_json_atomic(value, out: Path, indent: int = 1) -> None:
    """``value`` as indented JSON with a final newline, through :func:`write_atomic`."""
    write_atomic((json.dumps(value, indent=indent) + "\n").encode(), out)


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` to fill; when the block ends it replaces ``out`` (mode 0o755).

    If the block raises, the temporary folder is removed and ``out`` is left as it was::

        with atomic_folder(out) as tmp:
            (tmp / "model.json").write_text(...)
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
