"""bench/detector_rule.py --pixel-gaussians: the per-class Gaussians it adds to a detector are
those of the pooled training digits, and the min-p rule then names their score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load_bench

from bayesgate.attacks.detector_fit import PIXEL_QUADRATIC, PIXEL_QUADRATIC_SCORE, min_p_scores
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import load_detector
from bayesgate.models.store.directory import load_model

ROBUST = Path(__file__).resolve().parents[1] / "models" / "pretrained" / "bayesgate-robust"


def test_pixel_gaussians_are_those_of_the_pooled_training_digits() -> None:
    rule = load_bench("detector_rule")
    loaded = load_model(ROBUST)
    detector = load_detector(ROBUST, loaded.card.weights_sha256)
    assert PIXEL_QUADRATIC_SCORE not in min_p_scores(detector)
    rule.add_pixel_quadratic(loaded, detector)

    q = detector.quadratics[PIXEL_QUADRATIC]
    assert (q.image_shape, q.pool, tuple(q.means.shape)) == ((1, 28, 28), 2, (10, 196))
    x, y = load_mnist("train", val_size=loaded.card.training.val_size)
    pooled = x.numpy().reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(-1, 196)
    for c in (0, 7):
        np.testing.assert_allclose(
            q.means[c].numpy(), pooled[y.numpy() == c].mean(0), rtol=1e-5, atol=1e-6
        )
    assert detector.fit["shrinkage"][PIXEL_QUADRATIC] == list(q.shrinkage)
    assert all(0.0 < d < 0.05 for d in q.shrinkage)  # n ≫ D: Ledoit–Wolf shrinks a little
    assert min_p_scores(detector)[-1] == PIXEL_QUADRATIC_SCORE
    with pytest.raises(SystemExit, match="already has"):
        rule.add_pixel_quadratic(loaded, detector)
