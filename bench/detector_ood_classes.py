"""Per-digit flagged rates of an OOD set made from test digits (e.g. MNIST rotated 90°).

Usage: python bench/detector_ood_classes.py [--ood rotated] [--limit 1000] [--model DIR]
                                            [--json OUT.json] [--threads 1]

For the first ``--limit`` test digits, transformed by ``attacks.ood`` (``--ood``), scored with the
model's detector (K = the detector's, masks seeded 0): per original digit class, the fraction
flagged by every score at its calibrated threshold, the fraction the network still classifies as
the original digit (a rotation-invariant digit, such as most 0s, is a plausible digit), and the
fraction **no individual score flags** at its own 5 % threshold (predictive entropy, mutual
information, variation ratio, every Mahalanobis distance, −log KD, the logit). The latter is a
rough ceiling for rules built from these scores at that FPR: an image every score ranks among the
clean validation digits' bottom 95 % is flagged by none of them. ``fused_not_as_itself`` is the
fused flag's rate among the images the network does *not* classify as their original digit
(``n_not_as_itself`` of them): the flag rate on the images that are not a plausible digit of
their own class.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bayesgate.attacks.ood import OOD_SETS, ood_images
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import FUSED, load_detector
from bayesgate.models.detection.detector import collect_features, scores_numpy
from bayesgate.models.mc.uncertainty import predictive_mean
from bayesgate.models.store.directory import load_model

MODEL = Path(__file__).resolve().parents[1] / "models/pretrained/bayesgate-cnn"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--ood", default="rotated", choices=tuple(OOD_SETS))
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=args.limit)
    probs, feats = collect_features(
        loaded.network, ood_images(args.ood, x), detector.k, seed=0, progress=True
    )
    scores = scores_numpy(detector, probs, feats)
    flags = {n: scores[n] > t for n, t in detector.thresholds.items()}
    individual = [n for n in flags if n != FUSED]
    none = ~np.any([flags[n] for n in individual], axis=0)
    same = (predictive_mean(probs).argmax(dim=1) == y).numpy()
    y = y.numpy()
    rows = {}
    groups = {str(c): y == c for c in range(len(loaded.card.classes)) if np.any(y == c)}
    groups["all"] = np.ones_like(y, dtype=bool)
    for name, m in groups.items():
        other = m & ~same  # not classified as the digit it was made from
        rows[name] = {
            "n": int(m.sum()),
            "classified_as_itself": float(same[m].mean()),
            "flagged_by_no_score": float(none[m].mean()),
            **{n: float(f[m].mean()) for n, f in flags.items()},
            "n_not_as_itself": int(other.sum()),
            "fused_not_as_itself": float(flags[FUSED][other].mean()) if other.any() else None,
        }
    cols = [FUSED, "predictive_entropy", "mahalanobis_penultimate", "neg_log_kde"]
    print("digit   n  as-itself  no-score  " + "  ".join(cols) + "  fused|not-itself (n)")
    for c, r in rows.items():
        among = r["fused_not_as_itself"]
        print(
            f"{c:>5} {r['n']:>4}  {r['classified_as_itself']:.3f}  {r['flagged_by_no_score']:.3f}  "
            + "  ".join(f"{r.get(n, float('nan')):.3f}" for n in cols)
            + f"  {'–' if among is None else f'{among:.3f}'} ({r['n_not_as_itself']})"
        )
    if args.json:
        args.json.write_text(json.dumps({"ood": args.ood, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
