"""BB-α energies of Li & Gal (2017) for dropout networks.

For K stochastic passes ω_k ~ q and per-pass log-likelihoods ``ℓ_nk = log p(y_n | x_n, ω_k)``
the per-example loss is the (Monte Carlo) black-box α-energy

    L_n(α) = −(1/α) · log( (1/K) Σ_k exp(α·ℓ_nk) ) = −(1/α) · (logsumexp_k(α·ℓ_nk) − log K).

α → 0 gives the MC-dropout variational objective ``−(1/K) Σ_k ℓ_nk`` (taken exactly, not with a
tiny α); α = 1 gives ``−log (1/K) Σ_k p_k(y)``; K = 1 gives the plain negative log-likelihood for
every α. The L2 term ``λ Σ‖W‖²`` is added by the training loop (:func:`l2_penalty`).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def alpha_energy(log_lik: torch.Tensor, alpha: float) -> torch.Tensor:
    """Per-example BB-α energy from a ``B×K`` matrix of log-likelihoods; returns ``B``.

    ``−(1/α)·(logsumexp_k(α·ℓ_nk) − log K)``, or ``−mean_k ℓ_nk`` when ``α == 0``; computed by
    :func:`tilted_energy`, which stays accurate as α → 0.
    """
    if log_lik.dim() != 2:
        raise ValueError(f"log-likelihoods must be B×K, got shape {tuple(log_lik.shape)}")
    if not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number ≥ 0, got {alpha}")
    if alpha == 0:
        return -log_lik.mean(dim=1)
    return tilted_energy(log_lik, alpha)


def tilted_energy(log_lik: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """``−(1/α)·log mean_k exp(α·ℓ_k)`` over the last axis, for α ≥ 0 (broadcast over the rest);
    an α that is 0 in ``log_lik``'s dtype (float32 rounds α < 1e-45 to 0) is the exact α → 0
    limit ``−mean_k ℓ_k``, not ``0/0``.

    Written as ``−m − (1/α)·log1p(mean_k expm1(α·(ℓ_k − m)))`` with ``m = max_k ℓ_k``: the same
    value, but the form ``logsumexp_k(α·ℓ_k) − log K`` subtracts two numbers of size ``log K``
    to get one of size ``α·ℓ``, which in float32 at α = 1e-6 loses a percent. Here the small
    quantity is computed directly, and the energy tends smoothly to ``−mean_k ℓ_k`` as α → 0.
    The shift ``m`` carries no gradient (the value does not depend on it).
    """
    alpha = torch.as_tensor(alpha, dtype=log_lik.dtype, device=log_lik.device)
    zero = alpha == 0
    safe = torch.where(zero, torch.ones_like(alpha), alpha)  # no 0/0, not even in the backward
    shift = log_lik.detach().amax(dim=-1)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    scaled = safe.unsqueeze(-1) * (log_lik - shift.unsqueeze(-1))
    energy = -shift - torch.log1p(torch.expm1(scaled).mean(dim=-1)) / safe
    return torch.where(zero, -log_lik.mean(dim=-1), energy)


def bbalpha_softmax_loss(mc_logits: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """Mean BB-α energy for classification.

    ``mc_logits`` is ``B×K×C`` (K passes per example), ``y`` int64 ``B``;
    ``ℓ_nk = log_softmax(mc_logits)[n, k, y_n]``; returns ``mean_n L_n(α)`` (a scalar).
    """
    if mc_logits.dim() != 3:
        raise ValueError(f"mc_logits must be B×K×C, got shape {tuple(mc_logits.shape)}")
    b, k, _ = mc_logits.shape
    if y.shape != (b,):
        raise ValueError(f"labels must have shape ({b},), got {tuple(y.shape)}")
    log_p = torch.log_softmax(mc_logits, dim=-1)
    log_lik = log_p.gather(2, y.view(b, 1, 1).expand(b, k, 1)).squeeze(2)
    return alpha_energy(log_lik, alpha).mean()


def gaussian_log_likelihood(
    mc_pred: torch.Tensor, y: torch.Tensor, tau: torch.Tensor | float
) -> torch.Tensor:
    """``B×K`` log-densities ``log N(y_n; f_k(x_n), τ⁻¹ I)``.

    ``= −(τ/2)‖y_n − f_k(x_n)‖² + (D/2)·log τ − (D/2)·log 2π``
    for ``mc_pred`` ``B×K×D`` and ``y`` ``B×D``.
    """
    if mc_pred.dim() != 3:
        raise ValueError(f"mc_pred must be B×K×D, got shape {tuple(mc_pred.shape)}")
    b, _, d = mc_pred.shape
    if y.shape != (b, d):
        raise ValueError(f"targets must have shape ({b}, {d}), got {tuple(y.shape)}")
    tau = torch.as_tensor(tau, dtype=mc_pred.dtype, device=mc_pred.device)
    sq = (y.unsqueeze(1) - mc_pred).pow(2).sum(dim=2)
    return -0.5 * tau * sq + 0.5 * d * (torch.log(tau) - math.log(2 * math.pi))


def bbalpha_gaussian_loss(
    mc_pred: torch.Tensor, y: torch.Tensor, alpha: float, tau: torch.Tensor | float
) -> torch.Tensor:
    """Mean BB-α energy for regression with Gaussian noise of precision τ (Li & Gal eq. 10).

    ``−(1/α)·(logsumexp_k(α·log N(y_n; f_k(x_n), τ⁻¹)) − log K)`` averaged over the batch;
    τ may be a learnable tensor.
    """
    return alpha_energy(gaussian_log_likelihood(mc_pred, y, tau), alpha).mean()


def l2_penalty(model: nn.Module) -> torch.Tensor:
    """``Σ_i ‖W_i‖²`` over weight matrices and kernels (biases excluded), for ``λ·Σ‖W‖²``."""
    terms = [p.pow(2).sum() for name, p in model.named_parameters() if name.endswith("weight")]
    if not terms:
        return torch.zeros(())
    return torch.stack(terms).sum()
