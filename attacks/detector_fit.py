"""Fitting a model's fused detector (``bayesgate fit-detector``): statistics, fusion, thresholds.

Data (never the test split):

1. **training split** (``train_subset`` images): features from :func:`collect_features` (K MC
   passes) → class Gaussians per network layer (not the ``input`` pixels: a pixel-space distance
   lowered the unseen CW and rotated-digit rates, docs/detector.md) and the KDE samples, with the
   true labels; with ``trunk_grid`` also class Gaussians of the conv maps pooled to 2×2 cells
   (``trunk_2x2``), whose closest-class distance is a third p-value of the min-p rule (not an
   input of the logistic fusion: :func:`min_p_scores`);
2. **validation split**, shuffled once by ``seed`` and cut into two disjoint parts:
   - *fit* part (``fit_images``): the KDE bandwidth (held-out log-likelihood, true labels); the
     clean side (label 0) of the fusion; the first ``attack_images`` of it are attacked with every
     spec in ``attacks`` (default: FGS η ∈ {0.1, 0.2, 0.3} and the 40-step targeted attack, the
     attacks ``bayesgate calibrate`` uses) through the ``k_attack``-pass MC log-predictive, and the
     *successful* adversarial examples (:mod:`bayesgate.attacks.run`) are the logistic fusion's
     label 1 — with ``outliers``, so are synthetic outliers made from the same attacked images
     (:mod:`bayesgate.attacks.outliers`; one per image and kind), weighted ``outlier_share`` of
     the positive class (:func:`~bayesgate.models.detection.fusion.fit_fusion`); with
     ``rule="min-p"`` (default) the fit part's clean scores of the logit and of
     predictive entropy are the reference of conformal p-values and ``fused`` is their minimum
     (:func:`min_p_scores`; the logit stays as ``fused_logistic``);
   - *threshold* part (``threshold_images``, other clean images): every score's threshold at
     ``target_fpr`` (:func:`bayesgate.attacks.metrics.threshold_at_fpr`), and its realised FPR.

The report (``Detector.fit``) records the data sizes, shrinkage, bandwidth curve, fusion
coefficients, each score's AUROC of the adversarial examples vs the *threshold-part* clean images
(per attack and pooled; the adversarial side is in-sample for the fusion, so these are
validation numbers, not the test-split evaluation) and the realised threshold FPRs.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch

from bayesgate.attacks.fit_settings import FitSettings
from bayesgate.attacks.metrics import auroc, flag_rate, threshold_at_fpr
from bayesgate.attacks.outliers import outlier_images
from bayesgate.attacks.run import run_attack
from bayesgate.attacks.specs import parse_attacks
from bayesgate.errors import InvalidArgument
from bayesgate.models.detection.conformal import fit_conformal
from bayesgate.models.detection.detector import (
    FUSED,
    FUSED_LOGISTIC,
    Detector,
    collect_features,
    mahalanobis_names,
    quadratic_names,
    scores_numpy,
)
from bayesgate.models.detection.fit import fit_gaussians, fit_kde, fused_score_names, transform_for
from bayesgate.models.detection.fusion import fit_fusion
from bayesgate.models.mc.engine import INPUT_LAYER, TRUNK_GRID_LAYER
from bayesgate.models.store.directory import LoadedModel


def fit_detector(
    loaded: LoadedModel,
    settings: FitSettings | None = None,
    *,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> Detector:
    """Fit every part of the detector of ``loaded`` (see the module docstring); writes nothing."""
    from bayesgate.models.data.mnist import load_mnist

    settings = settings or FitSettings()
    settings.check()
    layers = getattr(loaded.network, "feature_layers", ())
    if settings.trunk_grid and TRUNK_GRID_LAYER not in layers:
        raise InvalidArgument(f"trunk-grid: the network has no {TRUNK_GRID_LAYER} features (CNNs)")
    run = _FitRun(loaded, settings, torch.device(device), progress)
    card = loaded.card
    val_size = card.training.val_size
    if val_size < settings.fit_images + settings.threshold_images:
        raise InvalidArgument(
            f"the validation split has {val_size} images; fit-images + threshold-images = "
            f"{settings.fit_images + settings.threshold_images}"
        )
    started = time.perf_counter()
    n_classes = len(card.classes)

    run.log(f"training split: features with K={run.k}")
    x_train, y_train = load_mnist("train", val_size=val_size, limit=settings.train_subset)
    _, train_feats = run.collect(x_train, "train features")
    gaussians = fit_gaussians(
        train_feats, y_train, n_classes, settings.shrinkage, include_grid=settings.trunk_grid
    )

    x_val, y_val = load_mnist("val", val_size=val_size)
    order = torch.randperm(x_val.shape[0], generator=torch.Generator().manual_seed(settings.seed))
    fit_rows = order[: settings.fit_images]
    thr_rows = order[settings.fit_images : settings.fit_images + settings.threshold_images]
    fit_probs, fit_feats = run.collect(x_val[fit_rows], "validation features (fit part)")
    kde, kde_report = fit_kde(
        train_feats[KDE_LAYER],
        y_train,
        fit_feats[KDE_LAYER],
        y_val[fit_rows],
        n_classes,
        per_class=settings.kde_per_class,
        dtype=settings.kde_dtype,
        seed=settings.seed,
    )
    run.log(f"KDE bandwidth σ = {kde.bandwidth:.4g}")
    detector = Detector(card.weights_sha256, run.k, gaussians, kde, KDE_LAYER)
    detector.target_fpr = settings.target_fpr
    fit_clean = scores_numpy(detector, fit_probs, fit_feats)

    attacked = slice(0, settings.attack_images)
    adversarial, attack_summaries = run.adversarial_scores(
        detector, x_val[fit_rows][attacked], y_val[fit_rows][attacked]
    )
    outliers = run.outlier_scores(detector, x_val[fit_rows][attacked], y_val[fit_rows][attacked])
    names = fused_score_names(tuple(gaussians), with_kde=True)
    pooled = {n: np.concatenate([a[n] for a in adversarial.values()]) for n in names}
    clean = {n: fit_clean[n] for n in names}
    transforms = tuple(transform_for(n) for n in names)
    detector.fusion = fit_fusion(
        clean,
        pooled,
        names,
        transforms,
        settings.l2,
        outliers={n: np.concatenate([o[n] for o in outliers.values()]) for n in names}
        if outliers
        else None,
        outlier_share=settings.outlier_share,
    )
    if settings.rule == "min-p":
        logit = scores_numpy_fused(detector, fit_clean)[FUSED]  # before the rule exists
        detector.conformal = fit_conformal(
            {**fit_clean, FUSED_LOGISTIC: logit}, min_p_scores(detector)
        )

    thr_clean = scores_numpy(detector, *run.collect(x_val[thr_rows], "validation (threshold part)"))
    detector.thresholds = {
        n: threshold_at_fpr(s, settings.target_fpr) for n, s in thr_clean.items()
    }
    if detector.conformal is not None:
        detector.thresholds[FUSED] = detector.conformal.gap_threshold(detector.thresholds[FUSED])
    adversarial = {key: scores_numpy_fused(detector, a) for key, a in adversarial.items()}
    outliers = {key: scores_numpy_fused(detector, o) for key, o in outliers.items()}
    detector.fit = _report(
        detector,
        settings,
        run,
        {
            "train": int(x_train.shape[0]),
            "fit": int(fit_rows.numel()),
            "attacked": int(settings.attack_images),
            "threshold": int(thr_rows.numel()),
        },
        kde_report,
        attack_summaries,
        adversarial,
        thr_clean,
        time.perf_counter() - started,
    )
    if outliers:
        detector.fit["outliers"] = {
            kind: {"images": len(o[FUSED]), "auroc": _aurocs(thr_clean, o)}
            for kind, o in outliers.items()
        }
    return detector


KDE_LAYER = "penultimate"
MIN_P_SCORES = (FUSED_LOGISTIC, "predictive_entropy")
""""Logistic OR entropy" with the FPR budget split by the minimum p-value: the logit keeps what it
learnt from the seen attacks, entropy's evidence (which the logit, fitted on attacks the trunk
distance separates, weights down) is never forgotten. See docs/detector.md for the comparison."""
INPUT_SCORE = mahalanobis_names(INPUT_LAYER)[0]
"""The pixel-space Mahalanobis distance (closest class): a third p-value of the min-p rule when a
detector has ``input`` Gaussians (only ``bench/detector_input_layer.py`` adds them: the
experiment of docs/detector.md, which this rule lost)."""
GRID_SCORE = mahalanobis_names(TRUNK_GRID_LAYER)[0]
"""The Mahalanobis distance of the conv maps pooled to 2×2 cells (closest class): a p-value of the
min-p rule when a detector has ``trunk_2x2`` Gaussians (``fit-detector --trunk-grid``,
``bench/detector_rule.py --grid-layer``)."""
PIXEL_QUADRATIC = "input_pool2"
"""Name of the per-class (quadratic) Gaussians of the input pooled over 2×2 pixels
(:mod:`bayesgate.models.detection.quadratic`; ``bench/detector_rule.py --pixel-gaussians``)."""
PIXEL_QUADRATIC_SCORE = quadratic_names(PIXEL_QUADRATIC)[0]
"""``min_c q_c(f)`` of those Gaussians: a p-value of the min-p rule when the detector has them."""


def min_p_scores(detector: Detector) -> tuple[str, ...]:
    """:data:`MIN_P_SCORES`, plus :data:`GRID_SCORE` / :data:`INPUT_SCORE` /
    :data:`PIXEL_QUADRATIC_SCORE` when the detector has ``trunk_2x2`` / ``input`` Gaussians /
    per-class Gaussians of the pooled input."""
    extra = [
        name
        for layer, name in ((TRUNK_GRID_LAYER, GRID_SCORE), (INPUT_LAYER, INPUT_SCORE))
        if layer in detector.gaussians
    ]
    if PIXEL_QUADRATIC in detector.quadratics:
        extra.append(PIXEL_QUADRATIC_SCORE)
    return MIN_P_SCORES + tuple(extra)


def scores_numpy_fused(detector: Detector, scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the fused score(s) to score arrays computed before the fusion was fitted."""
    assert detector.fusion is not None
    tensors = {n: torch.from_numpy(v) for n, v in scores.items()}
    if detector.conformal is not None:
        tensors[FUSED_LOGISTIC] = detector.fusion.logit(tensors)
        tensors[FUSED] = detector.conformal.score(tensors)
    else:
        tensors[FUSED] = detector.fusion.logit(tensors)
    return {n: v.numpy() for n, v in tensors.items()}


