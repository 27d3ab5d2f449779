"""The settings of a training run (:class:`TrainConfig`) and the values they choose among, without
torch.

Why a module of its own: ``bayesgate train`` offers these choices (``--loss``, ``--optimizer``,
``--lr-schedule``) and checks its settings by building a :class:`TrainConfig` before anything is
loaded or trained. Read from here, its ``--help`` and a setting it refuses answer without importing
torch (~3 s); the trainer (:mod:`.train`, torch) imports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bayesgate.errors import InvalidArgument

OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("constant", "cosine")
LOSSES = ("bbalpha", "elbo")  # "elbo" = BB-α with α = 0 (MC-dropout VI / Bayes by Backprop)
BETA_SCHEDULES = ("blundell", "uniform")
"""The KL-weight schedules of Bayes-by-Backprop training, by name
(:func:`bayesgate.models.networks.bbb.losses.beta_weight`)."""


def parse_beta_schedule(text: str | float) -> str | float:
    """``"blundell"``, ``"uniform"`` or a constant β ≥ 0 (a number or its string form)."""
    if isinstance(text, str) and text in BETA_SCHEDULES:
        return text
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"beta schedule must be one of {', '.join(BETA_SCHEDULES)} or a number ≥ 0, "
            f"got {text!r}"
        ) from None
    if not value >= 0:  # also rejects NaN
        raise InvalidArgument(f"a constant beta must be ≥ 0, got {text!r}")
    return value


@dataclass
class TrainConfig:
    """Hyper-parameters of one training run (stored in the model card)."""

    alpha: float = 0.5
    k_train: int = 10
    epochs: int = 10
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9  # SGD only (Keras' default SGD, used by Li & Gal's code: 0)
    weight_decay: float = 1e-6
    seed: int = 0
    patience: int = 0  # early stopping on validation log-likelihood; 0 = off
    keep_best: bool = False  # end with the best-validation-LL weights, without stopping early
    k_val: int = 10
    loss: str = "bbalpha"
    beta_schedule: str = (
        "blundell"  # KL weight schedule of BBB networks (BETA_SCHEDULES, or a constant β)
    )
    lr_schedule: str = "constant"  # or "cosine": lr·½(1 + cos(π·t/T)) over all T minibatches

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise InvalidArgument(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.loss == "elbo" and self.alpha != 0:
            raise InvalidArgument(f"the ELBO is the α = 0 limit of BB-α; got alpha={self.alpha}")
        parse_beta_schedule(self.beta_schedule)
        checks = [
            (
                math.isfinite(self.alpha) and self.alpha >= 0,
                f"alpha must be a finite number ≥ 0, got {self.alpha}",
            ),
            (self.k_train >= 1, f"k-train must be ≥ 1, got {self.k_train}"),
            (self.epochs >= 1, f"epochs must be ≥ 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be ≥ 1, got {self.batch_size}"),
            (
                self.optimizer in OPTIMIZERS,
                f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}",
            ),
            (self.lr > 0, f"learning rate must be > 0, got {self.lr}"),
            (self.momentum >= 0, f"momentum must be ≥ 0, got {self.momentum}"),
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
                raise InvalidArgument(message)

    @property
    def keeps_best(self) -> bool:
        """Whether the run ends with its best-validation-LL weights (early stopping or
        ``keep_best``) rather than its last ones."""
        return bool(self.patience) or self.keep_best
