"""The adaptive attack on a model's fused detector, evaluated on the test split.

For every radius ε: plain PGD (the same attack with detector weight λ = 0: it only has to
misclassify) and the adaptive attack (:class:`bayesgate.attacks.adaptive.AdaptivePGD`) at every
detector weight λ, all from the same random starts, gradients through the MC predictive and the
detector's scores (:func:`detector_score_fn`, fresh masks every step). Every result is then judged
on a **fresh, independent** MC draw (K = the detector's, masks seeded differently from the
attack's), among the *eligible* test digits (clean prediction right):

- ``misclassified`` — the fraction the attack pushed off the label (the undefended success rate
  for plain PGD);
- ``evaded`` — misclassified **and not flagged** by the fused detector at its calibrated
  threshold: the detector's real failure rate against this attacker;
- ``own_found`` — the fraction the attacker's own K-sample query believed evaded;
- mean L2 (and L∞) distortion of the misclassified and of the evading examples: what evading
  costs over merely misclassifying (Carlini & Wagner 2017).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bayesgate.attacks.adaptive import AdaptivePGD, ScoreFn
from bayesgate.attacks.adaptive_settings import AdaptiveSettings
from bayesgate.attacks.detect_eval import DetectorRun
from bayesgate.models.detection.detector import Detector, collect_features, scores_numpy
from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.mc.engine import mc_logits_features
from bayesgate.models.mc.uncertainty import predictive_mean
from bayesgate.models.store.directory import LoadedModel
from bayesgate.outputs import write_atomically, write_text_atomically

EVAL_SEED_OFFSET = 1_000_003
"""The verdict's MC masks are seeded ``seed + EVAL_SEED_OFFSET``, apart from the attack's."""


def detector_score_fn(
    model: nn.Module,
    detector: Detector,
    k: int,
    *,
    score: str | None = None,
    generator: torch.Generator | None = None,
) -> ScoreFn:
    """``x ↦ (log p̄(·|x), s(x))`` with autograd: ``k`` dropout passes (fresh masks per call from
    ``generator``), the detector's features from the same passes, ``s`` = ``score`` (default the
    detector's flagging score, ``fused`` when fitted) from :meth:`Detector.scores` with
    ``smooth=True`` (the min-p-value rule's differentiable surrogate, logsumexp over interpolated
    ``−log p_j``; the verdict that counts is the caller's exact score)."""
    name = score or detector.score

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        was_training = model.training
        model.eval()
        try:
            with mc_sampling(generator):
                logits, features = mc_logits_features(model, x, k)
        finally:
            model.train(was_training)
        log_p = torch.log_softmax(logits.float(), dim=-1)
        scores = detector.scores(log_p.exp(), features, smooth=True)
        return torch.logsumexp(log_p, dim=1) - math.log(k), scores[name]

    return fn


def evaluate_adaptive(
    loaded: LoadedModel,
    detector: Detector,
    settings: AdaptiveSettings | None = None,
    *,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Run every configuration of ``settings`` on the first ``limit`` test digits; JSON-ready."""
    from bayesgate.models.data.mnist import load_mnist

    settings = settings or AdaptiveSettings()
    run = _AdaptiveRun(loaded, detector, settings, torch.device(device), progress)
    x, y = load_mnist("test", limit=settings.limit)
    clean = run.judge(x, y)
    eligible = clean["correct"]
    rows = []
    for eps in settings.eps:
        for name, attack in settings.configs(eps):
            started = time.perf_counter()
            x_adv, found = run.attack(attack, x, y, name)
            verdict = run.judge(x_adv, y)
            rows.append(
                _row(
                    name, attack, x, x_adv, found, verdict, eligible, time.perf_counter() - started
                )
            )
            run.log(_one_line(rows[-1]))
    return {
        "model": loaded.card.name,
        "model_sha256": loaded.card.weights_sha256,
        "split": "test",
        "images": int(x.shape[0]),
        "eligible": int(eligible.sum()),
        "clean_flagged": float(clean["flagged"][eligible].mean()),
        "score": run.score,
        "threshold": run.threshold,
        "k_attack": run.k_attack,
        "k_eval": run.k,
        "seed_attack": settings.seed,
        "seed_eval": run.eval_seed,
        "steps": settings.steps,
        "optimizer": settings.optimizer,
        "restarts": settings.restarts,
        "region": settings.region,
        "kappa": settings.kappa,
        "delta": settings.delta,
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
    }


def served_draw(
    network: nn.Module,
    detector: Detector,
    x: torch.Tensor,
    k: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, np.ndarray]:
    """What the served verdict reads from one MC draw (``k`` passes, masks seeded ``seed``): the
    predictive mean ``p̄ = (1/K)·Σ_k p(y|x, ω_k)`` (B×C) and the detector's score (B,)."""
    probs, features = collect_features(network, x, k, seed=seed, device=device)
    return predictive_mean(probs), scores_numpy(detector, probs, features)[detector.score]


def judge(
    network: nn.Module,
    detector: Detector,
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> dict[str, np.ndarray]:
    """The served verdict of one MC draw (``k`` passes, masks seeded ``seed``): ``correct``
    (predictive-mean argmax = label), ``flagged`` (the detector's score > its threshold) and
    ``score``."""
    mean, score = served_draw(network, detector, x, k, seed, device)
    pred = mean.argmax(dim=1)
    return {
        "correct": (pred == y).numpy(),
        "flagged": score > float(detector.threshold),
        "score": score,
    }


class _AdaptiveRun(DetectorRun):
    """One ``adaptive-eval`` run; verdicts use masks independent of the attack's."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.score, self.threshold = self.detector.score, float(self.detector.threshold)
        self.eval_seed = self.settings.seed + EVAL_SEED_OFFSET

    def judge(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
        """Fresh MC verdicts (:func:`judge`) with masks seeded apart from the attack's."""
        return judge(self.network, self.detector, x, y, self.k, self.eval_seed, self.device)

    def attack(
        self, attack: AdaptivePGD, x: torch.Tensor, y: torch.Tensor, name: str
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Adversarial images and the attacker's own 'found' flags (cached as ``.npz``)."""
        name_ = _cache_name(attack, x.shape[0], self.k_attack, self.settings.seed)
        if attack.weight > 0:  # the images depend on the detector the attack descends
            name_ = f"{name_.removesuffix('.npz')}-det{_detector_tag(self.detector)}.npz"
        path = self.cache / name_
        if path.is_file():
            with np.load(path, allow_pickle=False) as data:
                return torch.from_numpy(data["x_adv"]), data["found"]
        net = self.network
        generator = torch.Generator(device=self.device).manual_seed(self.settings.seed)
        start_rng = torch.Generator().manual_seed(self.settings.seed + 7)
        score_fn = detector_score_fn(net, self.detector, self.k_attack, generator=generator)
        chunks, found = [], []
        starts = range(0, x.shape[0], self.settings.batch_size)
        params = [(p, p.requires_grad) for p in net.parameters()]
        for p, _ in params:
            p.requires_grad_(False)
        try:
            for i in tqdm(starts, desc=f"ε={attack.eps:g} {name}", disable=not self.progress):
                xb = x[i : i + self.settings.batch_size].to(self.device)
                yb = y[i : i + self.settings.batch_size].to(self.device)
                result = attack(score_fn, xb, yb, self.threshold, generator=start_rng)
                chunks.append(result.x_adv.cpu())
                found.append(result.found.cpu())
        finally:
            for p, flag in params:
                p.requires_grad_(flag)
        x_adv, found_arr = torch.cat(chunks), torch.cat(found).numpy()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(
            path,
            lambda out: np.savez_compressed(out, x_adv=x_adv.numpy(), found=found_arr),
            binary=True,
        )
        return x_adv, found_arr


def _detector_tag(detector: Detector) -> str:
    """12 hex digits of the sha256 of what defines the flagging score: the logistic fusion, the
    min-p rule and the thresholds."""
    spec = {
        "fusion": None if detector.fusion is None else detector.fusion.to_json(),
        "conformal": None if detector.conformal is None else detector.conformal.to_json(),
        "thresholds": detector.thresholds,
        "score": detector.score,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _cache_name(attack: AdaptivePGD, n: int, k_attack: int, seed: int) -> str:
    return (
        f"adaptive-eps{attack.eps:g}-w{attack.weight:g}-{attack.schedule}-t{attack.steps}"
        f"-a{attack.alpha:g}-kap{attack.kappa:g}-d{attack.delta:g}-n{n}-ka{k_attack}-s{seed}"
        f"{attack.cache_tag}.npz"
    )


def _row(
    name: str,
    attack: AdaptivePGD,
    x: torch.Tensor,
    x_adv: torch.Tensor,
    found: np.ndarray,
    verdict: dict[str, np.ndarray],
    eligible: np.ndarray,
    seconds: float,
) -> dict[str, Any]:
    delta = (x_adv - x).flatten(1)
    l2, linf = delta.norm(dim=1).numpy(), delta.abs().amax(dim=1).numpy()
    mis = eligible & ~verdict["correct"]
    evaded = mis & ~verdict["flagged"]
    n = int(eligible.sum())
    return {
        "eps": attack.eps,
        "attack": name,
        "weight": attack.weight,
        "schedule": attack.schedule,
        "optimizer": attack.optimizer,
        "restarts": attack.starts,
        "steps": attack.steps,
        "step_size": attack.alpha,
        "eligible": n,
        "misclassified": int(mis.sum()),
        "evaded": int(evaded.sum()),
        "misclassified_rate": mis.sum() / n,
        "evaded_rate": evaded.sum() / n,
        "flagged_among_misclassified": _mean(verdict["flagged"][mis]),
        "own_found_rate": float(found[eligible].mean()),
        "mean_l2_misclassified": _mean(l2[mis]),
        "mean_l2_evaded": _mean(l2[evaded]),
        "max_linf": float(linf.max()),
        "max_l1": float(delta.abs().sum(dim=1).max()),
        "max_l0": int((delta != 0).sum(dim=1).max()),
        "mean_score_misclassified": _mean(verdict["score"][mis]),
        "seconds": round(seconds, 1),
    }


def _mean(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if values.size else None


def _one_line(row: dict[str, Any]) -> str:
    return (
        f"ε={row['eps']:g} {row['attack']}: misclassified {row['misclassified_rate']:.3f}, "
        f"misclassified and not flagged {row['evaded_rate']:.3f} "
        f"(own query {row['own_found_rate']:.3f}), {row['seconds']:.0f} s"
    )


def adaptive_paths(out: Path | str) -> dict[str, Path]:
    """The files :func:`write_adaptive` writes into ``out``, by kind."""
    return {"json": Path(out) / "adaptive.json", "md": Path(out) / "adaptive.md"}


def write_adaptive(result: dict[str, Any], out: Path | str) -> dict[str, Path]:
    """``adaptive.json`` and ``adaptive.md`` (the table) in ``out``."""
    Path(out).mkdir(parents=True, exist_ok=True)
    paths = adaptive_paths(out)
    clean = json.loads(json.dumps(result, default=float))
    write_text_atomically(paths["json"], json.dumps(clean, indent=2, ensure_ascii=False) + "\n")
    write_text_atomically(paths["md"], adaptive_table(result))
    return paths


def _optimizer_text(result: dict[str, Any]) -> str:
    if result.get("optimizer", "pgd") == "patch-rs":
        sides = ", ".join(
            f"{math.isqrt(int(k))}×{math.isqrt(int(k))} at ε = {k:g}"
            for k in sorted({r["eps"] for r in result.get("rows", [])})
        )
        return (
            "Patch-RS (random search over the location and the content of one square patch of "
            f"pixels set to 0 or 1, Croce et al. 2022), {result['steps']} queries per image, no "
            "gradients; **ε is the pixel budget k** (L0) here, spent on a patch of side ⌊√k⌋"
            + (f" ({sides})" if sides else "")
        )
    if result.get("optimizer", "pgd") == "sparse-rs":
        where = (
            " on the digit's strokes and their one-pixel border only"
            if result.get("region", "anywhere") == "strokes"
            else ""
        )
        return (
            f"Sparse-RS (random search over pixels set to 0 or 1{where}, Croce et al. 2022), "
            f"{result['steps']} queries per image, no gradients; **ε is the number of pixels "
            "k** (L0) here"
        )
    if result.get("optimizer", "pgd") == "slide":
        return (
            f"SLIDE (sparse L1 descent, Tramèr & Boneh 2019), {result['steps']} steps from the "
            "clean image; **ε is an L1 radius** here"
        )
    if result.get("optimizer", "pgd") == "apgd":
        restarts = result.get("restarts", 1)
        return (
            f"APGD (Croce & Hein 2020), {result['steps']} gradient queries per run × {restarts} "
            f"run{'s' if restarts > 1 else ''} from random starts"
        )
    return f"{result['steps']} signed-gradient steps"


def adaptive_table(result: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 3) -> str:
        return "–" if v is None else f"{v:.{digits}f}"

    lines = [
        f"Model `{result['model']}`, first {result['images']} test images, "
        f"{result['eligible']} correctly classified (the denominators). Attack: "
        f"{_optimizer_text(result)} through the K = {result['k_attack']} MC "
        f"predictive and the detector, fresh masks per step; verdicts on a fresh K = "
        f"{result['k_eval']} draw. Flag: {result['score']} > {result['threshold']:.4g} "
        f"(flags {result['clean_flagged']:.3f} of these clean digits).",
        "",
        "| ε | attack | misclassified | misclassified & not flagged | attacker's own query | "
        "flagged among misclassified | mean L2 misclassified | mean L2 evaded |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['eps']:g} | {r['attack']} | {f(r['misclassified_rate'])} | "
            f"{f(r['evaded_rate'])} | {f(r['own_found_rate'])} | "
            f"{f(r['flagged_among_misclassified'])} | {f(r['mean_l2_misclassified'], 2)} | "
            f"{f(r['mean_l2_evaded'], 2)} |"
        )
    return "\n".join(lines) + "\n"
