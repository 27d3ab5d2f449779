"""Clean test-split false-positive rate of every detector score at its validation threshold.

    python bench/detector_clean_fpr.py [MODEL_DIR] [--limit N] [--threads 1]

All (or the first ``--limit``) MNIST test images, the detector's K, masks seeded 0; prints JSON
``{score: fraction of clean test images with score > threshold}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bayesgate.attacks.metrics import flag_rate
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import load_detector, score_images
from bayesgate.models.store.directory import load_model

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "pretrained" / "bayesgate-cnn"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    x, _ = load_mnist("test", limit=args.limit)
    scores = score_images(detector, loaded.network, x, k=detector.k, seed=0)
    fpr = {n: round(flag_rate(v, detector.thresholds[n]), 4) for n, v in scores.items()}
    print(json.dumps({"test_images": int(x.shape[0]), "k": detector.k, "clean_test_fpr": fpr}))


if __name__ == "__main__":
    main()
