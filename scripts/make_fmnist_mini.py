"""Build the Fashion-MNIST subset shipped in edge/data/fmnist_mini (run once; output is byte-stable).

    python scripts/make_fmnist_mini.py            # reads Debian's dataset-fashion-mnist

1,000 training and 2,000 test images, class-balanced, chosen by edge's own sampler (seed 0),
kept in the data set's original order.
"""

from __future__ import annotations

from edge.data.fmnist import MINI_DIR, load_fmnist
from edge.data.idx import write_idx
from edge.data.sampler import balanced_indices

SIZES = {"train": 1000, "test": 2000}
PREFIX = {"train": "train", "test": "t10k"}


def main() -> None:
    MINI_DIR.mkdir(parents=True, exist_ok=True)
    for split, n in SIZES.items():
        data = load_fmnist(split)
        idx = balanced_indices(data.labels, n, seed=0, num_classes=data.num_classes).sort().values
        write_idx(MINI_DIR / f"{PREFIX[split]}-images-idx3-ubyte.gz", data.images[idx].numpy())
        write_idx(MINI_DIR / f"{PREFIX[split]}-labels-idx1-ubyte.gz", data.labels[idx].numpy().astype("uint8"))
        print(f"{split}: {n} images, per class {data.labels[idx].bincount().tolist()}")


if __name__ == "__main__":
    main()
