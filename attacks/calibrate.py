"""Threshold calibration on clean validation images and detection metrics on the test set.

1. Validation (``bayesgate.models.data.mnist.load_mnist("val")``, never the test set): MC
probabilities over
   ``k`` passes, every score of :data:`bayesgate.models.mc.uncertainty.SCORES`, and for each score
   the
   threshold :func:`bayesgate.attacks.metrics.threshold_at_fpr` at the target false-positive rate
   (flag = ``score > threshold``; the realised validation FPR is ``≤`` the target and reported).
2. Test: clean MC predictions and scores; for every attack, adversarial images through the
   ``k_attack``-pass log-predictive, then the detection metrics of the *successful*
   adversarial examples against *all* clean test images (:func:`attack_record`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bayesgate.attacks.metrics import detection_metrics, flag_rate, threshold_at_fpr
from bayesgate.attacks.run import AttackOutcome, mc_predictions, run_attack
from bayesgate.attacks.specs import DEFAULT_ATTACKS, AttackSpec, parse_attacks
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.calibration import Calibration
from bayesgate.models.store.directory import LoadedModel

SCORE_NAMES: tuple[str, ...] = tuple(SCORES)
SCORE_LABELS = {
    "predictive_entropy": "predictive entropy",
    "mutual_information": "mutual information",
    "variation_ratio": "variation ratio",
}


def scores_from_probs(probs: torch.Tensor) -> dict[str, np.ndarray]:
    """Every uncertainty score of ``B×K×C`` MC probabilities, as float64 arrays of length B."""
    return {name: fn(probs).double().cpu().numpy() for name, fn in SCORES.items()}


def fit_thresholds(
    val_scores: dict[str, np.ndarray], target_fpr: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Thresholds at ``target_fpr`` for every score, and the realised validation FPR of each."""
    if not 0.0 < target_fpr < 1.0:
        raise ValueError(f"target false-positive rate must be in (0, 1), got {target_fpr}")
    thresholds = {n: threshold_at_fpr(s, target_fpr) for n, s in val_scores.items()}
    realised = {n: flag_rate(val_scores[n], t) for n, t in thresholds.items()}
    return thresholds, realised


def attack_record(
    outcome: AttackOutcome,
    clean_scores: dict[str, np.ndarray],
    thresholds: dict[str, float] | None,
    score: str,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Calibration entry of one attack, and the scores of its successful examples.

    ``attack`` is the spec's canonical string (``fgs:eta=0.2``), unique per entry, ``method`` its
    name (``fgs``), ``label`` a human label. Per score: AUROC, TPR/FPR at the calibrated
    threshold (when given), TPR at 5 % FPR and FPR at 95 % TPR, all for successful adversarial
    vs all clean test images; the active ``score``'s metrics are repeated at top level.
    """
    adv_all = scores_from_probs(outcome.adv_probs)
    adv = {name: values[outcome.success.numpy()] for name, values in adv_all.items()}
    per_score = {
        name: detection_metrics(
            clean_scores[name], adv[name], None if thresholds is None else thresholds[name]
        )
        for name in clean_scores
    }
    record: dict[str, Any] = {**outcome.summary(), "score": score}
    for metric in ("auroc", "tpr_at_threshold", "fpr_at_threshold", "tpr_at_5fpr", "fpr_at_95tpr"):
        if metric in per_score[score]:
            record[metric] = per_score[score][metric]
    record["scores"] = per_score
    return _rounded(record), adv


@dataclass
class CalibrationRun:
    """A finished calibration plus the raw score arrays the report plots."""

    calibration: Calibration
    val_scores: dict[str, np.ndarray]
    clean_scores: dict[str, np.ndarray]
    adversarial_scores: list[tuple[AttackSpec, dict[str, np.ndarray]]] = field(default_factory=list)
    test_images: int = 0


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
) -> CalibrationRun:
    """Calibrate ``loaded`` (see the module docstring); nothing is written here.

    ``k`` = MC samples of the scores (default the card's ``inference["k_test"]``), which the
    service must use too; ``k_attack`` = samples in the attacked log-predictive (default the
    card's ``inference["k_attack"]``, 10 as in the paper).
    """
    from bayesgate.models.data.mnist import load_mnist

    if score not in SCORES:
        raise ValueError(f"unknown score {score!r}; choose one of {', '.join(SCORES)}")
    if not 0.0 < target_fpr < 1.0:
        raise ValueError(f"target false-positive rate must be in (0, 1), got {target_fpr}")
    specs = parse_attacks(list(attacks))
    card = loaded.card
    if not card.stochastic and score != "predictive_entropy":
        raise ValueError(
            f"{card.name} is deterministic: its K passes agree, so {score} is 0 for every input; "
            "calibrate it on predictive_entropy"
        )
    k = int(k if k is not None else card.inference.get("k_test", 100))
    k_attack = int(k_attack if k_attack is not None else card.inference.get("k_attack", 10))
    if k < 1 or k_attack < 1:
        raise ValueError(f"k and k_attack must be ≥ 1, got {k} and {k_attack}")
    val_size = int(card.training.get("val_size", 10_000))
    if val_size <= 0:
        raise ValueError(
            f"model {card.name} was trained without a validation split (val_size 0): there are "
            "no held-out images to calibrate on"
        )
    model = loaded.network
    _log(progress, f"validation: {val_limit or val_size} images, K={k}")
    x_val, y_val = load_mnist("val", val_size=val_size, limit=val_limit)
    val_probs, val_pred = mc_predictions(model, x_val, k, device=device, seed=seed)
    val_scores = scores_from_probs(val_probs)
    thresholds, realised = fit_thresholds(val_scores, target_fpr)
    validation = {
        "split": "val",
        "images": int(x_val.shape[0]),
        "val_size": val_size,
        "seed": seed,
        "accuracy": float((val_pred == y_val).double().mean()),
        "realised_fpr": realised,
        "mean_score": {n: float(s.mean()) for n, s in val_scores.items()},
        "k_attack": k_attack,
    }
    x_test, y_test = load_mnist("test", limit=test_limit)
    _log(progress, f"test: {x_test.shape[0]} images; attacks: {', '.join(s.key for s in specs)}")
    test_probs, test_pred = mc_predictions(model, x_test, k, device=device, seed=seed)
    clean_scores = scores_from_probs(test_probs)
    records, adversarial = [], []
    for spec in specs:
        outcome = run_attack(
            model,
            x_test,
            y_test,
            spec,
            k=k_attack,
            k_eval=k,
            clean_pred=test_pred,
            batch_size=batch_size,
            seed=seed,
            device=device,
            progress=progress,
        )
        record, adv_scores = attack_record(outcome, clean_scores, thresholds, score)
        records.append(record)
        adversarial.append((spec, adv_scores))
        _log(progress, _one_line(record))
    calibration = Calibration(
        model_sha256=card.weights_sha256,
        score=score,
        target_fpr=target_fpr,
        k=k,
        thresholds=thresholds,
        validation=_rounded(validation),
        attacks=records,
    )
    return CalibrationRun(calibration, val_scores, clean_scores, adversarial, int(x_test.shape[0]))


def _one_line(record: dict[str, Any]) -> str:
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


def _rounded(value: Any, digits: int = 6) -> Any:
    """Round floats for JSON; keep ``None``; NaN/inf become ``None`` (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v, digits) for v in value]
    if isinstance(value, (float, np.floating)):
        return round(float(value), digits) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
