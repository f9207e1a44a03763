"""A bundle's .tar.gz: checked without unpacking on the host (edge.deploy.checked_source) and
checked again while the device unpacks it (jetson/archive.py run as ``python3 -c SOURCE``, as
edge deploy runs it there). Refused: absolute paths, ``..`` members, links, members outside the
bundle's folder, and a tampered file (named)."""

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import jetson.archive
from edge.bundle import BundleConfig, make_bundle
from edge.deploy import checked_source
from edge.errors import EdgeError
from jetson.bundle import Protocol, read_bundle
from tests.edge.trt.test_build import tiny_onnx


@pytest.fixture
def packed(tmp_path) -> Path:
    """``bundle.tar.gz`` of a one-variant bundle, as `edge bundle --tar` writes it."""
    make_bundle([tiny_onnx(tmp_path / "a.onnx")], tmp_path / "bundle", BundleConfig(check_data="fmnist-mini",
        precisions=("fp32",), protocol=Protocol(warmup=1, warmup_s=None, iterations=2, duration_s=None)), tar=True)
    return tmp_path / "bundle.tar.gz"


def repacked(source: Path, target: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]] = (),
             change: dict[str, bytes] | None = None) -> Path:
    """``source``'s members (some with other bytes), then ``extra``, into ``target``."""
    change = change or {}
    with tarfile.open(source) as old, tarfile.open(target, "w:gz") as new:
        for info in old.getmembers():
            data = old.extractfile(info).read() if info.isfile() else None
            if info.name in change:
                data = change[info.name]
                info.size = len(data)
            new.addfile(info, io.BytesIO(data) if data is not None else None)
        for info, data in extra:
            new.addfile(info, io.BytesIO(data) if data is not None else None)
    return target


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = b"x", link: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if data is not None and kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def device_unpack(archive: Path, into: Path) -> subprocess.CompletedProcess:
    """What edge deploy runs on the device: this file's source through ``python3 -c``, stdlib only."""
    source = Path(jetson.archive.__file__).read_text()
    return subprocess.run([sys.executable, "-I", "-c", source, str(archive), str(into), "manifest.json"],
                          capture_output=True, text=True, timeout=60)


def test_an_archive_is_read_and_checked_without_unpacking_and_unpacks_on_the_device(packed, tmp_path):
    bundle, archive = checked_source(packed)
    assert archive == packed and bundle.root == tmp_path / "bundle"  # where it would unpack: named by its folder
    assert bundle.sha256 == read_bundle(tmp_path / "bundle").sha256
    done = device_unpack(packed, tmp_path / "device" / "x y")
    assert done.returncode == 0, done.stderr
    unpacked = read_bundle(tmp_path / "device" / "x y")
    assert unpacked.sha256 == bundle.sha256 and unpacked.files == bundle.files


BAD = {
    "absolute": (member("/etc/evil"), "member '/etc/evil' is an absolute path"),
    "dot-dot": (member("bundle/../../evil"), "member 'bundle/../../evil' is a '..' part"),
    "symlink-out": (member("bundle/graphs/a/link", tarfile.SYMTYPE, link="/etc/passwd"),
                    "member 'bundle/graphs/a/link' is a symbolic link to '/etc/passwd'"),
    "hardlink-out": (member("bundle/jetson/h", tarfile.LNKTYPE, link="../../etc/passwd"),
                     "member 'bundle/jetson/h' is a hard link to '../../etc/passwd'"),
    "outside-folder": (member("other/file"), "member 'other/file' is outside the bundle's folder bundle/"),
    "fifo": (member("bundle/graphs/fifo", tarfile.FIFOTYPE), "member 'bundle/graphs/fifo' is neither a file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_an_unsafe_archive_is_refused_on_both_sides_naming_the_member(packed, tmp_path, case):
    extra, named = BAD[case]
    evil = repacked(packed, tmp_path / "evil.tar.gz", [extra])
    with pytest.raises(EdgeError, match="refused") as refused:
        checked_source(evil)
    assert named in str(refused.value)
    into = tmp_path / "device" / "bundle"
    done = device_unpack(evil, into)
    assert done.returncode == jetson.archive.EXIT_REFUSED and named in done.stderr
    assert not into.exists() or not any(into.iterdir())  # nothing was written: the check comes first
    assert not (tmp_path / "evil").exists() and not (tmp_path / "device" / "evil").exists()


def test_a_tampered_archive_is_refused_naming_the_file(packed, tmp_path):
    tampered = repacked(packed, tmp_path / "tampered.tar.gz", change={"bundle/graphs/a/fp32.onnx": b"not onnx"})
    with pytest.raises(EdgeError, match="graphs/a/fp32.onnx has 8 bytes"):
        checked_source(tampered)
    unlisted = repacked(packed, tmp_path / "unlisted.tar.gz", [member("bundle/jetson/extra.py")])
    with pytest.raises(EdgeError, match="the bundle was altered: jetson/extra.py is not in manifest.json"):
        checked_source(unlisted)
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(EdgeError, match="is not a readable .tar.gz"):
        checked_source(tmp_path / "junk.tar.gz")
