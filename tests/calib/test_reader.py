"""calib's calibration reader: whole static batches, and every image for a dynamic batch."""

import numpy as np

from calib.data import ArrayCalibrationReader


def batches(reader: ArrayCalibrationReader) -> list[int]:
    sizes = []
    while (feed := reader.get_next()) is not None:
        sizes.append(len(feed["x"]))
    return sizes


def test_a_dynamic_batch_reads_every_image_with_a_short_last_batch():
    images = np.arange(70, dtype=np.float32).reshape(70, 1)
    reader = ArrayCalibrationReader(images, "x", 32, partial=True)
    assert batches(reader) == [32, 32, 6] and len(reader) == 3
    reader.rewind()
    assert np.concatenate([reader.get_next()["x"] for _ in range(3)]).ravel().tolist() == list(range(70))


def test_fewer_images_than_one_batch_are_one_batch_when_the_batch_is_dynamic():
    reader = ArrayCalibrationReader(np.zeros((8, 1), np.float32), "x", 32, partial=True)
    assert batches(reader) == [8] and len(reader) == 1


def test_a_static_batch_reads_whole_batches_only():
    reader = ArrayCalibrationReader(np.zeros((70, 1), np.float32), "x", 32)
    assert batches(reader) == [32, 32] and len(reader) == 2


def test_set_range_of_a_dynamic_reader_ends_at_the_last_image():
    reader = ArrayCalibrationReader(np.zeros((70, 1), np.float32), "x", 32, partial=True)
    reader.set_range(1, 3)
    assert batches(reader) == [32, 6]
