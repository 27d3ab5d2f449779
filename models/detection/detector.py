"""The detector: every score of an input from its MC probabilities and features, and the fused one.

Scores (all "higher = more suspicious"; an input is flagged by a score when it exceeds that
score's threshold):

- ``predictive_entropy``, ``mutual_information``, ``variation_ratio`` — MC uncertainty from the
  ``B×K×C`` probabilities (:mod:`bayesgate.models.mc.uncertainty`);
- ``mahalanobis_<layer>`` = ``min_c d_c(f)`` and ``mahalanobis_<layer>_predicted`` = ``d_ŷ(f)`` for
  every feature layer (``trunk``, ``penultimate``; :mod:`.mahalanobis`), ``ŷ = argmax_c p̄_c``;
- ``neg_log_kde`` = ``−log KD(f)`` of the predicted class in the last hidden layer (:mod:`.kde`);
- ``gaussian_nll_<name>`` = ``min_c q_c(f)`` and ``gaussian_nll_<name>_predicted`` = ``q_ŷ(f)`` for
  every per-class (quadratic) Gaussian of the pooled input (opt-in; :mod:`.quadratic`);
- ``fused`` = the minimum-p-value rule over ``conformal.names`` when the detector has one
  (:mod:`.conformal`: ``−log min_j p_j`` with conformal p-values against clean validation scores),
  and then ``fused_logistic`` = the logistic-regression logit over the standardised scores in
  ``fusion.names`` (:mod:`.fusion`); without ``conformal``, ``fused`` is that logit.

API (for the service, the fitting command and the evaluation):

- :meth:`Detector.scores` ``(probs B×K×C, features {layer: B×D})`` → ``{name: B}`` tensors, pure
  torch and differentiable (an adaptive attack can take ``∇_x`` of
  ``scores(..., smooth=True)["fused"]`` through
  :func:`bayesgate.models.mc.engine.mc_logits_features`; ``smooth`` swaps the exact min-p-value
  score, a step function, for its differentiable surrogate :meth:`.ConformalFusion.smooth`);
- :func:`score_images` — scores of a whole image set in batches (``mc_predict_features`` with a
  seeded generator) as float64 numpy arrays;
- :meth:`Detector.flags` — ``score > threshold`` for every score with a threshold;
- storage: :func:`bayesgate.models.detection.store.save_detector` / ``load_detector``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bayesgate.models.detection.conformal import RULES, ConformalFusion
from bayesgate.models.detection.fusion import LogisticFusion
from bayesgate.models.detection.kde import ClassKDE
from bayesgate.models.detection.mahalanobis import ClassGaussians
from bayesgate.models.detection.quadratic import ClassQuadratic
from bayesgate.models.mc.engine import INPUT_LAYER, mc_predict_features
from bayesgate.models.mc.uncertainty import SCORES, predictive_mean

FUSED = "fused"
FUSED_LOGISTIC = "fused_logistic"
KDE_SCORE = "neg_log_kde"
UNCERTAINTY_SCORES: tuple[str, ...] = tuple(SCORES)


def mahalanobis_names(layer: str) -> tuple[str, str]:
    """``(mahalanobis_<layer>, mahalanobis_<layer>_predicted)``."""
    return f"mahalanobis_{layer}", f"mahalanobis_{layer}_predicted"


def quadratic_names(name: str) -> tuple[str, str]:
    """``(gaussian_nll_<name>, gaussian_nll_<name>_predicted)``."""
    return f"gaussian_nll_{name}", f"gaussian_nll_{name}_predicted"


@dataclass
class Detector:
    """Fitted statistics of one model (tied to its weights by ``model_sha256``).

    ``gaussians``: layer → class Gaussians; ``kde`` on ``kde_layer``; ``fusion`` (``None`` before
    the fusion is fitted); ``conformal`` (``None``: ``fused`` is the logistic logit);
    ``thresholds``: score name → threshold at ``target_fpr`` on clean
    validation images; ``k`` the MC samples the scores and thresholds were computed with;
    ``fit``: how it was fitted (data, bandwidth curve, AUROCs — JSON-ready); ``quadratics``:
    name (e.g. ``input_pool2``) → per-class Gaussians of the pooled ``input`` layer.
    """

    model_sha256: str
    k: int
    gaussians: dict[str, ClassGaussians]
    kde: ClassKDE | None = None
    kde_layer: str = "penultimate"
    fusion: LogisticFusion | None = None
    target_fpr: float = 0.05
    thresholds: dict[str, float] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    conformal: ConformalFusion | None = None
    quadratics: dict[str, ClassQuadratic] = field(default_factory=dict)

    @property
    def score_names(self) -> tuple[str, ...]:
        """Every score :meth:`scores` returns, in a fixed order."""
        names = list(UNCERTAINTY_SCORES)
        for layer in self.gaussians:
            names += mahalanobis_names(layer)
        for name in self.quadratics:
            names += quadratic_names(name)
        if self.kde is not None:
            names.append(KDE_SCORE)
        if self.fusion is not None:
            names.append(FUSED)
            if self.conformal is not None:
                names.append(FUSED_LOGISTIC)
        return tuple(names)

    @property
    def layers(self) -> tuple[str, ...]:
        """The feature layers :meth:`scores` reads."""
        kde = (self.kde_layer,) if self.kde is not None else ()
        pixels = (INPUT_LAYER,) if self.quadratics else ()
        return tuple(dict.fromkeys((*self.gaussians, *kde, *pixels)))

    @property
    def score(self) -> str:
        """The score that flags inputs: ``fused`` when fitted, predictive entropy otherwise."""
        return (
            FUSED if self.fusion is not None and FUSED in self.thresholds else UNCERTAINTY_SCORES[0]
        )

    @property
    def threshold(self) -> float:
        return self.thresholds[self.score]

    def scores(
        self,
        probs: torch.Tensor,
        features: Mapping[str, torch.Tensor],
        uncertainty: Mapping[str, torch.Tensor] | None = None,
        *,
        smooth: bool = False,
        predicted: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Every score of :attr:`score_names` (``B`` each) from ``B×K×C`` probs and features.

        ``uncertainty``: the MC uncertainty scores when the caller has them already (the service
        does), else they are computed from ``probs``; ``predicted``, likewise, the predicted
        classes ``argmax_c p̄_c`` (int64 ``B``). ``smooth``: ``fused`` is the
        min-p-value rule's differentiable surrogate (for attacks), not the exact score.
        """
        out = dict(uncertainty) if uncertainty is not None else {}
        out.update({name: fn(probs) for name, fn in SCORES.items() if name not in out})
        if predicted is None:
            predicted = predictive_mean(probs).argmax(dim=-1)
        for layer, gaussians in self.gaussians.items():
            closest, to_predicted = gaussians.scores(_layer(features, layer), predicted)
            out.update(zip(mahalanobis_names(layer), (closest, to_predicted), strict=True))
        for name, quadratic in self.quadratics.items():
            closest, to_predicted = quadratic.scores(_layer(features, INPUT_LAYER), predicted)
            out.update(zip(quadratic_names(name), (closest, to_predicted), strict=True))
        if self.kde is not None:
            out[KDE_SCORE] = -self.kde.log_density(_layer(features, self.kde_layer), predicted)
        if self.fusion is not None:
            out[FUSED] = self.fusion.logit(out)
        if self.conformal is not None:
            out[FUSED_LOGISTIC] = out.pop(FUSED)
            fuse = self.conformal.smooth if smooth else self.conformal.score
            out[FUSED] = fuse(out)
        return out

    def flags(self, scores: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``score > threshold`` (bool ``B``) for every score that has a threshold."""
        return {n: scores[n] > t for n, t in self.thresholds.items() if n in scores}


def rule_summary(detector: Detector) -> dict[str, Any]:
    """How ``fused`` is made, for reports: ``min_p_value`` (or ``fisher_p_value``) over its
    names, or ``logistic``."""
    if detector.conformal is not None:
        rule = detector.conformal
        sizes = {n: len(r) for n, r in zip(rule.names, rule.reference, strict=True)}
        return {"rule": RULES[rule.combine], "names": list(rule.names), "reference_sizes": sizes}
    return {"rule": "logistic" if detector.fusion is not None else None}


def _layer(features: Mapping[str, torch.Tensor], layer: str) -> torch.Tensor:
    if layer not in features:
        raise ValueError(f"the detector needs {layer!r} features; got {sorted(features)}")
    return features[layer]


@torch.no_grad()
def collect_features(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    *,
    batch_size: int = 500,
    seed: int | None = 0,
    device: torch.device | str = "cpu",
    progress: bool = False,
    desc: str = "features",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(probs N×K×C, {layer: N×D})`` on the CPU for a whole image set, masks seeded ``seed``."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    probs, feats = [], []
    starts = range(0, x.shape[0], batch_size)
    for i in tqdm(starts, desc=desc, disable=not progress, leave=False):
        out = mc_predict_features(model, x[i : i + batch_size].to(device), k, generator=generator)
        probs.append(out.probs.cpu())
        feats.append({n: f.cpu() for n, f in out.features.items()})
    return torch.cat(probs), {n: torch.cat([f[n] for f in feats]) for n in feats[0]}


def score_images(
    detector: Detector,
    model: nn.Module,
    x: torch.Tensor,
    *,
    k: int | None = None,
    batch_size: int = 500,
    seed: int | None = 0,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """Every score of every image in ``x`` (float64 numpy, length N); K defaults to the
    detector's."""
    probs, features = collect_features(
        model,
        x,
        k or detector.k,
        batch_size=batch_size,
        seed=seed,
        device=device,
        progress=progress,
        desc="scores",
    )
    return scores_numpy(detector, probs, features)


def scores_numpy(
    detector: Detector, probs: torch.Tensor, features: Mapping[str, torch.Tensor]
) -> dict[str, np.ndarray]:
    """:meth:`Detector.scores` as float64 numpy arrays (no autograd)."""
    with torch.no_grad():
        return {n: v.double().cpu().numpy() for n, v in detector.scores(probs, features).items()}
