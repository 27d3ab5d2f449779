"""What every attack shares: its parameters as a frozen dataclass, one ``__call__``, the registry.

An attack is a frozen dataclass whose fields are its parameters (with their defaults) and whose
class variables say what it is (:attr:`Attack.name`, :attr:`Attack.targeted`, :attr:`Attack.slow`).
Calling it attacks one batch::

    x_adv = attack(model_fn, x, y, generator=g)        # B×…, in [0, 1]

with ``model_fn`` the attacked function ``x ↦ log p̄(·|x)`` (B×C; see
:mod:`bayesgate.attacks.model_fn`), ``x`` images in [0, 1], ``y`` the labels an untargeted attack
pushes away from (default: the model's own prediction) or the classes a targeted attack pushes
towards, and ``generator`` the attack's own randomness (random starts, random search; the dropout
masks belong to ``model_fn``).

The parameters are declared without torch in :mod:`bayesgate.attacks.methods.parameters` (so that
the command line's parsers and the spec checks do not import torch): its fields,
:meth:`~AttackParameters.check`, :attr:`~AttackParameters.label` and
:attr:`~AttackParameters.linf_radius`, coerced to their declared types and checked when built, so
``FGS(eta="0.2") == FGS(eta=0.2)`` and a bad value fails early. An attack class derives from its
parameters class and :class:`Attack` and implements :meth:`Attack.perturb` on an
:class:`AttackInput`: ``class FGS(FGSParameters, Attack)``.

:func:`attack_registry` builds the name → class table that the spec parser, ``run_attack`` and
the CLI read (:data:`bayesgate.attacks.methods.ATTACKS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from bayesgate.attacks.methods.parameters import AttackParameters, registry
from bayesgate.attacks.model_fn import ModelFn

StepCallback = Callable[[int, torch.Tensor], None]
"""Called as ``callback(t, x_t)`` after step ``t`` (and with ``t = 0`` for the start point)."""

CLIP_MIN, CLIP_MAX = 0.0, 1.0


@dataclasses.dataclass(frozen=True)
class AttackInput:
    """One batch as :meth:`Attack.perturb` sees it, checked (see :meth:`Attack.__call__`)."""

    model_fn: ModelFn
    """The attacked function ``x ↦ log p̄(·|x)`` (B×C)."""
    x: torch.Tensor
    """Images (B×…) in [0, 1]."""
    y: torch.Tensor
    """Labels to move away from (untargeted) or target classes (targeted), int64 B."""
    generator: torch.Generator | None = None
    """The attack's own randomness."""
    on_step: StepCallback | None = None
    """``on_step(t, x_t)`` for attacks that step one at a time."""


@dataclasses.dataclass(frozen=True)
class Attack(AttackParameters):
    """Base class of the attacks: the parameters (:class:`AttackParameters`, whose subclass's
    fields are the attack's parameters) and the computation, :meth:`perturb`."""

    def __call__(
        self,
        model_fn: ModelFn,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        on_step: StepCallback | None = None,
    ) -> torch.Tensor:
        """Adversarial images for the batch ``x`` (B×…, in [0, 1]), same shape, in [0, 1].

        ``y`` (int64, B): target classes of a targeted attack (required); for an untargeted one
        the labels to move away from, by default ``argmax_c model_fn(x)`` (the model's own
        prediction, which avoids label leaking; one call of ``model_fn``). ``on_step`` sees the
        iterates of attacks that step one at a time.
        """
        check_images(x)
        if y is not None:
            y = check_labels(y, x, "target labels" if self.targeted else "labels y")
        elif self.targeted:
            raise ValueError(f"{self.name} is targeted: give the target labels y")
        else:
            y = own_prediction(model_fn, x)
        return self.perturb(AttackInput(model_fn, x, y, generator, on_step)).detach()

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        """The attack proper, on checked inputs (see :meth:`__call__`)."""
        raise NotImplementedError


def attack_registry(*classes: type[Attack]) -> dict[str, type[Attack]]:
    """``{cls.name: cls}`` for attack classes, checked: frozen dataclasses deriving from
    :class:`Attack`, unique names, a ``target`` parameter on every targeted attack."""
    return registry(classes, Attack)


def check_images(x: torch.Tensor) -> None:
    """Images must be a non-empty floating-point tensor with values in [0, 1]."""
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise ValueError("images must be a floating-point tensor")
    if x.numel() == 0:
        raise ValueError("no images to attack")
    if x.min() < CLIP_MIN or x.max() > CLIP_MAX:
        raise ValueError(
            f"images must lie in [0, 1]; got values in [{float(x.min()):.3g}, {float(x.max()):.3g}]"
        )


def check_labels(y: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    """``y`` as an int64 tensor of shape (B,) on ``x``'s device."""
    y = torch.as_tensor(y, device=x.device)
    if y.dtype != torch.int64 or y.shape != (x.shape[0],):
        raise ValueError(f"{name} must be int64 of shape ({x.shape[0]},), got {y.dtype} {y.shape}")
    return y


def own_prediction(model_fn: ModelFn, x: torch.Tensor) -> torch.Tensor:
    """``argmax_c model_fn(x)_c`` (B), without a graph."""
    with torch.no_grad():
        return model_fn(x).argmax(dim=1)
