"""Robust accuracy of a model under strong L∞ attacks, worst case per example, cached per batch.

For each radius ε and each of the first ``n`` test digits that the model classifies correctly
(clean verdict), three attacks run through the MC log-predictive (fresh dropout masks at every
query, K = ``k_attack`` passes):

- ``pgd`` — PGD-``pgd_steps`` × ``restarts`` random restarts, step ε/30
  (:class:`~bayesgate.attacks.methods.PGDRestarts`);
- ``apgd-ce`` and ``apgd-dlr`` — APGD with the cross-entropy and the DLR loss
  (:class:`~bayesgate.attacks.methods.APGD`), ``apgd_steps`` queries each.

Every adversarial image is judged on an **independent** MC draw (``k_eval`` passes, masks from a
generator seeded apart from the attacks'): the digit is *fooled* by an attack when
``argmax_c p̄(c|x') ≠ y``. Robust accuracy (worst of) is the fraction of the ``n`` digits that are
classified correctly clean and fooled by none of the attacks.

Results are cached per (model weights, attack, ε, batch) under ``<out>/cache/``: a killed run
resumes where it stopped, and every batch's random starts and masks come from a generator seeded
by (seed, attack, ε, batch), so the numbers do not depend on where a run was interrupted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

# the verdict's masks are drawn apart from every attack's, with adaptive-eval's verdict offset
from bayesgate.attacks.adaptive_eval import EVAL_SEED_OFFSET
from bayesgate.attacks.methods import APGD, Attack, PGDRestarts
from bayesgate.attacks.model_fn import frozen_parameters, log_predictive_fn
from bayesgate.attacks.robust_settings import RobustSettings
from bayesgate.models.mc.engine import mc_predict
from bayesgate.outputs import write_atomically


def attacks_at(eps: float, settings: RobustSettings) -> dict[str, Attack]:
    """Name → registered attack (:mod:`bayesgate.attacks.methods`) of the table at radius ε."""
    s = settings
    return {
        "pgd": PGDRestarts(eps=eps, eps_iter=eps / 30, steps=s.pgd_steps, restarts=s.restarts),
        "apgd-ce": APGD(eps=eps, steps=s.apgd_steps, loss="ce"),
        "apgd-dlr": APGD(eps=eps, steps=s.apgd_steps, loss="dlr"),
    }


def attack_label(name: str, settings: RobustSettings) -> str:
    """How the table names an attack, with its budget."""
    if name == "pgd":
        return f"PGD-{settings.pgd_steps} × {settings.restarts}"
    return f"{name.upper()}-{settings.apgd_steps}"


class BatchCache:
    """``<root>/<model key>/<name>.npy`` arrays written atomically, one per finished batch."""

    def __init__(self, root: Path, model_key: str) -> None:
        self.dir = Path(root) / model_key
        self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, name: str) -> np.ndarray | None:
        path = self.dir / f"{name}.npy"
        return np.load(path, allow_pickle=False) if path.is_file() else None

    def put(self, name: str, value: np.ndarray) -> None:
        write_atomically(
            self.dir / f"{name}.npy",
            lambda out: np.save(out, value, allow_pickle=False),
            binary=True,
        )


def model_key(name: str, weights_sha256: str) -> str:
    """Cache folder of a model: its name and the start of its weights' sha256."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"{safe}-{weights_sha256[:12]}"


