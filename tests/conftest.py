import os
import re
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


# The work units of `pytest -n 2` (scripts/test.sh): each test file is one unit (its module fixtures made once, its
# tests in order), but tests/test_readme.py's documented commands, one unit per guide (each guide runs in a folder
# of its own); the longest units first, so that the two workers end together (a run's wall time is its busiest
# worker's). xdist's own orders do not give this: `--dist loadfile` sorts files by their number of tests (the 189 of
# test_readme.py first, the 240-s guide of test_own_model.py anywhere), and `--dist loadgroup` drops its groups
# under pytest 9.2 (xdist 3.8 renames `Node._nodeid`, which pytest 9.2 no longer reads).
LONGEST_FIRST = ("tests/test_own_model.py", "tests/test_readme.py::precision",
                 "tests/edge/precision/test_quantize.py", "tests/edge/precision/test_gate.py",
                 "tests/edge/pipeline/test_pipeline.py", "tests/edge/deploy/test_deploy.py",
                 "tests/edge/deploy/test_deploy_faults.py", "tests/edge/test_distributed.py",
                 "tests/test_readme.py::width-compression", "tests/test_readme.py::attention-removal")
GUIDE_COMMAND = re.compile(r"(tests/test_readme\.py)::test_documented_command\[(.+?)-L\d+-")


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its file, or for a documented command, its guide (``tests/test_readme.py::NAME``)."""
    guide = GUIDE_COMMAND.match(nodeid)
    return f"{guide[1]}::{guide[2]}" if guide else nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))   # stable: the rest as collected


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist: without it (-p no:xdist) there is none
def pytest_xdist_make_scheduler(config, log):
    """Whole work units (:func:`work_unit`) to each worker, in the order collected."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnits(config, log)
