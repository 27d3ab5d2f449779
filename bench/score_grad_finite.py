"""How many test digits give a non-finite ∇x of a bundled model's detector score (the adaptive
attack's gradient: ``detector_score_fn``, K passes with fresh masks, the smooth ``fused``).

Usage: python bench/score_grad_finite.py [--model bayesgate-cnn] [--n 200] [--k 10] [--seed 0]

Measured 2026-11-28 (first 200 test digits, K = 10, seed 0): with ``models/mc/uncertainty.py``
of ``e7c2644`` 19 (bayesgate-cnn) and 1 (bayesgate-robust); with ``uncertainty.entr`` 0 and 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bayesgate.attacks.adaptive_eval import detector_score_fn
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection.store import load_detector
from bayesgate.models.store.bundled import resolve_model_dir
from bayesgate.models.store.directory import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bayesgate-cnn")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = resolve_model_dir(Path(args.model))
    loaded = load_model(directory)
    detector = load_detector(directory, loaded.card.weights_sha256)
    x, _ = load_mnist("test", limit=args.n)
    fn = detector_score_fn(
        loaded.network, detector, args.k, generator=torch.Generator().manual_seed(args.seed)
    )
    image = x.clone().requires_grad_(True)
    _, score = fn(image)
    (grad,) = torch.autograd.grad(score.sum(), image)
    bad = int((~torch.isfinite(grad)).flatten(1).any(1).sum())
    print(f"{args.model}: {bad} of {args.n} digits with a non-finite gradient of {detector.score}")


if __name__ == "__main__":
    main()
