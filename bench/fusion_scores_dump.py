"""Dump every detector score of the bundled model's clean validation parts, clean test images,
cached attack sets and OOD sets to one ``.npz`` (for comparing fusion rules offline).

Usage: python bench/fusion_scores_dump.py OUT.npz [--threads 1]

Validation parts are cut exactly as ``fit-detector`` cuts them (seed 0, 5000 fit + 5000
threshold); attack images come from the ``detect-eval`` cache (no attack is re-run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from bayesgate.attacks.detect_eval import EvalSettings, evaluate_detector
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection.detector import collect_features, scores_numpy
from bayesgate.models.detection.store import load_detector
from bayesgate.models.store.directory import load_model

MODEL = Path(__file__).resolve().parents[1] / "models/pretrained/bayesgate-cnn"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(MODEL)
    detector = load_detector(MODEL, loaded.card.weights_sha256)
    arrays: dict[str, np.ndarray] = {}
    val_size = loaded.card.training.val_size
    x_val, _ = load_mnist("val", val_size=val_size)
    order = torch.randperm(x_val.shape[0], generator=torch.Generator().manual_seed(0))
    for part, rows in (("val_fit", order[:5000]), ("val_thr", order[5000:10000])):
        probs, feats = collect_features(loaded.network, x_val[rows], detector.k, seed=0)
        for name, v in scores_numpy(detector, probs, feats).items():
            arrays[f"{part}/{name}"] = v
        print(part, flush=True)
    settings = EvalSettings(attack_limits={"square": 300, "cw": 500})
    result = evaluate_detector(loaded, detector, settings, progress=True)
    for name, v in result.clean.items():
        arrays[f"test_clean/{name}"] = v
    for s in result.sets:
        for name, v in s.scores.items():
            arrays[f"{s.key}/{name}"] = v
    np.savez_compressed(args.out, **arrays)


if __name__ == "__main__":
    main()
