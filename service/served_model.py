"""The served model: network + card from the store, its calibration, and what clients see of it.

:class:`ServedModel` is the one type the service serves; the inference worker owns the current one
(:attr:`bayesgate.service.worker.BatchWorker.model`), and an admin change replaces it there.
Start-up and reloads go through :func:`load_served_model`; every problem (missing or tampered
weights, broken card, missing or mismatched ``calibration.json``, a detector it references that is
missing, changed or fitted for other weights) becomes one :class:`StartupError` whose message
names the file and the problem. The store checks the card against the network (input shape,
number of classes) and ``calibration.json``'s every field; here the card's name must also be
one the routes can serve (:func:`served_name_problem`).

The decision (:attr:`ServedModel.decision`, ``score > threshold`` flags an input) is the admin's
override when there is one, else the fused detector's (``bayesgate fit-detector``, referenced from
``calibration.json``), else ``calibration.json``'s uncertainty score. What describes the flag —
the K its threshold was set at (the default K of a request), its target FPR, its AUROC per attack —
comes from the file that set that threshold (:attr:`ServedModel.basis`): ``detector.json`` when the
detector decides, ``calibration.json`` otherwise.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bayesgate.models.detection import Detector, load_detector
from bayesgate.models.detection.detector import rule_summary
from bayesgate.models.detection.store import DETECTOR_JSON
from bayesgate.models.device import pick_device
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.bundled import model_dir_not_found
from bayesgate.models.store.calibration import Calibration, read_calibration
from bayesgate.models.store.directory import (
    CALIBRATION_FILE,
    CARD_FILE,
    ModelCard,
    ModelStoreError,
    load_model,
)
from bayesgate.models.store.names import served_name_problem
from bayesgate.service.errors import StartupError


@dataclass(frozen=True)
class DecisionOverride:
    """The admin's ``score > threshold`` decision in place of ``calibration.json``'s."""

    score: str
    threshold: float
    set_at: str  # ISO 8601, UTC


@dataclass(frozen=True, slots=True)
class Decision:
    """Flag an input when its ``score`` exceeds ``threshold``."""

    score: str
    threshold: float


@dataclass(frozen=True, slots=True)
class FlagBasis:
    """What set the flag's threshold: ``decided_by`` (``"override"``, ``"detector"`` or
    ``"calibration"``), ``source`` (the file whose fit the threshold and its score's scale belong
    to: ``detector.json`` or ``calibration.json``), ``k`` (the MC samples of that fit),
    ``target_fpr`` (that fit's) and ``target_fpr_applies`` (False for an admin threshold that no
    fit set: the flag's false-positive rate is then not that target)."""

    decided_by: str
    source: str
    k: int
    target_fpr: float
    target_fpr_applies: bool = True


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
    detector: Detector | None = None

    @property
    def decision(self) -> Decision:
        """The override, else the detector's fused score, else calibration.json's score."""
        if self.override is not None:
            return Decision(self.override.score, self.override.threshold)
        if self.detector is not None:
            return Decision(self.detector.score, self.detector.threshold)
        return Decision(self.calibration.score, self.calibration.threshold)

    @cached_property
    def basis(self) -> FlagBasis:
        """Where the decision's threshold comes from (see :class:`FlagBasis`). An override's score
        belongs to ``calibration.json`` when it has a threshold there (the uncertainty scores),
        else to the detector; its target FPR is that file's, and applies only when the override
        keeps the stored threshold. Computed once per instance (a request
        without ``mc_samples`` reads its K); an admin change makes a new instance."""
        cal, detector, override = self.calibration, self.detector, self.override
        if override is not None:
            decided_by = "override"
        else:
            decided_by = "calibration" if detector is None else "detector"
        score = self.decision.score
        if detector is not None and (decided_by == "detector" or score not in cal.thresholds):
            source, k, fpr, stored = (
                DETECTOR_JSON,
                detector.k,
                detector.target_fpr,
                detector.thresholds,
            )
        else:
            source, k, fpr, stored = CALIBRATION_FILE, cal.k, cal.target_fpr, cal.thresholds
        applies = override is None or stored.get(score) == override.threshold
        return FlagBasis(decided_by, source, k, fpr, applies)

    @property
    def flag_aurocs(self) -> tuple[dict[str, float], str | None]:
        """``({attack: AUROC}, file)`` of the decision's score, from the file that measured it:
        the detector's fit report (validation images) for its scores, ``calibration.json``'s
        attack entries (test images) for the uncertainty scores; ``({}, None)`` when neither has
        that score's AUROC — never another score's."""
        score, detector = self.decision.score, self.detector
        if self.basis.source == DETECTOR_JSON and detector is not None:
            found = detector_aurocs(detector, score)
            if found:
                return found, DETECTOR_JSON
        found = attack_aurocs(self.calibration.attacks, score, self.calibration.score)
        return (found, CALIBRATION_FILE) if found else ({}, None)

    @property
    def score_names(self) -> tuple[str, ...]:
        """Every score a prediction carries: the uncertainty scores, and the detector's."""
        return self.detector.score_names if self.detector is not None else tuple(SCORES)

    @property
    def thresholds(self) -> dict[str, float]:
        """Each score's own threshold at the target FPR: calibration.json's for the uncertainty
        scores, the detector's for its density and fused scores."""
        detector = {} if self.detector is None else self.detector.thresholds
        return {**detector, **self.calibration.thresholds}

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def sha256(self) -> str:
        return self.card.weights_sha256

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.card.name, self.card.weights_sha256, self.basis.k)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input image from the card's input spec, e.g. ``(1, 28, 28)``."""
        return tuple(self.card.input.shape)

    @property
    def input_range(self) -> tuple[float, float]:
        return self.card.input.range

    def summary(self) -> dict[str, Any]:
        """The card and calibration summary a client needs to trust the adversarial flag.

        ``score``, ``threshold``, ``target_fpr``, ``mc_samples`` and ``auroc`` describe the flag
        as it is decided (:attr:`basis`: the detector's figures when it decides); ``validation``,
        ``attacks`` and ``created`` are ``calibration.json``'s, whose own score, threshold,
        target FPR, K and AUROCs are under ``calibration_file``."""
        cal, decision, basis = self.calibration, self.decision, self.basis
        aurocs, auroc_source = self.flag_aurocs
        return {
            "name": self.card.name,
            "weights_sha256": self.card.weights_sha256,
            "device": str(self.device),
            "card": self.card.to_dict(),
            "calibration": {
                "score": decision.score,
                "threshold": decision.threshold,
                "target_fpr": basis.target_fpr,
                "target_fpr_applies": basis.target_fpr_applies,
                "mc_samples": basis.k,
                "decided_by": basis.decided_by,
                "threshold_source": basis.source,
                "thresholds": self.thresholds,
                "validation": cal.validation,
                "auroc": aurocs,
                "auroc_score": decision.score,
                "auroc_source": auroc_source,
                "attacks": cal.attacks,
                "created": cal.created,
                "override": None if self.override is None else asdict(self.override),
                "detector": None if self.detector is None else detector_summary(self.detector),
                "calibration_file": {
                    "score": cal.score,
                    "threshold": cal.threshold,
                    "target_fpr": cal.target_fpr,
                    "mc_samples": cal.k,
                    "auroc": attack_aurocs(cal.attacks),
                },
            },
        }


