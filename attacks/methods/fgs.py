"""Untargeted Fast Gradient Sign (Goodfellow et al. 2015), one step, through cleverhans."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bayesgate.attacks.methods.base import CLIP_MAX, CLIP_MIN, Attack, AttackInput
from bayesgate.attacks.methods.parameters import FGSParameters


@dataclass(frozen=True)
class FGS(FGSParameters, Attack):
    """``x' = clip(x − η·sgn ∇_x log p̄(y|x), 0, 1)``, ``y`` the model's own prediction.

    cleverhans' ``fast_gradient_method`` (L∞, untargeted) ascends ``−log p̄(y|x)``, i.e. descends
    ``log p̄(y|x)`` — the same update. ``eta = 0`` returns the images unchanged. Its parameter
    (``eta``) is declared in :class:`~bayesgate.attacks.methods.parameters.FGSParameters`.
    """

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        from cleverhans.torch.attacks.fast_gradient_method import fast_gradient_method

        if self.eta == 0:
            return batch.x.detach().clone()
        return fast_gradient_method(
            batch.model_fn,
            batch.x,
            self.eta,
            np.inf,
            clip_min=CLIP_MIN,
            clip_max=CLIP_MAX,
            y=batch.y,
            targeted=False,
        )
