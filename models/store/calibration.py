"""``calibration.json``: the rejection thresholds of a model, written by ``bayesgate calibrate``.

An input is flagged adversarial when its uncertainty score exceeds the threshold; the threshold is
the ``(1 − target_fpr)`` quantile of the score on clean validation images, so about
``target_fpr`` of clean inputs are flagged. The file is tied to one set of weights by their sha256.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.checks import brief, is_int, is_real
from bayesgate.models.store.directory import (
    CALIBRATION_FILE,
    ModelStoreError,
    _atomic_write,
    read_json_object,
)

CALIBRATION_FORMAT = "bayesgate-calibration/1"
REQUIRED_FIELDS = ("model_sha256", "score", "target_fpr", "k", "thresholds")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# K, the MC samples the thresholds were set with: a forward pass per sample over the whole
# validation split, so far below this; the bound keeps K a number every JSON client reads exactly.
MAX_K = 1_000_000


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
        """Check every field's type and range (a ``ValueError`` naming the field), and store the
        numbers as plain ``int``/``float``: a file's ``"k": 2.5`` or ``"k": true`` is refused
        here, not by the first prediction that uses the calibration's K."""
        if not (isinstance(self.model_sha256, str) and SHA256_HEX.fullmatch(self.model_sha256)):
            raise ValueError(
                "model_sha256 must be a sha256 (64 lowercase hex digits), "
                f"got {brief(self.model_sha256)}"
            )
        if not isinstance(self.thresholds, dict):
            raise ValueError(
                f"thresholds must be a mapping score -> float, got {type(self.thresholds).__name__}"
            )
        if not isinstance(self.score, str) or self.score not in SCORES:
            raise ValueError(
                f"unknown score {_key(self.score)!r}; choose one of {', '.join(SCORES)}"
            )
        if self.score not in self.thresholds:
            raise ValueError(f"no threshold for the active score {self.score!r}")
        bad = [_key(n) for n, t in self.thresholds.items() if n not in SCORES or not is_real(t)]
        if bad:
            raise ValueError(
                f"invalid threshold entries: {', '.join(bad)} (each a score name and a finite "
                "number)"
            )
        self.thresholds = {n: float(t) for n, t in self.thresholds.items()}
        if not (is_real(self.target_fpr) and 0.0 < self.target_fpr < 1.0):
            raise ValueError(f"target_fpr must be in (0, 1), got {brief(self.target_fpr)}")
        self.target_fpr = float(self.target_fpr)
        if not (is_int(self.k) and 1 <= self.k <= MAX_K):
            raise ValueError(
                f"k must be a positive integer (at most {MAX_K:,}), got {brief(self.k)}"
            )
        self.k = int(self.k)
        if not isinstance(self.validation, dict):
            raise ValueError(f"validation must be a JSON object, got {brief(self.validation)}")
        if not (isinstance(self.attacks, list) and all(isinstance(a, dict) for a in self.attacks)):
            raise ValueError(f"attacks must be a list of JSON objects, got {brief(self.attacks)}")
        if self.detector is not None and not (
            isinstance(self.detector, dict)
            and isinstance(self.detector.get("file"), str)
            and isinstance(self.detector.get("sha256"), str)
            and SHA256_HEX.fullmatch(self.detector["sha256"])
        ):
            raise ValueError(
                'detector must be {"file": …, "sha256": …} (a file name and a sha256 of 64 '
                f"lowercase hex digits) or null, got {brief(self.detector)}"
            )
        for name in ("created", "format"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {brief(getattr(self, name))}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def write_calibration(calibration: Calibration, directory: Path | str) -> Path:
    """Write ``calibration.json`` into a model directory (atomically)."""
    calibration.created = calibration.created or dt.datetime.now(dt.UTC).isoformat(
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
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        raise ModelStoreError(f"{path}: lacks required field(s) {', '.join(missing)}")
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


def _key(name: Any) -> str:
    """A JSON key or name as a message shows it: as is when a short printable string, else as
    (cut) JSON."""
    if isinstance(name, str) and name.isprintable() and len(name) <= 60:
        return name
    return brief(name)