def detector_summary(detector: Detector) -> dict[str, Any]:
    """What a client sees of the fused detector: its scores, thresholds, fusion and fit."""
    fit = detector.fit
    return {
        "score": detector.score,
        "threshold": detector.threshold,
        "mc_samples": detector.k,
        "target_fpr": detector.target_fpr,
        "scores": list(detector.score_names),
        "thresholds": dict(detector.thresholds),
        "fusion": None if detector.fusion is None else detector.fusion.to_json(),
        "rule": rule_summary(detector),
        "kde_bandwidth": None if detector.kde is None else detector.kde.bandwidth,
        "shrinkage": {layer: g.shrinkage for layer, g in detector.gaussians.items()},
        "validation_auroc": fit.get("auroc"),
        "images": fit.get("images"),
    }


def attack_aurocs(
    attacks: list[dict[str, Any]], score: str | None = None, active: str | None = None
) -> dict[str, float]:
    """``{attack: AUROC}`` from the ``attacks`` entries of ``calibration.json``, as
    ``bayesgate calibrate`` writes them: ``attack`` is the spec with its parameters
    (``fgs:eta=0.2``), ``auroc`` the active score's AUROC. Entries without both (an attack with no
    successful example has ``auroc: null``) are skipped; they stay visible in the full list.

    With ``score``: that score's AUROC — the entry's ``auroc`` when the entry's ``score`` (else
    ``active``, the calibration's score) is ``score``, else its ``scores[score].auroc``.
    """
    out: dict[str, float] = {}
    for entry in attacks:
        if not isinstance(entry, dict):
            continue
        name, auroc = entry.get("attack"), entry.get("auroc")
        if score is not None and entry.get("score", active) != score:
            per_score = entry.get("scores")
            measured = per_score.get(score) if isinstance(per_score, dict) else None
            auroc = measured.get("auroc") if isinstance(measured, dict) else None
        if _finite(auroc) and isinstance(name, str):
            out[name] = float(auroc)
    return out


