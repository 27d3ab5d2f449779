"""A detector beside its model: ``detector.safetensors`` (statistics), ``detector.json`` (the rest).

``detector.safetensors`` holds the tensors — per layer ``mahalanobis.<layer>.means`` (``C×D``) and
``mahalanobis.<layer>.precision`` (``D×D``), ``kde.samples`` (``N×D``) and ``kde.offsets``
(``C+1``), per quadratic (per-class) Gaussian ``quadratic.<name>.means`` (``C×D``) and
``quadratic.<name>.precisions`` (``C×D×D``) — in the canonical form of
:func:`bayesgate.models.store.directory.canonical_safetensors`.
``detector.json`` holds everything else: the format, the model's weights sha256, K, the target
FPR, shrinkage per layer, the KDE bandwidth and layer, the fusion's names, transforms,
standardisation and coefficients, the min-p-value rule's names and sorted clean reference scores
(``conformal``, optional), the thresholds of every score, the fit report, and the sha256 of
the safetensors file (checked on load). JSON floats are written with ``repr`` precision, so a
save/load round trip is bit-exact; nothing is ever pickled.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from bayesgate.models.detection.conformal import ConformalFusion
from bayesgate.models.detection.detector import Detector
from bayesgate.models.detection.fusion import LogisticFusion
from bayesgate.models.detection.kde import ClassKDE
from bayesgate.models.detection.mahalanobis import ClassGaussians
from bayesgate.models.detection.quadratic import ClassQuadratic
from bayesgate.models.store.calibration import MAX_K
from bayesgate.models.store.checks import brief, first_line, is_int, is_real
from bayesgate.models.store.directory import (
    ModelStoreError,
    _atomic_write,
    canonical_safetensors,
    read_json_object,
)
from bayesgate.models.store.files import DETECTOR_JSON, DETECTOR_TENSORS

DETECTOR_FORMAT = "bayesgate-detector/1"


def save_detector(detector: Detector, directory: Path | str) -> str:
    """Write both files into ``directory`` (atomically); returns the sha256 of ``detector.json``."""
    directory = Path(directory)
    blob = canonical_safetensors(
        save_safetensors(_tensors(detector), metadata={"format": DETECTOR_FORMAT})
    )
    meta = _metadata(detector, hashlib.sha256(blob).hexdigest())
    text = (json.dumps(meta, indent=2) + "\n").encode()
    _atomic_write(directory / DETECTOR_TENSORS, blob)
    _atomic_write(directory / DETECTOR_JSON, text)
    return hashlib.sha256(text).hexdigest()


def load_detector(directory: Path | str, weights_sha256: str | None = None) -> Detector:
    """Read and check both files; with ``weights_sha256``, check they belong to those weights.

    Every problem is one :class:`ModelStoreError` naming the file.
    """
    directory = Path(directory)
    path = directory / DETECTOR_JSON
    meta = read_json_object(
        path, "detector not found (run `bayesgate fit-detector MODEL`)", f"a {DETECTOR_FORMAT} file"
    )
    if meta.get("format") != DETECTOR_FORMAT:
        raise ModelStoreError(f"{path}: not a {DETECTOR_FORMAT} file")
    if weights_sha256 is not None and meta.get("model_sha256") != weights_sha256:
        raise ModelStoreError(
            f"{path}: fitted for weights {str(meta.get('model_sha256'))[:16]}…, but the model's "
            f"weights are {weights_sha256[:16]}… (re-run `bayesgate fit-detector`)"
        )
    problem = metadata_problem(meta)
    if problem is not None:
        raise ModelStoreError(f"{path}: {problem}")
    tensors = _read_tensors(directory / DETECTOR_TENSORS, meta.get("statistics_sha256"))
    try:
        return _detector(meta, tensors)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ModelStoreError(f"{path}: {type(exc).__name__}: {first_line(str(exc))}") from exc


# detector.json's sections: a JSON object each (``None``: may also be null)
_SECTIONS: dict[str, bool] = {
    "mahalanobis": False,
    "thresholds": False,
    "quadratic": True,
    "kde": True,
    "fusion": True,
    "conformal": True,
    "fit": True,
}


def metadata_problem(meta: dict[str, Any]) -> str | None:
    """``field: problem`` for the first top-level field of ``detector.json`` of the wrong type or
    range (``k`` a positive integer, not ``true`` or 2.5; thresholds finite numbers; each section
    an object), ``None`` when they are right; what is inside the sections is checked as they
    are read (:func:`_detector`)."""
    for name in ("model_sha256", "statistics_sha256"):
        if not isinstance(meta.get(name), str):
            return f"{name} must be a string, got {brief(meta.get(name))}"
    k = meta.get("k")
    if not (is_int(k) and 1 <= k <= MAX_K):
        return f"k must be a positive integer (at most {MAX_K:,}), got {brief(k)}"
    fpr = meta.get("target_fpr")
    if not (is_real(fpr) and 0.0 < fpr < 1.0):
        return f"target_fpr must be in (0, 1), got {brief(fpr)}"
    for name, nullable in _SECTIONS.items():
        value = meta.get(name)
        if not (isinstance(value, dict) or (nullable and value is None)):
            kind = "a JSON object or null" if nullable else "a JSON object"
            return f"{name} must be {kind}, got {brief(value)}"
    bad = [n for n, t in meta["thresholds"].items() if not is_real(t)]
    if bad:
        return f"thresholds: {', '.join(bad)} must be finite numbers"
    kde = meta.get("kde")
    if kde is not None and not (is_real(kde.get("bandwidth")) and kde["bandwidth"] > 0):
        return f"kde.bandwidth must be a positive number, got {brief(kde.get('bandwidth'))}"
    return None


def _tensors(detector: Detector) -> dict[str, torch.Tensor]:
    out = {}
    for layer, g in detector.gaussians.items():
        out[f"mahalanobis.{layer}.means"] = g.means.detach().cpu().contiguous()
        out[f"mahalanobis.{layer}.precision"] = g.precision.detach().cpu().contiguous()
    for name, q in detector.quadratics.items():
        out[f"quadratic.{name}.means"] = q.means.detach().cpu().contiguous()
        out[f"quadratic.{name}.precisions"] = q.precisions.detach().cpu().contiguous()
    if detector.kde is not None:
        out["kde.samples"] = detector.kde.samples.detach().cpu().contiguous()
        out["kde.offsets"] = detector.kde.offsets.detach().cpu().contiguous()
    return out


def _metadata(detector: Detector, statistics_sha256: str) -> dict[str, Any]:
    return {
        "format": DETECTOR_FORMAT,
        "model_sha256": detector.model_sha256,
        "statistics_sha256": statistics_sha256,
        "k": detector.k,
        "target_fpr": detector.target_fpr,
        "score": detector.score,
        "mahalanobis": {
            layer: {"shrinkage": g.shrinkage, "dim": int(g.means.shape[1])}
            for layer, g in detector.gaussians.items()
        },
        "quadratic": {
            name: {
                "layer": "input",
                "image_shape": list(q.image_shape),
                "pool": q.pool,
                "shrinkage": list(q.shrinkage),
                "dim": int(q.means.shape[1]),
            }
            for name, q in detector.quadratics.items()
        },
        "kde": None
        if detector.kde is None
        else {
            "layer": detector.kde_layer,
            "bandwidth": detector.kde.bandwidth,
            "samples": int(detector.kde.samples.shape[0]),
            "dtype": str(detector.kde.samples.dtype).removeprefix("torch."),
        },
        "fusion": None if detector.fusion is None else detector.fusion.to_json(),
        "conformal": None if detector.conformal is None else detector.conformal.to_json(),
        "thresholds": dict(detector.thresholds),
        "fit": detector.fit,
    }


def _read_tensors(path: Path, expected_sha256: Any) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelStoreError(f"{path}: detector statistics not found")
    blob = path.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != expected_sha256:
        raise ModelStoreError(
            f"{path}: sha256 {digest[:16]}… does not match {DETECTOR_JSON}'s "
            f"{str(expected_sha256)[:16]}… (file truncated or tampered with)"
        )
    try:
        return load_safetensors(blob)
    except (SafetensorError, ValueError) as exc:
        raise ModelStoreError(f"{path}: not a valid safetensors file ({exc})") from exc


def _detector(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Detector:
    gaussians = {
        layer: ClassGaussians(
            tensors[f"mahalanobis.{layer}.means"],
            tensors[f"mahalanobis.{layer}.precision"],
            float(info["shrinkage"]),
        )
        for layer, info in meta["mahalanobis"].items()
    }
    quadratics = {
        name: ClassQuadratic(
            tensors[f"quadratic.{name}.means"],
            tensors[f"quadratic.{name}.precisions"],
            tuple(float(d) for d in info["shrinkage"]),
            tuple(int(n) for n in info["image_shape"]),
            int(info["pool"]),
        )
        for name, info in (meta.get("quadratic") or {}).items()
    }
    kde_meta = meta.get("kde")
    kde = None
    if kde_meta is not None:
        kde = ClassKDE(tensors["kde.samples"], tensors["kde.offsets"], float(kde_meta["bandwidth"]))
    fusion = None if meta.get("fusion") is None else LogisticFusion.from_json(meta["fusion"])
    conformal_meta = meta.get("conformal")
    conformal = None if conformal_meta is None else ConformalFusion.from_json(conformal_meta)
    return Detector(
        model_sha256=str(meta["model_sha256"]),
        k=int(meta["k"]),
        gaussians=gaussians,
        quadratics=quadratics,
        kde=kde,
        kde_layer=str(kde_meta["layer"]) if kde_meta else "penultimate",
        fusion=fusion,
        conformal=conformal,
        target_fpr=float(meta["target_fpr"]),
        thresholds={str(n): float(t) for n, t in meta["thresholds"].items()},
        fit=dict(meta.get("fit") or {}),
    )
