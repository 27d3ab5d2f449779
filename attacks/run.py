"""Run an attack over a data set in seeded batches and judge which adversarial examples succeeded.

Success is judged on the MC predictive ``p̄`` over ``k_eval`` passes (the K the detector uses),
not on the attack's own K:

- untargeted (FGS, PGD, CW): an image is *eligible* when its clean prediction is right, and the
  attack *succeeds* when the prediction on ``x_adv`` is wrong;
- targeted: eligible when the clean prediction is right and the true class is not the target;
  success when ``x_adv`` is classified as the target.

``success_rate = #success / #eligible``; ``adversarial_accuracy`` is the accuracy on all attacked
images (every image is attacked, eligible or not).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bayesgate.attacks.methods import Attack
from bayesgate.attacks.model_fn import frozen_parameters, log_predictive_fn
from bayesgate.attacks.specs import parse_attack
from bayesgate.errors import InvalidArgument
from bayesgate.models.mc.uncertainty import predictive_mean
from bayesgate.models.training.evaluate import collect_mc

NO_TARGET = -1
BATCH_SEED_STRIDE = 100_003
"""Batch ``b`` of a run seeded ``s`` gives its attack a generator seeded ``s·stride + b``."""

StepHook = Callable[[int, torch.Tensor, slice], None]
"""``hook(t, x_t, rows)``: step ``t`` of the targeted attack on the batch ``rows`` of the data."""


@dataclass
class AttackOutcome:
    """Adversarial images and their verdicts, all on the CPU; ``N`` = number of images.

    ``x_adv`` N×…; ``labels``, ``clean_pred``, ``adv_pred``, ``target`` (``-1`` if untargeted)
    int64 N; ``eligible``, ``success`` bool N; ``adv_probs`` N×K×C (``k_eval`` samples);
    ``linf``, ``l2`` the perturbation norms ``‖x_adv − x‖_∞``, ``‖x_adv − x‖₂`` (N).
    """

    attack: Attack
    x_adv: torch.Tensor
    labels: torch.Tensor
    clean_pred: torch.Tensor
    adv_pred: torch.Tensor
    target: torch.Tensor
    eligible: torch.Tensor
    success: torch.Tensor
    adv_probs: torch.Tensor
    linf: torch.Tensor
    l2: torch.Tensor
    k: int
    k_eval: int
    seed: int

    @property
    def success_rate(self) -> float | None:
        n = int(self.eligible.sum())
        return float(self.success.sum()) / n if n else None

    @property
    def clean_accuracy(self) -> float:
        return float((self.clean_pred == self.labels).double().mean())

    @property
    def adversarial_accuracy(self) -> float:
        return float((self.adv_pred == self.labels).double().mean())

    def summary(self) -> dict[str, Any]:
        """JSON-ready counts and rates."""
        return {
            "attack": self.attack.key,
            "method": self.attack.name,
            "params": self.attack.params,
            "label": self.attack.label,
            "k_attack": self.k,
            "k_eval": self.k_eval,
            "seed": self.seed,
            "images": int(self.labels.numel()),
            "eligible": int(self.eligible.sum()),
            "successful": int(self.success.sum()),
            "success_rate": self.success_rate,
            "clean_accuracy": self.clean_accuracy,
            "adversarial_accuracy": self.adversarial_accuracy,
            "mean_linf_success": _mean(self.linf[self.success]),
            "mean_l2_success": _mean(self.l2[self.success]),
        }

    def save_npz(self, path: Path | str, x_clean: torch.Tensor | None = None) -> Path:
        """``np.savez_compressed`` of the arrays (no pickled objects: load with
        ``allow_pickle=False``); ``meta`` is a JSON string with :meth:`summary`."""
        path = Path(path)
        if path.suffix != ".npz":
            raise InvalidArgument(f"{path}: adversarial examples are written as .npz")
        arrays: dict[str, np.ndarray] = {
            "x_adv": self.x_adv.numpy().astype(np.float32),
            "labels": self.labels.numpy(),
            "clean_pred": self.clean_pred.numpy(),
            "adv_pred": self.adv_pred.numpy(),
            "target": self.target.numpy(),
            "eligible": self.eligible.numpy(),
            "success": self.success.numpy(),
            "meta": np.array(json.dumps(self.summary())),
        }
        if x_clean is not None:
            arrays["x_clean"] = x_clean.cpu().numpy().astype(np.float32)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
        return path


def _mean(values: torch.Tensor) -> float | None:
    return float(values.double().mean()) if values.numel() else None


def mc_predictions(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    batch_size: int = 500,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs N×K×C, argmax of p̄ N)`` on the CPU, masks from a generator seeded ``seed``;
    ``progress``: ``evaluate``'s bar ("MC K=…")."""
    probs, _ = collect_mc(
        model, x, k, device=device, batch_size=batch_size, seed=seed, progress=progress
    )
    return probs, predictive_mean(probs).argmax(dim=1)


def choose_targets(
    labels: torch.Tensor, target: int | str, n_classes: int, seed: int
) -> torch.Tensor:
    """Target classes: a fixed class, or ``"random"`` = uniform over the classes ≠ the label."""
    if target == "random":
        rng = np.random.default_rng(seed)
        shift = torch.from_numpy(rng.integers(1, n_classes, size=labels.numel()))
        return (labels + shift) % n_classes
    if not 0 <= int(target) < n_classes:
        raise InvalidArgument(f"target class {target} out of range for {n_classes} classes")
    return torch.full_like(labels, int(target))


