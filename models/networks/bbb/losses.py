"""Objectives for Bayes-by-Backprop networks: the ELBO with a KL weight β, and BB-α.

Minibatch ``i`` of ``M`` per epoch, batch ``B_i`` of ``N`` training examples, K network samples
per example with log-likelihoods ``ℓ_nk = log p(y_n | x_n, w_k)`` and ``KL = KL[q(w) ‖ p(w)]``
(:func:`bayesgate.models.networks.bbb.layers.kl_divergence`):

- ELBO (Blundell et al. 2015; Shridhar et al. 2018, their code's ``nll·N + β·KL``)::

      F_i = N · mean_{n∈B_i} (−(1/K) Σ_k ℓ_nk) + β_i · KL

- BB-α (Hernández-Lobato et al. 2016, in the form Li & Gal 2017 use for dropout, eq. 3, here with
  the BBB posterior and its exact KL)::

      F_i(α) = N · mean_{n∈B_i} L_n(α) + β_i · KL,
      L_n(α) = −(1/α) · (logsumexp_k(α·ℓ_nk) − log K)
      (:func:`bayesgate.models.mc.losses.alpha_energy`)

  ``α → 0`` gives ``L_n = −(1/K) Σ_k ℓ_nk``, i.e. exactly the ELBO (taken as the limit, not with a
  tiny α).

Both are returned divided by N (a per-example objective, so learning rates and logged losses are
comparable with the dropout networks'); the minimiser is unchanged.

β schedules (each sums to 1 over the M minibatches of an epoch):

- ``"blundell"``: ``β_i = 2^(M−i) / (2^M − 1)`` — early minibatches carry most of the KL;
- ``"uniform"``: ``β_i = 1/M``;
- a number ``c``: ``β_i = c`` (Shridhar's code uses 0.1). With the data term scaled to N as above,
  ``c = 1`` makes every minibatch an unbiased estimate of the full negative ELBO; the schedules that
  sum to 1 weigh the KL M times less (they were derived for a minibatch *sum* data term).
"""

from __future__ import annotations

import torch

from bayesgate.models.mc.losses import bbalpha_softmax_loss
from bayesgate.models.training.config import parse_beta_schedule


def beta_weight(schedule: str | float, i: int, m: int) -> float:
    """KL weight ``β_i`` of minibatch ``i`` (1-based) of ``m`` (see the module docstring).

    Blundell's ``2^(M−i)/(2^M−1)`` is evaluated as ``2^(−i)/(1 − 2^(−M))`` so that large M does
    not overflow.
    """
    if m < 1 or not 1 <= i <= m:
        raise ValueError(f"minibatch index must satisfy 1 ≤ i ≤ M, got i={i}, M={m}")
    schedule = parse_beta_schedule(schedule)
    if schedule == "blundell":
        return 2.0 ** (-i) / (1.0 - 2.0 ** (-m))
    if schedule == "uniform":
        return 1.0 / m
    return float(schedule)


def bbb_bbalpha_loss(
    mc_logits: torch.Tensor,
    y: torch.Tensor,
    kl: torch.Tensor,
    n_train: int,
    beta: float,
    alpha: float,
) -> torch.Tensor:
    """``F_i(α)/N = mean_n L_n(α) + β·KL/N`` (a scalar).

    ``mc_logits`` ``B×K×C`` logits of K network samples, ``y`` int64 ``B``, ``kl`` the scalar
    ``KL[q ‖ p]``, ``n_train`` = N, ``beta`` = β_i, ``alpha`` ≥ 0 (0 = ELBO).
    """
    if n_train < 1:
        raise ValueError(f"number of training examples must be ≥ 1, got {n_train}")
    if beta < 0:
        raise ValueError(f"beta must be ≥ 0, got {beta}")
    if kl.dim() != 0:
        raise ValueError(f"kl must be a scalar, got shape {tuple(kl.shape)}")
    return bbalpha_softmax_loss(mc_logits, y, alpha) + beta * kl / n_train


def elbo_loss(
    mc_logits: torch.Tensor, y: torch.Tensor, kl: torch.Tensor, n_train: int, beta: float
) -> torch.Tensor:
    """Negative ELBO per example, ``F_i/N = −mean_n (1/K) Σ_k ℓ_nk + β·KL/N`` (a scalar)."""
    return bbb_bbalpha_loss(mc_logits, y, kl, n_train, beta, alpha=0.0)
