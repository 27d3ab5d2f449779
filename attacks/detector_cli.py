"""``bayesgate fit-detector MODEL``: fit the fused detector and store it beside the model.

Writes ``detector.safetensors`` + ``detector.json`` into the model directory and, when the model
has a ``calibration.json`` for the same weights, references the detector from it (file name and
sha256), so the service flags inputs by the fused score. Prints a JSON summary.

The parser's defaults and choices, and the checks of the settings, are those of
:class:`~bayesgate.attacks.fit_settings.FitSettings` (torch-free), so ``--help`` and a refused
setting do not wait for torch (~3 s); the fitting itself (:mod:`~bayesgate.attacks.detector_fit`,
torch) is imported after the checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bayesgate.attacks.fit_settings import OUTLIER_KINDS, RULES, FitSettings
from bayesgate.attacks.specs import spec_needs
from bayesgate.errors import InvalidArgument, writable_dir
from bayesgate.models.device import (
    DEFAULT_DEVICE,
    DEVICE_CHOICES,
    add_threads_flag,
    pick_device,
    set_threads,
)


def register(sub: argparse._SubParsersAction) -> None:
    d = FitSettings()
    p = sub.add_parser(
        "fit-detector",
        help="fit the feature-density + uncertainty detector (fused) and store it by the model",
    )
    p.add_argument("model", type=Path, help="model directory (detector files are written there)")
    p.add_argument("--k", type=int, default=d.k, help="MC passes of the scores (card k_test)")
    p.add_argument("--k-attack", type=int, default=d.k_attack, help="MC passes attacked (k_attack)")
    p.add_argument(
        "--attacks",
        nargs="+",
        default=list(d.attacks),
        metavar="SPEC",
        help="attacks whose successful examples train the fusion (default: %(default)s)",
    )
    p.add_argument(
        "--train-subset",
        type=int,
        default=d.train_subset,
        help="first N training images (default all)",
    )
    p.add_argument("--fit-images", type=int, default=d.fit_images, help="validation: fit part")
    p.add_argument(
        "--threshold-images", type=int, default=d.threshold_images, help="validation: thresholds"
    )
    p.add_argument(
        "--attack-images", type=int, default=d.attack_images, help="fit images that are attacked"
    )
    p.add_argument("--kde-per-class", type=int, default=d.kde_per_class, help="KDE samples/class")
    p.add_argument(
        "--kde-dtype",
        choices=("float32", "float16"),
        default=d.kde_dtype,
        help="precision of the stored KDE samples",
    )
    p.add_argument(
        "--shrinkage",
        type=float,
        default=d.shrinkage,
        help="fixed covariance shrinkage (Ledoit–Wolf)",
    )
    p.add_argument(
        "--trunk-grid",
        action="store_true",
        help="also fit Gaussians of the conv maps pooled to 2×2 cells (trunk_2x2; CNNs): a third "
        "p-value of the min-p rule",
    )
    p.add_argument(
        "--outliers",
        nargs="+",
        default=list(d.outliers),
        metavar="KIND",
        help=f"synthetic outliers ({', '.join(OUTLIER_KINDS)}) made from the attacked fit images, "
        "added to the logistic fusion's positives (default: none)",
    )
    p.add_argument(
        "--outlier-share",
        type=float,
        default=d.outlier_share,
        help="share of the positive class's weight given to the outliers (default: %(default)s)",
    )
    p.add_argument("--l2", type=float, default=d.l2, help="L2 penalty of the logistic fusion")
    p.add_argument(
        "--rule",
        choices=RULES,
        default=d.rule,
        help="the fused score: minimum conformal p-value (attack-free) or the logistic logit",
    )
    p.add_argument("--target-fpr", type=float, default=d.target_fpr, help="clean FPR of thresholds")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of masks, splits, subsamples")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="images per attack batch")
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICE_CHOICES)}")
    add_threads_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_fit_detector, needs=_needs)


def _needs(args: argparse.Namespace) -> list[Any]:
    return spec_needs(args.attacks)


def cmd_fit_detector(args: argparse.Namespace) -> int:
    for name in ("k", "k_attack", "train_subset", "batch_size", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InvalidArgument(f"--{name.replace('_', '-')} must be ≥ 1, got {value}")
    settings = FitSettings(
        k=args.k,
        k_attack=args.k_attack,
        attacks=tuple(args.attacks),
        train_subset=args.train_subset,
        fit_images=args.fit_images,
        threshold_images=args.threshold_images,
        attack_images=args.attack_images,
        kde_per_class=args.kde_per_class,
        kde_dtype=args.kde_dtype,
        shrinkage=args.shrinkage,
        trunk_grid=args.trunk_grid,
        outliers=tuple(args.outliers),
        outlier_share=args.outlier_share,
        l2=args.l2,
        rule=args.rule,
        target_fpr=args.target_fpr,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    settings.check()  # before loading the model and extracting features
    writable_dir(args.model, "MODEL")  # the detector files go there, after the fit
    set_threads(args.threads)
    from bayesgate.attacks.detector_fit import fit_detector  # torch: after the checks
    from bayesgate.models.store.directory import load_model

    device = pick_device(args.device)
    loaded = load_model(args.model, device)
    detector = fit_detector(loaded, settings, device=device, progress=not args.no_progress)
    summary = store_detector(detector, args.model)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    if not summary["calibration_references_it"]:
        print(
            f"fit-detector: note: {args.model} has no calibration.json yet; serve, predict and "
            f"Gate.load need one: run `bayesgate calibrate {args.model}` (the flag then stays "
            "with this detector)",
            file=sys.stderr,
        )
    return 0


def detector_reference(directory: Path, weights_sha256: str) -> dict[str, str] | None:
    """``{"file", "sha256"}`` of the model's fitted detector when it belongs to these weights, so
    that re-running ``bayesgate calibrate`` keeps serving the fused score; ``None`` otherwise."""
    import hashlib

    from bayesgate.models.detection.store import DETECTOR_JSON, load_detector
    from bayesgate.models.store.directory import ModelStoreError

    try:
        load_detector(directory, weights_sha256=weights_sha256)
    except ModelStoreError:
        return None
    digest = hashlib.sha256((Path(directory) / DETECTOR_JSON).read_bytes()).hexdigest()
    return {"file": DETECTOR_JSON, "sha256": digest}


def store_detector(detector: Any, directory: Path) -> dict[str, Any]:
    """Save the detector, reference it from ``calibration.json`` if there is one; a summary."""
    from bayesgate.models.detection.detector import rule_summary
    from bayesgate.models.detection.store import DETECTOR_JSON, save_detector
    from bayesgate.models.store.calibration import read_calibration, write_calibration
    from bayesgate.models.store.directory import CALIBRATION_FILE

    sha = save_detector(detector, directory)
    linked = False
    if (Path(directory) / CALIBRATION_FILE).is_file():
        calibration = read_calibration(directory, weights_sha256=detector.model_sha256)
        calibration.detector = {"file": DETECTOR_JSON, "sha256": sha}
        write_calibration(calibration, directory)
        linked = True
    fit = detector.fit
    return {
        "detector": str(Path(directory) / DETECTOR_JSON),
        "calibration_references_it": linked,
        "score": detector.score,
        "threshold": detector.threshold,
        "shrinkage": fit.get("shrinkage"),
        "kde_bandwidth": detector.kde.bandwidth if detector.kde is not None else None,
        "fusion": None if detector.fusion is None else detector.fusion.to_json(),
        "rule": rule_summary(detector),
        "validation_auroc": fit.get("auroc"),
        "realised_fpr": fit.get("realised_fpr"),
        "seconds": fit.get("seconds"),
    }
