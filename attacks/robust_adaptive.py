"""The adaptive-detector step of ``evaluate-robust``: issue 15's adaptive attack
(:mod:`bayesgate.attacks.adaptive_eval`) against the fused detector fitted beside a model.

Kept apart from the robust-accuracy attacks: it needs a fitted detector (``detector.json``, from
``bayesgate fit-detector``), which a training checkpoint does not have. Per ε the reported rate
is the **worst over plain PGD and every detector weight λ** of the fraction of eligible digits
(clean prediction right) that end misclassified and not flagged on a fresh MC draw; the clean
FPR is the fraction of eligible clean digits the detector flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bayesgate.attacks.robust_eval import RobustSettings

NO_DETECTOR = "not run: no fitted detector beside this model (`bayesgate fit-detector MODEL`)"


def adaptive_detector_step(
    path: Path,
    settings: RobustSettings,
    *,
    weights: Sequence[float],
    steps: int,
    cache_dir: Path,
    device: torch.device,
    progress: bool,
) -> dict[str, Any]:
    """``{"status": "ran", "by_eps": {ε: rate}, "clean_fpr": …, "detail": …}`` or the reason it
    did not run."""
    from bayesgate.attacks.adaptive_eval import AdaptiveSettings, evaluate_adaptive
    from bayesgate.models.detection.store import DETECTOR_JSON, load_detector
    from bayesgate.models.store.directory import load_model

    if not (path / DETECTOR_JSON).is_file():
        return {"status": NO_DETECTOR}
    loaded = load_model(path, device)
    detector = load_detector(path, loaded.card.weights_sha256)
    adaptive = AdaptiveSettings(
        eps=tuple(settings.eps),
        weights=tuple(weights),
        steps=steps,
        limit=settings.n,
        k_attack=settings.k_attack,
        seed=settings.seed,
        batch_size=settings.batch_size,
        cache_dir=cache_dir,
    )
    result = evaluate_adaptive(loaded, detector, adaptive, device=device, progress=progress)
    by_eps: dict[str, float] = {}
    for row in result["rows"]:
        key = f"{row['eps']:g}"
        by_eps[key] = max(by_eps.get(key, 0.0), float(row["evaded_rate"]))
    return {
        "status": "ran",
        "by_eps": by_eps,
        "clean_fpr": float(result["clean_flagged"]),
        "detail": result,
    }
