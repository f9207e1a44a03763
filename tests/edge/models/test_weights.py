import pickle

import pytest
import torch
from safetensors.torch import save_file

from edge.errors import EdgeError
from edge.models import create_model
from edge.models.weights_io import read_state_dict, save_safetensors

SPEC = "timm:vit_tiny_patch16_224,img_size=32,patch_size=8,depth=2"


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return create_model(SPEC)


def test_safetensors_round_trip(tiny, tmp_path):
    save_safetensors(tiny.state_dict(), tmp_path / "w.safetensors")
    loaded = create_model(SPEC, weights=tmp_path / "w.safetensors")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), tiny(x), rtol=0, atol=0)


def test_weights_only_torch_file_and_wrapped_state_dict(tiny, tmp_path):
    torch.save({"state_dict": tiny.state_dict(), "epoch": 3}, tmp_path / "w.pth")
    loaded = create_model(SPEC, weights=tmp_path / "w.pth")
    assert torch.equal(loaded.pos_embed, tiny.pos_embed)


def test_mismatching_architecture_names_first_tensor(tiny, tmp_path):
    save_safetensors(tiny.state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(EdgeError) as e:
        create_model("timm:vit_tiny_patch16_224,img_size=32,patch_size=8,depth=2,embed_dim=96",
                     weights=tmp_path / "w.safetensors")
    message = str(e.value)
    assert "'cls_token'" in message and "(1, 1, 96)" in message and "(1, 1, 192)" in message


def test_missing_and_extra_tensors(tiny, tmp_path):
    state = dict(tiny.state_dict())
    del state["blocks.1.mlp.fc1.weight"]
    save_file(state, str(tmp_path / "missing.safetensors"))
    with pytest.raises(EdgeError, match="'blocks.1.mlp.fc1.weight' is missing"):
        create_model(SPEC, weights=tmp_path / "missing.safetensors")
    state = {**tiny.state_dict(), "blocks.2.norm1.weight": torch.ones(192)}
    save_file(state, str(tmp_path / "extra.safetensors"))
    with pytest.raises(EdgeError, match="unexpected tensor 'blocks.2.norm1.weight'"):
        create_model(SPEC, weights=tmp_path / "extra.safetensors")


class _Payload:
    """Unpickling this would create a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_with_objects_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"weight": _Payload(marker)}, f, protocol=2)   # torch.save's protocol
    with pytest.raises(EdgeError, match="pickled Python objects"):
        read_state_dict(tmp_path / "evil.pt")
    assert not marker.exists()


def test_corrupt_files(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(EdgeError, match="not a readable safetensors file"):
        read_state_dict(tmp_path / "bad.safetensors")
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(EdgeError, match="corrupt or not a torch file"):
        read_state_dict(tmp_path / "bad.pt")
    with pytest.raises(EdgeError, match="does not exist"):
        read_state_dict(tmp_path / "none.safetensors")
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    with pytest.raises(EdgeError, match="is not a state dict"):
        read_state_dict(tmp_path / "list.pt")
