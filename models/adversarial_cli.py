"""The adversarial-training options of ``bayesgate train`` and the per-epoch robust monitor.

``--adversarial pgd|fgsm-rs`` turns on :class:`~bayesgate.models.training.adversarial.
AdversarialBatch` as the trainer's batch transform; every epoch the clean and PGD accuracy of the
first ``--monitor-size`` validation images are added to the epoch's log line, and
``--epoch-log FILE`` appends every epoch's row as one JSON line (a resumed run continues the
file).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from bayesgate.models.training.adversarial import (
    ADVERSARIAL_METHODS,
    AdversarialBatch,
    AdversarialConfig,
    monitor_accuracy,
)
from bayesgate.models.training.checkpoint import read_checkpoint


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("adversarial training (Madry et al. 2018; Wong et al. 2020)")
    g.add_argument(
        "--adversarial",
        choices=ADVERSARIAL_METHODS,
        default=None,
        help="train on adversarial minibatches: PGD, or one-step FGSM with random start",
    )
    g.add_argument("--eps", type=float, default=0.3, help="L∞ radius (default %(default)s)")
    g.add_argument(
        "--attack-steps", type=int, default=7, help="PGD steps per minibatch (default %(default)s)"
    )
    g.add_argument(
        "--attack-step-size",
        type=float,
        default=None,
        help="step at full ε (default 2.5·ε/steps for PGD, 1.25·ε for FGSM-RS)",
    )
    g.add_argument(
        "--eps-ramp-epochs",
        type=float,
        default=0.0,
        help="grow ε linearly from 0 over this many epochs, per minibatch (default %(default)s: "
        "no ramp)",
    )
    g.add_argument(
        "--clean-mix",
        type=float,
        default=0.0,
        help="fraction of every minibatch left clean (default %(default)s)",
    )
    g.add_argument(
        "--attack-k",
        type=int,
        default=1,
        help="MC dropout passes per attack step (default %(default)s: fresh masks every step)",
    )
    g.add_argument(
        "--monitor-size",
        type=int,
        default=500,
        help="validation images of the per-epoch clean/robust accuracy (default %(default)s)",
    )
    g.add_argument(
        "--epoch-log", type=Path, default=None, help="append every epoch's row to this JSONL file"
    )


def adversarial_config(args: argparse.Namespace, alpha: float) -> AdversarialConfig | None:
    """The inner-attack settings, or None without ``--adversarial``."""
    if args.adversarial is None:
        return None
    return AdversarialConfig(
        method=args.adversarial,
        eps=args.eps,
        steps=args.attack_steps,
        step_size=args.attack_step_size,
        eps_ramp_epochs=args.eps_ramp_epochs,
        clean_mix=args.clean_mix,
        attack_k=args.attack_k,
        alpha=alpha,
        monitor_size=args.monitor_size,
    )


def batch_transform(
    config: AdversarialConfig,
    train_images: int,
    batch_size: int,
    checkpoint_dir: Path,
    resume: bool,
) -> AdversarialBatch:
    """The transform, its ε ramp continued from the checkpoint's epochs when resuming."""
    steps_per_epoch = math.ceil(train_images / batch_size)
    epochs_done = 0
    found = read_checkpoint(Path(checkpoint_dir)) if resume else None
    if found is not None:
        epochs_done = int(found[1]["progress"]["epoch"])
    return AdversarialBatch(config, steps_per_epoch, done=epochs_done * steps_per_epoch)


class EpochLog:
    """``on_epoch`` of an adversarial run: adds the monitor's accuracies, prints, appends JSONL."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: AdversarialConfig | None,
        monitor_data: tuple[torch.Tensor, torch.Tensor] | None,
        *,
        k: int,
        device: torch.device,
        path: Path | None,
        printer: Any,
    ) -> None:
        self.model, self.config, self.k, self.device = model, config, k, device
        self.monitor_data = monitor_data
        self.path, self.printer = path, printer

    def __call__(self, row: dict[str, float]) -> None:
        if self.config is not None and self.monitor_data is not None:
            x, y = (t.to(self.device) for t in self.monitor_data)
            row.update(monitor_accuracy(self.model, x, y, self.config, k=self.k))
        line = json.dumps({key: round(v, 5) for key, v in row.items()})
        self.printer(line)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(line + "\n")