def detector_aurocs(detector: Detector, score: str) -> dict[str, float]:
    """``{attack: AUROC of score}`` from the detector's fit report (``fit.attacks``: successful
    adversarial examples of the validation fit part against the clean threshold part); attacks
    without a finite AUROC for ``score`` are skipped."""
    attacks = detector.fit.get("attacks")
    out: dict[str, float] = {}
    if not isinstance(attacks, dict):
        return out
    for name, entry in attacks.items():
        aurocs = entry.get("auroc") if isinstance(entry, dict) else None
        auroc = aurocs.get(score) if isinstance(aurocs, dict) else None
        if _finite(auroc):
            out[str(name)] = float(auroc)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def load_served_model(
    directory: Path | str, device: str = "auto", source: str = "BAYESGATE_MODEL_DIR"
) -> ServedModel:
    """Load weights (sha256-verified) and ``calibration.json`` (tied to those weights);
    ``source`` names where the directory came from in the message when it does not exist."""
    directory = Path(directory)
    if not directory.is_dir():
        raise StartupError(model_dir_not_found(directory, source))
    try:
        dev = pick_device(device)
    except (ValueError, RuntimeError) as exc:
        raise StartupError(f"device: {exc}") from exc
    try:
        loaded = load_model(directory, dev)
        problem = served_name_problem(loaded.card.name)
        if problem is not None:
            raise ModelStoreError(f"{directory / CARD_FILE}: name: {problem}")
        calibration = read_calibration(directory, weights_sha256=loaded.card.weights_sha256)
        detector = _referenced_detector(directory, calibration, loaded.card.weights_sha256)
    except ModelStoreError as exc:
        raise StartupError(str(exc)) from exc
    served = ServedModel(
        network=loaded.network,
        card=loaded.card,
        calibration=calibration,
        device=dev,
        directory=directory,
        detector=detector,
    )
    check_answers(served)
    return served


def answer_blank(
    served: ServedModel, k: int, images: int = 2, generator: torch.Generator | None = None
) -> None:
    """``images`` blank images through the path every request takes — the engine with the
    detector's features, every uncertainty measure and detector score (:func:`predictions`) —
    with ``k`` passes; raises what that path raises."""
    from bayesgate.service.prediction import answer

    answer(served, torch.zeros(images, *served.input_shape, device=served.device), k, generator)


def check_answers(served: ServedModel) -> None:
    """:func:`answer_blank` with K = 2 and a seeded generator (no global random state drawn). A
    detector whose statistics do not fit the network's features (its files consistent with each
    other) fails here, as one :class:`StartupError` naming ``detector.json``, instead of in the
    first request or the warm-up batch."""
    generator = torch.Generator(device=served.device).manual_seed(0)
    try:
        answer_blank(served, 2, generator=generator)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as exc:
        name = DETECTOR_JSON if served.detector is not None else CARD_FILE
        line = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise StartupError(
            f"{served.directory / name}: the model cannot answer a blank image ({line})"
        ) from exc


def _referenced_detector(
    directory: Path, calibration: Calibration, weights_sha256: str
) -> Detector | None:
    """The detector ``calibration.json`` references, its ``detector.json`` checked against the
    recorded sha256 and its statistics against the weights; ``None`` when there is none."""
    reference = calibration.detector
    if reference is None:
        return None
    path = directory / DETECTOR_JSON
    if reference["file"] != DETECTOR_JSON or not path.is_file():
        raise ModelStoreError(
            f"{directory / reference['file']}: detector referenced by calibration.json not found"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != reference["sha256"]:
        raise ModelStoreError(
            f"{path}: sha256 {digest[:16]}… differs from calibration.json's "
            f"{reference['sha256'][:16]}… (re-run `bayesgate fit-detector`)"
        )
    detector = load_detector(directory, weights_sha256=weights_sha256)
    if detector.fusion is None or detector.score not in detector.thresholds:
        raise ModelStoreError(f"{path}: the detector has no fitted fusion and threshold")
    return detector