def evaluate_robust(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: RobustSettings,
    cache: BatchCache,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Clean accuracy and, per ε, each attack's and the worst-of robust accuracy (JSON-ready)."""
    model.eval()
    clean = _clean_correct(model, x, y, settings, cache)
    batches = range(0, x.shape[0], settings.batch_size)
    total = len(settings.eps) * len(settings.attacks) * len(batches)
    bar = tqdm(total=total, desc="attacks", disable=not progress)
    per_eps = []
    for eps in settings.eps:
        fooled = {}
        for name in settings.attacks:
            parts = []
            for start in batches:
                bar.set_postfix(eps=eps, attack=name)
                parts.append(_fooled_batch(model, x, y, clean, eps, name, start, settings, cache))
                bar.update()
            fooled[name] = np.concatenate(parts)
        per_eps.append(_eps_row(eps, clean, fooled, settings))
    bar.close()
    return {
        "images": int(x.shape[0]),
        "clean_accuracy": float(clean.mean()),
        "settings": asdict(settings),
        "eps": per_eps,
    }


def _eps_row(
    eps: float, clean: np.ndarray, fooled: dict[str, np.ndarray], settings: RobustSettings
) -> dict[str, Any]:
    any_fooled = np.any(np.stack(list(fooled.values())), axis=0)
    return {
        "eps": eps,
        "robust_accuracy": {
            attack_label(name, settings): float((clean & ~f).mean()) for name, f in fooled.items()
        },
        "robust_accuracy_worst_of": float((clean & ~any_fooled).mean()),
    }


def _clean_correct(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: RobustSettings, cache: BatchCache
) -> np.ndarray:
    name = f"clean-n{x.shape[0]}-k{settings.k_eval}-s{settings.seed}"
    cached = cache.get(name)
    if cached is None:
        cached = _verdict(model, x, y, settings, batch_seed=0)
        cache.put(name, cached)
    return cached


def _fooled_batch(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    clean: np.ndarray,
    eps: float,
    name: str,
    start: int,
    settings: RobustSettings,
    cache: BatchCache,
) -> np.ndarray:
    """Fooled flags of one batch (False where the clean verdict is already wrong), cached."""
    stop = min(start + settings.batch_size, x.shape[0])
    key = f"{name}-{_budget(name, settings)}-eps{eps:g}-b{start}-{stop}-s{settings.seed}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    fooled = np.zeros(stop - start, dtype=bool)
    todo = np.flatnonzero(clean[start:stop])
    if todo.size:
        seed = _batch_seed(settings.seed, name, eps, start)
        generator = torch.Generator(device=x.device).manual_seed(seed)
        idx = torch.as_tensor(start + todo)
        attack = attacks_at(eps, settings)[name]
        model_fn = log_predictive_fn(model, settings.k_attack, generator=generator)
        with frozen_parameters(model):
            x_adv = attack(model_fn, x[idx], y[idx], generator=generator)
        _check_feasible(x_adv, x[idx], eps)
        correct = _verdict(model, x_adv, y[idx], settings, batch_seed=seed)
        fooled[todo] = ~correct
    cache.put(key, fooled)
    return fooled


def _budget(name: str, settings: RobustSettings) -> str:
    if name == "pgd":
        return f"{settings.pgd_steps}x{settings.restarts}-k{settings.k_attack}"
    return f"{settings.apgd_steps}-k{settings.k_attack}"


def _verdict(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: RobustSettings, batch_seed: int
) -> np.ndarray:
    """``argmax_c p̄(c|x) == y`` over ``k_eval`` passes, masks independent of the attacks'."""
    generator = torch.Generator(device=x.device).manual_seed(batch_seed + EVAL_SEED_OFFSET)
    out = []
    for xb, yb in zip(x.split(settings.batch_size), y.split(settings.batch_size), strict=True):
        probs = mc_predict(model, xb, settings.k_eval, generator=generator).probs.mean(dim=1)
        out.append((probs.argmax(dim=1) == yb).cpu().numpy())
    return np.concatenate(out)


def _check_feasible(x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> None:
    """An attack leaving the ε-ball or [0, 1] would make the table wrong: fail loudly."""
    gap = float((x_adv - x).abs().max())
    if gap > eps + 1e-5 or float(x_adv.min()) < 0 or float(x_adv.max()) > 1:
        raise RuntimeError(f"attack left the feasible set: ‖δ‖∞ = {gap:.6f} > ε = {eps}")


def _batch_seed(seed: int, name: str, eps: float, start: int) -> int:
    digest = hashlib.sha256(json.dumps([seed, name, eps, start]).encode()).digest()
    return int.from_bytes(digest[:6], "little")
