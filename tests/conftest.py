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


# The work units of `pytest -n 2 --dist loadgroup --no-loadscope-reorder` (scripts/test.sh): each test file is
# one unit (its module fixtures made once), but tests/test_readme.py's documented commands, one unit per guide
# (each guide runs in a folder of its own); the longest units first, so that the two workers end together (a
# run's wall time is its busiest worker's). xdist's default order, by number of tests, put the 189 tests of
# test_readme.py first and the 240-s guide of test_own_model.py anywhere.
LONGEST_FIRST = ("tests/test_own_model.py", "tests/test_readme.py::docs/precision.md",
                 "tests/edge/precision/test_quantize.py", "tests/edge/precision/test_gate.py",
                 "tests/edge/pipeline/test_pipeline.py", "tests/edge/deploy/test_deploy.py",
                 "tests/edge/deploy/test_deploy_faults.py", "tests/edge/test_distributed.py",
                 "tests/test_readme.py::docs/width-compression.md", "tests/test_readme.py::docs/attention-removal.md")


def work_unit(item) -> str:
    path = item.nodeid.split("::")[0]
    if path == "tests/test_readme.py" and item.originalname == "test_documented_command":
        return f"{path}::{item.module.DOC_COMMANDS[item.callspec.params['index']].file}"
    return path


def pytest_collection_modifyitems(config, items):
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))
    items.sort(key=lambda item: rank.get(work_unit(item), len(rank)))   # stable: the rest as collected
