"""Evaluate a model's fitted detector on the test split: attacks (seen and unseen) and OOD inputs.

Per attack: every image of the test subset is attacked (:func:`bayesgate.attacks.run.run_attack`,
``k_attack``-pass log-predictive); the positives are the *successful* adversarial examples (judged
on a ``k``-pass MC predictive), the negatives *all* clean test images of the subset. Per OOD set
(:mod:`bayesgate.attacks.ood`): every OOD image is a positive. For every score of the detector
(:class:`bayesgate.models.detection.detector.Detector`: predictive entropy, mutual information,
variation ratio, Mahalanobis per layer, ``−log KD``, fused):

- AUROC (positives vs clean test images);
- TPR at the detector's calibrated threshold (fitted on clean *validation* images), i.e. the
  fraction of positives flagged;
- the clean test FPR at that threshold.

Adversarial images are cached per model, attack, subset, attack K and seed as ``.npz`` (no
pickle) under ``cache_dir`` (default ``~/.cache/bayesgate/detect-eval``), so an interrupted run
resumes at the next attack and a re-run only rescores (the success verdicts are recomputed with
the evaluation's K). A larger subset continues the longest cached one of the same attack: the
first ``m`` images come from the cache, images ``m…n−1`` are attacked as their own run with the
same seed (their masks and random starts repeat the first run's stream, on other images), and the
``n`` images are cached with ``continued_from = m`` in their metadata.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bayesgate.attacks.detect_settings import EvalSettings
from bayesgate.attacks.methods import Attack
from bayesgate.attacks.metrics import detection_metrics
from bayesgate.attacks.ood import OOD_LABELS, ood_images
from bayesgate.attacks.run import attack_in_batches, attack_targets, mc_predictions, verdicts
from bayesgate.models.detection.detector import Detector, collect_features, scores_numpy
from bayesgate.models.mc.uncertainty import predictive_mean
from bayesgate.models.store.directory import LoadedModel
from bayesgate.outputs import write_atomically


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/bayesgate/detect-eval`` (the user cache of the data settings)."""
    from bayesgate.models.data.settings import data_settings

    return data_settings().cache_root / "detect-eval"


@dataclass
class ScoredSet:
    """One row of the evaluation: the positives' scores and how they were made."""

    key: str
    label: str
    kind: str  # "attack" or "ood"
    scores: dict[str, np.ndarray]
    summary: dict[str, Any]


@dataclass
class DetectionEval:
    """Everything :func:`evaluate_detector` measured (the report and plots read this)."""

    config: dict[str, Any]
    thresholds: dict[str, float]
    clean: dict[str, np.ndarray]
    sets: list[ScoredSet]
    seconds: dict[str, float]

    def rows(self) -> list[dict[str, Any]]:
        """One JSON-ready row per set: counts and, per score, AUROC, TPR / FPR at the threshold,
        TPR at 5 % clean FPR and clean FPR at 95 % TPR (the usual OOD operating point)."""
        out = []
        for s in self.sets:
            per_score = {
                name: _metrics(self.clean[name], s.scores[name], self.thresholds.get(name))
                for name in self.clean
            }
            out.append(
                {"set": s.key, "label": s.label, "kind": s.kind, **s.summary, "scores": per_score}
            )
        return out

    def to_json(self) -> dict[str, Any]:
        clean_fpr = {
            name: float(np.mean(self.clean[name] > t))
            for name, t in self.thresholds.items()
            if name in self.clean
        }
        return {
            **self.config,
            "thresholds": self.thresholds,
            "clean_test_fpr": clean_fpr,
            "seconds": self.seconds,
            "rows": self.rows(),
        }


def _metrics(clean: np.ndarray, pos: np.ndarray, threshold: float | None) -> dict[str, Any]:
    m = detection_metrics(clean, pos, threshold)
    keep = (
        "auroc",
        "tpr_at_threshold",
        "fpr_at_threshold",
        "tpr_at_5fpr",
        "fpr_at_95tpr",
        "mean_adversarial",
    )
    return {k: m[k] for k in keep if k in m}


