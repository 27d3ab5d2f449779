"""The served model: network + card from the store, its calibration, and what clients see of it.

Start-up goes through :func:`load_serving_model`; every problem (missing or tampered weights,
broken card, missing or mismatched ``calibration.json``) becomes one :class:`StartupError` whose
message names the file and the problem.
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

# Keys an attack entry of calibration.json may use for its name and its AUROC.
_ATTACK_NAME_KEYS = ("attack", "name", "id")
_AUROC_KEYS = ("auroc", "roc_auc", "AUROC")


@dataclass
class ServingModel:
    """What the worker runs and the routes describe."""

    network: nn.Module
    card: ModelCard
    calibration: Calibration
    device: torch.device
    directory: Path
    # The admin's score/threshold replacing calibration.json's: {"score", "threshold", "set_at"}.
    override: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def sha256(self) -> str:
        return self.card.weights_sha256

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
                "override": self.override,
            },
        }


def attack_aurocs(attacks: list[dict[str, Any]]) -> dict[str, float]:
    """``{attack name: AUROC}`` from the ``attacks`` entries of ``calibration.json``.

    Entries without a name are numbered (``attack-<i>``); top-level ``eps``/``epsilon``/``eta``/
    ``steps`` not already spelled in the name are appended; entries without an AUROC are skipped
    (they stay visible in the full ``attacks`` list).
    """
    out: dict[str, float] = {}
    for i, entry in enumerate(attacks):
        if not isinstance(entry, dict):
            continue
        auroc = next((entry[k] for k in _AUROC_KEYS if k in entry), None)
        if not isinstance(auroc, int | float) or not math.isfinite(auroc):
            continue
        name = next((str(entry[k]) for k in _ATTACK_NAME_KEYS if k in entry), f"attack-{i}")
        extras = [
            f"{k}={entry[k]}"
            for k in ("eps", "epsilon", "eta", "steps")
            if k in entry and f"{k}=" not in name
        ]
        out[" ".join([name, *extras])] = float(auroc)
    return out


def load_serving_model(directory: Path | str, device: str = "auto") -> ServingModel:
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
    return ServingModel(
        network=loaded.network,
        card=loaded.card,
        calibration=calibration,
        device=dev,
        directory=directory,
    )
