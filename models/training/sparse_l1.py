"""Sparse L1 steps (SLIDE, Tramèr & Boneh 2019, "Adversarial training and robustness for
multiple perturbations"), shared by L1 adversarial training (:mod:`.adversarial`) and the
adaptive L1 attack (:mod:`bayesgate.attacks.adaptive_slide`).

One step from ``x_t`` along a direction ``d`` (the gradient to ascend, or minus the gradient to
descend), inside the L1 ball of radius ``ε`` around the clean ``x`` and the box [0, 1]:

1. zero the components that would push a pixel already at 0 or 1 out of the box (cleverhans's
   ``clip_grad``: no step is wasted on MNIST's black background);
2. keep the pixels whose ``|d|`` is at or above the ``sparsity``-th percentile per image
   (``q`` = the ``⌊s/100·n⌋``-th smallest ``|d|``; 99: about the top 1 %, 8 of 784 pixels);
3. ``x_{t+1} = clip(x_t + a · sgn(d) ⊙ 1[|d| ≥ q] / Σ 1[|d| ≥ q])`` (``a`` = the step's L1
   length, spread evenly over the kept pixels);
4. ``δ = x_{t+1} − x``, ``δ ← δ · min(1, ε/‖δ‖₁)``, ``x_{t+1} = clip(x + δ)`` — cleverhans's
   rescaling: a point inside the ball, not its closest point.
"""

from __future__ import annotations

import torch

CLIP_MIN, CLIP_MAX = 0.0, 1.0


def sparse_l1_step(
    x_t: torch.Tensor,
    x: torch.Tensor,
    direction: torch.Tensor,
    step_size: float,
    eps: float,
    sparsity: float,
) -> torch.Tensor:
    """One SLIDE step of L1 length ``step_size`` along ``direction`` (see the module docstring),
    then :func:`project_l1`. Shapes ``B×…``; no gradient is tracked."""
    with torch.no_grad():
        d = direction.flatten(1)
        flat = x_t.flatten(1)
        d = torch.where(((flat <= CLIP_MIN) & (d < 0)) | ((flat >= CLIP_MAX) & (d > 0)), 0.0, d)
        size = d.abs()
        k = max(1, int(sparsity / 100.0 * size.shape[1]))
        q = size.kthvalue(k, dim=1, keepdim=True).values
        top = (size >= q).to(d.dtype)
        step = torch.sign(d) * top / top.sum(dim=1, keepdim=True)
        x_new = (flat + step_size * step).clamp(CLIP_MIN, CLIP_MAX)
        return project_l1(x_new.view_as(x_t), x, eps)


def project_l1(x_t: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """``clip(x + δ·min(1, ε/‖δ‖₁))`` with ``δ = x_t − x``, per image (cleverhans's L1
    rescaling): ``‖result − x‖₁ ≤ ε`` and the result in [0, 1]."""
    delta = (x_t - x).flatten(1)
    l1 = delta.abs().sum(dim=1, keepdim=True)
    scale = torch.clamp(eps / l1.clamp_min(1e-12), max=1.0)
    return (x + (delta * scale).view_as(x)).clamp(CLIP_MIN, CLIP_MAX)
