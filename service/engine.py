"""The engine call the inference worker makes: ``B×K×C`` probabilities of K dropout passes.

Replaceable per worker (``BatchWorker.engine``): the tests slow it down, gate it or make it fail.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bayesgate.models.mc.engine import mc_predict

# (network, x B×…, k, generator or None) → probs B×K×C
Engine = Callable[[nn.Module, torch.Tensor, int, "torch.Generator | None"], torch.Tensor]


def mc_engine(
    network: nn.Module, x: torch.Tensor, k: int, generator: torch.Generator | None
) -> torch.Tensor:
    """``B×K×C`` probabilities of K dropout passes
    (:func:`bayesgate.models.mc.engine.mc_predict`)."""
    return mc_predict(network, x, k, generator=generator).probs
