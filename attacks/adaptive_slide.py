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
The L1 "projection" is cleverhans's rescaling — inside the ball, not its closest point.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.adaptive import CLIP_MAX, CLIP_MIN, AdaptivePGD
from bayesgate.attacks.adaptive_settings import AdaptiveSLIDEParameters


@dataclass(frozen=True)
class AdaptiveSLIDE(AdaptiveSLIDEParameters, AdaptivePGD):
    """The adaptive attack with sparse L1 steps; see the module docstring."""

    def _start(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return x.clone()

    def _step(self, x_t: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        d = -grad.flatten(1)
        flat = x_t.flatten(1)
        d = torch.where(((flat <= CLIP_MIN) & (d < 0)) | ((flat >= CLIP_MAX) & (d > 0)), 0.0, d)
        size = d.abs()
        k = max(1, int(self.sparsity / 100.0 * size.shape[1]))
        q = size.kthvalue(k, dim=1, keepdim=True).values
        top = (size >= q).to(d.dtype)
        step = torch.sign(d) * top / top.sum(dim=1, keepdim=True)
        x_new = (flat + self.alpha * step).clamp(CLIP_MIN, CLIP_MAX)
        return self._project(x_new.view_as(x_t), x)

    def _project(self, x_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``clip(x + δ·min(1, ε/‖δ‖₁))`` with ``δ = x_t − x``, per image."""
        delta = (x_t - x).flatten(1)
        l1 = delta.abs().sum(dim=1, keepdim=True)
        scale = torch.clamp(self.eps / l1.clamp_min(1e-12), max=1.0)
        return (x + (delta * scale).view_as(x)).clamp(CLIP_MIN, CLIP_MAX)
