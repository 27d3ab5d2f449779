"""Re-set a fitted detector's min-p rule (its score names), optionally adding opt-in Gaussians.

Usage:
  python bench/detector_rule.py --names fused_logistic mutual_information neg_log_kde   # in place
  python bench/detector_rule.py --input-layer --out DIR     # the pixel-space experiment, a copy
  python bench/detector_rule.py --grid-layer --out DIR      # conv maps pooled to 2×2, a copy
  python bench/detector_rule.py --pixel-gaussians --out DIR  # per-class Gaussians, pooled pixels
  python bench/detector_rule.py --combine fisher --names … --out DIR  # Fisher's −Σ log p, a copy

Nothing already fitted is re-fitted (the logistic fusion, the trunk and penultimate Gaussians and
the KDE stay as they are). Steps:

1. with ``--input-layer``: class means and the Ledoit–Wolf-shrunk tied covariance of the flattened
   training images (all of the training split, true labels; :func:`fit_class_gaussians`, as every
   layer), and ``--names`` defaults to :func:`bayesgate.attacks.detector_fit.min_p_scores` (logit,
   entropy, pixel-space distance); with ``--grid-layer`` likewise for the trunk's conv maps
   averaged over 2×2 cells (``trunk_2x2``, the engine's features of the training images; K = 1:
   the trunk is deterministic), and the default names are logit, entropy, ``trunk_2x2`` distance;
   with ``--pixel-gaussians`` one Gaussian per class with its own Ledoit–Wolf-shrunk covariance
   of the training images average-pooled over 2×2 pixels (:func:`fit_class_quadratic`), and the
   default names are logit, entropy, ``gaussian_nll_input_pool2``;
2. the two validation parts cut as ``fit-detector`` cut them (seed 0): every score of the 5 000
   fit-part and 5 000 threshold-part images (K = the detector's, masks seeded 0). The stored logit
   threshold must come out again (checked, up to float rounding), so these are the parts the
   detector was calibrated on;
3. ``fused`` = min-p (``--combine fisher``: Fisher's ``−Σ_j log p_j``) over the names against the
   fit part's clean scores; every threshold at the
   target FPR on the threshold part. No attack and no OOD image enters any step.

``--out DIR`` copies the model directory there first and changes the copy (``bayesgate
detect-eval DIR …`` evaluates it); without it the model directory itself is rewritten
(``detector.json`` and, with ``--input-layer``, ``detector.safetensors``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from bayesgate.attacks.detector_cli import store_detector
from bayesgate.attacks.detector_fit import PIXEL_QUADRATIC, min_p_scores
from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import FUSED, FUSED_LOGISTIC, load_detector
from bayesgate.models.detection.conformal import fit_conformal
from bayesgate.models.detection.detector import Detector, collect_features, scores_numpy
from bayesgate.models.detection.mahalanobis import fit_class_gaussians
from bayesgate.models.detection.quadratic import fit_class_quadratic
from bayesgate.models.mc.engine import INPUT_LAYER, TRUNK_GRID_LAYER
from bayesgate.models.store.directory import load_model

MODEL = Path(__file__).resolve().parents[1] / "models/pretrained/bayesgate-cnn"
PARTS = 5000


def validation_scores(loaded, detector: Detector, seed: int = 0) -> dict[str, dict]:
    """Every score of the fit and threshold parts (``fit-detector``'s cut, masks seeded 0), the
    logit as ``fused_logistic``."""
    x_val, _ = load_mnist("val", val_size=loaded.card.training.val_size)
    order = torch.randperm(x_val.shape[0], generator=torch.Generator().manual_seed(seed))
    conformal, detector.conformal = detector.conformal, None  # "fused" is then the logit
    out = {}
    for part, rows in (("fit", order[:PARTS]), ("thr", order[PARTS : 2 * PARTS])):
        probs, feats = collect_features(
            loaded.network, x_val[rows], detector.k, seed=0, progress=True, desc=part
        )
        out[part] = scores_numpy(detector, probs, feats)
        out[part][FUSED_LOGISTIC] = out[part].pop(FUSED)
    detector.conformal = conformal
    return out


def add_layer(loaded, detector: Detector, layer: str) -> None:
    """Gaussians of ``layer`` (``input`` or ``trunk_2x2``) on the training split (Ledoit–Wolf,
    true labels), in place."""
    if layer in detector.gaussians:
        raise SystemExit(f"the detector already has the {layer} layer")
    x, y = load_mnist("train", val_size=loaded.card.training.val_size)
    started = time.perf_counter()
    if layer == INPUT_LAYER:
        features = x.flatten(1)
    else:
        features = collect_features(loaded.network, x, 1, progress=True, desc="train")[1][layer]
    gaussians = fit_class_gaussians(features, y, len(loaded.card.classes))
    seconds = time.perf_counter() - started
    dim, delta = features.shape[1], gaussians.shrinkage
    print(f"{layer} Gaussians: D = {dim}, δ = {delta:.4g} ({seconds:.0f} s)")
    detector.gaussians = {**detector.gaussians, layer: gaussians}
    shrinkage = {**detector.fit.get("shrinkage", {}), layer: gaussians.shrinkage}
    detector.fit = {**detector.fit, "shrinkage": shrinkage}


def add_pixel_quadratic(loaded, detector: Detector) -> None:
    """Per-class Gaussians of the training images pooled 2×2 (Ledoit–Wolf per class, true
    labels), in place."""
    if PIXEL_QUADRATIC in detector.quadratics:
        raise SystemExit(f"the detector already has {PIXEL_QUADRATIC} Gaussians")
    x, y = load_mnist("train", val_size=loaded.card.training.val_size)
    started = time.perf_counter()
    quadratic = fit_class_quadratic(x, y, len(loaded.card.classes), pool=2)
    seconds = time.perf_counter() - started
    deltas = ", ".join(f"{d:.3g}" for d in quadratic.shrinkage)
    print(
        f"{PIXEL_QUADRATIC} per-class Gaussians: D = {quadratic.means.shape[1]}, δ_c = {deltas} "
        f"({seconds:.0f} s)"
    )
    detector.quadratics = {**detector.quadratics, PIXEL_QUADRATIC: quadratic}
    shrinkage = {**detector.fit.get("shrinkage", {}), PIXEL_QUADRATIC: list(quadratic.shrinkage)}
    detector.fit = {**detector.fit, "shrinkage": shrinkage}


def set_rule(
    loaded, detector: Detector, names: tuple[str, ...], how: str, combine: str = "min"
) -> None:
    """``fused`` = min-p (or Fisher's ``−Σ log p``, ``combine="fisher"``) over ``names``; every
    threshold again on the threshold part (in place)."""
    stored = detector.thresholds[FUSED_LOGISTIC]
    parts = validation_scores(loaded, detector)
    recomputed = threshold_at_fpr(parts["thr"][FUSED_LOGISTIC], detector.target_fpr)
    print(f"logit threshold: stored {stored!r}, recomputed {recomputed!r}")
    assert abs(recomputed - stored) <= 1e-5 * abs(stored), (
        "the threshold part is not the one the detector was calibrated on"
    )
    detector.conformal = fit_conformal(parts["fit"], names, combine=combine)
    thr = parts["thr"]
    thr[FUSED] = detector.conformal.score({n: torch.from_numpy(thr[n]) for n in names}).numpy()
    thresholds = {n: threshold_at_fpr(s, detector.target_fpr) for n, s in thr.items()}
    thresholds[FUSED] = detector.conformal.gap_threshold(thresholds[FUSED])
    detector.thresholds = thresholds
    detector.fit = {
        **detector.fit,
        "realised_fpr": {n: flag_rate(s, thresholds[n]) for n, s in thr.items()},
        "rule": f"{'Fisher' if combine == 'fisher' else 'min-p'} over {', '.join(names)}: {how} "
        "(logistic fusion, statistics unchanged)",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=None, help="change a copy made here")
    parser.add_argument("--names", nargs="+", default=None, help="scores of the min-p rule")
    parser.add_argument("--input-layer", action="store_true", help="add pixel-space Gaussians")
    parser.add_argument("--grid-layer", action="store_true", help="add trunk_2x2 Gaussians")
    parser.add_argument(
        "--pixel-gaussians", action="store_true", help="add per-class Gaussians, 2×2-pooled pixels"
    )
    parser.add_argument(
        "--combine",
        choices=("min", "fisher"),
        default="min",
        help="how the p-values are combined: min-p (default) or Fisher's −Σ log p",
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    directory = args.model
    if args.out is not None:
        if args.out.exists():
            raise SystemExit(f"{args.out} exists; give a new directory")
        directory = Path(shutil.copytree(args.model, args.out))
    loaded = load_model(directory)
    detector = load_detector(directory, loaded.card.weights_sha256)
    for layer, wanted in ((TRUNK_GRID_LAYER, args.grid_layer), (INPUT_LAYER, args.input_layer)):
        if wanted:
            add_layer(loaded, detector, layer)
    if args.pixel_gaussians:
        add_pixel_quadratic(loaded, detector)
    names = tuple(args.names) if args.names else min_p_scores(detector)
    set_rule(loaded, detector, names, "set by bench/detector_rule.py", args.combine)
    print(json.dumps(store_detector(detector, directory), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
