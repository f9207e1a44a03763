import os
from pathlib import Path

import pytest

os.environ.setdefault("EDGE_NO_PROGRESS", "1")

from edge.data.fmnist import DEBIAN_DIR, is_idx_folder  # noqa: E402

HAVE_FMNIST = is_idx_folder(Path(os.environ.get("EDGE_FMNIST_DIR", DEBIAN_DIR)))
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="full Fashion-MNIST not installed "
                                  "(apt-get install dataset-fashion-mnist)")


@pytest.fixture(scope="session")
def reference_model():
    from edge.models import create_model

    return create_model("fmnist-deit-tiny")