def run_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    attack: Attack | str,
    *,
    k: int = 10,
    k_eval: int = 100,
    clean_pred: torch.Tensor | None = None,
    batch_size: int = 100,
    seed: int = 0,
    device: torch.device | str = "cpu",
    progress: bool = False,
    step_hook: StepHook | None = None,
) -> AttackOutcome:
    """Attack every image of ``(x, y)`` with ``attack`` (or a spec such as ``"fgs:eta=0.2"``)
    through the ``k``-pass log-predictive; ``clean_pred`` (the ``k_eval`` MC prediction on ``x``,
    computed if not given) is the label the untargeted attacks push away from. Randomness: see
    :func:`attack_in_batches`; ``x`` and ``x_adv`` are evaluated with masks seeded ``seed``
    (common random numbers). ``step_hook`` sees every step of an attack that reports its
    iterates (the targeted one)."""
    device = torch.device(device)
    attack = parse_attack(attack) if isinstance(attack, str) else attack
    _check_run(x, y, batch_size)
    target = attack_targets(model, x, y, attack, seed, device)  # a bad target fails before work
    if clean_pred is None:
        _, clean_pred = mc_predictions(model, x, k_eval, device=device, seed=seed)
    labels = target if attack.targeted else clean_pred
    x_adv = attack_in_batches(
        model,
        x,
        labels,
        attack,
        k=k,
        batch_size=batch_size,
        seed=seed,
        device=device,
        progress=progress,
        step_hook=step_hook,
    )
    adv_probs, adv_pred = mc_predictions(model, x_adv, k_eval, device=device, seed=seed)
    eligible, success = verdicts(attack, y, clean_pred, adv_pred, target)
    delta = (x_adv - x.cpu()).flatten(1)
    return AttackOutcome(
        attack=attack,
        x_adv=x_adv,
        labels=y.cpu(),
        clean_pred=clean_pred.cpu(),
        adv_pred=adv_pred,
        target=target.cpu(),
        eligible=eligible.cpu(),
        success=success.cpu(),
        adv_probs=adv_probs,
        linf=delta.abs().amax(dim=1),
        l2=delta.norm(dim=1),
        k=k,
        k_eval=k_eval,
        seed=seed,
    )


def _check_run(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{x.shape[0]} images but {y.shape[0]} labels")
    if batch_size < 1:
        raise InvalidArgument(f"batch size must be ≥ 1, got {batch_size}")


def attack_targets(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    attack: Attack,
    seed: int,
    device: torch.device,
) -> torch.Tensor:
    """Target classes of a targeted attack (:func:`choose_targets` with its ``target``
    parameter), ``NO_TARGET`` for every image of an untargeted one."""
    if not attack.targeted:
        return torch.full_like(y, NO_TARGET)
    return choose_targets(y, attack.target, _n_classes(model, x, device), seed)


def attack_in_batches(
    model: nn.Module,
    x: torch.Tensor,
    labels: torch.Tensor,
    attack: Attack,
    *,
    k: int,
    batch_size: int,
    seed: int,
    device: torch.device,
    progress: bool = False,
    step_hook: StepHook | None = None,
) -> torch.Tensor:
    """``x_adv`` (on the CPU): ``attack`` on batches of ``x`` with ``labels`` (the targets of a
    targeted attack, else the labels to move away from), parameter gradients off.

    The dropout masks of the attacked ``k``-pass log-predictive come from one generator seeded
    ``seed``; the attack's own randomness in batch ``b`` from a generator seeded
    ``seed·100003 + b``."""
    masks = torch.Generator(device=device).manual_seed(seed)
    model_fn = log_predictive_fn(model, k, generator=masks)
    chunks = []
    starts = range(0, x.shape[0], batch_size)
    with frozen_parameters(model):
        for batch, start in enumerate(tqdm(starts, desc=attack.label, disable=not progress)):
            rows = slice(start, start + batch_size)
            own = torch.Generator(device=device).manual_seed(seed * BATCH_SEED_STRIDE + batch)
            adv = attack(
                model_fn,
                x[rows].to(device),
                labels[rows].to(device),
                generator=own,
                on_step=None if step_hook is None else _bind(step_hook, rows),
            )
            chunks.append(adv.cpu())
    return torch.cat(chunks)


def verdicts(
    attack: Attack,
    y: torch.Tensor,
    clean_pred: torch.Tensor,
    adv_pred: torch.Tensor,
    target: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(eligible, success)`` as in the module docstring (bool N each)."""
    correct = clean_pred == y
    if attack.targeted:
        eligible = correct & (y != target)
        return eligible, eligible & (adv_pred == target)
    return correct, correct & (adv_pred != y)


def _bind(hook: StepHook, rows: slice) -> Callable[[int, torch.Tensor], None]:
    return lambda t, x_t: hook(t, x_t, rows)


def _n_classes(model: nn.Module, x: torch.Tensor, device: torch.device) -> int:
    with torch.no_grad():
        return int(model(x[:1].to(device)).shape[1])
