"""Two detectors' flags side by side on the same images: each, either, both.

For the first ``--limit`` test digits, clean and transformed by each ``--ood`` set, both model
directories' detectors score the *same* MC passes (the first directory's network, K = its
detector's, masks seeded 0; the two must hold the same weights) and flag at their own thresholds.
Prints, per set, the fraction each flags, either flags and both flag — e.g. what serving a second,
OOD-oriented flag beside the served one would flag of clean traffic.

    python bench/flag_union.py models/pretrained/bayesgate-robust \\
        ~/.cache/bayesgate/i15/model-fisher --ood rotated rotated45 letters --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bayesgate.attacks.ood import OOD_SETS, ood_images
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import load_detector
from bayesgate.models.detection.detector import collect_features, scores_numpy
from bayesgate.models.store.directory import load_model


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="model directory (its network scores both)")
    parser.add_argument("second", type=Path, help="model directory with the same weights")
    parser.add_argument("--ood", nargs="*", default=["rotated"], choices=tuple(OOD_SETS))
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(args.first)
    detectors = [load_detector(d, loaded.card.weights_sha256) for d in (args.first, args.second)]
    if detectors[0].k != detectors[1].k:
        parser.error("the two detectors score with different K")
    x, _ = load_mnist("test", limit=args.limit)
    sets = {"clean": x, **{name: ood_images(name, x) for name in args.ood}}
    rows = {}
    for name, images in sets.items():
        probs, feats = collect_features(loaded.network, images, detectors[0].k, seed=0)
        a, b = (scores_numpy(d, probs, feats)[d.score] > d.threshold for d in detectors)
        rows[name] = {
            "first": float(a.mean()),
            "second": float(b.mean()),
            "either": float(np.mean(a | b)),
            "both": float(np.mean(a & b)),
        }
        r = rows[name]
        print(f"{name:10s} first {r['first']:.3f}  second {r['second']:.3f}  "
              f"either {r['either']:.3f}  both {r['both']:.3f}")  # fmt: skip
    if args.json:
        meta = {"first": str(args.first), "second": str(args.second), "limit": args.limit}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
