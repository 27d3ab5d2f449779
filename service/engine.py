"""The engine call the inference worker makes: K dropout passes of a batch.

``engine(network, x, k, generator)`` returns the ``B×K×C`` probabilities;
``engine(network, x, k, generator, features=True)`` (called when the served model has a fused
detector) returns :class:`~bayesgate.models.mc.engine.MCFeaturePrediction`: the same probabilities
and, from the same K passes, the features the detector reads.

Replaceable per worker (``BatchWorker.engine``): the tests slow it down, gate it or make it fail.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bayesgate.models.mc.engine import MCFeaturePrediction, mc_predict, mc_predict_features

Engine = Callable[..., "torch.Tensor | MCFeaturePrediction"]
"""``engine(network, x, k, generator[, features=True])``, as :func:`mc_engine`."""


def mc_engine(
    network: nn.Module,
    x: torch.Tensor,
    k: int,
    generator: torch.Generator | None,
    *,
    features: bool = False,
) -> torch.Tensor | MCFeaturePrediction:
    """``B×K×C`` probabilities of K dropout passes (:func:`~bayesgate.models.mc.engine.mc_predict`),
    or with ``features`` :func:`~bayesgate.models.mc.engine.mc_predict_features`."""
    if features:
        return mc_predict_features(network, x, k, generator=generator)
    return mc_predict(network, x, k, generator=generator).probs
