"""A bundle packed as ``BUNDLE.tar.gz`` (``edge bundle --tar``): checked member by member before
anything is read or written, on the host (``edge deploy BUNDLE.tar.gz``, before any device sees
it) and on the device, which unpacks it with this very file run by its Python::

    python3 -c "$(cat archive.py)" ARCHIVE INTO [LAST ...]

so it imports nothing but the standard library, not even the rest of ``jetson`` (which is inside
the archive). An archive is refused, naming the member, when a member has an absolute path, a
``..`` part, lies outside the one top folder every member shares, or is anything but a regular
file or a folder (a symbolic or hard link, a device, a FIFO: a bundle holds none, so no link can
lead out of it). Unpacking writes each file of the top folder into INTO (without the top folder's
name), through a temporary file renamed into place, and the files named LAST (the bundle's
``manifest.json``) after all others, so an unpack cut short leaves the old manifest or none. The
checksums are checked afterwards against the manifest, as for a bundle copied as a folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

EXIT_REFUSED = 2


class ArchiveError(ValueError):
    """An archive that is not a bundle's, or not safe to unpack: the message names the member."""


def member_problem(info: tarfile.TarInfo, top: str) -> str | None:
    """Why ``info`` may not be unpacked from a bundle archive whose folder is ``top`` (None: it may)."""
    name = info.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or (parts and parts[0].endswith(":")):
        return "an absolute path"
    if ".." in parts:
        return "a '..' part (it would land outside the bundle)"
    if not parts or parts[0] != top:
        return f"outside the bundle's folder {top}/"
    if info.issym() or info.islnk():
        return f"a {'symbolic' if info.issym() else 'hard'} link to {info.linkname!r} (a bundle holds files and " \
               "folders only)"
    if not (info.isfile() or info.isdir()):
        return "neither a file nor a folder (a device or FIFO)"
    return None


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise ArchiveError(f"{path} is not a readable .tar.gz: {e}") from e


def check_archive(path: Path) -> tuple[str, list[tarfile.TarInfo]]:
    """The top folder and the members of a bundle archive; an ArchiveError naming the first bad member."""
    with _open(path) as archive:
        try:
            members = archive.getmembers()
        except (OSError, tarfile.TarError, EOFError) as e:
            raise ArchiveError(f"{path} is damaged: {e}") from e
    if not members:
        raise ArchiveError(f"{path} is empty")
    first = PurePosixPath(members[0].name).parts
    top = first[0] if first else ""
    if top in ("", ".", "..", "/") or top.startswith("/"):
        top = "?"
    bad = [(m.name, problem) for m in members if (problem := member_problem(m, top))]
    if bad:
        name, problem = bad[0]
        more = f" (and {len(bad) - 1} more bad members)" if len(bad) > 1 else ""
        raise ArchiveError(f"{path}: member {name!r} is {problem}: refused{more}")
    return top, members


def relative(info: tarfile.TarInfo) -> str:
    """A member's path inside the bundle (without the top folder)."""
    return PurePosixPath(*PurePosixPath(info.name).parts[1:]).as_posix()


def archive_files(path: Path) -> tuple[str, dict[str, dict], bytes | None, str]:
    """The top folder, sha256 and size of every file (by path inside the bundle), the bytes of
    ``manifest.json`` (None if absent) and the archive's own sha256, read without unpacking."""
    top, _ = check_archive(path)
    files: dict[str, dict] = {}
    manifest = None
    with _open(path) as archive:
        for info in archive:
            if not info.isfile():
                continue
            handle = archive.extractfile(info)
            if handle is None:
                continue
            digest = hashlib.sha256()
            data = b""
            for chunk in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023 - read at once, in the loop
                digest.update(chunk)
                if relative(info) == "manifest.json":
                    data += chunk
            files[relative(info)] = {"sha256": digest.hexdigest(), "bytes": info.size}
            if relative(info) == "manifest.json":
                manifest = data
    whole = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            whole.update(chunk)
    return top, files, manifest, whole.hexdigest()


def _inside(target: Path, root: Path) -> bool:
    """Whether ``target``'s folder, links resolved, is ``root`` or below it (a folder already on the
    device that is a link out of it is refused too)."""
    folder = os.path.realpath(target.parent)
    base = os.path.realpath(root)
    return folder == base or folder.startswith(base + os.sep)


def unpack(path: Path, into: Path, last: tuple[str, ...] = ("manifest.json",)) -> list[str]:
    """Check the archive, then write its files into ``into`` (those named ``last`` at the end); their paths."""
    check_archive(path)
    into.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    with _open(path) as archive:
        members = archive.getmembers()
        ordered = [m for m in members if relative(m) not in last] + [m for m in members if relative(m) in last]
        for info in ordered:
            name = relative(info)
            if name in ("", "."):
                continue
            target = into / name
            if info.isdir():
                target.mkdir(parents=True, exist_ok=True)
                if not _inside(target / "x", into):
                    raise ArchiveError(f"{path}: folder {name} would lie outside {into} (a link on the device)")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if not _inside(target, into):
                raise ArchiveError(f"{path}: {name} would land outside {into} (a link on the device)")
            source = archive.extractfile(info)
            if source is None:
                continue
            handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            try:
                with os.fdopen(handle, "wb") as out:
                    for chunk in iter(lambda: source.read(1 << 20), b""):  # noqa: B023 - read at once, in the loop
                        out.write(chunk)
                os.chmod(temporary, 0o644)
                os.replace(temporary, target)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
            written.append(name)
    return written


def main(argv: list[str]) -> int:
    """``ARCHIVE INTO [LAST ...]``: unpack; a JSON line with what was written, or the refusal on stderr (exit 2)."""
    if len(argv) < 2:
        print("usage: archive.py ARCHIVE INTO [LAST ...]", file=sys.stderr)
        return EXIT_REFUSED
    try:
        written = unpack(Path(argv[0]), Path(argv[1]), tuple(argv[2:]) or ("manifest.json",))
    except ArchiveError as e:
        print(f"refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps({"files": len(written)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
