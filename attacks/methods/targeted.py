"""The paper's targeted iterative FGS (Li & Gal 2017), one cleverhans step at a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from bayesgate.attacks.methods.base import (
    PARSE,
    Attack,
    AttackInput,
    check,
)
from bayesgate.attacks.methods.pgd import linf_pgd
from bayesgate.errors import InvalidArgument

RANDOM = "random"


def parse_target(attack: str, value: Any) -> int | str:
    """A target class index, or ``"random"`` (a random class ≠ the label per image)."""
    if value == RANDOM:
        return RANDOM
    try:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"attack {attack!r}: target must be a class index or 'random', got {value!r}"
        ) from exc


@dataclass(frozen=True)
class TargetedFGS(Attack):
    """``x_t = clip(x_{t−1} + η·sgn ∇_x log p̄(y_target|x_{t−1}), 0, 1)``, ``t = 1…steps``.

    There is no ε-ball other than the one the steps imply (``‖x_t − x‖_∞ ≤ t·η``). Each step is
    cleverhans' ``projected_gradient_descent(targeted=True, rand_init=False, nb_iter=1,
    eps=eps_iter=η)`` started from ``x_{t−1}``, which equals step t of one run with
    ``nb_iter=steps`` and ``eps=steps·η`` (tested); running step by step lets ``on_step(t, x_t)``
    see every intermediate image for the step sweep (it also gets ``t = 0, x``).
    """

    name: ClassVar[str] = "targeted"
    requires: ClassVar[tuple[str, ...]] = ("cleverhans",)
    targeted: ClassVar[bool] = True

    eta: float = 0.01
    """Step size η."""
    steps: int = 40
    """Number of steps."""
    target: int | str = field(default=RANDOM, metadata={PARSE: parse_target})
    """Target class, or ``"random"``: a class ≠ the label, drawn per image (seeded)."""

    def check(self) -> None:
        check(0.0 < self.eta <= 1.0, f"targeted eta must be in (0, 1], got {self.eta}")
        check(self.steps >= 0, f"targeted steps must be ≥ 0, got {self.steps}")
        check(self.target == RANDOM or self.target >= 0, "targeted target must be ≥ 0")

    @property
    def linf_radius(self) -> float:
        """``steps·η``: each step moves a pixel by at most η."""
        return self.steps * self.eta

    @property
    def label(self) -> str:
        to = "" if self.target == RANDOM else f" →{self.target}"
        return f"targeted {self.steps}×η={self.eta:g}{to}"

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        x_t, on_step = batch.x.detach().clone(), batch.on_step
        if on_step:
            on_step(0, x_t)
        for t in range(1, self.steps + 1):
            x_t = linf_pgd(
                batch,
                eps=self.eta,
                eps_iter=self.eta,
                steps=1,
                targeted=True,
                random_start=False,
                x=x_t,
            ).detach()
            if on_step:
                on_step(t, x_t)
        return x_t
