"""The paper's targeted iterative FGS (Li & Gal 2017), one cleverhans step at a time."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.methods.base import Attack, AttackInput
from bayesgate.attacks.methods.parameters import TargetedFGSParameters
from bayesgate.attacks.methods.pgd import linf_pgd


@dataclass(frozen=True)
class TargetedFGS(TargetedFGSParameters, Attack):
    """``x_t = clip(x_{t−1} + η·sgn ∇_x log p̄(y_target|x_{t−1}), 0, 1)``, ``t = 1…steps``.

    There is no ε-ball other than the one the steps imply (``‖x_t − x‖_∞ ≤ t·η``). Each step is
    cleverhans' ``projected_gradient_descent(targeted=True, rand_init=False, nb_iter=1,
    eps=eps_iter=η)`` started from ``x_{t−1}``, which equals step t of one run with
    ``nb_iter=steps`` and ``eps=steps·η`` (tested); running step by step lets ``on_step(t, x_t)``
    see every intermediate image for the step sweep (it also gets ``t = 0, x``). Its parameters
    are declared in :class:`~bayesgate.attacks.methods.parameters.TargetedFGSParameters`.
    """

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
