"""The served model: network + card from the store, its calibration, and what clients see of it.

:class:`ServedModel` is the one type the service serves; the inference worker owns the current one
(:attr:`bayesgate.service.worker.BatchWorker.model`), and an admin change replaces it there.
Start-up and reloads go through :func:`load_served_model`; every problem (missing or tampered
weights, broken card, missing or mismatched ``calibration.json``) becomes one
:class:`StartupError` whose message names the file and the problem.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bayesgate.models.device import pick_device
from bayesgate.models.store.calibration import Calibration, read_calibration
from bayesgate.models.store.directory import ModelCard, ModelStoreError, load_model
from bayesgate.service.errors import StartupError


@dataclass(frozen=True)
class DecisionOverride:
    """The admin's ``score > threshold`` decision in place of ``calibration.json``'s."""

    score: str
    threshold: float
    set_at: str  # ISO 8601, UTC


@dataclass(frozen=True, slots=True)
class ModelRef:
    """Which weights and calibration answered: what a response names as its model."""

    name: str
    weights_sha256: str
    calibration_mc_samples: int  # K the threshold was calibrated with


@dataclass(frozen=True)
class ServedModel:
    """What the worker runs and the routes describe (replaced whole, never changed in place)."""

    network: nn.Module
    card: ModelCard
    calibration: Calibration
    device: torch.device
    directory: Path
    override: DecisionOverride | None = None

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def sha256(self) -> str:
        return self.card.weights_sha256

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.card.name, self.card.weights_sha256, self.calibration.k)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input image from the card's input spec, e.g. ``(1, 28, 28)``."""
        return tuple(int(d) for d in self.card.input.get("shape", (1, 28, 28)))

    @property
    def input_range(self) -> tuple[float, float]:
        lo, hi = self.card.input.get("range", (0.0, 1.0))
        return float(lo), float(hi)

    def summary(self) -> dict[str, Any]:
        """The card and calibration summary a client needs to trust the adversarial flag."""
        cal = self.calibration
        return {
            "name": self.card.name,
            "weights_sha256": self.card.weights_sha256,
            "device": str(self.device),
            "card": asdict(self.card),
            "calibration": {
                "score": cal.score,
                "threshold": cal.threshold,
                "target_fpr": cal.target_fpr,
                "mc_samples": cal.k,
                "thresholds": dict(cal.thresholds),
                "validation": cal.validation,
                "auroc": attack_aurocs(cal.attacks),
                "attacks": cal.attacks,
                "created": cal.created,
                "override": None if self.override is None else asdict(self.override),
            },
        }


def attack_aurocs(attacks: list[dict[str, Any]]) -> dict[str, float]:
    """``{attack: AUROC}`` from the ``attacks`` entries of ``calibration.json``, as
    ``bayesgate calibrate`` writes them: ``attack`` is the spec with its parameters
    (``fgs:eta=0.2``), ``auroc`` the active score's AUROC. Entries without both (an attack with no
    successful example has ``auroc: null``) are skipped; they stay visible in the full list.
    """
    out: dict[str, float] = {}
    for entry in attacks:
        if not isinstance(entry, dict):
            continue
        name, auroc = entry.get("attack"), entry.get("auroc")
        if isinstance(name, str) and isinstance(auroc, int | float) and math.isfinite(auroc):
            out[name] = float(auroc)
    return out


def load_served_model(directory: Path | str, device: str = "auto") -> ServedModel:
    """Load weights (sha256-verified) and ``calibration.json`` (tied to those weights)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise StartupError(f"{directory}: model directory not found (set BAYESGATE_MODEL_DIR)")
    try:
        dev = pick_device(device)
    except (ValueError, RuntimeError) as exc:
        raise StartupError(f"device: {exc}") from exc
    try:
        loaded = load_model(directory, dev)
        calibration = read_calibration(directory, weights_sha256=loaded.card.weights_sha256)
    except ModelStoreError as exc:
        raise StartupError(str(exc)) from exc
    shape = loaded.card.input.get("shape")
    if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape)):
        raise StartupError(f"{directory / 'card.json'}: input.shape must be a list of sizes")
    return ServedModel(
        network=loaded.network,
        card=loaded.card,
        calibration=calibration,
        device=dev,
        directory=directory,
    )
