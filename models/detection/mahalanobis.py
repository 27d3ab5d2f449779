"""Class-conditional Gaussians with a tied, shrunk covariance (Lee et al. 2018, "A simple unified
framework for detecting out-of-distribution samples and adversarial attacks").

Fitted on training features ``f_n`` (``N×D``) with labels ``y_n``:

- class means ``μ_c = mean{f_n : y_n = c}``;
- the tied (within-class) covariance ``S = (1/N) Σ_n (f_n − μ_{y_n})(f_n − μ_{y_n})ᵀ``, shrunk
  toward a scaled identity so that it is well conditioned:
  ``Σ = (1 − δ)·S + δ·(tr S / D)·I``, ``δ`` from Ledoit & Wolf (2004) (the optimal shrinkage
  under squared Frobenius loss, estimated from the data: :func:`ledoit_wolf_shrinkage`) unless a
  fixed ``δ`` is given;
- the precision ``P = Σ⁻¹`` (float64 Cholesky inverse, stored float32).

Scores of a feature ``f`` (``B×D``): ``d_c(f) = (f − μ_c)ᵀ P (f − μ_c)`` (``B×C``), the distance to
the closest class ``min_c d_c(f)`` and to the predicted class ``d_ŷ(f)``. Larger = further from
the training data = more suspicious. They are computed whitened: with the Cholesky factor
``P = L Lᵀ`` (float64 at load, kept float32), ``d_c(f) = ‖Lᵀf − Lᵀμ_c‖²``, where ``Lᵀμ_c`` is
precomputed — one ``D×D`` product per input instead of one per input and class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClassGaussians:
    """``means`` ``C×D`` and ``precision`` ``D×D`` (float32), ``shrinkage`` δ used in the fit."""

    means: torch.Tensor
    precision: torch.Tensor
    shrinkage: float

    def __post_init__(self) -> None:
        # row-major always: a column-major precision (inverses return one) takes another matmul
        # kernel than the row-major copy read back from safetensors and differs in the last bit
        object.__setattr__(self, "means", self.means.contiguous())
        object.__setattr__(self, "precision", self.precision.contiguous())
        chol = torch.linalg.cholesky(self.precision.double())  # P = L Lᵀ
        object.__setattr__(self, "_whiten", chol.to(self.means.dtype).contiguous())
        object.__setattr__(self, "_white_means", (self.means.double() @ chol).to(self.means.dtype))

    def distances(self, f: torch.Tensor) -> torch.Tensor:
        """Squared Mahalanobis distances ``d_c(f) = (f − μ_c)ᵀ P (f − μ_c) = ‖Lᵀ(f − μ_c)‖²``,
        ``B×C``."""
        u = (f if f.dtype == self.means.dtype else f.to(self.means.dtype)) @ self._whiten  # Lᵀf
        return (u.unsqueeze(1) - self._white_means.unsqueeze(0)).pow(2).sum(dim=-1)

    def scores(self, f: torch.Tensor, predicted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(min_c d_c(f), d_ŷ(f))``, each ``B``, for predicted classes ``ŷ`` (int64 ``B``)."""
        d = self.distances(f)
        return d.min(dim=1).values, d.gather(1, predicted.view(-1, 1)).squeeze(1)


def ledoit_wolf_shrinkage(x: torch.Tensor) -> float:
    """Ledoit–Wolf shrinkage ``δ ∈ [0, 1]`` for centred data ``x`` (``N×D``), in float64.

    With ``S = xᵀx/N`` and ``μ = tr S / D``: ``d² = ‖S − μI‖²_F / D``,
    ``b̄² = (1/(N²D)) Σ_n ‖x_n x_nᵀ − S‖²_F = (1/(ND)) (Σ_n‖x_n‖⁴/N − ‖S‖²_F)``, and
    ``δ = min(b̄², d²) / d²`` (Ledoit & Wolf 2004, Lemma 3.2–3.4; ``δ = 0`` when ``d² = 0``).
    """
    x = x.double()
    n, d = x.shape
    s = x.T @ x / n
    mu = torch.trace(s) / d
    s_frob2 = (s * s).sum()
    delta2 = (s_frob2 - 2 * mu * torch.trace(s) + d * mu**2) / d
    x2 = x * x
    beta2 = ((x2.T @ x2).sum() / n - s_frob2) / (n * d)
    if float(delta2) <= 0.0:
        return 0.0
    return float(torch.clamp(torch.minimum(beta2, delta2) / delta2, 0.0, 1.0))


def fit_class_gaussians(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    shrinkage: float | None = None,
) -> ClassGaussians:
    """Class means, tied covariance shrunk by ``shrinkage`` (Ledoit–Wolf when ``None``), precision.

    Every class needs at least one example (its mean is otherwise undefined).
    """
    f = features.double()
    labels = labels.long()
    if f.ndim != 2 or labels.shape != (f.shape[0],):
        raise ValueError(f"need N×D features and N labels, got {tuple(f.shape)}, {labels.shape}")
    counts = torch.bincount(labels, minlength=n_classes)
    if counts.numel() > n_classes or bool((counts == 0).any()):
        raise ValueError(f"each of {n_classes} classes needs examples; counts {counts.tolist()}")
    means = torch.zeros(n_classes, f.shape[1], dtype=torch.float64).index_add_(0, labels, f)
    means /= counts.unsqueeze(1).double()
    centred = f - means[labels]
    delta = ledoit_wolf_shrinkage(centred) if shrinkage is None else float(shrinkage)
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"shrinkage must be in [0, 1], got {delta}")
    chol, info = torch.linalg.cholesky_ex(shrunk_covariance(centred, delta))
    if int(info) != 0:
        raise ValueError(f"the shrunk covariance (δ = {delta:g}) is singular; use shrinkage > 0")
    precision = torch.cholesky_inverse(chol)
    return ClassGaussians(means.float(), precision.float(), delta)


def shrunk_covariance(centred: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """``(1 − δ)·S + δ·(tr S / D)·I`` with ``S = xᵀx/N`` of centred ``x`` (float64)."""
    n, d = centred.shape
    s = centred.T @ centred / n
    mu = torch.trace(s) / d
    return (1.0 - shrinkage) * s + shrinkage * mu * torch.eye(d, dtype=s.dtype)
