"""The adversarial-training options of ``bayesgate train`` and the per-epoch robust monitor.

``--adversarial pgd|fgsm-rs`` turns on :class:`~bayesgate.models.training.adversarial.
AdversarialBatch` as the trainer's batch transform; every epoch the clean and PGD accuracy of the
first ``--monitor-size`` validation images are added to the epoch's log line, and
``--epoch-log FILE`` appends every epoch's row as one JSON line (a resumed run continues the
file).

The training modules (torch) are imported by the functions that use them, so ``train``'s parser
(:func:`add_arguments`) and its checks (:func:`check_arguments`, :func:`adversarial_config`) need
no torch: the methods it offers and the settings it checks come from the torch-free
:mod:`~bayesgate.models.training.adversarial_config`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bayesgate.errors import InvalidArgument
from bayesgate.models.training.adversarial_config import ADVERSARIAL_METHODS, AdversarialConfig

if TYPE_CHECKING:
    import torch

    from bayesgate.models.training.adversarial import AdversarialBatch
FIELDS = {
    "eps": "eps",
    "attack_steps": "steps",
    "attack_step_size": "step_size",  # default None: from ε, the steps and the method
    "eps_ramp_epochs": "eps_ramp_epochs",
    "clean_mix": "clean_mix",
    "attack_k": "attack_k",
    "monitor_size": "monitor_size",
    "l1_eps": "l1_eps",
    "l1_share": "l1_share",
    "l1_steps": "l1_steps",
    "l1_step_size": "l1_step_size",  # default None: 2.5·ε₁/steps
    "l1_sparsity": "l1_sparsity",
}
"""The options that apply with ``--adversarial`` only, and the :class:`AdversarialConfig` field
each sets."""
ADVERSARIAL_DEFAULTS: dict[str, Any] = {
    key: getattr(AdversarialConfig(), field) for key, field in FIELDS.items()
}
"""Those options' values when not given: :class:`AdversarialConfig`'s defaults."""
L1_ONLY = ("l1_share", "l1_steps", "l1_step_size", "l1_sparsity")
"""The options that apply with ``--l1-eps`` > 0 only."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "adversarial training (Madry et al. 2018; Wong et al. 2020; Tramèr & Boneh 2019)"
    )
    g.add_argument(
        "--adversarial",
        choices=ADVERSARIAL_METHODS,
        default=None,
        help="train on adversarial minibatches: PGD, or one-step FGSM with random start",
    )
    d = ADVERSARIAL_DEFAULTS
    # defaults None: a flag given without --adversarial is refused (check_arguments)
    g.add_argument("--eps", type=float, default=None, help=f"L∞ radius (default {d['eps']})")
    g.add_argument(
        "--attack-steps",
        type=int,
        default=None,
        help=f"PGD steps per minibatch (default {d['attack_steps']})",
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
        default=None,
        help="grow ε linearly from 0 over this many epochs, per minibatch (default "
        f"{d['eps_ramp_epochs']}: no ramp)",
    )
    g.add_argument(
        "--clean-mix",
        type=float,
        default=None,
        help=f"fraction of every minibatch left clean (default {d['clean_mix']})",
    )
    g.add_argument(
        "--attack-k",
        type=int,
        default=None,
        help=f"MC dropout passes per attack step (default {d['attack_k']}: fresh masks every step)",
    )
    g.add_argument(
        "--monitor-size",
        type=int,
        default=None,
        help="validation images of the per-epoch clean/robust accuracy (default "
        f"{d['monitor_size']})",
    )
    g.add_argument(
        "--l1-eps",
        type=float,
        default=None,
        help="also train on sparse L1 (SLIDE) examples of this L1 radius, beside the L∞ ones "
        "(Tramèr & Boneh 2019; their MNIST radius: 10) (default 0: none)",
    )
    g.add_argument(
        "--l1-share",
        type=float,
        default=None,
        help=f"with --l1-eps: fraction of the attacked examples of a minibatch that get the L1 "
        f"attack (default {d['l1_share']})",
    )
    g.add_argument(
        "--l1-steps",
        type=int,
        default=None,
        help=f"with --l1-eps: SLIDE steps per minibatch (default {d['l1_steps']})",
    )
    g.add_argument(
        "--l1-step-size",
        type=float,
        default=None,
        help="with --l1-eps: L1 length of a step at full ε₁ (default 2.5·ε₁/steps)",
    )
    g.add_argument(
        "--l1-sparsity",
        type=float,
        default=None,
        help=f"with --l1-eps: percentile of |∇| above which a pixel moves in a step (default "
        f"{d['l1_sparsity']}: the top 1 %%)",
    )
    g.add_argument(
        "--epoch-log", type=Path, default=None, help="append every epoch's row to this JSONL file"
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse (one line) the adversarial-only options given other than at their defaults without
    ``--adversarial``: the model would be trained on clean images while its card's command
    named them. With
    ``--adversarial``, fill in the defaults of those not given (so the recorded command spells
    them out)."""
    if args.adversarial is None:
        # a flag at its default changes nothing (and the commands that earlier runs recorded,
        # which spelled every default out, still run)
        given = [
            key
            for key, default in ADVERSARIAL_DEFAULTS.items()
            if getattr(args, key, None) not in (None, default)
        ]
        if given:
            flags = ", ".join("--" + key.replace("_", "-") for key in given)
            verb = "applies" if len(given) == 1 else "apply"
            raise InvalidArgument(
                f"{flags} {verb} with --adversarial only (pgd or fgsm-rs); without it the "
                "model is trained on clean images"
            )
        return
    with_l1 = bool(getattr(args, "l1_eps", None))
    if not with_l1:
        given = [key for key in L1_ONLY if getattr(args, key, None) is not None]
        if given:
            flags = ", ".join("--" + key.replace("_", "-") for key in given)
            verb = "applies" if len(given) == 1 else "apply"
            raise InvalidArgument(
                f"{flags} {verb} with --l1-eps > 0 only; without it no L1 examples are made"
            )
    for key, default in ADVERSARIAL_DEFAULTS.items():
        if key.startswith("l1_") and not with_l1:
            continue  # an L∞-only run's command stays as it was before the L1 options
        if getattr(args, key, None) is None:
            setattr(args, key, default)


def adversarial_config(args: argparse.Namespace, alpha: float) -> AdversarialConfig | None:
    """The inner-attack settings, or None without ``--adversarial``."""
    if args.adversarial is None:
        return None

    given = {field: getattr(args, key, None) for key, field in FIELDS.items()}
    settings = {field: value for field, value in given.items() if value is not None}
    return AdversarialConfig(method=args.adversarial, alpha=alpha, **settings)  # the rest default


def batch_transform(
    config: AdversarialConfig,
    train_images: int,
    batch_size: int,
    checkpoint_dir: Path,
    resume: bool,
) -> AdversarialBatch:
    """The transform, its ε ramp continued from the checkpoint's epochs when resuming."""
    from bayesgate.models.training.adversarial import AdversarialBatch
    from bayesgate.models.training.checkpoint import read_checkpoint

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
            from bayesgate.models.training.adversarial import monitor_accuracy

            x, y = (t.to(self.device) for t in self.monitor_data)
            row.update(monitor_accuracy(self.model, x, y, self.config, k=self.k))
        line = json.dumps({key: round(v, 5) for key, v in row.items()})
        self.printer(line)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(line + "\n")
