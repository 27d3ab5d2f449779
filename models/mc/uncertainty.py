"""Uncertainty measures from MC predictive samples ``probs`` shaped ``B×K×C``.

Notation: ``p_k = probs[:, k]``, ``p̄ = (1/K) Σ_k p_k``, ``H[p] = −Σ_c p_c log p_c`` (computed with
``torch.special.entr`` so that ``0·log 0 = 0``; :func:`entr`). All functions return one value per
example.
"""

from __future__ import annotations

import math

import torch

from bayesgate.models.mc.options import SCORE_NAMES
from bayesgate.tables import keyed_by


def _check(probs: torch.Tensor) -> None:
    if probs.dim() != 3:
        raise ValueError(f"MC probabilities must be B×K×C, got shape {tuple(probs.shape)}")


def entr(p: torch.Tensor) -> torch.Tensor:
    """``−p log p`` elementwise with ``0·log 0 = 0``: ``torch.special.entr``, whose gradient at an
    exact 0 is ``−(log 0 + 1) = +∞`` — through a softmax that is ``0·∞ = NaN`` for every logit of
    the row, which would poison an attack's step on any input whose softmax underflows. So when a
    gradient is needed, the zeros go through ``entr(1) = 0`` and take gradient 0 there; the
    values are the same bits either way (and without autograd it is ``torch.special.entr``)."""
    if not p.requires_grad:
        return torch.special.entr(p)
    zero = p == 0
    return torch.where(zero, 0.0, torch.special.entr(torch.where(zero, 1.0, p)))


def predictive_mean(probs: torch.Tensor) -> torch.Tensor:
    """``p̄(c|x) = (1/K) Σ_k p_k(c|x)``, shape ``B×C``."""
    _check(probs)
    return probs.mean(dim=1)


def predictive_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Total uncertainty ``H[p̄] = −Σ_c p̄_c log p̄_c`` (nats), shape ``B``."""
    return entr(predictive_mean(probs)).sum(dim=-1)


def expected_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Aleatoric part ``E = (1/K) Σ_k H[p_k]``, shape ``B``."""
    _check(probs)
    return entr(probs).sum(dim=-1).mean(dim=1)


def mutual_information(probs: torch.Tensor) -> torch.Tensor:
    """Epistemic part ``MI = H[p̄] − (1/K) Σ_k H[p_k]`` (BALD), clamped at 0 against round-off."""
    return (predictive_entropy(probs) - expected_entropy(probs)).clamp_min(0.0)


def variation_ratio(probs: torch.Tensor) -> torch.Tensor:
    """``1 − f_mode/K``, ``f_mode`` = number of passes voting for the most common argmax."""
    _check(probs)
    b, k, c = probs.shape
    votes = probs.argmax(dim=-1)  # B×K passes' classes → B×C vote counts (exact integers)
    counts = torch.zeros(b, c, dtype=torch.int64, device=probs.device)
    counts.scatter_add_(1, votes, torch.ones_like(votes))
    return 1.0 - counts.amax(dim=-1).to(probs.dtype) / k


def kwon_variance(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Diagonals of the predictive-variance decomposition of Kwon et al. (2020), each ``B×C``.

    aleatoric ``diag( diag(p̄) − (1/K) Σ_k p_k p_kᵀ ) = p̄ − (1/K) Σ_k p_k²``;
    epistemic ``diag( (1/K) Σ_k (p_k − p̄)(p_k − p̄)ᵀ ) = (1/K) Σ_k (p_k − p̄)²``.
    """
    mean = predictive_mean(probs)
    aleatoric = mean - probs.pow(2).mean(dim=1)
    epistemic = (probs - mean.unsqueeze(1)).pow(2).mean(dim=1)
    return aleatoric, epistemic


def kwon_uncertainty(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scalar aleatoric and epistemic uncertainty of Kwon et al. (2020), each ``B``: the traces
    ``Σ_c`` of the diagonals of :func:`kwon_variance`,

    aleatoric ``Σ_c (p̄_c − (1/K) Σ_k p_kc²)``, epistemic ``Σ_c (1/K) Σ_k (p_kc − p̄_c)²``;
    their sum is ``1 − Σ_c p̄_c²`` (the total predictive variance's trace).
    """
    aleatoric, epistemic = kwon_variance(probs)
    return aleatoric.sum(dim=-1), epistemic.sum(dim=-1)


def summary(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every per-example measure the service reports, each computed once: ``mean`` (``p̄``,
    ``B×C``), the :data:`SCORES` by name, and ``aleatoric_variance``, ``epistemic_variance`` (the
    two of :func:`kwon_uncertainty`), ``B`` each.

    Each equals its function above bit for bit: the same torch ops on the same tensors, only
    ``p̄`` is computed once instead of four times and ``H[p̄]`` once instead of twice.
    """
    _check(probs)
    mean = probs.mean(dim=1)
    entropy = entr(mean).sum(dim=-1)
    expected = entr(probs).sum(dim=-1).mean(dim=1)
    aleatoric = (mean - probs.pow(2).mean(dim=1)).sum(dim=-1)
    epistemic = (probs - mean.unsqueeze(1)).pow(2).mean(dim=1).sum(dim=-1)
    return {
        "mean": mean,
        "predictive_entropy": entropy,
        "mutual_information": (entropy - expected).clamp_min(0.0),
        "variation_ratio": variation_ratio(probs),
        "aleatoric_variance": aleatoric,
        "epistemic_variance": epistemic,
    }


def mc_log_likelihood(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``log p̄(y|x) = logsumexp_k(log p_k(y|x)) − log K`` for int64 labels ``y`` (``B``)."""
    _check(log_probs)
    b, k, _ = log_probs.shape
    picked = log_probs.gather(2, y.view(b, 1, 1).expand(b, k, 1)).squeeze(2)
    return torch.logsumexp(picked, dim=1) - math.log(k)


SCORES = keyed_by(
    SCORE_NAMES,
    {
        "predictive_entropy": predictive_entropy,
        "mutual_information": mutual_information,
        "variation_ratio": variation_ratio,
    },
    "uncertainty scores",
)
"""Score name (:data:`~bayesgate.models.mc.options.SCORE_NAMES`) → its function."""
