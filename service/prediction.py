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
- the decision: ``score`` = the calibrated score (one of the three above, named ``score_name``),
  ``adversarial = score > threshold``;
- ``model``: the weights and calibration that computed it (never read anywhere else, so an admin
  reload between a request's arrival and its batch cannot mislabel the answer).

A new score is one more field here, computed in :func:`predictions`, and named in the two
encoders (the ``/v1`` response model and the ``/v2`` output table).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.models.mc import uncertainty
from bayesgate.service.served_model import ModelRef, ServedModel


@dataclass(frozen=True, slots=True)
class Prediction:
    """One instance's answer (plain Python values, ready to encode)."""

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
    model: ModelRef
    samples: list[list[float]] | None = None  # K×C, when the request asked for them


def predictions(probs: torch.Tensor, model: ServedModel) -> list[Prediction]:
    """One :class:`Prediction` per row of ``probs`` (``B×K×C``, any device), computed by
    ``model``; without the samples (the worker attaches them on request)."""
    probs = probs.detach().float().cpu()
    calibration, classes, ref = model.calibration, model.card.classes, model.ref
    mean = uncertainty.predictive_mean(probs)
    measures = {
        "predictive_entropy": uncertainty.predictive_entropy(probs),
        "mutual_information": uncertainty.mutual_information(probs),
        "variation_ratio": uncertainty.variation_ratio(probs),
    }
    # Calibration accepts only these three scores (bayesgate.models.mc.uncertainty.SCORES).
    scores = measures[calibration.score].tolist()
    entropy, mutual, ratio = (values.tolist() for values in measures.values())
    aleatoric, epistemic = (v.tolist() for v in uncertainty.kwon_uncertainty(probs))
    threshold = calibration.threshold
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
            score_name=calibration.score,
            score=scores[b],
            threshold=threshold,
            adversarial=scores[b] > threshold,
            model=ref,
        )
        for b, label in enumerate(labels)
    ]
