"""Class-conditional Gaussians with one covariance per class (quadratic discriminant analysis) on
the input image average-pooled over ``pool × pool`` pixels: a generative model of the digit.

Fitted on training images ``x_n`` with labels ``y_n``; the feature is ``f = avgpool_pool(x)``
flattened (``D = C·(H/pool)·(W/pool)`` values). Per class ``c``:

- the mean ``μ_c = mean{f_n : y_n = c}``;
- the class's own covariance ``S_c = (1/N_c) Σ_{y_n = c} (f_n − μ_c)(f_n − μ_c)ᵀ``, shrunk toward
  a scaled identity by its own Ledoit–Wolf ``δ_c``
  (:func:`~.mahalanobis.ledoit_wolf_shrinkage` of the class's centred features):
  ``Σ_c = (1 − δ_c)·S_c + δ_c·(tr S_c / D)·I``;
- the precision ``P_c = Σ_c⁻¹`` (float64 Cholesky inverse, stored float32) and, derived from it at
  load, ``log det Σ_c = −log det P_c``.

Score of a feature ``f``: ``q_c(f) = (f − μ_c)ᵀ P_c (f − μ_c) + log det Σ_c``, which is
``−2 log N(f; μ_c, Σ_c) − D log 2π``; the detector reads ``min_c q_c(f)`` and ``q_ŷ(f)``. Larger =
less likely under every class's model of the digit = more suspicious. Unlike the tied covariance
of :mod:`.mahalanobis`, a stroke where *some* digit often has ink is charged against the spread of
the class it is compared with. Computed whitened (``P_c = L_c L_cᵀ``, ``q_c = ‖L_cᵀ f − L_cᵀ μ_c‖²
+ log det Σ_c``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bayesgate.models.detection.mahalanobis import ledoit_wolf_shrinkage, shrunk_covariance


@dataclass(frozen=True)
class ClassQuadratic:
    """``means`` ``C×D``, ``precisions`` ``C×D×D`` (float32), per-class ``shrinkage`` δ_c, and how
    the feature is made from the flattened input: ``image_shape`` ``(channels, H, W)``, ``pool``."""

    means: torch.Tensor
    precisions: torch.Tensor
    shrinkage: tuple[float, ...]
    image_shape: tuple[int, int, int]
    pool: int

    def __post_init__(self) -> None:
        c, d = self.means.shape
        if self.precisions.shape != (c, d, d) or len(self.shrinkage) != c:
            raise ValueError(
                f"means {tuple(self.means.shape)}, precisions {tuple(self.precisions.shape)} and "
                f"{len(self.shrinkage)} shrinkages do not describe the same classes"
            )
        if d != pooled_dim(self.image_shape, self.pool):
            raise ValueError(f"D = {d} is not the size of {self.image_shape} pooled by {self.pool}")
        object.__setattr__(self, "means", self.means.contiguous())
        object.__setattr__(self, "precisions", self.precisions.contiguous())
        chol = torch.linalg.cholesky(self.precisions.double())  # P_c = L_c L_cᵀ
        white_means = torch.einsum("cd,cde->ce", self.means.double(), chol)
        log_det_cov = -2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
        dtype = self.means.dtype
        object.__setattr__(self, "_whiten", chol.to(dtype).contiguous())
        object.__setattr__(self, "_white_means", white_means.to(dtype))
        object.__setattr__(self, "log_det_cov", log_det_cov.to(dtype))

    def features(self, flat_input: torch.Tensor) -> torch.Tensor:
        """``avgpool_pool`` of the flattened images (``B×(C·H·W)``), flattened: ``B×D``."""
        x = flat_input.reshape(flat_input.shape[0], *self.image_shape)
        return pool_images(x, self.pool).to(self.means.dtype)

    def nll(self, flat_input: torch.Tensor) -> torch.Tensor:
        """``q_c(f) = (f − μ_c)ᵀ P_c (f − μ_c) + log det Σ_c`` for every class, ``B×C``."""
        u = torch.einsum("bd,cde->bce", self.features(flat_input), self._whiten)  # L_cᵀ f
        return (u - self._white_means.unsqueeze(0)).pow(2).sum(dim=-1) + self.log_det_cov

    def scores(
        self, flat_input: torch.Tensor, predicted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(min_c q_c(f), q_ŷ(f))``, each ``B``, for predicted classes ``ŷ`` (int64 ``B``)."""
        q = self.nll(flat_input)
        return q.min(dim=1).values, q.gather(1, predicted.view(-1, 1)).squeeze(1)


def pooled_dim(image_shape: tuple[int, int, int], pool: int) -> int:
    """``channels · ⌊H/pool⌋ · ⌊W/pool⌋``."""
    channels, h, w = image_shape
    return channels * (h // pool) * (w // pool)


def pool_images(x: torch.Tensor, pool: int) -> torch.Tensor:
    """``B×C×H×W`` images averaged over ``pool × pool`` cells, flattened to ``B×D``."""
    return F.avg_pool2d(x, pool).flatten(1) if pool > 1 else x.flatten(1)


def fit_class_quadratic(
    images: torch.Tensor, labels: torch.Tensor, n_classes: int, pool: int = 2
) -> ClassQuadratic:
    """Per-class means, Ledoit–Wolf-shrunk per-class covariances and precisions of the pooled
    ``B×C×H×W`` training images (every class needs at least two examples)."""
    if images.ndim != 4 or labels.shape != (images.shape[0],):
        raise ValueError(
            f"need B×C×H×W images and B labels, got {tuple(images.shape)}, {tuple(labels.shape)}"
        )
    if pool < 1:
        raise ValueError(f"pool must be ≥ 1, got {pool}")
    f = pool_images(images.double(), pool)
    labels = labels.long()
    counts = torch.bincount(labels, minlength=n_classes)
    if counts.numel() > n_classes or bool((counts < 2).any()):
        raise ValueError(
            f"each of {n_classes} classes needs ≥ 2 examples; counts {counts.tolist()}"
        )
    means, precisions, shrinkage = [], [], []
    for c in range(n_classes):
        fc = f[labels == c]
        mu = fc.mean(dim=0)
        centred = fc - mu
        delta = ledoit_wolf_shrinkage(centred)
        chol, info = torch.linalg.cholesky_ex(shrunk_covariance(centred, delta))
        if int(info) != 0:
            raise ValueError(f"class {c}: the shrunk covariance (δ = {delta:g}) is singular")
        means.append(mu)
        precisions.append(torch.cholesky_inverse(chol))
        shrinkage.append(delta)
    shape = (int(images.shape[1]), int(images.shape[2]), int(images.shape[3]))
    return ClassQuadratic(
        torch.stack(means).float(), torch.stack(precisions).float(), tuple(shrinkage), shape, pool
    )
