"""The fused detector: L2-regularised logistic regression over standardised scores.

Each input score ``s_j`` (higher = more suspicious) is transformed and standardised,
``z_j = (g_j(s_j) − m_j) / σ_j`` with ``g_j`` the identity or ``log1p`` (for the non-negative,
heavy-tailed distances and ``−log KD``: they then add like log-ratios instead of letting one
far-out score swamp the rest), and ``m_j, σ_j`` the mean and standard deviation of ``g_j(s_j)``
over the training set. The fused score is the logit

    η(x) = b + Σ_j w_j z_j,          P(adversarial | x) = 1 / (1 + e^{−η})

fitted by minimising the weighted, L2-regularised negative log-likelihood

    L(w, b) = −(1/Σ_i v_i) Σ_i v_i [y_i log σ(η_i) + (1 − y_i) log(1 − σ(η_i))] + (λ/2)‖w‖²

(no penalty on ``b``; weights ``v_i`` give the clean and the adversarial class equal total weight;
with synthetic outliers (:mod:`bayesgate.attacks.outliers`) among the positives, the adversarial
class's half is split: ``share`` to the outliers, ``1 − share`` to the attacks)
with Newton's method and a backtracking line search (:func:`fit_logistic`); ``L`` is strictly
convex for ``λ > 0``, so the optimum is unique even on separable data. Everything is float64
numpy; the coefficients live in JSON (:meth:`LogisticFusion.to_json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

TRANSFORMS = ("identity", "log1p")


@dataclass(frozen=True)
class LogisticFusion:
    """Score names, their transform, standardisation ``(mean, std)``, coefficients, intercept."""

    names: tuple[str, ...]
    transforms: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    l2: float
    _cache: dict[tuple[Any, ...], torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        n = len(self.names)
        if not all(len(v) == n for v in (self.transforms, self.mean, self.std, self.coef)):
            raise ValueError("fusion: names, transforms, mean, std and coef differ in length")
        if any(t not in TRANSFORMS for t in self.transforms):
            raise ValueError(f"fusion: transforms must be in {TRANSFORMS}, got {self.transforms}")
        if any(not s > 0 for s in self.std):
            raise ValueError("fusion: standard deviations must be > 0")

    def standardise(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``z_j = (g_j(s_j) − m_j)/σ_j`` as ``B×F`` columns, in the scores' dtype."""
        raw = torch.stack([scores[name] for name in self.names], dim=-1)
        log1p = self._tensor("log1p", raw)
        raw = torch.where(log1p, torch.log1p(raw.clamp_min(0.0)), raw)
        return (raw - self._tensor("mean", raw)) / self._tensor("std", raw)

    def logit(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The fused score ``η = b + Σ_j w_j z_j`` (``B``); differentiable in the scores."""
        z = self.standardise(scores)
        return z @ self._tensor("coef", z) + self.intercept

    def _tensor(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """``mean``/``std``/``coef`` (or the ``log1p`` mask) as a tensor like ``like``, cached
        per dtype and device (the request path calls this for every batch)."""
        key = (name, like.dtype, like.device)
        cached = self._cache.get(key)
        if cached is None:
            if name == "log1p":
                values = [t == "log1p" for t in self.transforms]
                cached = torch.tensor(values, dtype=torch.bool, device=like.device)
            else:
                cached = torch.tensor(getattr(self, name), dtype=like.dtype, device=like.device)
            self._cache[key] = cached
        return cached

    def to_json(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
            if not k.startswith("_")
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogisticFusion:
        fields = ("names", "transforms", "mean", "std", "coef")
        return cls(
            **{k: tuple(data[k]) for k in fields},
            intercept=float(data["intercept"]),
            l2=float(data["l2"]),
        )


def transform(values: np.ndarray, kind: str) -> np.ndarray:
    """``g(s)``: the identity or ``log1p(max(s, 0))``."""
    return np.log1p(np.maximum(values, 0.0)) if kind == "log1p" else values


def fit_fusion(
    clean: Mapping[str, np.ndarray],
    adversarial: Mapping[str, np.ndarray],
    names: tuple[str, ...],
    transforms: tuple[str, ...],
    l2: float = 1e-3,
    *,
    outliers: Mapping[str, np.ndarray] | None = None,
    outlier_share: float = 0.5,
) -> LogisticFusion:
    """Fit :class:`LogisticFusion` on clean (label 0) vs adversarial (label 1) score arrays.

    Weights: the clean rows share 1/2, the adversarial rows 1/2 — or, with ``outliers`` (score
    arrays of synthetic outliers, also label 1), the attacks ``(1 − outlier_share)/2`` and the
    outliers ``outlier_share/2``. Standardisation is over every row."""
    if not len(clean[names[0]]) or not len(adversarial[names[0]]):
        raise ValueError("fusion needs clean and adversarial examples")
    groups = [clean, adversarial]
    shares = [0.5, 0.5]
    if outliers is not None:
        if not 0.0 < outlier_share < 1.0:
            raise ValueError(f"outlier_share must be in (0, 1), got {outlier_share}")
        if not len(outliers[names[0]]):
            raise ValueError("fusion: outliers given but empty")
        groups.append(outliers)
        shares = [0.5, 0.5 * (1.0 - outlier_share), 0.5 * outlier_share]
    raw = np.stack(
        [
            transform(np.concatenate([g[n] for g in groups]).astype(np.float64), t)
            for n, t in zip(names, transforms, strict=True)
        ],
        axis=1,
    )
    mean, std = raw.mean(axis=0), raw.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    sizes = [len(g[names[0]]) for g in groups]
    y = np.concatenate([np.full(m, 0.0 if i == 0 else 1.0) for i, m in enumerate(sizes)])
    weights = np.concatenate(
        [np.full(m, share / m) for m, share in zip(sizes, shares, strict=True)]
    )
    coef, intercept = fit_logistic((raw - mean) / std, y, weights, l2)
    return LogisticFusion(
        names=tuple(names),
        transforms=tuple(transforms),
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        coef=tuple(float(v) for v in coef),
        intercept=float(intercept),
        l2=float(l2),
    )


def fit_logistic(
    z: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray | None = None,
    l2: float = 1e-3,
    *,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> tuple[np.ndarray, float]:
    """Minimise ``L(w, b)`` of the module docstring by Newton's method; returns ``(w, b)``.

    Gradient ``g = Zᵀ(v ⊙ (p − y))/V + λw̃``, Hessian ``H = Zᵀ diag(v p(1−p)) Z / V + λĨ`` on the
    design ``Z = [z, 1]`` (``w̃``, ``Ĩ`` without the intercept); each step is halved until ``L``
    decreases. Stops when the Newton decrement ``gᵀH⁻¹g/2 < tol``.
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, f = z.shape
    v = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=np.float64)
    v = v / v.sum()
    design = np.hstack([z, np.ones((n, 1))])
    penalty = np.full(f + 1, float(l2))
    penalty[-1] = 0.0
    theta = np.zeros(f + 1)

    def loss(t: np.ndarray) -> float:
        eta = design @ t
        # −[y log σ(η) + (1−y) log(1−σ(η))] = softplus(η) − yη, computed stably
        return float(v @ (np.logaddexp(0.0, eta) - y * eta) + 0.5 * penalty @ (t * t))

    current = loss(theta)
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        grad = design.T @ (v * (p - y)) + penalty * theta
        hess = (design * (v * p * (1.0 - p))[:, None]).T @ design + np.diag(penalty)
        hess += 1e-12 * np.eye(f + 1)  # l2 = 0 on separable data: keep H invertible
        step = np.linalg.solve(hess, grad)
        if 0.5 * grad @ step < tol:
            break
        scale = 1.0
        while scale > 1e-10:
            candidate = theta - scale * step
            value = loss(candidate)
            if value <= current:
                theta, current = candidate, value
                break
            scale *= 0.5
        else:
            break
    return theta[:-1], float(theta[-1])
