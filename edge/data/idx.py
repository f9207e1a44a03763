"""Reader for the IDX format of (Fashion-)MNIST, with validation of magic numbers and sizes."""

from __future__ import annotations

import gzip
import struct
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from edge.errors import EdgeError

# IDX type codes (third byte of the magic number) -> numpy big-endian dtype.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


@lru_cache(maxsize=4)
def _gunzip(path: Path, mtime_ns: int, size: int) -> bytes:
    """A gzip file's bytes, kept for the next read of the same file while its time and size are unchanged: one
    process (an `edge pipeline` run) reads the 60,000 training images once instead of at every step (0.6-0.8 s of
    decompression each time here)."""
    with gzip.open(path, "rb") as f:
        return f.read()


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            stat = path.stat()
            return _gunzip(path.resolve(), stat.st_mtime_ns, stat.st_size)
        return path.read_bytes()
    except FileNotFoundError as e:
        raise EdgeError(f"IDX file {path} does not exist",
                        fix="check the path, or pass --data with a folder holding the IDX files") from e
    except (EOFError, OSError, zlib.error) as e:
        raise EdgeError(f"IDX file {path} is corrupt or truncated",
                        expected="a complete gzip stream", found=f"{type(e).__name__}: {e}",
                        fix="download or reinstall the data set "
                            "(apt-get install --reinstall dataset-fashion-mnist)") from e


def read_idx(path: str | Path, *, ndim: int | None = None) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array.

    Checks the magic number (two zero bytes, a known type code, the number of
    dimensions, ``ndim`` if given) and that the payload has exactly the size the
    header announces.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise EdgeError(f"IDX file {path} is too short to hold a header",
                        expected="at least 4 bytes", found=f"{len(raw)} bytes",
                        fix="the file is truncated: download or reinstall it")
    zero, type_code, dims = struct.unpack(">HBB", raw[:4])
    if zero != 0 or type_code not in _IDX_DTYPES:
        raise EdgeError(f"{path} is not an IDX file",
                        expected="magic number 0x0000TTDD (TT a type code such as 0x08 for uint8)",
                        found=f"0x{raw[:4].hex()}",
                        fix="pass the Fashion-MNIST/MNIST IDX files (e.g. t10k-images-idx3-ubyte.gz)")
    if ndim is not None and dims != ndim:
        raise EdgeError(f"IDX file {path} has {dims} dimensions",
                        expected=f"{ndim} dimensions (magic 0x000008{ndim:02x})", found=f"magic 0x{raw[:4].hex()}",
                        fix="images files are idx3, label files idx1: check which file was passed")
    header_end = 4 + 4 * dims
    if len(raw) < header_end:
        raise EdgeError(f"IDX file {path} is truncated inside its header",
                        expected=f"{header_end} header bytes", found=f"{len(raw)} bytes",
                        fix="download or reinstall the data set")
    shape = struct.unpack(f">{dims}I", raw[4:header_end])
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(raw) - header_end
    if found != expected:
        raise EdgeError(f"IDX file {path} has the wrong payload size",
                        expected=f"{expected} bytes for shape {tuple(shape)}", found=f"{found} bytes",
                        fix="the file is truncated or corrupt: download or reinstall the data set")
    array = np.frombuffer(raw, dtype=dtype, offset=header_end).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as a gzip-compressed IDX file (used to build the shipped subset)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime=0: byte-identical output
        f.write(header + array.tobytes())