def evaluate_detector(
    loaded: LoadedModel,
    detector: Detector,
    settings: EvalSettings | None = None,
    *,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> DetectionEval:
    """Run the evaluation of the module docstring (nothing but the cache is written)."""
    from bayesgate.models.data.mnist import load_mnist

    settings = settings or EvalSettings()
    settings.check()
    specs = settings.specs()
    run = EvalRun(loaded, detector, settings, torch.device(device), progress)
    x, y = load_mnist("test", limit=settings.limit)
    started = time.perf_counter()
    clean_probs, clean = run.score(x, "clean test")
    clean_pred = predictive_mean(clean_probs).argmax(dim=1)
    seconds = {"clean": time.perf_counter() - started}
    sets = []
    for spec in specs:
        started = time.perf_counter()
        sets.append(run.attack_set(spec, x, y, clean_pred))
        seconds[spec.key] = time.perf_counter() - started
    for name in settings.ood:
        started = time.perf_counter()
        sets.append(run.ood_set(name, x))
        seconds[f"ood:{name}"] = time.perf_counter() - started
    config = {
        "model": loaded.card.name,
        "model_sha256": loaded.card.weights_sha256,
        "split": "test",
        "images": int(x.shape[0]),
        "clean_accuracy": float((clean_pred == y).double().mean()),
        "k": run.k,
        "k_attack": run.k_attack,
        "seed": settings.seed,
        "detector_score": detector.score,
        "target_fpr": detector.target_fpr,
        "torch_threads": torch.get_num_threads(),
    }
    return DetectionEval(config, dict(detector.thresholds), clean, sets, _round(seconds))


class DetectorRun:
    """What every evaluation of a detector holds: the model, its detector, the settings (``k``,
    ``k_attack``, ``seed``, ``cache_dir``, ``batch_size``), the device and the cache folder."""

    def __init__(
        self,
        loaded: LoadedModel,
        detector: Detector,
        settings: Any,
        device: torch.device,
        progress: bool,
    ) -> None:
        if detector.model_sha256 != loaded.card.weights_sha256:
            raise ValueError(f"the detector was fitted for other weights than {loaded.card.name}")
        self.loaded, self.detector, self.settings = loaded, detector, settings
        self.device, self.progress = device, progress
        self.k = int(settings.k or detector.k)
        self.k_attack = int(settings.k_attack or loaded.card.inference.k_attack)
        self.cache = (settings.cache_dir or default_cache_dir()) / loaded.card.weights_sha256[:16]

    @property
    def network(self) -> nn.Module:
        return self.loaded.network

    def log(self, message: str) -> None:
        if self.progress:
            print(message, file=sys.stderr)


class EvalRun(DetectorRun):
    """One ``detect-eval`` run: the scores of a set (:meth:`score`), an attack's images and
    verdicts (:meth:`adversarial`, cached) and its scored set (:meth:`attack_set`), an OOD set
    (:meth:`ood_set`). ``bench/through_examples.py`` draws the digits of :meth:`adversarial`
    that get through the flag, with exactly ``detect-eval``'s images and verdicts."""

    def score(self, x: torch.Tensor, desc: str) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """``(probs N×K×C, every score)`` of ``x`` with the evaluation's K and seed."""
        probs, features = collect_features(
            self.network,
            x,
            self.k,
            batch_size=500,
            seed=self.settings.seed,
            device=self.device,
            progress=self.progress,
            desc=desc,
        )
        return probs, scores_numpy(self.detector, probs, features)

    def attack_set(
        self, spec: Attack, x: torch.Tensor, y: torch.Tensor, clean_pred: torch.Tensor
    ) -> ScoredSet:
        n = min(x.shape[0], self.settings.attack_limits.get(spec.name, x.shape[0]))
        x_adv, success, summary = self.adversarial(spec, x[:n], y[:n], clean_pred[:n])
        self.log(
            f"{spec.label}: {summary['successful']}/{summary['eligible']} succeeded "
            f"({summary['images']} images)"
        )
        if success.any():
            _, scores = self.score(x_adv[success], spec.label)
        else:
            scores = {name: np.zeros(0) for name in self.detector.score_names}
        return ScoredSet(spec.key, spec.label, "attack", scores, summary)

    def adversarial(
        self, spec: Attack, x: torch.Tensor, y: torch.Tensor, clean_pred: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Adversarial images, success mask and summary; the verdicts use this run's K."""
        x_adv, target, seconds = self.adversarial_images(spec, x, y)
        _, adv_pred = mc_predictions(
            self.network, x_adv, self.k, device=self.device, seed=self.settings.seed
        )
        eligible, success = verdicts(spec, y, clean_pred, adv_pred, target)
        delta = (x_adv - x).flatten(1)
        n_eligible = int(eligible.sum())
        summary = {
            "attack": spec.key,
            "images": int(x.shape[0]),
            "eligible": n_eligible,
            "successful": int(success.sum()),
            "success_rate": float(success.sum()) / n_eligible if n_eligible else None,
            "mean_linf_success": _mean(delta.abs().amax(dim=1)[success]),
            "mean_l2_success": _mean(delta.norm(dim=1)[success]),
            "attack_seconds": seconds,
        }
        return x_adv, success, summary

    def adversarial_images(
        self, spec: Attack, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``(x_adv, target, seconds)`` from the cache, else attacked now and cached.

        The untargeted attacks push away from the true label ``y``: on the eligible images
        (clean prediction right, the only ones judged) that is the model's own prediction, so
        the images do not depend on the evaluation's K and one cache serves every K.
        """
        path = self.cache / _cache_name(spec, x.shape[0], self.k_attack, self.settings.seed)
        if path.is_file():
            return _load_images(path)
        prefix = _cached_prefix(self.cache, spec, x.shape[0], self.k_attack, self.settings.seed)
        done = 0 if prefix is None else prefix[0].shape[0]
        started = time.perf_counter()
        x_rest, target_rest = self._attack(spec, x[done:], y[done:])
        seconds = round(time.perf_counter() - started, 1)
        meta: dict[str, Any] = {"attack": spec.key, "seconds": seconds}
        if prefix is not None:
            x_rest, target_rest = (
                torch.cat([prefix[0], x_rest]),
                torch.cat([prefix[1], target_rest]),
            )
            meta.update(seconds=round(prefix[2] + seconds, 1), continued_from=done)
        _save_images(path, x_rest, target_rest, meta)
        return x_rest, target_rest, meta["seconds"]

    def _attack(
        self, spec: Attack, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_adv, target)`` of ``spec`` on ``x`` as one run seeded ``settings.seed``."""
        target = attack_targets(self.network, x, y, spec, self.settings.seed, self.device)
        x_adv = attack_in_batches(
            self.network,
            x,
            target if spec.targeted else y,
            spec,
            k=self.k_attack,
            batch_size=self.settings.batch_size,
            seed=self.settings.seed,
            device=self.device,
            progress=self.progress,
        )
        return x_adv, target

    def ood_set(self, name: str, x: torch.Tensor) -> ScoredSet:
        x_ood = ood_images(name, x, seed=self.settings.seed)
        probs, scores = self.score(x_ood, OOD_LABELS[name])
        pred = predictive_mean(probs).argmax(dim=1)
        counts = torch.bincount(pred, minlength=probs.shape[-1]).tolist()
        summary = {"images": int(x_ood.shape[0]), "predicted_classes": counts}
        return ScoredSet(f"ood:{name}", OOD_LABELS[name], "ood", scores, summary)


def _cache_name(spec: Attack, n: int, k_attack: int, seed: int) -> str:
    safe = spec.key.replace(":", "_").replace(",", "_").replace("=", "")
    return f"{safe}-n{n}-ka{k_attack}-s{seed}.npz"


def _load_images(path: Path) -> tuple[torch.Tensor, torch.Tensor, float]:
    with np.load(path, allow_pickle=False) as data:
        seconds = float(json.loads(str(data["meta"]))["seconds"])
        return torch.from_numpy(data["x_adv"]), torch.from_numpy(data["target"]), seconds


def _cached_prefix(
    cache: Path, spec: Attack, n: int, k_attack: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """The cached images of the same attack on the longest first ``m < n`` test images, if any."""
    sizes = [m for m in range(1, n) if (cache / _cache_name(spec, m, k_attack, seed)).is_file()]
    return _load_images(cache / _cache_name(spec, max(sizes), k_attack, seed)) if sizes else None


def _save_images(
    path: Path, x_adv: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "x_adv": x_adv.numpy().astype(np.float32),
        "target": target.numpy(),
        "meta": np.array(json.dumps(meta)),
    }
    write_atomically(path, lambda out: np.savez_compressed(out, **arrays), binary=True)


def _mean(values: torch.Tensor) -> float | None:
    return float(values.double().mean()) if values.numel() else None


def _round(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in values.items()}
