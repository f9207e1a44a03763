import pytest
import torch

from edge.analysis.fit import fit_map, fit_residual
from edge.analysis.moments import PairMoments
from edge.analysis.similarity import block_redundancy, linear_cka_reference
from edge.errors import EdgeError


def _moments(reps, batch=None, images=None):
    m = PairMoments.zeros(len(reps), reps[0].shape[-1])
    n = reps[0].shape[0]
    batch = batch or n
    for start in range(0, n, batch):
        m.update([r[start:start + batch] for r in reps], images=None if images is None else images)
    return m


def test_streamed_sums_equal_one_shot():
    g = torch.Generator().manual_seed(0)
    reps = [torch.randn(300, 16, generator=g) * (i + 1) + i for i in range(4)]
    one = _moments(reps)
    streamed = _moments(reps, batch=37)
    assert one.count == streamed.count == 300
    torch.testing.assert_close(streamed.sums, one.sums, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(streamed.grams, one.grams, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(streamed.cosine_sums, one.cosine_sums, rtol=1e-12, atol=1e-10)
    x = torch.stack(reps).double()
    torch.testing.assert_close(one.grams[1, 3], x[1].T @ x[3], rtol=1e-12, atol=1e-9)
    halves = _moments([r[:150] for r in reps]).merge(_moments([r[150:] for r in reps]))
    torch.testing.assert_close(halves.grams, one.grams, rtol=1e-12, atol=1e-9)


def test_cka_invariances_and_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 12, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))
    y = torch.randn(200, 12, generator=g, dtype=torch.float64) + 0.5 * x
    cka = _moments([x, x @ q, 3.7 * x, y]).cka()
    assert cka[0, 1].item() == pytest.approx(1.0, abs=1e-12)
    assert cka[0, 2].item() == pytest.approx(1.0, abs=1e-12)
    assert cka[0, 3].item() == pytest.approx(linear_cka_reference(x, y).item(), abs=1e-12)
    assert 0.0 < cka[0, 3].item() < 0.99
    torch.testing.assert_close(cka, cka.T)


def test_cosine_and_squared_distance():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    m = _moments([x, y])
    assert m.cosine()[0, 1].item() == pytest.approx(0.5)  # cos 0 and cos 1
    assert m.squared_distance()[0, 1].item() == pytest.approx((2.0 + 1.0) / 2)


def test_block_redundancy_matches_rba_definition():
    g = torch.Generator().manual_seed(2)
    images, tokens, dim = 10, 5, 4
    h = [torch.randn(images, tokens, dim, generator=g, dtype=torch.float64) for _ in range(3)]
    m = PairMoments.zeros(3, dim)
    m.update([r.reshape(-1, dim) for r in h], images=images)
    direct = [-((h[b + 1] - h[b]) ** 2).sum((1, 2)).mean() for b in range(2)]
    torch.testing.assert_close(block_redundancy(m), torch.stack(direct), rtol=1e-10, atol=1e-10)


def test_affine_fit_recovers_exact_map():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(500, 8, generator=g, dtype=torch.float64) * 2 + 1
    a = torch.randn(8, 8, generator=g, dtype=torch.float64)
    b = torch.randn(8, generator=g, dtype=torch.float64)
    m = _moments([x, x @ a + b], batch=64)
    fitted = fit_map(m, 0, 1, "affine")
    torch.testing.assert_close(fitted.weight, a, rtol=0, atol=1e-8)
    torch.testing.assert_close(fitted.bias, b, rtol=0, atol=1e-8)
    assert fit_residual(m, 0, 1, fitted)["r2"] == pytest.approx(1.0, abs=1e-9)


def test_linear_fit_matches_lstsq_and_residual_matches_direct():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(400, 6, generator=g, dtype=torch.float64)
    y = x @ torch.randn(6, 6, generator=g, dtype=torch.float64) + 0.1 * torch.randn(400, 6, generator=g,
                                                                                   dtype=torch.float64) + 0.3
    m = _moments([x, y])
    fitted = fit_map(m, 0, 1, "linear")
    torch.testing.assert_close(fitted.weight, torch.linalg.lstsq(x, y).solution, rtol=0, atol=1e-10)
    for method in ("linear", "affine", "identity"):
        f = fit_map(m, 0, 1, method)
        pred = x @ f.weight + (f.bias if f.bias is not None else 0)
        direct = ((pred - y) ** 2).mean().item()
        assert fit_residual(m, 0, 1, f)["mse"] == pytest.approx(direct, rel=1e-9)


def test_ridge_shrinks_and_is_needed_with_too_few_rows():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    m = _moments([x, x])
    with pytest.raises(EdgeError, match="ridge"):
        fit_map(m, 0, 1, "linear")
    ridged = fit_map(m, 0, 1, "linear", ridge=1e-3)
    assert torch.isfinite(ridged.weight).all()
    big = _moments([torch.randn(100, 8, generator=g, dtype=torch.float64)] * 2)
    assert fit_map(big, 0, 1, "affine", ridge=10.0).weight.norm() < fit_map(big, 0, 1, "affine").weight.norm()


def test_cka_of_a_constant_representation_is_undefined_not_huge():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(50, 8, generator=g, dtype=torch.float64)
    constant = torch.ones(50, 8, dtype=torch.float64) * torch.arange(8)  # e.g. the class token before block 0
    cka = _moments([constant, x, 2 * x]).cka()
    assert torch.isnan(cka[0]).all() and torch.isnan(cka[:, 0]).all()
    assert cka[1, 2].item() == pytest.approx(1.0, abs=1e-12)


def test_rank_deficient_inputs_get_the_minimum_norm_solution():
    g = torch.Generator().manual_seed(7)
    basis = torch.randn(3, 8, generator=g, dtype=torch.float64)
    x = torch.randn(400, 3, generator=g, dtype=torch.float64) @ basis  # rank 3 in 8 dimensions
    y = x @ torch.randn(8, 8, generator=g, dtype=torch.float64)
    m = _moments([x, y])
    fitted = fit_map(m, 0, 1, "linear")
    torch.testing.assert_close(fitted.weight, torch.linalg.pinv(x) @ y, rtol=0, atol=1e-8)
    stats = fit_residual(m, 0, 1, fitted)
    assert stats["input_rank"] == 3 and stats["min_norm"] and stats["r2"] == pytest.approx(1.0, abs=1e-9)
