"""The answer for one input: :class:`Prediction`, built from the engine's ``B×K×C`` probabilities.

The worker makes one :class:`Prediction` per instance; ``/v1`` (:mod:`bayesgate.service.schemas`)
and ``/v2`` (:mod:`bayesgate.service.inference_protocol`) only encode it. For instance ``b`` with
MC samples ``p_k = probs[b, k]`` (``K×C``):

- ``probabilities = p̄ = (1/K) Σ_k p_k`` and ``label = argmax_c p̄_c``;
- ``predictive_entropy = H[p̄] = −Σ_c p̄_c log p̄_c``;
- ``mutual_information = H[p̄] − (1/K) Σ_k H[p_k]``;
- ``variation_ratio = 1 − f_mode / K``;
- ``aleatoric_variance = 1 − (1/K) Σ_k ‖p_k‖²`` and ``epistemic_variance = (1/K) Σ_k ‖p_k‖² − ‖p̄‖²``
  (Kwon et al.);
- ``scores``: every score by name — the three above and, when the model has a fused detector
  (:mod:`bayesgate.models.detection`), ``mahalanobis_<layer>``, ``mahalanobis_<layer>_predicted``,
  ``neg_log_kde`` and ``fused``, computed from the features of the same K passes;
- the decision (:attr:`ServedModel.decision`): ``score = scores[score_name]``, the fused score when
  there is a detector (else calibration.json's), or the admin's override;
  ``adversarial = score > threshold``;
- ``model``: the weights and calibration that computed it (never read anywhere else, so an admin
  reload between a request's arrival and its batch cannot mislabel the answer).

A new score is one more field here, computed in :func:`predictions`, and named in the two
encoders (the ``/v1`` response model and the ``/v2`` output table).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from bayesgate.models.mc import uncertainty
from bayesgate.service.served_model import ModelRef, ServedModel


@dataclass(slots=True)  # not frozen: a frozen dataclass is ~2× slower to build, per instance
class Prediction:
    """One instance's answer (plain Python values, ready to encode; not changed once built)."""

    label: int
    class_name: str
    probabilities: list[float]
    predictive_entropy: float
    mutual_information: float
    variation_ratio: float
    aleatoric_variance: float
    epistemic_variance: float
    score_name: str
    score: float
    threshold: float
    adversarial: bool
    scores: dict[str, float]  # every score by name (uncertainty, density, fused)
    model: ModelRef
    samples: list[list[float]] | None = None  # K×C, when the request asked for them


def predictions(
    probs: torch.Tensor,
    model: ServedModel,
    features: Mapping[str, torch.Tensor] | None = None,
) -> list[Prediction]:
    """One :class:`Prediction` per row of ``probs`` (``B×K×C``, any device), computed by
    ``model``; without the samples (the worker attaches them on request). ``features`` (from the
    same K passes) are needed when the model has a fused detector."""
    probs = probs.detach().float().cpu()
    classes, ref, decision = model.card.classes, model.ref, model.decision
    mean = uncertainty.predictive_mean(probs)
    measures = {name: fn(probs) for name, fn in uncertainty.SCORES.items()}
    scores = _all_scores(model, probs, features, measures)
    entropy, mutual, ratio = (measures[n].tolist() for n in UNCERTAINTY)
    aleatoric, epistemic = (v.tolist() for v in uncertainty.kwon_uncertainty(probs))
    per_row = _rows(scores)
    labels, means = mean.argmax(dim=-1).tolist(), mean.tolist()
    return [
        Prediction(
            label=label,
            class_name=classes[label] if label < len(classes) else str(label),
            probabilities=means[b],
            predictive_entropy=entropy[b],
            mutual_information=mutual[b],
            variation_ratio=ratio[b],
            aleatoric_variance=aleatoric[b],
            epistemic_variance=epistemic[b],
            score_name=decision.score,
            score=per_row[b][decision.score],
            threshold=decision.threshold,
            adversarial=per_row[b][decision.score] > decision.threshold,
            scores=per_row[b],
            model=ref,
        )
        for b, label in enumerate(labels)
    ]


UNCERTAINTY = ("predictive_entropy", "mutual_information", "variation_ratio")


def _all_scores(
    model: ServedModel,
    probs: torch.Tensor,
    features: Mapping[str, torch.Tensor] | None,
    measures: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The uncertainty scores, and with a detector every density score and the fused one."""
    if model.detector is None:
        return measures
    if features is None:
        raise RuntimeError("the served model has a detector but the engine gave no features")
    cpu = {name: f.detach().float().cpu() for name, f in features.items()}
    with torch.inference_mode():
        return model.detector.scores(probs, cpu, measures)


def _rows(scores: dict[str, torch.Tensor]) -> list[dict[str, float]]:
    """``{name: B values}`` → one ``{name: value}`` per instance (plain floats)."""
    names = list(scores)
    columns = torch.stack([scores[n].double() for n in names], dim=1).tolist()
    return [dict(zip(names, row, strict=True)) for row in columns]
