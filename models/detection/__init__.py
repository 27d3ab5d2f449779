"""Adversarial / out-of-distribution detection from MC uncertainty and feature-space density.

- :mod:`.mahalanobis` — class Gaussians with a tied, Ledoit–Wolf-shrunk covariance (Lee et al.
  2018);
- :mod:`.kde` — per-class Gaussian kernel density of the last hidden layer (Feinman et al. 2017);
- :mod:`.fusion` — logistic regression over standardised scores (Newton, L2);
- :mod:`.conformal` — the attack-free rule: minimum conformal p-value against clean scores;
- :mod:`.detector` — :class:`Detector`: every score from ``B×K×C`` probabilities + features;
- :mod:`.fit` — fitting the statistics and thresholds from score arrays;
- :mod:`.store` — ``detector.safetensors`` + ``detector.json`` beside the model.

The features come from the MC engine in the same K passes as the probabilities
(:func:`bayesgate.models.mc.engine.mc_predict_features`). Generating the adversarial examples the
fusion is trained on belongs to :mod:`bayesgate.attacks.detector_fit` (data flows one way).
"""

from bayesgate.models.detection.detector import (
    FUSED,
    FUSED_LOGISTIC,
    KDE_SCORE,
    Detector,
    collect_features,
    mahalanobis_names,
    score_images,
    scores_numpy,
)
from bayesgate.models.detection.store import load_detector, save_detector

__all__ = [
    "FUSED",
    "FUSED_LOGISTIC",
    "KDE_SCORE",
    "Detector",
    "collect_features",
    "load_detector",
    "mahalanobis_names",
    "save_detector",
    "score_images",
    "scores_numpy",
]
