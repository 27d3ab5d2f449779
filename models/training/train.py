"""Training loop for dropout networks with the BB-α loss (Li & Gal 2017).

Objective per minibatch: ``mean_n L_n(α) + λ·Σ_i ‖W_i‖²`` with the K passes vectorised by
:func:`bayesgate.models.mc.engine.mc_logits` (trunk once, head on ``K·B`` rows). Deterministic
baselines are
trained by maximum likelihood (K = 1, dropout as a regulariser).

Bayes-by-Backprop networks (any network holding
:class:`bayesgate.models.networks.bbb.layers.BayesLayer`) are
trained instead on ``mean_n L_n(α) + β_i·KL[q ‖ p]/N``
(:func:`bayesgate.models.networks.bbb.losses.bbb_bbalpha_loss`; α = 0 is the ELBO) with β_i from
``beta_schedule``
for minibatch i of the epoch; the prior takes the place of the L2 term, so ``weight_decay`` is not
applied to them.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from bayesgate.models.mc.engine import mc_logits
from bayesgate.models.mc.losses import bbalpha_softmax_loss, l2_penalty
from bayesgate.models.networks.bbb.layers import has_bayes_layers, kl_divergence
from bayesgate.models.networks.bbb.losses import bbb_bbalpha_loss, beta_weight, parse_beta_schedule
from bayesgate.models.training.evaluate import evaluate

OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("constant", "cosine")
LOSSES = ("bbalpha", "elbo")  # "elbo" = BB-α with α = 0 (MC-dropout VI / Bayes by Backprop)


@dataclass
class TrainConfig:
    """Hyper-parameters of one training run (stored in the model card)."""

    alpha: float = 0.5
    k_train: int = 10
    epochs: int = 10
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-6
    seed: int = 0
    patience: int = 0  # early stopping on validation log-likelihood; 0 = off
    k_val: int = 10
    loss: str = "bbalpha"
    beta_schedule: str = (
        "blundell"  # KL weight schedule of BBB networks (bayesgate.models.networks.bbb.losses)
    )
    lr_schedule: str = "constant"  # or "cosine": lr·½(1 + cos(π·t/T)) over all T minibatches

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.loss == "elbo" and self.alpha != 0:
            raise ValueError(f"the ELBO is the α = 0 limit of BB-α; got alpha={self.alpha}")
        parse_beta_schedule(self.beta_schedule)
        checks = [
            (self.alpha >= 0, f"alpha must be ≥ 0, got {self.alpha}"),
            (self.k_train >= 1, f"k-train must be ≥ 1, got {self.k_train}"),
            (self.epochs >= 1, f"epochs must be ≥ 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be ≥ 1, got {self.batch_size}"),
            (
                self.optimizer in OPTIMIZERS,
                f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}",
            ),
            (self.lr > 0, f"learning rate must be > 0, got {self.lr}"),
            (
                self.lr_schedule in LR_SCHEDULES,
                f"lr schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}",
            ),
            (self.weight_decay >= 0, f"weight decay must be ≥ 0, got {self.weight_decay}"),
            (self.patience >= 0, f"patience must be ≥ 0, got {self.patience}"),
            (self.k_val >= 1, f"k-val must be ≥ 1, got {self.k_val}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass
class TrainResult:
    """Per-epoch history and the validation metrics of the weights kept."""

    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    val_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    samples_per_second: float = 0.0  # examples·K per second over the whole run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def train(
    model: nn.Module,
    train_data: tuple[torch.Tensor, torch.Tensor],
    val_data: tuple[torch.Tensor, torch.Tensor] | None,
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    progress: bool = True,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place; returns the history. Keeps the best-validation weights when
    early stopping is on (``patience > 0``), the last ones otherwise."""
    device = torch.device(device)
    torch.manual_seed(config.seed)
    model.to(device)
    k = config.k_train if getattr(model, "stochastic", True) else 1
    bayesian = has_bayes_layers(model)
    optimizer = _make_optimizer(model, config)
    x_train, y_train = train_data
    n = x_train.shape[0]
    steps_per_epoch = math.ceil(n / config.batch_size)
    schedule = _make_schedule(optimizer, config, steps_per_epoch * config.epochs)
    shuffle = torch.Generator().manual_seed(config.seed)
    result = TrainResult()
    best_ll, best_state, stale = -math.inf, None, 0
    start = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        model.train()
        order = torch.randperm(n, generator=shuffle)
        bar = tqdm(
            range(0, n, config.batch_size),
            desc=f"epoch {epoch}/{config.epochs}",
            disable=not progress,
            leave=False,
        )
        total, seen, t0 = 0.0, 0, time.perf_counter()
        for step, i in enumerate(bar, start=1):
            idx = order[i : i + config.batch_size]
            xb, yb = (
                x_train[idx].to(device, non_blocking=True),
                y_train[idx].to(device, non_blocking=True),
            )
            logits = mc_logits(model, xb, k)
            if bayesian:
                beta = beta_weight(config.beta_schedule, step, steps_per_epoch)
                loss = bbb_bbalpha_loss(logits, yb, kl_divergence(model), n, beta, config.alpha)
                objective = loss
            else:
                loss = bbalpha_softmax_loss(logits, yb, config.alpha)
                objective = (
                    loss + config.weight_decay * l2_penalty(model) if config.weight_decay else loss
                )
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
            total += loss.item() * idx.numel()
            seen += idx.numel()
            bar.set_postfix(
                loss=f"{total / seen:.4f}",
                rows_per_s=f"{seen * k / (time.perf_counter() - t0):.0f}",
            )
        row = {
            "epoch": epoch,
            "train_loss": total / seen,
            "seconds": time.perf_counter() - t0,
            "lr": optimizer.param_groups[0]["lr"],  # after the epoch's last step
        }
        if val_data is not None:
            val = evaluate(model, *val_data, k=config.k_val, device=device, seed=config.seed)
            row.update({f"val_{key}": value for key, value in val.items()})
            if val["log_likelihood"] > best_ll:
                best_ll, stale, result.best_epoch = val["log_likelihood"], 0, epoch
                if config.patience:
                    best_state = copy.deepcopy(model.state_dict())
            else:
                stale += 1
        result.history.append(row)
        if on_epoch:
            on_epoch(row)
        if config.patience and stale >= config.patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    if not config.patience:
        result.best_epoch = len(result.history)
    last = next((r for r in result.history if r["epoch"] == result.best_epoch), result.history[-1])
    result.val_metrics = {k_[4:]: v for k_, v in last.items() if k_.startswith("val_")}
    result.seconds = time.perf_counter() - start
    train_seconds = sum(r["seconds"] for r in result.history)
    result.samples_per_second = (
        n * k * len(result.history) / train_seconds if train_seconds else 0.0
    )
    model.eval()
    return result


def _make_schedule(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Per-minibatch schedule: cosine annealing ``lr_t = lr·½(1 + cos(π·t/T))``, ``T`` = all
    minibatches of the run (so the last step reaches 0), or None for a constant rate."""
    if config.lr_schedule == "constant":
        return None
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps, eta_min=0.0)


def _make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
