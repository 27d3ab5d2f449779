"""Threshold calibration on clean validation images and detection metrics on the test set.

1. Validation (``bayesgate.models.data.mnist.load_mnist("val")``, never the test set): MC
   probabilities over ``k`` passes (with ``progress``, a progress bar ``MC K=…``), every score of
   :data:`bayesgate.models.mc.uncertainty.SCORES`, and for each score the threshold
   :func:`bayesgate.attacks.metrics.threshold_at_fpr` at the target false-positive rate (flag =
   ``score > threshold``; the realised validation FPR is ``≤`` the target and reported).
2. Test: the clean → attack → record pipeline of :mod:`bayesgate.attacks.pipeline` — clean MC
   predictions and scores; for every attack, adversarial images through the ``k_attack``-pass
   log-predictive, then the detection metrics of the *successful* adversarial examples against
   *all* clean test images at the validation thresholds.

When the model directory holds a fused detector (``bayesgate fit-detector``), one line on stderr
says what the new ``calibration.json`` will change: nothing of the flag when the detector belongs
to these weights (``bayesgate calibrate`` links it again, and the detector decides the flag), or
that a detector fitted for other weights is not linked (:func:`detector_note`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesgate.attacks.methods import Attack
from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.attacks.pipeline import (
    AttackResult,
    ExampleScores,
    clean_run,
    detection_run,
    rounded,
    uncertainty_scores,
)
from bayesgate.attacks.specs import DEFAULT_ATTACKS, parse_attacks
from bayesgate.errors import InvalidArgument
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.calibration import Calibration
from bayesgate.models.store.directory import LoadedModel, ModelCard
from bayesgate.models.store.own_files import no_validation_split

SCORE_NAMES: tuple[str, ...] = tuple(SCORES)
SCORE_LABELS = {
    "predictive_entropy": "predictive entropy",
    "mutual_information": "mutual information",
    "variation_ratio": "variation ratio",
}


def fit_thresholds(
    val_scores: dict[str, np.ndarray], target_fpr: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Thresholds at ``target_fpr`` for every score, and the realised validation FPR of each."""
    _check_target_fpr(target_fpr)
    thresholds = {n: threshold_at_fpr(s, target_fpr) for n, s in val_scores.items()}
    realised = {n: flag_rate(val_scores[n], t) for n, t in thresholds.items()}
    return thresholds, realised


@dataclass
class CalibrationRun:
    """A finished calibration plus the raw score arrays the report plots."""

    calibration: Calibration
    val_scores: dict[str, np.ndarray]
    clean_scores: dict[str, np.ndarray]
    adversarial_scores: list[tuple[Attack, dict[str, np.ndarray]]] = field(default_factory=list)
    test_images: int = 0


@dataclass(frozen=True)
class _Settings:
    """``calibrate``'s arguments, checked, with the card's defaults filled in."""

    score: str
    target_fpr: float
    k: int
    k_attack: int
    val_size: int
    attacks: list[Attack]


def calibrate(
    loaded: LoadedModel,
    *,
    score: str = "predictive_entropy",
    target_fpr: float = 0.05,
    k: int | None = None,
    k_attack: int | None = None,
    attacks: list[str] | tuple[str, ...] = DEFAULT_ATTACKS,
    val_limit: int | None = None,
    test_limit: int | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    batch_size: int = 100,
    progress: bool = False,
    score_fn: ExampleScores = uncertainty_scores,
) -> CalibrationRun:
    """Calibrate ``loaded`` (see the module docstring); nothing is written here.

    ``k`` = MC samples of the scores (default the card's ``inference.k_test``), which the
    service must use too; ``k_attack`` = samples in the attacked log-predictive (default the
    card's ``inference.k_attack``, 10 as in the paper). ``score_fn``: the per-example scores.
    """
    from bayesgate.models.data.mnist import load_mnist

    settings = _settings(loaded.card, score, target_fpr, k, k_attack, attacks)
    note = detector_note(loaded.directory, loaded.card.weights_sha256, score, target_fpr)
    if note is not None:
        print(note, file=sys.stderr)
    _log(progress, f"validation: {val_limit or settings.val_size} images, K={settings.k}")
    x_val, y_val = load_mnist("val", val_size=settings.val_size, limit=val_limit)
    val = clean_run(
        loaded.network,
        x_val,
        settings.k,
        score_fn=score_fn,
        seed=seed,
        device=device,
        progress=progress,
    )
    thresholds, realised = fit_thresholds(val.scores, target_fpr)
    x_test, y_test = load_mnist("test", limit=test_limit)
    keys = ", ".join(a.key for a in settings.attacks)
    _log(progress, f"test: {x_test.shape[0]} images; attacks: {keys}")
    test = detection_run(
        loaded.network,
        x_test,
        y_test,
        settings.attacks,
        k_attack=settings.k_attack,
        k_eval=settings.k,
        thresholds=thresholds,
        score=score,
        score_fn=score_fn,
        seed=seed,
        batch_size=batch_size,
        device=device,
        progress=progress,
        log=_one_line,
    )
    calibration = Calibration(
        model_sha256=loaded.card.weights_sha256,
        score=score,
        target_fpr=target_fpr,
        k=settings.k,
        thresholds=thresholds,
        validation=_validation_summary(settings, val.scores, val.pred, y_val, realised, seed),
        attacks=[r.record for r in test.results],
    )
    return CalibrationRun(
        calibration, val.scores, test.clean.scores, test.adversarial_scores, test.clean.images
    )


