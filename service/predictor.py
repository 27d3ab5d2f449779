"""One engine call and the per-instance answer built from its ``B×K×C`` MC probabilities.

For each instance ``b`` with MC samples ``p_k = probs[b, k]`` (``K×C``):

- ``probabilities = p̄ = (1/K) Σ_k p_k`` and ``label = argmax_c p̄_c``;
- ``predictive_entropy = H[p̄] = −Σ_c p̄_c log p̄_c``;
- ``mutual_information = H[p̄] − (1/K) Σ_k H[p_k]``;
- ``variation_ratio = 1 − f_mode / K``;
- ``score`` = the calibrated score (one of the three), ``adversarial = score > threshold``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bayesgate.models.mc import uncertainty
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.store.calibration import Calibration

# (network, x B×…, k, generator or None) → probs B×K×C
Engine = Callable[[nn.Module, torch.Tensor, int, "torch.Generator | None"], torch.Tensor]


def mc_engine(
    network: nn.Module, x: torch.Tensor, k: int, generator: torch.Generator | None
) -> torch.Tensor:
    """The MC engine: ``B×K×C`` probabilities of K dropout passes
    (``bayesgate.models.mc.engine.mc_predict``)."""
    return mc_predict(network, x, k, generator=generator).probs


def summarise(
    probs: torch.Tensor,
    calibration: Calibration,
    classes: list[str],
) -> list[dict[str, Any]]:
    """Per-instance answers from ``probs`` (``B×K×C``, any device) as plain Python values.

    The K×C samples themselves are not included (the worker attaches them on request).
    """
    probs = probs.detach().float().cpu()
    mean = uncertainty.predictive_mean(probs)
    measures = {
        "predictive_entropy": uncertainty.predictive_entropy(probs),
        "mutual_information": uncertainty.mutual_information(probs),
        "variation_ratio": uncertainty.variation_ratio(probs),
    }
    # The calibrated score is one of the three (computed once); any other name goes through
    # bayesgate.models.mc.uncertainty.score, which knows every score it can threshold.
    score = measures.get(calibration.score)
    if score is None:
        score = uncertainty.score(probs, calibration.score)
    labels = mean.argmax(dim=-1).tolist()
    entropy, mutual, ratio = (measures[name].tolist() for name in measures)
    aleatoric, epistemic = (v.tolist() for v in uncertainty.kwon_uncertainty(probs))
    scores = score.tolist()
    threshold = calibration.threshold
    means = mean.tolist()
    out = []
    for b, label in enumerate(labels):
        out.append(
            {
                "label": label,
                "class_name": classes[label] if label < len(classes) else str(label),
                "probabilities": means[b],
                "predictive_entropy": entropy[b],
                "mutual_information": mutual[b],
                "variation_ratio": ratio[b],
                "aleatoric_variance": aleatoric[b],
                "epistemic_variance": epistemic[b],
                "score_name": calibration.score,
                "score": scores[b],
                "threshold": threshold,
                "adversarial": scores[b] > threshold,
            }
        )
    return out
