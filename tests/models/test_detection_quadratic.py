"""Per-class (quadratic) Gaussians of pooled images against the Gaussian log-density, Ledoit–Wolf
per class, pooling by hand, and the detector's storage and scores."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesgate.attacks.detector_fit import PIXEL_QUADRATIC, PIXEL_QUADRATIC_SCORE, min_p_scores
from bayesgate.models.detection import Detector, load_detector, save_detector
from bayesgate.models.detection.detector import quadratic_names
from bayesgate.models.detection.mahalanobis import ClassGaussians, ledoit_wolf_shrinkage
from bayesgate.models.detection.quadratic import ClassQuadratic, fit_class_quadratic

SHA = "cd" * 32
C = 3


def _images(n_per_class: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``3n×1×4×4`` images: class c is a different 2×2-pooled Gaussian (own covariance each)."""
    g = torch.Generator().manual_seed(seed)
    xs = []
    for c in range(C):
        mix = torch.randn(16, 16, generator=g, dtype=torch.float64) * (0.3 + 0.4 * c)
        x = torch.randn(n_per_class, 16, generator=g, dtype=torch.float64) @ mix + c
        xs.append(x.view(n_per_class, 1, 4, 4))
    return torch.cat(xs).float(), torch.arange(C).repeat_interleave(n_per_class)


def _pool_by_hand(x: np.ndarray) -> np.ndarray:
    """``B×1×4×4`` → ``B×4``: the mean of each 2×2 cell, row by row."""
    return np.stack(
        [x[:, 0, i : i + 2, j : j + 2].mean(axis=(1, 2)) for i in (0, 2) for j in (0, 2)], axis=1
    )