class _FitRun:
    """The model, settings and device of one fit; collects features and adversarial scores."""

    def __init__(
        self, loaded: LoadedModel, settings: FitSettings, device: torch.device, progress: bool
    ) -> None:
        card = loaded.card
        self.loaded, self.settings, self.device, self.progress = loaded, settings, device, progress
        self.k = settings.k or card.inference.k_test
        self.k_attack = settings.k_attack or card.inference.k_attack
        self.attacks = parse_attacks(list(settings.attacks))

    def log(self, message: str) -> None:
        if self.progress:
            print(message, file=sys.stderr)

    def collect(self, x: torch.Tensor, desc: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(probs N×K×C, features)`` with the fit's K, seed and device."""
        return collect_features(
            self.loaded.network,
            x,
            self.k,
            batch_size=500,
            seed=self.settings.seed,
            device=self.device,
            progress=self.progress,
            desc=desc,
        )

    def adversarial_scores(
        self, detector: Detector, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[dict[str, dict[str, np.ndarray]], list[dict[str, Any]]]:
        """Scores of the successful adversarial examples per attack spec, and attack summaries."""
        scores: dict[str, dict[str, np.ndarray]] = {}
        summaries = []
        for attack in self.attacks:
            outcome = run_attack(
                self.loaded.network,
                x,
                y,
                attack,
                k=self.k_attack,
                k_eval=self.k,
                batch_size=self.settings.batch_size,
                seed=self.settings.seed,
                device=self.device,
                progress=self.progress,
            )
            summary = outcome.summary()
            summaries.append(summary)
            self.log(f"{attack.label}: {summary['successful']} of {summary['eligible']} succeeded")
            if int(outcome.success.sum()) > 0:
                adv = outcome.x_adv[outcome.success]
                scores[attack.key] = scores_numpy(detector, *self.collect(adv, attack.label))
        if not scores:
            raise InvalidArgument(
                "no attack succeeded on the fit images: nothing to fit the fusion on"
            )
        return scores, summaries

    def outlier_scores(
        self, detector: Detector, x: torch.Tensor, y: torch.Tensor
    ) -> dict[str, dict[str, np.ndarray]]:
        """Scores of the synthetic outliers of every kind in ``settings.outliers``."""
        return {
            kind: scores_numpy(
                detector,
                *self.collect(outlier_images(kind, x, y, self.settings.seed), f"outliers: {kind}"),
            )
            for kind in self.settings.outliers
        }


def _report(
    detector: Detector,
    settings: FitSettings,
    run: _FitRun,
    images: dict[str, int],
    kde_report: dict[str, Any],
    attack_summaries: list[dict[str, Any]],
    adversarial: dict[str, dict[str, np.ndarray]],
    thr_clean: dict[str, np.ndarray],
    seconds: float,
) -> dict[str, Any]:
    """The JSON fit report (see the module docstring)."""
    pooled = {n: np.concatenate([a[n] for a in adversarial.values()]) for n in thr_clean}
    per_attack = {}
    for summary in attack_summaries:
        scores = adversarial.get(summary["attack"])
        per_attack[summary["attack"]] = {
            "label": summary["label"],
            "eligible": summary["eligible"],
            "successful": summary["successful"],
            "success_rate": summary["success_rate"],
            "auroc": None if scores is None else _aurocs(thr_clean, scores),
        }
    return {
        "settings": {k: v for k, v in vars(settings).items()},
        "k": run.k,
        "k_attack": run.k_attack,
        "images": images,
        "shrinkage": {layer: g.shrinkage for layer, g in detector.gaussians.items()},
        "kde": kde_report,
        "realised_fpr": {n: flag_rate(s, detector.thresholds[n]) for n, s in thr_clean.items()},
        "auroc": _aurocs(thr_clean, pooled),
        "attacks": per_attack,
        "seconds": round(seconds, 1),
    }


def _aurocs(clean: dict[str, np.ndarray], adversarial: dict[str, np.ndarray]) -> dict[str, float]:
    return {n: round(auroc(clean[n], adversarial[n]), 6) for n in clean}
