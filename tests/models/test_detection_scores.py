"""Mahalanobis, kernel density and the logistic fusion against closed forms and direct sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.models.detection.fusion import fit_fusion, fit_logistic
from bayesgate.models.detection.kde import (
    EXP_FLOOR,
    ClassKDE,
    choose_bandwidth,
    held_out_log_likelihood,
    logsumexp_rows,
    subsample_per_class,
)
from bayesgate.models.detection.mahalanobis import fit_class_gaussians, ledoit_wolf_shrinkage

D, C = 4, 3
MEANS = np.array([[0.0, 0.0, 0.0, 0.0], [3.0, -1.0, 0.5, 2.0], [-2.0, 2.0, 1.0, -1.0]])
COV = np.array(
    [[2.0, 0.6, 0.0, 0.3], [0.6, 1.0, 0.2, 0.0], [0.0, 0.2, 0.5, 0.1], [0.3, 0.0, 0.1, 1.5]]
)


def _gaussians(n_per_class: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.multivariate_normal(m, COV, n_per_class) for m in MEANS])
    return x, np.repeat(np.arange(C), n_per_class)


def test_mahalanobis_matches_the_closed_form_without_shrinkage() -> None:
    x, y = _gaussians(400)
    g = fit_class_gaussians(torch.from_numpy(x), torch.from_numpy(y), C, shrinkage=0.0)
    means = np.stack([x[y == c].mean(0) for c in range(C)])
    resid = x - means[y]
    precision = np.linalg.inv(resid.T @ resid / len(x))
    f = np.random.default_rng(1).normal(size=(7, D)) * 2
    expected = np.array(
        [[(fi - m) @ precision @ (fi - m) for m in means] for fi in f]
    )  # float64 (f − μ_c)ᵀ Σ⁻¹ (f − μ_c), one pair at a time
    got = g.distances(torch.from_numpy(f).float()).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    predicted = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    closest, to_pred = g.scores(torch.from_numpy(f).float(), predicted)
    np.testing.assert_allclose(closest.numpy(), expected.min(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_pred.numpy(), expected[np.arange(7), predicted], rtol=1e-4)


def test_mahalanobis_of_in_class_points_is_chi_squared() -> None:
    """For f ~ N(μ_c, Σ), (f − μ_c)ᵀ Σ⁻¹ (f − μ_c) ~ χ²_D: mean D, variance 2D."""
    x, y = _gaussians(20_000, seed=2)
    g = fit_class_gaussians(torch.from_numpy(x), torch.from_numpy(y), C)
    assert g.shrinkage < 0.01  # n ≫ D: Ledoit–Wolf barely shrinks
    fresh, fresh_y = _gaussians(5_000, seed=3)
    d = g.distances(torch.from_numpy(fresh).float())[torch.arange(3 * 5_000), fresh_y]
    se = math.sqrt(2 * D / d.numel())
    assert abs(float(d.double().mean()) - D) < 5 * se + 0.02 * D  # + shrinkage/estimation bias


def _ledoit_wolf_by_definition(x: np.ndarray) -> float:
    """Ledoit & Wolf (2004) with their inner product ⟨A, B⟩ = tr(ABᵀ)/p, literally, in loops."""
    n, p = x.shape
    s = x.T @ x / n
    m = np.trace(s) / p
    d2 = np.sum((s - m * np.eye(p)) ** 2) / p
    b2 = sum(np.sum((np.outer(xi, xi) - s) ** 2) / p for xi in x) / n**2
    return min(b2, d2) / d2


@pytest.mark.parametrize(("n", "p"), [(30, 10), (200, 5), (8, 20)])
def test_ledoit_wolf_shrinkage_matches_its_definition(n: int, p: int) -> None:
    rng = np.random.default_rng(n + p)
    x = rng.normal(size=(n, p)) @ rng.normal(size=(p, p))
    x -= x.mean(0)
    assert ledoit_wolf_shrinkage(torch.from_numpy(x)) == pytest.approx(
        _ledoit_wolf_by_definition(x), rel=1e-9
    )


def test_shrinkage_makes_a_rank_deficient_covariance_invertible() -> None:
    rng = np.random.default_rng(0)
    x = np.zeros((12, 30))
    x[:, :5] = rng.normal(size=(12, 5))  # 25 dead units, fewer points than dimensions
    y = np.arange(12) % 3
    g = fit_class_gaussians(torch.from_numpy(x), torch.from_numpy(y), 3)
    assert 0.0 < g.shrinkage <= 1.0
    assert torch.isfinite(g.precision).all()
    with pytest.raises(ValueError, match="singular"):
        fit_class_gaussians(torch.from_numpy(x), torch.from_numpy(y), 3, shrinkage=0.0)


def test_kde_matches_a_direct_float64_sum() -> None:
    rng = np.random.default_rng(4)
    samples = [rng.normal(size=(n, 5)) + c for c, n in enumerate((6, 9, 4))]
    kde = ClassKDE(
        torch.from_numpy(np.concatenate(samples)).float(), torch.tensor([0, 6, 15, 19]), 1.7
    )
    f = rng.normal(size=(8, 5)) + 1
    classes = np.array([0, 1, 2, 2, 1, 0, 1, 1])
    expected = [
        math.log(
            sum(math.exp(-np.sum((f[b] - s) ** 2) / 1.7**2) for s in samples[c]) / len(samples[c])
        )
        for b, c in enumerate(classes)
    ]
    got = kde.log_density(torch.from_numpy(f).float(), torch.from_numpy(classes))
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-5, atol=1e-5)


def test_kde_log_space_survives_far_points() -> None:
    """Far from every sample exp(−‖f − φ‖²/σ²) underflows; the log-space value stays exact."""
    kde = ClassKDE(torch.zeros(3, 2), torch.tensor([0, 3]), 1.0)
    far = torch.tensor([[30.0, 40.0]])  # ‖f‖² = 2500
    assert float(kde.log_density(far, torch.tensor([0]))) == pytest.approx(-2500.0)


def _far_rows(generator: torch.Generator) -> list[torch.Tensor]:
    """Rows like a kernel density's terms: most far below their maximum (their exp underflows),
    some just either side of the floor, a few near the maximum; and the edge cases."""
    rows = []
    for n in (1, 2, 7, 64, 500, 5000):
        for scale in (0.5, 20.0, 300.0):
            x = torch.randn(4, n, generator=generator) * scale - 60.0
            rows.append(x)
            edge = (
                x.amax(1, keepdim=True)
                - EXP_FLOOR
                + 3 * torch.rand(4, n, generator=generator)
                - 1.5
            )
            edge[:, 0] = x.amax(1)  # the maximum itself stays
            rows.append(edge)
    rows.append(torch.tensor([[-math.inf, -math.inf], [-math.inf, 0.0], [math.inf, 1.0]]))
    rows.append(torch.tensor([[math.nan, 1.0], [1.0, -200.0]]))
    return rows


def test_logsumexp_rows_is_torch_logsumexp_bit_for_bit_on_random_rows() -> None:
    g = torch.Generator().manual_seed(11)
    for x in _far_rows(g):
        got, want = logsumexp_rows(x), torch.logsumexp(x, dim=1)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), (x.shape, (got - want).abs().max())


def test_logsumexp_rows_sums_no_term_below_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes it fast: the exponentials torch computes are of normal floats only."""
    seen: list[torch.Tensor] = []
    real = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda x, dim: seen.append(x) or real(x, dim=dim))
    x = torch.tensor([[0.0, -100.0, -300.0, -80.0], [5.0, 4.0, -1e6, 5.0]])
    logsumexp_rows(x)
    assert torch.equal(seen[0], torch.tensor([[0.0, -87.0, -87.0, -80.0], [5.0, 4.0, -82.0, 5.0]]))
    # and the kernel density goes through it
    kde = ClassKDE(torch.zeros(3, 2), torch.tensor([0, 3]), 1.0)
    kde.log_density(torch.tensor([[30.0, 40.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    kde.log_density(torch.tensor([[30.0, 40.0]]), torch.tensor([0]))
    assert len(seen) == 3 and all(
        bool((t >= t.amax(1, keepdim=True) - EXP_FLOOR).all()) for t in seen
    )


def test_logsumexp_rows_moves_a_sum_on_exact_ties_by_at_most_an_ulp() -> None:
    """The exception the docstring names: a row whose partial sums are exact rounding ties at
    every scale (found by a reviewer's search over float32 exp values), where round-half-to-even
    lets the raised e^−87 decide: about one ulp of the sum (1.2e-7) in the result. Without the
    one raised term the same row gives the same bits."""
    x = torch.tensor(
        [[-100.0, -70.16397094726562, -58.64856719970703, -47.47519302368164,
          -34.84124755859375, -22.998506546020508, -11.026066780090332, 0.0]]
    )  # fmt: skip
    got, want = logsumexp_rows(x), torch.logsumexp(x, dim=1)
    assert abs(float(got) - float(want)) <= 2**-22
    no_raised = x[:, 1:]  # every term within 87 of the maximum: nothing raised, the same bits
    assert torch.equal(logsumexp_rows(no_raised), torch.logsumexp(no_raised, dim=1))


def test_logsumexp_rows_of_no_columns_is_minus_infinity() -> None:
    assert torch.equal(logsumexp_rows(torch.zeros(3, 0)), torch.full((3,), -math.inf))


def test_logsumexp_rows_keeps_float64_and_gradients_as_torch_has_them() -> None:
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, 50, generator=g, dtype=torch.float64) * 100
    assert torch.equal(logsumexp_rows(x), torch.logsumexp(x, dim=1))
    a = (torch.randn(3, 50, generator=g) * 100).requires_grad_()
    b = a.detach().clone().requires_grad_()
    logsumexp_rows(a).sum().backward()
    torch.logsumexp(b, dim=1).sum().backward()
    assert torch.equal(a.grad, b.grad)  # the unfloored path: every term keeps its gradient


def test_bandwidth_maximises_held_out_likelihood_and_is_interior() -> None:
    rng = np.random.default_rng(5)
    train = torch.from_numpy(rng.normal(size=(400, 2)) * [1.0, 0.5])
    labels = torch.from_numpy(np.arange(400) % 2)
    samples, offsets = subsample_per_class(train, labels, 2, 150, torch.Generator().manual_seed(0))
    assert offsets.tolist() == [0, 150, 300]
    val = torch.from_numpy(rng.normal(size=(300, 2)) * [1.0, 0.5])
    val_y = torch.from_numpy(np.arange(300) % 2)
    sigma, curve = choose_bandwidth(samples, offsets, val, val_y)
    sigmas = [s for s, _ in curve]
    assert sigmas[0] < sigma < sigmas[-1]
    assert max(curve, key=lambda p: p[1])[0] == sigma
    # ℓ(σ) is the normalised density: N(φ, σ²/2·I) kernels; check one value by a direct sum
    s_np, f_np, y_np = samples.numpy(), val.numpy(), val_y.numpy()
    direct = np.mean(
        [
            np.log(
                np.mean(np.exp(-np.sum((f - s_np[offsets[c] : offsets[c + 1]]) ** 2, 1) / sigma**2))
            )
            - math.log(math.pi * sigma**2)  # (D/2)·log(πσ²) with D = 2
            for f, c in zip(f_np, y_np, strict=True)
        ]
    )
    assert held_out_log_likelihood(samples, offsets, val, val_y, sigma) == pytest.approx(direct)


def test_bandwidth_grid_widens_past_its_lower_edge_around_the_median_distance() -> None:
    """Validation points lying close to kernel samples want a σ far below the median distance:
    with a narrow grid (5 points over a factor 4 around σ₀) the search must widen downwards
    until the held-out likelihood peaks inside, and σ₀ itself — the root of the median squared
    distance to the samples of the point's class (computed here with numpy) — is on the first
    grid. Catches a widening in the wrong direction and a σ₀ without its square root."""
    rng = np.random.default_rng(7)
    train = torch.from_numpy(rng.normal(size=(200, 2)))
    labels = torch.from_numpy(np.arange(200) % 2)
    samples, offsets = subsample_per_class(train, labels, 2, 100, torch.Generator().manual_seed(0))
    val = samples[::2] + torch.from_numpy(rng.normal(scale=0.05, size=(100, 2)))
    val_y = torch.cat([torch.zeros(50), torch.ones(50)]).long()
    sigma, curve = choose_bandwidth(samples, offsets, val, val_y, points=5, span=4.0)
    s_np, v_np = samples.numpy(), val.numpy()
    squared = np.concatenate(
        [
            ((v_np[val_y.numpy() == c, None] - s_np[None, offsets[c] : offsets[c + 1]]) ** 2)
            .sum(-1)
            .ravel()
            for c in (0, 1)
        ]
    )
    sigma0 = math.sqrt(np.sort(squared)[(len(squared) - 1) // 2])  # torch's (lower) median
    sigmas = [s for s, _ in curve]
    assert any(s == pytest.approx(sigma0, rel=1e-9) for s in sigmas)
    assert sigma < sigma0 / 2 / 2  # below the first grid's lower edge by more than a widening
    assert sigmas[0] < sigma < sigmas[-1] and max(curve, key=lambda p: p[1])[0] == sigma
    for neighbour in (sigma / 2**0.5, sigma * 2**0.5):  # an interior maximum on the grid
        ll = held_out_log_likelihood(samples, offsets, val, val_y, neighbour)
        assert ll < held_out_log_likelihood(samples, offsets, val, val_y, sigma)


def test_logistic_regression_recovers_a_separating_direction() -> None:
    rng = np.random.default_rng(6)
    z = rng.normal(size=(600, 3))
    direction = np.array([2.0, -1.0, 0.0]) / math.sqrt(5)
    margin = z @ direction
    keep = np.abs(margin) > 0.2  # separable with a gap
    z, y = z[keep], (margin[keep] > 0).astype(float)
    w, b = fit_logistic(z, y, l2=1e-4)
    assert w @ direction / np.linalg.norm(w) > 0.99
    assert np.all(((z @ w + b) > 0) == (y == 1))


def test_logistic_regression_satisfies_its_optimality_condition() -> None:
    """Non-separable data: ∇L = Σ_i v_i (σ(η_i) − y_i) [z_i, 1] + λ[w, 0] = 0 at the optimum."""
    rng = np.random.default_rng(7)
    z = rng.normal(size=(500, 4))
    y = (rng.random(500) < 1 / (1 + np.exp(-(z @ [1.0, -0.5, 0.0, 2.0] + 0.3)))).astype(float)
    v = rng.random(500)
    w, b = fit_logistic(z, y, v, l2=0.05)
    p = 1 / (1 + np.exp(-(z @ w + b)))
    vn = v / v.sum()
    np.testing.assert_allclose(z.T @ (vn * (p - y)) + 0.05 * w, 0.0, atol=1e-8)
    assert abs(vn @ (p - y)) < 1e-8


def test_fused_threshold_keeps_its_fpr_on_held_out_clean_scores() -> None:
    rng = np.random.default_rng(8)

    def clean(n: int) -> dict[str, np.ndarray]:
        return {"a": rng.normal(size=n), "b": rng.exponential(size=n)}

    adversarial = {"a": rng.normal(2.0, 1.0, 400), "b": rng.exponential(4.0, 400)}
    fusion = fit_fusion(clean(400), adversarial, ("a", "b"), ("identity", "log1p"))
    assert fusion.coef[0] > 0 and fusion.coef[1] > 0

    def fused(s: dict[str, np.ndarray]) -> np.ndarray:
        return fusion.logit({k: torch.from_numpy(v) for k, v in s.items()}).numpy()

    target, n_cal, n_test = 0.05, 2_000, 20_000
    threshold = threshold_at_fpr(fused(clean(n_cal)), target)
    fpr = flag_rate(fused(clean(n_test)), threshold)
    # the calibration quantile's own spread plus the test estimate's, at about 4 σ
    tol = 4 * math.sqrt(target * (1 - target) * (1 / n_cal + 1 / n_test))
    assert abs(fpr - target) < tol


def test_pixel_space_distance_is_the_shrunk_mahalanobis_of_the_pixels() -> None:
    """An ``input`` layer (opt-in) scores the flattened pixels: min over classes of
    ``(x − μ_c)ᵀ Σ⁻¹ (x − μ_c)``, ``Σ = (1 − δ)S + δ (tr S / D) I``, computed here in float64 numpy
    from the definition; without ``include_input`` the layer is not fitted."""
    from bayesgate.attacks.detector_fit import INPUT_SCORE, min_p_scores
    from bayesgate.models.detection.detector import Detector
    from bayesgate.models.detection.fit import fit_gaussians

    rng = np.random.default_rng(3)
    pixels = rng.uniform(0, 1, (60, 16)) * (rng.uniform(0, 1, 16) > 0.3)  # some constant pixels
    labels = np.repeat(np.arange(C), 20)
    feats = {"input": torch.from_numpy(pixels).float()}
    y = torch.from_numpy(labels)
    assert fit_gaussians(feats, y, C) == {}
    det = Detector("0" * 64, 5, fit_gaussians(feats, y, C, shrinkage=0.2, include_input=True))
    mu = np.stack([pixels[labels == c].mean(0) for c in range(C)])
    centred = pixels - mu[labels]
    s = centred.T @ centred / len(pixels)
    sigma = 0.8 * s + 0.2 * np.trace(s) / 16 * np.eye(16)
    probe = rng.uniform(0, 1, (7, 16))
    diff = probe[:, None, :] - mu[None]
    expected = np.einsum("bcd,de,bce->bc", diff, np.linalg.inv(sigma), diff).min(axis=1)
    probs = torch.full((7, 5, C), 1.0 / C)
    got = det.scores(probs, {"input": torch.from_numpy(probe).float()})[INPUT_SCORE]
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=2e-4)
    assert min_p_scores(det)[-1] == INPUT_SCORE


def test_grid_layer_is_fitted_only_when_asked_and_scores_the_closed_form() -> None:
    """``trunk_2x2`` (conv maps pooled to 2×2 cells, opt-in): fitted with ``include_grid``, its
    closest-class distance is ``min_c (f − μ_c)ᵀ Σ⁻¹ (f − μ_c)`` with the Ledoit–Wolf-shrunk tied
    covariance (computed here in float64 numpy from the definitions), a p-value of the min-p rule
    and not an input of the logistic fusion."""
    from bayesgate.attacks.detector_fit import GRID_SCORE, MIN_P_SCORES, min_p_scores
    from bayesgate.models.detection.detector import Detector
    from bayesgate.models.detection.fit import fit_gaussians, fused_score_names

    x, y = _gaussians(300, seed=4)
    x = x.astype(np.float32).astype(np.float64)  # the features the fit sees
    feats = {"trunk_2x2": torch.from_numpy(x).float(), "trunk": torch.from_numpy(x[:, :2]).float()}
    labels = torch.from_numpy(y)
    assert set(fit_gaussians(feats, labels, C)) == {"trunk"}
    gaussians = fit_gaussians(feats, labels, C, include_grid=True)
    assert set(gaussians) == {"trunk", "trunk_2x2"}
    det = Detector("0" * 64, 5, gaussians)
    mu = np.stack([x[y == c].mean(0) for c in range(C)])
    centred = x - mu[y]
    delta = _ledoit_wolf_by_definition(centred)
    assert gaussians["trunk_2x2"].shrinkage == pytest.approx(delta, rel=1e-6)
    s = centred.T @ centred / len(x)
    sigma = (1 - delta) * s + delta * np.trace(s) / D * np.eye(D)
    probe = np.random.default_rng(5).normal(size=(6, D)) * 2
    diff = probe[:, None, :] - mu[None]
    expected = np.einsum("bcd,de,bce->bc", diff, np.linalg.inv(sigma), diff).min(axis=1)
    probs = torch.full((6, 5, C), 1.0 / C)
    got = det.scores(
        probs, {"trunk_2x2": torch.from_numpy(probe).float(), "trunk": feats["trunk"][:6]}
    )
    np.testing.assert_allclose(got[GRID_SCORE].double().numpy(), expected, rtol=1e-4)
    assert min_p_scores(det) == (*MIN_P_SCORES, GRID_SCORE)
    assert GRID_SCORE not in fused_score_names(tuple(gaussians), with_kde=True)
    with pytest.raises(ValueError, match="trunk_2x2"):
        fit_gaussians({"penultimate": feats["trunk"]}, labels, C, include_grid=True)


def test_fusion_with_outliers_weights_three_groups_as_documented() -> None:
    """Clean 1/2, attacks (1 − share)/2, outliers share/2 — checked against ``fit_logistic`` on
    a design built here by hand; the outliers pull the weight toward the score that sees them."""
    rng = np.random.default_rng(11)
    clean = {"a": rng.normal(size=300), "b": rng.exponential(size=300)}
    attacks = {"a": rng.normal(2.5, 1.0, 30), "b": rng.exponential(size=30)}  # seen by a
    outliers = {"a": rng.normal(size=200), "b": rng.exponential(6.0, 200)}  # seen by b
    names, transforms = ("a", "b"), ("identity", "log1p")
    fusion = fit_fusion(
        clean, attacks, names, transforms, 0.01, outliers=outliers, outlier_share=0.3
    )

    raw = np.stack(
        [
            np.concatenate([clean["a"], attacks["a"], outliers["a"]]),
            np.log1p(np.concatenate([clean["b"], attacks["b"], outliers["b"]])),
        ],
        axis=1,
    )
    z = (raw - raw.mean(axis=0)) / raw.std(axis=0)
    y = np.r_[np.zeros(300), np.ones(230)]
    v = np.r_[np.full(300, 0.5 / 300), np.full(30, 0.35 / 30), np.full(200, 0.15 / 200)]
    w, b = fit_logistic(z, y, v, 0.01)
    np.testing.assert_allclose(fusion.coef, w, rtol=1e-9)
    assert fusion.intercept == pytest.approx(b, rel=1e-9)
    np.testing.assert_allclose(fusion.mean, raw.mean(axis=0), rtol=1e-12)

    without = fit_fusion(clean, attacks, names, transforms, 0.01)
    more = fit_fusion(clean, attacks, names, transforms, 0.01, outliers=outliers, outlier_share=0.8)
    assert without.coef[1] < fusion.coef[1] < more.coef[1]  # b's weight grows with the share
    with pytest.raises(ValueError, match="outlier_share"):
        fit_fusion(clean, attacks, names, transforms, outliers=outliers, outlier_share=1.0)
