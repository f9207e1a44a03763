import json

import pytest
import torch

from edge.analysis.collect import block_outputs
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.cost import analytic_flops, measured_flops
from edge.compress.load import load_model
from edge.compress.methods.block_approximation.module import ApproximatedSpan
from edge.data import ArrayPreprocess, InputSpec, calibration_set
from edge.errors import EdgeError
from edge.models import create_model, data_config
from edge.models.info import original_block_indices

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
SOURCE = {"model": TINY, "weights": None, "img_size": None}


def tiny(seed=0):
    torch.manual_seed(seed)
    return create_model(TINY)


def run(plan, samples=100, **kw):
    return compress(tiny(), SOURCE, CompressConfig(plan=plan, data="fmnist-mini", samples=samples, **kw))


def test_linear_span_equals_least_squares_on_calibration_tokens():
    model, manifest = run("linear:0-2")
    original = tiny()
    calib = calibration_set("fmnist-mini", 100)
    spec = InputSpec.from_data_config(data_config(original))
    with block_outputs(original) as captured, torch.no_grad():
        original.forward_features(ArrayPreprocess(spec)(calib.images))
        x, y = captured[1].reshape(-1, 32).double(), captured[3].reshape(-1, 32).double()
    expected = torch.linalg.lstsq(x, y).solution
    span = model.blocks[1]
    assert isinstance(span, ApproximatedSpan) and span.replaced == (1, 2) and span.map.bias is None
    torch.testing.assert_close(span.map.weight.double().T, expected, rtol=0, atol=2e-5)
    assert original_block_indices(model.blocks) == [(0,), (1, 2), (3,)]
    assert manifest["fit"]["linear:0-2"]["all"]["r2"] > 0.5


def test_affine_skip_identity_and_own_prefix_map():
    model, _ = run("affine:-1-0,skip:1-2,identity:2-3:prefix=own")
    spans = [m for m in model.blocks if isinstance(m, ApproximatedSpan)]
    assert [s.method for s in spans] == ["affine", "skip", "identity"]
    assert spans[0].map.bias is not None and len(model.blocks) == 4  # blocks 0, 2, 3 replaced; 1 kept
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        tokens = model.forward_features(x)
    assert tokens.shape == (2, 17, 32)


def test_own_prefix_map_fits_class_token_separately():
    model, manifest = run("affine:1-3:prefix=own")
    span = model.blocks[2]
    assert span.prefix_map is not None and span.num_prefix_tokens == 1
    assert set(manifest["fit"]["affine:1-3:prefix=own"]) == {"patch", "prefix"}


def test_params_and_flops_before_after_agree_with_analytic_count():
    model, manifest = run("linear:0-2")
    before, after = manifest["before"], manifest["after"]
    assert before["flops"] == before["flops_analytic"] and after["flops"] == after["flops_analytic"]
    assert after["params"] < before["params"] and after["flops"] < before["flops"]
    reference = create_model("fmnist-deit-tiny", pretrained_weights=False)
    assert measured_flops(reference, (1, 28, 28)) == analytic_flops(reference)


def test_artifact_round_trip_is_exact(tmp_path):
    model, manifest = run("affine:1-3:prefix=own,linear:-1-0")
    save_artifact(model, tmp_path / "art", manifest)
    restored, saved = load_artifact(tmp_path / "art")
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), rtol=0, atol=0)
    assert saved["plan"] == "linear:-1-0,affine:1-3:prefix=own"
    assert json.loads((tmp_path / "art" / "edge-model.json").read_text())["source"]["model"] == TINY
    again = load_model(str(tmp_path / "art"))  # artifacts load wherever a model name is accepted
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_same_inputs_same_compressed_weights():
    a, _ = run("auto-affine:2")
    b, _ = run("auto-affine:2")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_auto_plan_chooses_k_blocks_and_reports_candidates():
    model, manifest = run("auto-linear:2")
    chosen = [row for row in manifest["planner"] if row["chosen"]]
    assert len(chosen) == 2 and len(manifest["planner"]) == 4 + 3
    assert sum(len(s.replaced) for s in model.blocks if isinstance(s, ApproximatedSpan)) == 2
    assert manifest["plan"] == chosen[-1]["plan"]
    assert all({"kl", "agreement", "feature_rel_error", "block_redundancy"} <= set(r) for r in manifest["planner"])


def test_trained_translators_run():
    model, manifest = run("resmlp:0-1:steps=20,mlp:2-3:steps=20")
    methods = [m.method for m in model.blocks if isinstance(m, ApproximatedSpan)]
    assert methods == ["resmlp", "mlp"] and manifest["fit"]["mlp:2-3:steps=20"]["all"]["mse"] >= 0


def test_too_few_samples_without_ridge_suggests_ridge():
    with pytest.raises(EdgeError, match="ridge"):
        run("linear:0-1", samples=1)
    model, _ = run("linear:0-1:ridge=0.001", samples=1)
    assert torch.isfinite(model.blocks[1].map.weight).all()


def test_bad_artifact_and_existing_output(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "edge-model.json").write_text("{not json")
    with pytest.raises(EdgeError, match="cannot be read"):
        load_artifact(tmp_path / "bad")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("user data")
    model, manifest = run("skip:0-1")
    with pytest.raises(EdgeError, match="not an edge artifact"):
        save_artifact(model, tmp_path / "other", manifest)
    assert (tmp_path / "other" / "keep.txt").read_text() == "user data"


def test_compressing_a_compressed_model_is_refused(tmp_path):
    model, manifest = run("linear:0-1")
    save_artifact(model, tmp_path / "art", manifest)
    with pytest.raises(EdgeError, match="already compressed"):
        compress(load_artifact(tmp_path / "art")[0], {"model": str(tmp_path / "art")},
                 CompressConfig(plan="linear:2-3", data="fmnist-mini", samples=50))
