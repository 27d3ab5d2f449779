"""One clean → attack → record pipeline, shared by ``calibrate`` and the detection sweep.

1. **clean**: MC probabilities of the clean images over ``k_eval`` passes (masks seeded ``seed``),
   their prediction ``argmax p̄`` and every per-example score (:data:`ExampleScores`);
2. **attack**: for every attack, :func:`bayesgate.attacks.run.run_attack` through the
   ``k_attack``-pass log-predictive, pushing away from the clean prediction;
3. **record**: the scores of the adversarial images, and the detection metrics of the
   *successful* ones against *all* clean images (:func:`attack_record`).

The per-example scores are the uncertainty scores of :data:`bayesgate.models.mc.uncertainty.SCORES`
by default; a caller can pass any ``score_fn`` that maps images and their MC probabilities to
named score arrays (for example scores computed from the network's features), and every later
step handles its scores alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bayesgate.attacks.methods import Attack
from bayesgate.attacks.metrics import detection_metrics
from bayesgate.attacks.run import AttackOutcome, StepHook, mc_predictions, run_attack
from bayesgate.errors import check_at_least
from bayesgate.models.mc.uncertainty import SCORES

ExampleScores = Callable[[torch.Tensor, torch.Tensor], dict[str, np.ndarray]]
"""``score_fn(x, probs)``: images ``x`` (N×…, CPU) and their MC probabilities ``probs`` (N×K×C)
↦ ``{score name: float64 array of length N}``; higher = more suspicious."""

HEADLINE_METRICS = ("auroc", "tpr_at_threshold", "fpr_at_threshold", "tpr_at_5fpr", "fpr_at_95tpr")
"""The active score's metrics that an attack record repeats at its top level."""


def scores_from_probs(probs: torch.Tensor) -> dict[str, np.ndarray]:
    """Every uncertainty score of ``B×K×C`` MC probabilities, as float64 arrays of length B."""
    return {name: fn(probs).double().cpu().numpy() for name, fn in SCORES.items()}


def uncertainty_scores(x: torch.Tensor, probs: torch.Tensor) -> dict[str, np.ndarray]:
    """The default :data:`ExampleScores`: :func:`scores_from_probs` (the images are unused)."""
    return scores_from_probs(probs)


def attack_record(
    outcome: AttackOutcome,
    clean_scores: dict[str, np.ndarray],
    thresholds: dict[str, float] | None,
    score: str,
    score_fn: ExampleScores = uncertainty_scores,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Calibration entry of one attack, and the scores of its successful examples.

    ``attack`` is the canonical spec (``fgs:eta=0.2``), unique per entry, ``method`` its name
    (``fgs``), ``label`` a human label. Per score of ``clean_scores``: AUROC, TPR/FPR at the
    calibrated threshold (when given), TPR at 5 % FPR and FPR at 95 % TPR, all for successful
    adversarial vs all clean images; the active ``score``'s metrics are repeated at top level.
    """
    adv_all = score_fn(outcome.x_adv, outcome.adv_probs)
    adv = {name: adv_all[name][outcome.success.numpy()] for name in clean_scores}
    per_score = {
        name: detection_metrics(
            clean_scores[name], adv[name], None if thresholds is None else thresholds[name]
        )
        for name in clean_scores
    }
    record: dict[str, Any] = {**outcome.summary(), "score": score}
    record.update({m: per_score[score][m] for m in HEADLINE_METRICS if m in per_score[score]})
    record["scores"] = per_score
    return rounded(record), adv


@dataclass
class CleanRun:
    """Step 1 of the pipeline: the clean images' MC probabilities, prediction and scores."""

    probs: torch.Tensor
    pred: torch.Tensor
    scores: dict[str, np.ndarray]

    @property
    def images(self) -> int:
        return int(self.pred.shape[0])


@dataclass
class AttackResult:
    """Steps 2–3 for one attack: the outcome, its record and its successful examples' scores."""

    attack: Attack
    outcome: AttackOutcome
    record: dict[str, Any]
    scores: dict[str, np.ndarray]


@dataclass
class DetectionRun:
    """The whole pipeline on one model and one image set."""

    clean: CleanRun
    results: list[AttackResult]

    @property
    def adversarial_scores(self) -> list[tuple[Attack, dict[str, np.ndarray]]]:
        """``(attack, scores of its successful examples)`` pairs, the form the plots take."""
        return [(r.attack, r.scores) for r in self.results]


def clean_run(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    *,
    score_fn: ExampleScores = uncertainty_scores,
    seed: int = 0,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> CleanRun:
    """Step 1: MC probabilities over ``k`` passes (masks seeded ``seed``) and every score
    (``progress``: a bar over the batches)."""
    probs, pred = mc_predictions(model, x, k, device=device, seed=seed, progress=progress)
    return CleanRun(probs, pred, score_fn(x, probs))


def attack_and_record(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    attack: Attack,
    clean: CleanRun,
    *,
    k_attack: int,
    k_eval: int,
    thresholds: dict[str, float] | None = None,
    score: str = "predictive_entropy",
    score_fn: ExampleScores = uncertainty_scores,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 100,
    device: torch.device | str = "cpu",
    progress: bool = False,
    step_hook: StepHook | None = None,
) -> AttackResult:
    """Steps 2–3 for one attack, on the first ``limit`` images (all if ``None``); the negatives
    of the record are always *all* clean images."""
    n = x.shape[0] if limit is None else min(limit, x.shape[0])
    outcome = run_attack(
        model,
        x[:n],
        y[:n],
        attack,
        k=k_attack,
        k_eval=k_eval,
        clean_pred=clean.pred[:n],
        batch_size=batch_size,
        seed=seed,
        device=device,
        progress=progress,
        step_hook=step_hook,
    )
    record, adv = attack_record(outcome, clean.scores, thresholds, score, score_fn)
    return AttackResult(attack, outcome, record, adv)


def detection_run(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    attacks: Sequence[Attack],
    *,
    k_attack: int,
    k_eval: int,
    thresholds: dict[str, float] | None = None,
    score: str = "predictive_entropy",
    score_fn: ExampleScores = uncertainty_scores,
    slow_limit: int | None = None,
    seed: int = 0,
    batch_size: int = 100,
    device: torch.device | str = "cpu",
    progress: bool = False,
    log: Callable[[AttackResult], str] | None = None,
) -> DetectionRun:
    """The whole pipeline: clean run, then every attack and its record (module docstring).

    ``slow_limit``: attacks whose class is marked ``slow`` (CW) attack only the first
    ``slow_limit`` images. ``log(result)`` gives a progress line printed after each attack
    (when ``progress``).
    """
    check_at_least("slow_limit", slow_limit)  # 0 or −1 would silently mean another limit
    clean = clean_run(model, x, k_eval, score_fn=score_fn, seed=seed, device=device)
    results = []
    for attack in attacks:
        result = attack_and_record(
            model,
            x,
            y,
            attack,
            clean,
            k_attack=k_attack,
            k_eval=k_eval,
            thresholds=thresholds,
            score=score,
            score_fn=score_fn,
            limit=slow_limit if attack.slow else None,
            seed=seed,
            batch_size=batch_size,
            device=device,
            progress=progress,
        )
        results.append(result)
        if progress and log is not None:
            print(log(result), file=sys.stderr, flush=True)
    return DetectionRun(clean, results)


def rounded(value: Any, digits: int = 6) -> Any:
    """Round floats for JSON; keep ``None``; NaN/inf become ``None`` (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    if isinstance(value, (float, np.floating)):
        return round(float(value), digits) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