def detector_note(
    directory: Path | str | None, weights_sha256: str, score: str, target_fpr: float
) -> str | None:
    """One line about the fused detector in ``directory``, ``None`` when there is none.

    ``bayesgate calibrate`` links a ``detector.json`` fitted for these weights from the new
    ``calibration.json`` (``detector_reference``), and the service then flags by the detector's
    score and threshold: the line says the new threshold is kept for ``score`` but the flag stays
    with the detector, whose FPR ``bayesgate fit-detector --target-fpr`` changes. A
    ``detector.json`` fitted for other weights is not linked: the line says so."""
    from bayesgate.models.detection.store import DETECTOR_JSON, load_detector
    from bayesgate.models.store.directory import ModelStoreError

    if directory is None or not (Path(directory) / DETECTOR_JSON).is_file():
        return None
    path = Path(directory) / DETECTOR_JSON
    try:
        detector = load_detector(directory, weights_sha256=weights_sha256)
    except ModelStoreError as exc:
        if _fitted_for(path) not in (None, weights_sha256):
            return (
                f"calibrate: note: {path} was fitted for other weights, so the new "
                f"calibration.json does not link it and {score} alone flags inputs; re-run "
                f"`bayesgate fit-detector {directory}` to flag by the fused detector"
            )
        return f"calibrate: note: {path} is not linked from the new calibration.json: {exc}"
    return (
        f"calibrate: note: {directory}'s flag stays with the fused detector ({DETECTOR_JSON}: "
        f"{detector.score} > {detector.threshold:.4g}, target FPR {detector.target_fpr:g}, "
        f"K {detector.k}); the new calibration.json keeps {score}'s threshold at target FPR "
        f"{target_fpr:g} for that score only. To change the flag's FPR run `bayesgate "
        f"fit-detector {directory} --target-fpr …`"
    )


def _fitted_for(path: Path) -> str | None:
    """``model_sha256`` of a ``detector.json``, ``None`` when it cannot be read."""
    import json

    try:
        sha = json.loads(path.read_text()).get("model_sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return sha if isinstance(sha, str) else None


def _settings(
    card: ModelCard,
    score: str,
    target_fpr: float,
    k: int | None,
    k_attack: int | None,
    attacks: list[str] | tuple[str, ...],
) -> _Settings:
    """Check the arguments against each other and the card; fill in the card's K and split."""
    if score not in SCORES:
        raise InvalidArgument(f"unknown score {score!r}; choose one of {', '.join(SCORES)}")
    _check_target_fpr(target_fpr)
    parsed = parse_attacks(list(attacks))
    if not card.stochastic and score != "predictive_entropy":
        raise InvalidArgument(
            f"{card.name} is deterministic: its K passes agree, so {score} is 0 for every input; "
            "calibrate it on predictive_entropy"
        )
    k = int(k if k is not None else card.inference.k_test)
    k_attack = int(k_attack if k_attack is not None else card.inference.k_attack)
    if k < 1 or k_attack < 1:
        raise InvalidArgument(f"k and k_attack must be ≥ 1, got {k} and {k_attack}")
    val_size = card.training.val_size
    if val_size <= 0:
        raise InvalidArgument(no_validation_split(card.name))
    return _Settings(score, target_fpr, k, k_attack, val_size, parsed)


def _check_target_fpr(target_fpr: float) -> None:
    if not 0.0 < target_fpr < 1.0:
        raise InvalidArgument(f"target false-positive rate must be in (0, 1), got {target_fpr}")


def _validation_summary(
    settings: _Settings,
    val_scores: dict[str, np.ndarray],
    val_pred: torch.Tensor,
    y_val: torch.Tensor,
    realised: dict[str, float],
    seed: int,
) -> dict[str, Any]:
    """The ``validation`` section of ``calibration.json``."""
    return rounded(
        {
            "split": "val",
            "images": int(y_val.shape[0]),
            "val_size": settings.val_size,
            "seed": seed,
            "accuracy": float((val_pred == y_val).double().mean()),
            "realised_fpr": realised,
            "mean_score": {n: float(s.mean()) for n, s in val_scores.items()},
            "k_attack": settings.k_attack,
        }
    )


def _one_line(result: AttackResult) -> str:
    record = result.record

    def fmt(v: Any) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    return (
        f"{record['label']}: success {fmt(record['success_rate'])} "
        f"({record['successful']}/{record['eligible']}), AUROC {fmt(record.get('auroc'))}, "
        f"TPR@thr {fmt(record.get('tpr_at_threshold'))}"
    )


def _log(enabled: bool, message: str) -> None:
    if enabled:
        print(message, file=sys.stderr)
