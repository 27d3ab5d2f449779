"""Switch a fitted detector's ``fused`` score to the min-p rule without re-fitting anything else.

Usage: python bench/detector_min_p.py SCORES.npz [MODEL_DIR]

``SCORES.npz`` is ``bench/fusion_scores_dump.py``'s output for the same detector (its ``val_fit``
and ``val_thr`` parts are ``fit-detector``'s validation fit and threshold parts, seed 0). The
statistics (``detector.safetensors``) and the logistic fusion stay as they are; the logit's
threshold moves to ``fused_logistic``; ``fused`` becomes the minimum conformal p-value of
:data:`bayesgate.attacks.detector_fit.MIN_P_SCORES` against the ``val_fit`` clean scores, with its
threshold at the target FPR on ``val_thr``. ``fit-detector --rule min-p`` does the same in one go.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bayesgate.attacks.detector_cli import store_detector
from bayesgate.attacks.detector_fit import MIN_P_SCORES
from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.models.detection import FUSED, FUSED_LOGISTIC, load_detector
from bayesgate.models.detection.conformal import fit_conformal

MODEL = Path(__file__).resolve().parents[1] / "models/pretrained/bayesgate-cnn"


def part(data: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """One part's scores, the logistic logit renamed ``fused_logistic``."""
    out = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith(f"{name}/")}
    out[FUSED_LOGISTIC] = out.pop(FUSED)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scores", type=Path)
    parser.add_argument("model", type=Path, nargs="?", default=MODEL)
    args = parser.parse_args()
    detector = load_detector(args.model)
    if detector.conformal is not None:
        raise SystemExit(f"{args.model}: the detector already has the min-p rule")
    with np.load(args.scores) as f:
        data = dict(f)
    fit, thr = part(data, "val_fit"), part(data, "val_thr")
    logit_threshold = detector.thresholds[FUSED]
    assert threshold_at_fpr(thr[FUSED_LOGISTIC], detector.target_fpr) == logit_threshold, (
        "the dumped threshold part is not the one the detector was calibrated on"
    )
    detector.conformal = fit_conformal(fit, MIN_P_SCORES)
    fused = detector.conformal.score({n: torch.from_numpy(thr[n]) for n in MIN_P_SCORES}).numpy()
    threshold = detector.conformal.gap_threshold(threshold_at_fpr(fused, detector.target_fpr))
    detector.thresholds = {**detector.thresholds, FUSED_LOGISTIC: logit_threshold, FUSED: threshold}
    realised = dict(detector.fit.get("realised_fpr", {}))
    realised[FUSED_LOGISTIC] = realised.get(FUSED)
    realised[FUSED] = flag_rate(fused, threshold)
    aurocs = dict(detector.fit.get("auroc", {}))
    aurocs[FUSED_LOGISTIC] = aurocs.pop(FUSED, None)  # the seen attacks' scores are not stored
    detector.fit = {
        **detector.fit,
        "auroc": aurocs,
        "realised_fpr": realised,
        "rule": "min-p set by bench/detector_min_p.py (statistics and logistic fusion unchanged)",
    }
    print(json.dumps(store_detector(detector, args.model), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
