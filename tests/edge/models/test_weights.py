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
    with pytest.raises(EdgeError, match="missing 1: 'blocks.1.mlp.fc1.weight'"):
        create_model(SPEC, weights=tmp_path / "missing.safetensors")
    state = {**tiny.state_dict(), "blocks.2.norm1.weight": torch.ones(192)}
    save_file(state, str(tmp_path / "extra.safetensors"))
    with pytest.raises(EdgeError, match="unexpected 1: 'blocks.2.norm1.weight'"):
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


@pytest.mark.parametrize("key", ["state_dict", "model", "state_dict_ema", "model_ema"])
@pytest.mark.parametrize("prefix", ["", "module.", "model."])
def test_a_checkpoint_as_training_code_saves_it_loads(tiny, tmp_path, key, prefix):
    """Weights under a checkpoint key and a wrapper's prefix (DistributedDataParallel's module., Lightning's model.)."""
    state = {f"{prefix}{k}": v for k, v in tiny.state_dict().items()}
    torch.save({key: state, "epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "w.pth")
    loaded = create_model(SPEC, weights=tmp_path / "w.pth")
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(loaded(x), tiny(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_hub_snapshot_folder_loads(tiny, tmp_path, name):
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "config.json").write_text("{}")
    if name.endswith(".safetensors"):
        save_safetensors(tiny.state_dict(), snapshot / name)
    else:
        torch.save(tiny.state_dict(), snapshot / name)
    loaded = create_model(SPEC, weights=snapshot)
    assert torch.equal(loaded.pos_embed, tiny.pos_embed)
    (snapshot / name).unlink()
    with pytest.raises(EdgeError, match="holds no weights file") as e:
        create_model(SPEC, weights=snapshot)
    assert "model.safetensors or pytorch_model.bin" in str(e.value)


def test_position_embeddings_are_resampled_to_another_img_size(tiny, tmp_path):
    """Weights of a 32-px model (4x4 patches of 8) into the same model at 48 px (6x6): timm's resampling."""
    from timm.layers import resample_abs_pos_embed

    save_safetensors(tiny.state_dict(), tmp_path / "w.safetensors")
    bigger = create_model(SPEC, weights=tmp_path / "w.safetensors", img_size=48)
    assert bigger.pos_embed.shape == (1, 1 + 36, 192)
    expected = resample_abs_pos_embed(tiny.pos_embed, (6, 6), num_prefix_tokens=1)
    torch.testing.assert_close(bigger.pos_embed, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(bigger.blocks[0].attn.qkv.weight, tiny.blocks[0].attn.qkv.weight, rtol=0, atol=0)
    assert bigger(torch.randn(1, 3, 48, 48)).shape == (1, 1000)


def test_every_missing_and_unexpected_name_is_listed(tiny, tmp_path):
    state = {k: v for k, v in tiny.state_dict().items() if not k.startswith("blocks.1.")}
    state["extra.weight"] = torch.ones(3)
    save_file(state, str(tmp_path / "w.safetensors"))
    with pytest.raises(EdgeError) as e:
        create_model(SPEC, weights=tmp_path / "w.safetensors")
    message = str(e.value)
    assert "missing 12: 'blocks.1.norm1.weight'" in message and "and 6 more" in message
    assert "unexpected 1: 'extra.weight'" in message


def test_a_file_that_is_no_checkpoint_exits_2_naming_it(tmp_path, capsys):
    from edge.cli import main

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes about this model\n")
    assert main(["eval", "fmnist-deit-tiny", "--weights", str(notes), "--data", "fmnist-mini"]) == 2
    err = capsys.readouterr().err
    assert f"weights file {notes} is not a weights file edge can read" in err and "bug" not in err
