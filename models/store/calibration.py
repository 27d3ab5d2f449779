"""``calibration.json``: the rejection thresholds of a model, written by ``bayesgate calibrate``.

An input is flagged adversarial when its uncertainty score exceeds the threshold; the threshold is
the ``(1 − target_fpr)`` quantile of the score on clean validation images, so about
``target_fpr`` of clean inputs are flagged. The file is tied to one set of weights by their sha256.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.directory import (
    CALIBRATION_FILE,
    ModelStoreError,
    _atomic_write,
    read_json_object,
)

CALIBRATION_FORMAT = "bayesgate-calibration/1"


@dataclass
class Calibration:
    """Thresholds for every score, the active score, and the detection metrics per attack."""

    model_sha256: str
    score: str
    target_fpr: float
    k: int
    thresholds: dict[str, float]
    validation: dict[str, Any] = field(default_factory=dict)
    attacks: list[dict[str, Any]] = field(default_factory=list)
    # {"file": "detector.json", "sha256": …}: the fused detector (bayesgate fit-detector) that,
    # when present, gives the served score, threshold and flag instead of ``score``
    detector: dict[str, Any] | None = None
    created: str = ""
    format: str = CALIBRATION_FORMAT

    @property
    def threshold(self) -> float:
        """Threshold of the active score."""
        return self.thresholds[self.score]

    def __post_init__(self) -> None:
        if not isinstance(self.thresholds, dict):
            raise ValueError(
                f"thresholds must be a mapping score -> float, got {type(self.thresholds).__name__}"
            )
        if self.score not in SCORES:
            raise ValueError(f"unknown score {self.score!r}; choose one of {', '.join(SCORES)}")
        if self.score not in self.thresholds:
            raise ValueError(f"no threshold for the active score {self.score!r}")
        bad = [n for n, t in self.thresholds.items() if n not in SCORES or not math.isfinite(t)]
        if bad:
            raise ValueError(f"invalid threshold entries: {', '.join(bad)}")
        if not 0.0 < self.target_fpr < 1.0:
            raise ValueError(f"target_fpr must be in (0, 1), got {self.target_fpr}")
        if self.k < 1:
            raise ValueError(f"k must be ≥ 1, got {self.k}")
        if self.detector is not None and not (
            isinstance(self.detector, dict)
            and isinstance(self.detector.get("file"), str)
            and isinstance(self.detector.get("sha256"), str)
        ):
            raise ValueError('detector must be {"file": …, "sha256": …}')

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def write_calibration(calibration: Calibration, directory: Path | str) -> Path:
    """Write ``calibration.json`` into a model directory (atomically)."""
    calibration.created = calibration.created or dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"
    )
    path = Path(directory) / CALIBRATION_FILE
    _atomic_write(path, calibration.to_json().encode())
    return path


def read_calibration(directory: Path | str, weights_sha256: str | None = None) -> Calibration:
    """Read and validate ``calibration.json``; with ``weights_sha256``, check it belongs to them."""
    path = Path(directory) / CALIBRATION_FILE
    data = read_json_object(
        path,
        "calibration not found (run `bayesgate calibrate MODEL`)",
        f"a {CALIBRATION_FORMAT} file",
    )
    if data.get("format") != CALIBRATION_FORMAT:
        raise ModelStoreError(f"{path}: not a {CALIBRATION_FORMAT} file")
    known = set(Calibration.__dataclass_fields__)
    try:
        calibration = Calibration(**{k: v for k, v in data.items() if k in known})
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelStoreError(f"{path}: {exc}") from exc
    if weights_sha256 is not None and calibration.model_sha256 != weights_sha256:
        raise ModelStoreError(
            f"{path}: calibrated for weights {calibration.model_sha256[:16]}…, "
            f"but the model's weights are {weights_sha256[:16]}… (re-run `bayesgate calibrate`)"
        )
    return calibration
