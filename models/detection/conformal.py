"""Attack-free fusion: conformal p-values of each score, combined as their minimum (or summed).

For each input score ``s_j`` (higher = more suspicious) and its sorted clean *reference* scores
``r_{j,1} ≤ … ≤ r_{j,n_j}`` (clean validation images, no attack), the conformal p-value is

    p_j(x) = (1 + #{i : r_{j,i} ≥ s_j(x)}) / (n_j + 1),

the fraction of clean images at least as suspicious as ``x`` by score ``j`` (Vovk et al. 2005;
exchangeable clean inputs give ``P(p_j ≤ α) ≤ α``). The fused score is

    fused(x) = −log min_j p_j(x),

so an input is as suspicious as its most extreme score: no score's evidence is averaged away by
another (the minimum is monotone non-decreasing in every ``s_j``). With ``combine="fisher"``
(Fisher's method) the evidence is added up instead,

    fused(x) = −Σ_j log p_j(x),

so several moderately unusual scores can flag an image that no single one would (also monotone in
every ``s_j``; the threshold is empirical, so the scores' correlation does not matter).

Either way the threshold is set like every other score's, at the target FPR on *other* clean
validation images; for min-p that absorbs the multiple-testing correction (≈ a per-score level of
target/F, less when the scores agree).

The exact p-value is a step function with zero gradient almost everywhere. :meth:`smooth` is the
differentiable surrogate an adaptive attacker descends: ``log p_j`` interpolated linearly between
the reference order statistics (and continued with the last segment's slope beyond them) and the
minimum replaced by ``−τ log Σ_j exp(−ℓ_j/τ)`` over ``ℓ_j = −log p_j`` (a soft maximum of the
``ℓ_j``, ≥ the exact maximum and within ``τ log F`` of it); for Fisher's rule the sum of the same
interpolated ``ℓ_j``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

SURROGATE_TEMPERATURE = 0.1
RULES = {"min": "min_p_value", "fisher": "fisher_p_value"}  # combine → the JSON's "rule"


@dataclass(frozen=True)
class ConformalFusion:
    """Score names and, per name, the sorted clean reference scores (tuples of floats)."""

    names: tuple[str, ...]
    reference: tuple[tuple[float, ...], ...]
    combine: str = "min"  # "min": −log min_j p_j; "fisher": −Σ_j log p_j
    _cache: dict[tuple[Any, ...], torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if len(self.names) != len(self.reference) or not self.names:
            raise ValueError("conformal fusion: one non-empty reference per score name")
        if self.combine not in RULES:
            raise ValueError(f"conformal fusion: combine must be one of {sorted(RULES)}")
        for name, ref in zip(self.names, self.reference, strict=True):
            if len(ref) < 2 or any(b < a for a, b in itertools.pairwise(ref)):
                raise ValueError(f"conformal fusion: {name} reference must be ≥ 2 sorted values")

    def p_values(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``p_j(x)`` of the module docstring as ``B×F`` columns, in the scores' dtype."""
        columns = []
        for j, name in enumerate(self.names):
            s = scores[name]
            ref = self._reference(j, s)
            at_least = ref.numel() - torch.searchsorted(ref, s.detach().contiguous(), right=False)
            columns.append((1.0 + at_least.to(s.dtype)) / (ref.numel() + 1.0))
        return torch.stack(columns, dim=-1)

    def score(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``fused`` (``B``): ``−log min_j p_j``, or ``−Σ_j log p_j`` for Fisher's rule; exact, not
        differentiable (see :meth:`smooth`).

        The minimum (or the sum) is taken as the p-values are made (no ``B×F`` stack: the request
        path)."""
        fisher = self.combine == "fisher"
        acc = None
        for j, name in enumerate(self.names):
            s = scores[name]
            ref = self._reference(j, s)
            n = ref.numel()
            # 1 + #{r ≥ s} = 1 + n − #{r < s}; searchsorted (left) counts #{r < s}
            p = (n + 1 - torch.searchsorted(ref, s.detach().contiguous())).to(s.dtype) / (n + 1)
            if fisher:
                ell = -torch.log(p)
                acc = ell if acc is None else acc + ell
            else:
                acc = p if acc is None else torch.minimum(acc, p)
        assert acc is not None  # names is non-empty (checked at construction)
        return acc if fisher else -torch.log(acc)

    def smooth(
        self, scores: Mapping[str, torch.Tensor], temperature: float = SURROGATE_TEMPERATURE
    ) -> torch.Tensor:
        """The differentiable surrogate of :meth:`score` (module docstring), for attacks."""
        ell = torch.stack(
            [self._smooth_neg_log_p(j, scores[n]) for j, n in enumerate(self.names)], dim=-1
        )
        if self.combine == "fisher":
            return ell.sum(dim=-1)
        return temperature * torch.logsumexp(ell / temperature, dim=-1)

    def _smooth_neg_log_p(self, j: int, s: torch.Tensor) -> torch.Tensor:
        """``−log p_j`` linearly interpolated in ``s`` between the knots ``(r_(i), −log p(r_(i)))``
        (``p(r_(i)) = (n − i + 2)/(n + 1)``, 1-based ``i``, ties aside), extrapolated linearly."""
        ref = self._reference(j, s)
        n = ref.numel()
        knots = -torch.log((n + 1.0 - torch.arange(n, dtype=s.dtype, device=s.device)) / (n + 1.0))
        i = torch.searchsorted(ref, s.detach().contiguous()).clamp(1, n - 1)
        x0, x1, y0, y1 = ref[i - 1], ref[i], knots[i - 1], knots[i]
        slope = (y1 - y0) / (x1 - x0).clamp_min(1e-12)
        return y0 + slope * (s - x0)

    def levels(self) -> np.ndarray:
        """Every value the min-p :meth:`score` can take, ``−log((1 + c)/(n_j + 1))``, sorted,
        unique."""
        values = [-np.log((1.0 + np.arange(len(r) + 1)) / (len(r) + 1.0)) for r in self.reference]
        return np.unique(np.concatenate(values))

    def gap_threshold(self, threshold: float) -> float:
        """The midpoint between ``threshold`` and the next larger value :meth:`score` can take.

        ``score > t`` and ``score > gap_threshold(t)`` flag the same inputs in exact arithmetic
        (no score lies between), but the midpoint is immune to the last-bit differences between
        a float64 threshold and a float32 score at the same p-value. A ``threshold`` within
        ``10⁻⁶`` (relative) of a level is taken as that level (a float32 score's rounding).
        Fisher's sums take too many values to list: the threshold is returned as it is."""
        if self.combine == "fisher":
            return float(threshold)
        levels = self.levels()
        tol = 1e-6 * max(1.0, abs(threshold))  # a level computed in float32 is within this
        i = int(np.searchsorted(levels, threshold - tol))  # the level ``threshold`` rounds to
        if i < levels.size and abs(levels[i] - threshold) <= tol:
            threshold, i = float(levels[i]), i + 1
        return float(threshold if i >= levels.size else (threshold + levels[i]) / 2)

    def _reference(self, j: int, like: torch.Tensor) -> torch.Tensor:
        key = (j, like.dtype, like.device)
        cached = self._cache.get(key)
        if cached is None:
            cached = torch.tensor(self.reference[j], dtype=like.dtype, device=like.device)
            self._cache[key] = cached
        return cached

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": RULES[self.combine],
            "names": list(self.names),
            "reference": {n: list(r) for n, r in zip(self.names, self.reference, strict=True)},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConformalFusion:
        combine = {rule: key for key, rule in RULES.items()}.get(data.get("rule"))
        if combine is None:
            raise ValueError(f"conformal fusion: unknown rule {data.get('rule')!r}")
        names = tuple(data["names"])
        reference = tuple(tuple(float(v) for v in data["reference"][n]) for n in names)
        return cls(names, reference, combine)


def fit_conformal(
    clean: Mapping[str, np.ndarray],
    names: tuple[str, ...],
    digits: int = 7,
    combine: str = "min",
) -> ConformalFusion:
    """The reference of each score: its clean values, rounded to ``digits`` significant digits
    (compact JSON; the p-values are then exact for the stored reference), sorted; ``combine``:
    ``min`` (min-p) or ``fisher``."""
    reference = []
    for name in names:
        values = np.asarray(clean[name], dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"conformal fusion: {name} has non-finite clean scores")
        reference.append(tuple(sorted(float(f"{v:.{digits}g}") for v in values)))
    return ConformalFusion(tuple(names), tuple(reference), combine)