def test_nll_is_minus_twice_the_gaussian_log_density_of_each_class() -> None:
    x, y = _images(300)
    q = fit_class_quadratic(x, y, C, pool=2)
    f = _pool_by_hand(x.double().numpy())
    probe = torch.randn(9, 1, 4, 4, generator=torch.Generator().manual_seed(5)) * 2
    fp = _pool_by_hand(probe.double().numpy())
    yn = y.numpy()
    expected = np.empty((9, C))
    for c in range(C):
        fc = f[yn == c]
        mu = fc.mean(0)
        s = (fc - mu).T @ (fc - mu) / len(fc)
        delta = ledoit_wolf_shrinkage(torch.from_numpy(fc - mu))
        assert q.shrinkage[c] == pytest.approx(delta, rel=1e-9)
        cov = (1 - delta) * s + delta * np.trace(s) / 4 * np.eye(4)
        dist = torch.distributions.MultivariateNormal(
            torch.from_numpy(mu), torch.from_numpy(cov)
        )  # independent reference: −2 log N(f; μ_c, Σ_c) − D log 2π
        expected[:, c] = -2 * dist.log_prob(torch.from_numpy(fp)).numpy() - 4 * math.log(
            2 * math.pi
        )
    got = q.nll(probe.flatten(1)).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
    predicted = torch.tensor([0, 1, 2, 2, 1, 0, 0, 1, 2])
    closest, to_pred = q.scores(probe.flatten(1), predicted)
    np.testing.assert_allclose(closest.numpy(), expected.min(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(
        to_pred.numpy(), expected[np.arange(9), predicted.numpy()], rtol=1e-4, atol=1e-3
    )


def test_own_covariances_separate_what_a_tied_one_cannot() -> None:
    """Two classes with the same mean and different spreads: a tied covariance gives both the
    same distance, the per-class model tells a point typical of the wide class from the narrow."""
    g = torch.Generator().manual_seed(3)
    narrow = torch.randn(4000, 1, 2, 2, generator=g) * 0.1
    wide = torch.randn(4000, 1, 2, 2, generator=g) * 3.0
    x, y = torch.cat([narrow, wide]), torch.arange(2).repeat_interleave(4000)
    q = fit_class_quadratic(x, y, 2, pool=1)
    point = torch.full((1, 4), 3.0)
    nll = q.nll(point)[0]
    assert float(nll[1]) < float(nll[0])  # typical of the wide class, far out for the narrow
    # min over classes: a point typical of the narrow class scores lower than one typical of none
    assert float(q.nll(torch.zeros(1, 4)).min()) < float(q.nll(torch.full((1, 4), 30.0)).min())


def test_pooled_features_are_cell_means_and_bad_inputs_are_refused() -> None:
    x, y = _images(20)
    q = fit_class_quadratic(x, y, C, pool=2)
    np.testing.assert_allclose(
        q.features(x.flatten(1)).numpy(), _pool_by_hand(x.numpy()), rtol=1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="B×C×H×W"):
        fit_class_quadratic(x.flatten(1), y, C)
    with pytest.raises(ValueError, match="≥ 2 examples"):
        fit_class_quadratic(x[:21], y[:21], C)
    with pytest.raises(ValueError, match="same classes"):
        ClassQuadratic(q.means, q.precisions[:2], q.shrinkage, q.image_shape, q.pool)
    with pytest.raises(ValueError, match="pooled"):
        ClassQuadratic(q.means, q.precisions, q.shrinkage, (1, 8, 8), 2)


def _detector_with_quadratic() -> tuple[Detector, ClassQuadratic]:
    x, y = _images(50)
    q = fit_class_quadratic(x, y, C, pool=2)
    gaussians = {"trunk": ClassGaussians(torch.zeros(C, 2), torch.eye(2), 0.1)}
    thresholds = {"predictive_entropy": 0.5, PIXEL_QUADRATIC_SCORE: 12.25}
    det = Detector(SHA, 4, gaussians, target_fpr=0.05, thresholds=thresholds)
    det.quadratics = {PIXEL_QUADRATIC: q}
    return det, q


def test_detector_scores_store_and_min_p_names_carry_the_quadratic(tmp_path: Path) -> None:
    det, q = _detector_with_quadratic()
    assert det.score_names[-2:] == quadratic_names(PIXEL_QUADRATIC)
    assert "input" in det.layers
    assert min_p_scores(det)[-1] == PIXEL_QUADRATIC_SCORE
    b = 6
    g = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(b, 4, C, generator=g), dim=-1)
    pixels = torch.randn(b, 16, generator=g)
    features = {"trunk": torch.randn(b, 2, generator=g), "input": pixels}
    scores = det.scores(probs, features)
    predicted = probs.mean(1).argmax(-1)
    closest, to_pred = q.scores(pixels, predicted)
    assert torch.equal(scores[PIXEL_QUADRATIC_SCORE], closest)
    assert torch.equal(scores[quadratic_names(PIXEL_QUADRATIC)[1]], to_pred)
    with pytest.raises(ValueError, match="'input'"):
        det.scores(probs, {"trunk": features["trunk"]})

    save_detector(det, tmp_path)
    back = load_detector(tmp_path, weights_sha256=SHA)
    bq = back.quadratics[PIXEL_QUADRATIC]
    assert torch.equal(bq.means, q.means) and torch.equal(bq.precisions, q.precisions)
    assert bq.shrinkage == q.shrinkage and bq.image_shape == q.image_shape and bq.pool == q.pool
    assert torch.equal(bq.log_det_cov, q.log_det_cov)
    again = back.scores(probs, features)
    for name, value in scores.items():
        assert torch.equal(again[name], value), name


def test_quadratic_scores_are_differentiable_in_the_pixels() -> None:
    det, _ = _detector_with_quadratic()
    pixels = torch.randn(3, 16, requires_grad=True)
    probs = torch.softmax(torch.randn(3, 4, C), dim=-1)
    out = det.scores(probs, {"trunk": torch.randn(3, 2), "input": pixels})
    out[PIXEL_QUADRATIC_SCORE].sum().backward()
    assert pixels.grad is not None and bool(pixels.grad.abs().sum() > 0)
