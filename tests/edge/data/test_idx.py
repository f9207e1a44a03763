import struct

import numpy as np
import pytest

from edge.data import load_dataset
from edge.data.fmnist import load_idx_split
from edge.data.idx import read_idx, write_idx
from edge.errors import EdgeError


def test_round_trip_gz(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a-idx3-ubyte.gz", array)
    out = read_idx(tmp_path / "a-idx3-ubyte.gz", ndim=3)
    assert out.dtype == np.uint8 and np.array_equal(out, array)


def test_a_gzip_file_read_again_gives_its_current_content_in_a_fresh_array(tmp_path):
    import os

    path = tmp_path / "a-idx3-ubyte.gz"
    write_idx(path, np.zeros((2, 3, 4), np.uint8))
    first = read_idx(path, ndim=3)
    first[:] = 7                                   # the caller's own copy: the next read is not changed
    assert not read_idx(path, ndim=3).any()
    write_idx(path, np.full((2, 3, 4), 5, np.uint8))   # the same size: only its time tells the change
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert (read_idx(path, ndim=3) == 5).all()
    write_idx(path, np.ones((3, 3, 4), np.uint8))      # another size
    assert read_idx(path, ndim=3).shape == (3, 3, 4)


def test_raw_file_with_big_endian_int32(tmp_path):
    values = np.array([1, -2, 70000], dtype=">i4")
    (tmp_path / "x.idx").write_bytes(struct.pack(">HBBI", 0, 0x0C, 1, 3) + values.tobytes())
    assert read_idx(tmp_path / "x.idx").tolist() == [1, -2, 70000]


def test_bad_magic_is_named(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x12\x34\x08\x03" + b"\x00" * 16)
    with pytest.raises(EdgeError, match="is not an IDX file") as e:
        read_idx(tmp_path / "bad")
    assert "0x12340803" in str(e.value)


def test_wrong_dimension_count(tmp_path):
    write_idx(tmp_path / "labels.gz", np.zeros(5, np.uint8))
    with pytest.raises(EdgeError, match="has 1 dimensions"):
        read_idx(tmp_path / "labels.gz", ndim=3)


def test_truncated_payload(tmp_path):
    array = np.zeros((10, 28, 28), np.uint8)
    raw = struct.pack(">HBB3I", 0, 8, 3, 10, 28, 28) + array.tobytes()
    (tmp_path / "short").write_bytes(raw[:-100])
    with pytest.raises(EdgeError, match="wrong payload size") as e:
        read_idx(tmp_path / "short")
    assert "7840 bytes" in str(e.value) and "7740 bytes" in str(e.value)


def test_truncated_gzip_stream(tmp_path):
    write_idx(tmp_path / "full.gz", np.random.default_rng(0).integers(0, 255, (50, 28, 28), dtype=np.uint8))
    data = (tmp_path / "full.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(EdgeError, match="corrupt or truncated"):
        read_idx(tmp_path / "cut.gz")


def test_corrupt_gzip_bytes(tmp_path):
    (tmp_path / "junk.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"garbage" * 20)
    with pytest.raises(EdgeError, match="corrupt or truncated"):
        read_idx(tmp_path / "junk.gz")


def test_images_and_labels_must_agree(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((4, 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    with pytest.raises(EdgeError, match="disagree on the number of samples"):
        load_idx_split(tmp_path, "test", "x")


def test_idx_folder_via_data_option(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.full((6, 28, 28), 7, np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(6, dtype=np.uint8))
    data = load_dataset(str(tmp_path), "test")
    assert len(data) == 6 and data.labels.tolist() == list(range(6))


def test_missing_dataset_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_FMNIST_DIR", str(tmp_path))
    with pytest.raises(EdgeError) as e:
        load_dataset("fmnist", "test")
    message = str(e.value)
    assert "apt-get install dataset-fashion-mnist" in message and "fmnist-mini" in message


def test_unknown_data_name(tmp_path):
    with pytest.raises(EdgeError, match="neither a known data set nor an existing folder"):
        load_dataset("fmnist-tiny", "test")
