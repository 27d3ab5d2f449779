"""The adaptive attack of :mod:`bayesgate.attacks.adaptive` with sparse L1 steps (SLIDE).

The same loss, schedule, bookkeeping and verdicts as
:class:`~bayesgate.attacks.adaptive.AdaptivePGD` (misclassify, then evade the detector:
``relu(m + κ) + λ·g·relu(s − threshold + δ)``); what changes is the threat model,
``‖x' − x‖₁ ≤ ε`` (and ``x'`` in [0, 1]), and the step, SLIDE's (Tramèr & Boneh 2019;
:class:`bayesgate.attacks.methods.slide.SLIDE` is the detector-blind version through
cleverhans). With ``d = −∇L`` (down the loss), zeroing the components that would push a pixel
already at 0 or 1 out of the box, and ``q`` the ``sparsity``-th percentile of ``|d|`` per
image::

    x_{t+1} = clip(x_t + α · sgn(d) ⊙ 1[|d| ≥ q] / Σ 1[|d| ≥ q])
    δ = x_{t+1} − x;  δ ← δ · min(1, ε/‖δ‖₁);  x_{t+1} = clip(x + δ)

(α = ``step_size``, default ε/10), from the clean image: no random start, as cleverhans's SLIDE.
The L1 "projection" is cleverhans's rescaling — inside the ball, not its closest point. The step
is :func:`bayesgate.models.training.sparse_l1.sparse_l1_step`, which L1 adversarial training takes
too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.adaptive import AdaptivePGD
from bayesgate.attacks.adaptive_settings import AdaptiveSLIDEParameters
from bayesgate.models.training.sparse_l1 import project_l1, sparse_l1_step


@dataclass(frozen=True)
class AdaptiveSLIDE(AdaptiveSLIDEParameters, AdaptivePGD):
    """The adaptive attack with sparse L1 steps; see the module docstring."""

    def _start(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return x.clone()

    def _step(self, x_t: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return sparse_l1_step(x_t, x, -grad, self.alpha, self.eps, self.sparsity)

    def _project(self, x_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``clip(x + δ·min(1, ε/‖δ‖₁))`` with ``δ = x_t − x``, per image."""
        return project_l1(x_t, x, self.eps)
