"""Held-out log-likelihood of validation digits under a class-conditional probabilistic PCA of the
pixels, by number of components k (how many a likelihood rule would keep for a pixel-space score).

Usage: python bench/pixel_ppca_likelihood.py [--k 10 50 100 …]

Model (Tipping & Bishop 1999, tied across classes): class means μ_c and the within-class covariance
``S`` of the 50 000 training digits (true labels); eigenvalues ``λ_1 ≥ … ≥ λ_D`` of ``S + δI`` with
``δ = 1/(12·255²)`` — the variance of uniform dequantisation noise on pixels stored as ``i/255``,
which the validation digits get too (``x + U(0, 1/255) − 1/(2·255)``, seed 0) so that constant
border pixels do not make the density degenerate. With ``σ² = mean(λ_{k+1…D})`` the model
covariance is ``C = U_k (Λ_k − σ²) U_kᵀ + σ² I`` and each held-out digit (the 5 000 fit-part
validation images of ``fit-detector``, true labels) scores
``log N(x; μ_y, C) = −½ [Σ_{i≤k} (u_iᵀd)²/λ_i + (‖d‖² − Σ_{i≤k} (u_iᵀd)²)/σ² + log|C| + D log 2π]``,
``d = x − μ_y``. Printed: mean held-out log-likelihood per k (float64).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bayesgate.models.data.mnist import load_mnist

PARTS = 5000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--k", type=int, nargs="+", default=[10, 50, 100, 200, 300, 400, 500, 600, 700, 783]
    )
    args = parser.parse_args()
    x, y = load_mnist("train")
    train, labels = x.flatten(1).double().numpy(), y.numpy()
    means = np.stack([train[labels == c].mean(0) for c in range(10)])
    centred = train - means[labels]
    d = train.shape[1]
    delta = 1.0 / (12 * 255**2)
    lam, vecs = np.linalg.eigh(centred.T @ centred / len(train) + delta * np.eye(d))
    lam, vecs = lam[::-1], vecs[:, ::-1]
    xv, yv = load_mnist("val")
    order = torch.randperm(xv.shape[0], generator=torch.Generator().manual_seed(0)).numpy()
    held, held_y = xv.flatten(1).double().numpy()[order[:PARTS]], yv.numpy()[order[:PARTS]]
    noise = np.random.default_rng(0).uniform(0, 1 / 255, held.shape) - 0.5 / 255
    diff = held + noise - means[held_y]
    proj2, total = (diff @ vecs) ** 2, (diff**2).sum(1)
    print("k  sigma2  mean held-out log-likelihood (nats per digit)")
    for k in args.k:
        sigma2 = lam[k:].mean() if k < d else 1.0
        inside = (proj2[:, :k] / lam[:k]).sum(1)
        outside = (total - proj2[:, :k].sum(1)) / sigma2 if k < d else 0.0
        logdet = np.log(lam[:k]).sum() + (d - k) * np.log(sigma2)
        ll = -0.5 * (inside + outside + logdet + d * np.log(2 * np.pi))
        print(f"{k:>3}  {sigma2:.3g}  {ll.mean():.1f}")


if __name__ == "__main__":
    main()
