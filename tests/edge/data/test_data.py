import numpy as np
import pytest
import torch

from edge.data import FMNIST_CLASSES, ArrayPreprocess, InputSpec, balanced_indices, calibration_set, load_dataset
from edge.data.augment import random_shift_flip
from edge.errors import EdgeError
from tests.conftest import needs_fmnist


def test_fmnist_mini_is_shipped_and_balanced():
    test = load_dataset("fmnist-mini", "test")
    train = load_dataset("fmnist-mini", "train")
    assert (len(test), len(train)) == (2000, 1000)
    assert test.images.shape == (2000, 28, 28) and test.images.dtype == torch.uint8
    assert test.labels.bincount().tolist() == [200] * 10
    assert train.labels.bincount().tolist() == [100] * 10
    assert test.classes == FMNIST_CLASSES


@needs_fmnist
def test_full_fmnist_sizes():
    assert len(load_dataset("fmnist", "test")) == 10000
    assert len(load_dataset("fmnist", "train")) == 60000


def test_balanced_sampler_counts_and_determinism():
    labels = torch.arange(1000) % 10
    a = balanced_indices(labels, 505, seed=3)
    assert len(a) == 505 and len(set(a.tolist())) == 505
    counts = labels[a].bincount(minlength=10)
    assert counts.max() - counts.min() <= 1 and int(counts.sum()) == 505
    assert torch.equal(a, balanced_indices(labels, 505, seed=3))
    assert not torch.equal(a, balanced_indices(labels, 505, seed=4))


def test_balanced_sampler_rejects_impossible_requests():
    labels = torch.tensor([0] * 50 + [1] * 3)
    with pytest.raises(EdgeError, match="class 1 has 3 samples"):
        balanced_indices(labels, 20)
    with pytest.raises(EdgeError, match="data set holds 53"):
        balanced_indices(labels, 54)
    with pytest.raises(EdgeError, match="not positive"):
        balanced_indices(labels, 0)


def test_calibration_set_is_balanced_and_seeded():
    calib = calibration_set("fmnist-mini", 100, seed=0)
    assert len(calib) == 100 and calib.labels.bincount().tolist() == [10] * 10
    assert torch.equal(calib.images, calibration_set("fmnist-mini", 100, seed=0).images)


def test_preprocess_normalises_with_model_config():
    spec = InputSpec(1, 28, 28, (0.5,), (0.25,))
    x = ArrayPreprocess(spec)(torch.tensor([[[0, 255]]], dtype=torch.uint8).expand(1, 28, 2).contiguous()
                              .repeat(1, 1, 14))
    assert x.shape == (1, 1, 28, 28)
    torch.testing.assert_close(x[0, 0, 0, :2], torch.tensor([-2.0, 2.0]))


def test_preprocess_resizes_gray_to_rgb_model():
    spec = InputSpec(3, 224, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    images = torch.full((2, 28, 28), 255, dtype=torch.uint8)
    x = ArrayPreprocess(spec)(images)
    assert x.shape == (2, 3, 224, 224)
    expected = (1 - torch.tensor(spec.mean)) / torch.tensor(spec.std)
    torch.testing.assert_close(x[0, :, 100, 100], expected)


def test_augmentation_shifts_within_padding_and_is_seeded():
    images = torch.zeros(64, 28, 28, dtype=torch.uint8)
    images[:, 10:18, 10:18] = 255
    out = random_shift_flip(images, torch.Generator().manual_seed(0), pad=2)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert (out.sum((1, 2)) == images.sum((1, 2))).all()  # shift keeps the whole square inside
    assert torch.equal(out, random_shift_flip(images, torch.Generator().manual_seed(0), pad=2))
    assert not torch.equal(out, images)


def test_augmentation_with_no_padding_only_flips():
    images = torch.randint(0, 255, (32, 28, 28), dtype=torch.uint8)
    out = random_shift_flip(images, torch.Generator().manual_seed(1), pad=0)
    same = (out == images).flatten(1).all(1)
    flipped = (out == images.flip(-1)).flatten(1).all(1)
    assert bool((same | flipped).all()) and 0 < int(flipped.sum()) < 32


def test_image_folder_uses_model_preprocessing(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / "val" / name).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "val" / name / f"{i}.png")
    (tmp_path / "val" / "dog" / "notes.txt").write_text("not an image")
    data = load_dataset(str(tmp_path), "test")
    assert len(data) == 6 and data.classes == ("cat", "dog") and data.labels.tolist() == [0, 0, 0, 1, 1, 1]
    spec = InputSpec(3, 32, 32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), crop_pct=1.0)
    x, y = next(data.batches(4, data.preprocess_for(spec)))
    assert x.shape == (4, 3, 32, 32) and y.tolist() == [0, 0, 0, 1]
    assert -1.0 - 1e-6 <= float(x.min()) and float(x.max()) <= 1.0 + 1e-6


def test_image_folder_without_classes(tmp_path):
    (tmp_path / "x.png").write_bytes(b"")
    with pytest.raises(EdgeError, match="has no class folders"):
        load_dataset(str(tmp_path), "test")


SMALL = InputSpec(3, 32, 32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), crop_pct=1.0)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_an_unreadable_image_stops_with_its_path_in_the_calling_process_or_a_worker(tmp_path, monkeypatch, workers):
    from tests.rgb_folder import make_rgb_folder

    monkeypatch.setenv("EDGE_DATA_WORKERS", workers)
    make_rgb_folder(tmp_path, train=2, val=2, size=16, classes=2)
    broken = tmp_path / "val" / "class_01" / "0001.jpg"
    broken.write_bytes(b"not a jpeg at all")
    data = load_dataset(str(tmp_path), "test")
    with pytest.raises(EdgeError, match=f"image {broken} cannot be read") as e:
        data.inputs(SMALL)
    assert "remove or replace the file" in str(e.value)


def test_a_folders_training_batches_do_not_depend_on_workers_and_resume_at_a_step(tmp_path, monkeypatch):
    """Each image's augmentation is seeded by its step and row: the same batches with or without a worker process,
    and a run resumed at step 3 draws what the whole run drew there."""
    from edge.data import TrainingStream
    from tests.rgb_folder import make_rgb_folder

    make_rgb_folder(tmp_path, train=5, val=1, size=24, classes=2)
    data = load_dataset(str(tmp_path), "train")

    def draws(start, workers):
        monkeypatch.setenv("EDGE_DATA_WORKERS", str(workers))
        stream = TrainingStream(4, 7, True, start, 5, lambda n: slice(0, n))
        return list(data.training_batches(SMALL, stream))

    whole, threaded = draws(0, 0), draws(0, 1)
    assert [e for e, *_ in whole] == [0, 0, 0, 1, 1] and all(share == 1.0 for *_, share in whole)
    for (_, x, y, _), (_, x2, y2, _) in zip(whole, threaded):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    resumed = draws(3, 0)
    assert torch.equal(resumed[0][1], whole[3][1]) and torch.equal(resumed[0][2], whole[3][2])
    assert not torch.equal(whole[0][1], whole[3][1][: len(whole[0][1])])   # augmented afresh each epoch
