import os
from pathlib import Path

import pytest

os.environ.setdefault("EDGE_NO_PROGRESS", "1")

from edge.data.fmnist import DEBIAN_DIR, is_idx_folder  # noqa: E402

HAVE_FMNIST = is_idx_folder(Path(os.environ.get("EDGE_FMNIST_DIR", DEBIAN_DIR)))
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="full Fashion-MNIST not installed "
                                  "(apt-get install dataset-fashion-mnist)")


@pytest.fixture(autouse=True)
def no_onnxruntime_notes_from_an_earlier_test():
    """ONNX Runtime's notes are one process-wide log (edge.check.compare.ORT_MESSAGES) that the CLI writes out and
    counts on stderr at exit. A test that cleans a graph without the CLI leaves its notes there, and a later test
    in the same worker would see them in its stderr: each test starts with none."""
    from edge.check.compare import ORT_MESSAGES

    ORT_MESSAGES.take()


@pytest.fixture(scope="session")
def reference_model():
    from edge.models import create_model

    return create_model("fmnist-deit-tiny")


# The tiny timm ViT that tests export, clean and run through the pipeline (4 blocks, 28x28, patch 7).
TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Random but fixed weights for :data:`TINY` (a .safetensors path), so that two runs see the same model."""
    import torch

    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("w") / "tiny.safetensors"
    save_safetensors(create_model(TINY).state_dict(), path)
    return str(path)


# The longest test files, first: under `pytest -n 2 --dist loadfile` (scripts/test.sh) each whole file goes to one
# worker in the order collected, so these two, collected last, could run one after the other on one worker while
# the other worker had finished (1,822 s for the whole run on the 2-vCPU Intel VM); first, each starts on a worker
# of its own and the rest fill in around them.
LONGEST_FIRST = ("tests/test_readme.py", "tests/test_own_model.py", "tests/edge/pipeline/test_pipeline.py",
                 "tests/edge/test_distributed.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))   # stable: the rest as collected
