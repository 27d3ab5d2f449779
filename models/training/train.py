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

The loop is a list of named steps: set up (:class:`_Trainer`), restore a checkpoint if resuming,
then per epoch train (:meth:`_Trainer.run_epoch`, one :meth:`_Trainer.step` per minibatch),
validate, update the early-stopping state and write a checkpoint
(:mod:`bayesgate.models.training.checkpoint`), so an interrupted run continues bit-identically.
A ``batch_transform(model, x, y) -> (x, y)`` callable, if given, replaces each minibatch before
the loss (e.g. with adversarial examples); RNG it draws from the global torch generator is part
of the checkpointed state.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from bayesgate.models.mc.engine import mc_logits
from bayesgate.models.mc.losses import bbalpha_softmax_loss, l2_penalty
from bayesgate.models.networks.bbb.layers import has_bayes_layers, kl_divergence
from bayesgate.models.networks.bbb.losses import bbb_bbalpha_loss, beta_weight
from bayesgate.models.training import checkpoint as ckpt
from bayesgate.models.training.config import TrainConfig
from bayesgate.models.training.evaluate import evaluate

Data = tuple[torch.Tensor, torch.Tensor]
BatchTransform = Callable[[nn.Module, torch.Tensor, torch.Tensor], Data]
HISTORY_FILE = "history.jsonl"


@dataclass
class TrainResult:
    """Per-epoch history and the validation metrics of the weights kept."""

    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    val_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of this call (one sitting of a resumed run)
    samples_per_second: float = 0.0  # examples·K per second over all epochs' training time


@dataclass
class _Progress:
    """What the loop has done so far: saved in every checkpoint."""

    epoch: int = 0  # epochs completed
    history: list[dict[str, float]] = field(default_factory=list)
    best_ll: float | None = None
    best_epoch: int = 0
    stale: int = 0  # epochs without a better validation log-likelihood
    stopped: bool = False  # early stopping fired
    best_state: dict[str, torch.Tensor] | None = None  # kept with early stopping or keep_best

    def scalars(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "best_state"}


def train(
    model: nn.Module,
    train_data: Data,
    val_data: Data | None,
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    progress: bool = True,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    checkpointing: ckpt.Checkpointing | None = None,
    batch_transform: BatchTransform | None = None,
) -> TrainResult:
    """Train ``model`` in place; returns the history. Ends with the best-validation-LL weights
    when early stopping is on (``patience > 0``) or ``keep_best`` is set, the last ones
    otherwise. With ``checkpointing`` a checkpoint is written after every epoch (the best weights
    in it too), and ``resume=True`` continues from it."""
    start = time.perf_counter()
    trainer = _Trainer(model, train_data, config, device, progress, batch_transform)
    state = _Progress()
    if checkpointing is not None:
        state = _start_or_resume(trainer, checkpointing)
    for epoch in range(state.epoch + 1, config.epochs + 1):
        if state.stopped:
            break
        row = trainer.run_epoch(epoch)
        if val_data is not None:
            row.update(trainer.validate(val_data))
        _record_epoch(state, row, model, config)
        if checkpointing is not None:
            _save(trainer, state, checkpointing)
        if on_epoch:
            on_epoch(row)
    return _finish(trainer, state, time.perf_counter() - start)


