"""Choose the min-p rule's scores on validation data only: clean parts + rotated validation digits.

Usage: python bench/detector_rule_selection.py [--model DIR] [--json OUT.json] [--threads 1]

Candidates: ``fused = −log min_j p_j`` over ``fused_logistic`` (kept in every rule: it carries the
seen attacks) plus any subset of the other scores the detector has (entropy, mutual information,
closest-class Mahalanobis per layer, ``−log KD``) — 32 rules for the bundled model. Data, all from
the validation split cut as ``fit-detector`` cut it (seed 0, K = the detector's, masks seeded 0):

- p-value references: the 5 000 clean *fit-part* scores;
- thresholds: the target FPR on the 5 000 clean *threshold-part* images;
- OOD proxy: the fit-part images rotated by 90° (``attacks.ood``'s ``rotated``; other images than
  the test column's).

Selection rule (fixed before running): the largest fraction of rotated validation digits flagged;
ties → fewer scores. No test image enters; the chosen rule is then evaluated once on the test
split with ``bayesgate detect-eval`` (docs/detector.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.attacks.ood import ood_images
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import FUSED_LOGISTIC, load_detector
from bayesgate.models.detection.conformal import fit_conformal
from bayesgate.models.detection.detector import collect_features, mahalanobis_names, scores_numpy
from bayesgate.models.store.directory import load_model

MODEL = Path(__file__).resolve().parents[1] / "models/pretrained/bayesgate-cnn"
PARTS = 5000


def validation_sets(loaded, detector) -> dict[str, dict[str, np.ndarray]]:
    """Every score of the clean fit part, the clean threshold part and the rotated fit part."""
    x_val, _ = load_mnist("val", val_size=loaded.card.training.val_size)
    order = torch.randperm(x_val.shape[0], generator=torch.Generator().manual_seed(0))
    images = {
        "fit": x_val[order[:PARTS]],
        "thr": x_val[order[PARTS : 2 * PARTS]],
        "rotated": ood_images("rotated", x_val[order[:PARTS]]),
    }
    out = {}
    for name, x in images.items():
        probs, feats = collect_features(
            loaded.network, x, detector.k, seed=0, progress=True, desc=name
        )
        out[name] = scores_numpy(detector, probs, feats)
    return out


def candidates(detector) -> list[tuple[str, ...]]:
    """``(fused_logistic,) + T`` for every subset ``T`` of the other fusable scores."""
    others = ["predictive_entropy", "mutual_information"]
    others += [mahalanobis_names(layer)[0] for layer in detector.gaussians]
    if detector.kde is not None:
        others.append("neg_log_kde")
    subsets = itertools.chain.from_iterable(
        itertools.combinations(others, r) for r in range(len(others) + 1)
    )
    return [(FUSED_LOGISTIC, *s) for s in subsets]


def evaluate(names: tuple[str, ...], sets: dict, target_fpr: float) -> dict:
    """Validation numbers of the min-p rule over ``names``."""
    rule = fit_conformal(sets["fit"], names)

    def fused(part: str) -> np.ndarray:
        return rule.score({n: torch.from_numpy(sets[part][n]) for n in names}).numpy()

    threshold = threshold_at_fpr(fused("thr"), target_fpr)
    return {
        "names": list(names),
        "val_fpr": flag_rate(fused("thr"), threshold),
        "val_rotated_flagged": flag_rate(fused("rotated"), threshold),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    sets = validation_sets(loaded, detector)
    singles = {
        n: flag_rate(sets["rotated"][n], threshold_at_fpr(sets["thr"][n], detector.target_fpr))
        for n in sets["thr"]
    }
    rows = [evaluate(c, sets, detector.target_fpr) for c in candidates(detector)]
    rows.sort(key=lambda r: (-r["val_rotated_flagged"], len(r["names"])))
    for r in rows:
        print(f"{r['val_rotated_flagged']:.4f}  fpr {r['val_fpr']:.4f}  {' + '.join(r['names'])}")
    print("single scores, rotated validation digits flagged at their own threshold:")
    for n, v in sorted(singles.items(), key=lambda kv: -kv[1]):
        print(f"  {n}: {v:.4f}")
    print("chosen:", " + ".join(rows[0]["names"]))
    if args.json:
        report = {"chosen": rows[0]["names"], "rules": rows, "single_scores": singles}
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
