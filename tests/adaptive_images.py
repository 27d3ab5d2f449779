"""One small ``adaptive-eval`` run whose cached images the bench scripts' tests read: the SLIDE
attacks (λ = 0 and 1, 15 steps, ε₁ = 10) on the first digits of the bundled CNN, which lets
many through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bayesgate.attacks.adaptive_eval import evaluate_adaptive
from bayesgate.attacks.adaptive_settings import AdaptiveSettings
from bayesgate.models.detection.store import load_detector
from bayesgate.models.store.bundled import resolve_model_dir
from bayesgate.models.store.directory import load_model


@dataclass(frozen=True)
class AdaptiveImages:
    """The model directory, its network and detector, ``adaptive-eval``'s rows (plain, then
    λ = 1) and the two cache files."""

    model: Path
    loaded: Any
    detector: Any
    plain_row: dict[str, Any]
    adaptive_row: dict[str, Any]
    plain: Path
    adaptive: Path


def slide_on_the_cnn(cache: Path, limit: int) -> AdaptiveImages:
    """Run (or read from ``cache``) the attacks of the module docstring on ``limit`` digits."""
    model = resolve_model_dir(Path("bayesgate-cnn"))
    loaded = load_model(model)
    detector = load_detector(model, loaded.card.weights_sha256)
    settings = AdaptiveSettings(
        eps=(10.0,), weights=(1.0,), steps=15, limit=limit, optimizer="slide", cache_dir=cache
    )
    plain_row, adaptive_row = evaluate_adaptive(loaded, detector, settings)["rows"]
    (adaptive,) = [p for p in cache.rglob("*.npz") if "-w1-" in p.name]
    (plain,) = [p for p in cache.rglob("*.npz") if "-w0-" in p.name]
    return AdaptiveImages(model, loaded, detector, plain_row, adaptive_row, plain, adaptive)