class _Trainer:
    """The pieces of one run: model, optimiser, LR schedule, data order, per-batch step."""

    def __init__(
        self,
        model: nn.Module,
        train_data: Data,
        config: TrainConfig,
        device: torch.device | str,
        progress: bool,
        batch_transform: BatchTransform | None,
    ) -> None:
        self.device = torch.device(device)
        torch.manual_seed(config.seed)
        self.model = model.to(self.device)
        self.config = config
        self.x, self.y = train_data
        self.k = config.k_train if getattr(model, "stochastic", True) else 1
        self.bayesian = has_bayes_layers(model)
        self.steps_per_epoch = math.ceil(self.x.shape[0] / config.batch_size)
        self.optimizer = _make_optimizer(model, config)
        self.schedule = _make_schedule(self.optimizer, config, self.steps_per_epoch * config.epochs)
        self.data_order = torch.Generator().manual_seed(config.seed)
        self.progress = progress
        self.batch_transform = batch_transform

    def run_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training data in a fresh random order; the epoch's history row."""
        self.model.train()
        n, size = self.x.shape[0], self.config.batch_size
        order = torch.randperm(n, generator=self.data_order)
        bar = tqdm(range(0, n, size), desc=f"epoch {epoch}/{self.config.epochs}",
                   disable=not self.progress, leave=False)  # fmt: skip
        total, seen, t0 = 0.0, 0, time.perf_counter()
        for step, i in enumerate(bar, start=1):
            idx = order[i : i + size]
            x = self.x[idx].to(self.device, non_blocking=True)
            y = self.y[idx].to(self.device, non_blocking=True)
            loss, rows = self.step(x, y, step)
            total, seen = total + loss * rows, seen + rows
            rate = seen * self.k / (time.perf_counter() - t0)
            bar.set_postfix(loss=f"{total / seen:.4f}", rows_per_s=f"{rate:.0f}")
        return {
            "epoch": epoch,
            "train_loss": total / seen,
            "seconds": time.perf_counter() - t0,
            "lr": self.optimizer.param_groups[0]["lr"],  # after the epoch's last step
        }

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[float, int]:
        """One optimiser step on a minibatch (after ``batch_transform``); (loss, rows)."""
        if self.batch_transform is not None:
            x, y = self.batch_transform(self.model, x, y)
        loss, objective = self.loss(x, y, step)
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        self.optimizer.step()
        if self.schedule is not None:
            self.schedule.step()
        return loss.item(), int(y.shape[0])

    def loss(
        self, x: torch.Tensor, y: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(BB-α loss, objective minimised): the objective adds λ·Σ‖W‖², or for BBB networks
        the loss already holds β·KL/N."""
        config = self.config
        logits = mc_logits(self.model, x, self.k)
        if self.bayesian:
            beta = beta_weight(config.beta_schedule, step, self.steps_per_epoch)
            n = self.x.shape[0]
            loss = bbb_bbalpha_loss(logits, y, kl_divergence(self.model), n, beta, config.alpha)
            return loss, loss
        loss = bbalpha_softmax_loss(logits, y, config.alpha)
        if not config.weight_decay:
            return loss, loss
        return loss, loss + config.weight_decay * l2_penalty(self.model)

    def validate(self, val_data: Data) -> dict[str, float]:
        """Validation metrics (``val_*``) at K = ``k_val``, masks drawn from a seeded generator."""
        val = evaluate(
            self.model, *val_data, k=self.config.k_val, device=self.device, seed=self.config.seed
        )
        return {f"val_{key}": value for key, value in val.items()}

    def tensors(self, state: _Progress) -> dict[str, torch.Tensor]:
        """Model, optimiser state and best weights, for a checkpoint."""
        opt_tensors, _ = ckpt.split_optimizer_state(self.optimizer.state_dict())
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()} | opt_tensors
        if state.best_state is not None:
            tensors |= {f"best.{k}": v for k, v in state.best_state.items()}
        return tensors


def _record_epoch(state: _Progress, row: dict, model: nn.Module, config: TrainConfig) -> None:
    """Append the row and update the early-stopping state from its validation log-likelihood."""
    state.epoch = int(row["epoch"])
    state.history.append(row)
    if "val_log_likelihood" not in row:
        return
    ll = row["val_log_likelihood"]
    if state.best_ll is None or ll > state.best_ll:
        state.best_ll, state.stale, state.best_epoch = ll, 0, state.epoch
        if config.keeps_best:
            state.best_state = copy.deepcopy(model.state_dict())
    else:
        state.stale += 1
    state.stopped = bool(config.patience) and state.stale >= config.patience


def _run_settings(trainer: _Trainer, checkpointing: ckpt.Checkpointing) -> dict:
    """The settings a resumed run must share with its checkpoint. ``epochs`` may grow with a
    constant learning rate (the run just continues); a cosine schedule is laid out over all
    epochs, so there it must match too."""
    settings = asdict(trainer.config) | checkpointing.settings
    settings["train_images"] = int(trainer.x.shape[0])
    if trainer.config.lr_schedule == "constant":
        del settings["epochs"]
    if not trainer.config.keep_best:
        del settings["keep_best"]  # checkpoints written before the option existed still resume
    else:
        del settings["patience"]  # with the best weights kept, patience only decides when to stop
    return json.loads(json.dumps(settings))  # as read back from the checkpoint (lists, not tuples)


def _start_or_resume(trainer: _Trainer, checkpointing: ckpt.Checkpointing) -> _Progress:
    """Restore the checkpoint when resuming; refuse to overwrite an unfinished run otherwise."""
    directory = Path(checkpointing.directory)
    found = ckpt.read_checkpoint(directory)
    if found is None:
        return _Progress()
    tensors, saved = found
    unfinished = not ckpt.is_finished(saved)
    if not checkpointing.resume:
        if unfinished:
            raise ckpt.CheckpointError(
                f"{directory} holds an unfinished run (epoch {saved['progress']['epoch']} of "
                f"{saved['epochs']}); pass --resume to continue it, or remove the directory"
            )
        return _Progress()
    saved_settings = dict(saved["settings"])
    if trainer.config.keep_best:
        saved_settings.pop("patience", None)  # a keep-best run's stopping rule may change
    ckpt.check_same_settings(saved_settings, _run_settings(trainer, checkpointing), directory)
    if saved["progress"]["epoch"] > trainer.config.epochs:
        raise ckpt.CheckpointError(
            f"the checkpoint in {directory} has {saved['progress']['epoch']} epochs done, more "
            f"than --epochs {trainer.config.epochs}"
        )
    progress = _restore(trainer, tensors, saved)
    if trainer.config.keep_best:  # stop (or go on) by this run's patience, not the saved one's
        patience = trainer.config.patience
        progress.stopped = bool(patience) and progress.stale >= patience
    return progress


def _restore(trainer: _Trainer, tensors: dict[str, torch.Tensor], saved: dict) -> _Progress:
    """Load model, optimiser, schedule, RNG states and the loop's progress from a checkpoint."""
    trainer.model.load_state_dict(ckpt.prefixed(tensors, "model"))
    trainer.optimizer.load_state_dict(ckpt.join_optimizer_state(tensors, saved["optimizer"]))
    if trainer.schedule is not None:
        trainer.schedule.load_state_dict(saved["schedule"])
    ckpt.restore_rng_states(saved["rng"], trainer.data_order)
    best = ckpt.prefixed(tensors, "best")
    return _Progress(**saved["progress"], best_state=best or None)


def _save(trainer: _Trainer, state: _Progress, checkpointing: ckpt.Checkpointing) -> None:
    """Write the checkpoint and the history (``history.jsonl``) of the epoch just finished."""
    directory = Path(checkpointing.directory)
    _, optimizer_rest = ckpt.split_optimizer_state(trainer.optimizer.state_dict())
    ckpt.write_checkpoint(
        directory,
        trainer.tensors(state),
        {
            "epoch": state.epoch,
            "epochs": trainer.config.epochs,
            "settings": _run_settings(trainer, checkpointing),
            "progress": state.scalars(),
            "optimizer": optimizer_rest,
            "schedule": trainer.schedule.state_dict() if trainer.schedule is not None else None,
            "rng": ckpt.rng_states(trainer.data_order),
        },
    )
    lines = "".join(json.dumps(row) + "\n" for row in state.history)
    ckpt.atomic_write(directory / HISTORY_FILE, lines.encode())


def _finish(trainer: _Trainer, state: _Progress, seconds: float) -> TrainResult:
    """Put the kept weights in the model and summarise the run."""
    config, model = trainer.config, trainer.model
    if state.best_state is not None:
        model.load_state_dict(state.best_state)
    best_epoch = state.best_epoch if config.keeps_best else len(state.history)
    last = next((r for r in state.history if r["epoch"] == best_epoch), state.history[-1])
    train_seconds = sum(r["seconds"] for r in state.history)
    rows = trainer.x.shape[0] * trainer.k * len(state.history)
    model.eval()
    return TrainResult(
        history=state.history,
        best_epoch=best_epoch,
        val_metrics={k[4:]: v for k, v in last.items() if k.startswith("val_")},
        seconds=seconds,
        samples_per_second=rows / train_seconds if train_seconds else 0.0,
    )


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
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
