"""Fitting the density statistics of a :class:`~.detector.Detector` from features.

1. Mahalanobis (every feature layer; the ``input`` pixels and the spatially pooled ``trunk_2x2``
   maps only when asked): class means + Ledoit–Wolf-shrunk tied covariance on the training
   split's features with their true labels (:func:`.mahalanobis.fit_class_gaussians`).
2. KDE (``kde_layer``): a per-class random subsample of ≤ ``kde_per_class`` training features
   (stored as ``kde_dtype``), the bandwidth σ maximising the held-out log-likelihood of validation
   features with their true labels (:func:`.kde.choose_bandwidth`).

The fusion and the thresholds need adversarial examples and detection metrics, which belong to
the attack module: :mod:`bayesgate.attacks.detector_fit` runs the whole pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from bayesgate.models.detection.detector import KDE_SCORE, UNCERTAINTY_SCORES, mahalanobis_names
from bayesgate.models.detection.kde import ClassKDE, choose_bandwidth, subsample_per_class
from bayesgate.models.detection.mahalanobis import ClassGaussians, fit_class_gaussians
from bayesgate.models.mc.engine import INPUT_LAYER, TRUNK_GRID_LAYER

KDE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
OPT_IN_LAYERS = (INPUT_LAYER, TRUNK_GRID_LAYER)
"""Layers fitted only when asked; their distances enter the min-p rule as their own p-values
(``bayesgate.attacks.detector_fit.min_p_scores``), never the logistic fusion."""


def fit_gaussians(
    features: Mapping[str, torch.Tensor],
    labels: torch.Tensor,
    n_classes: int,
    shrinkage: float | None = None,
    *,
    include_input: bool = False,
    include_grid: bool = False,
) -> dict[str, ClassGaussians]:
    """:class:`ClassGaussians` per feature layer (Ledoit–Wolf shrinkage when ``None``); the
    ``input`` pixels only with ``include_input`` (a pixel-space distance lowered the unseen CW and
    rotated-digit rates of the min-p rule: docs/detector.md), the ``trunk_2x2`` maps (conv maps
    pooled to 2×2 cells) only with ``include_grid``."""
    wanted = {INPUT_LAYER: include_input, TRUNK_GRID_LAYER: include_grid}
    if include_grid and TRUNK_GRID_LAYER not in features:
        raise ValueError(f"the network has no {TRUNK_GRID_LAYER!r} features (a CNN trunk has)")
    return {
        layer: fit_class_gaussians(f, labels, n_classes, shrinkage)
        for layer, f in features.items()
        if wanted.get(layer, True)
    }


def fit_kde(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    n_classes: int,
    *,
    per_class: int = 500,
    dtype: str = "float32",
    seed: int = 0,
) -> tuple[ClassKDE, dict[str, Any]]:
    """The per-class kernel density and a JSON report (σ, the σ grid and its log-likelihoods).

    σ is chosen with the samples as they will be stored (after the ``dtype`` cast), so the
    served density is the one whose likelihood was maximised.
    """
    if dtype not in KDE_DTYPES:
        raise ValueError(f"kde dtype must be one of {', '.join(KDE_DTYPES)}, got {dtype!r}")
    generator = torch.Generator().manual_seed(seed)
    samples, offsets = subsample_per_class(
        train_features, train_labels, n_classes, per_class, generator
    )
    samples = samples.to(KDE_DTYPES[dtype])
    sigma, curve = choose_bandwidth(samples.float(), offsets, val_features, val_labels)
    report = {
        "bandwidth": sigma,
        "per_class": per_class,
        "samples": int(samples.shape[0]),
        "dtype": dtype,
        "grid": [[s, ll] for s, ll in curve],
        "validation_images": int(val_features.shape[0]),
    }
    return ClassKDE(samples, offsets, sigma), report


def fused_score_names(layers: tuple[str, ...] | list[str], with_kde: bool) -> tuple[str, ...]:
    """The scores the fusion reads: predictive entropy, mutual information, the closest-class
    Mahalanobis distance of every layer but the opt-in ones (:data:`OPT_IN_LAYERS`), and
    ``−log KD``."""
    names = list(UNCERTAINTY_SCORES[:2])
    names += [mahalanobis_names(layer)[0] for layer in layers if layer not in OPT_IN_LAYERS]
    if with_kde:
        names.append(KDE_SCORE)
    return tuple(names)


def transform_for(name: str) -> str:
    """``log1p`` for the non-negative, heavy-tailed distance scores; identity otherwise."""
    return "log1p" if name.startswith("mahalanobis_") or name == KDE_SCORE else "identity"
