"""Sparse L1 descent, SLIDE (Tramèr & Boneh 2019), untargeted, through cleverhans.

An L1 attack: the perturbation ``δ = x' − x`` has ``‖δ‖₁ ≤ ε`` and changes few pixels by much
rather than every pixel by a little, a threat model that neither the L∞ attacks (FGS, PGD, APGD,
Square) nor CW-L2 cover. Each step moves ``x`` by ``eps_iter`` in L1 along the sign of the
gradient of ``CE(log p̄(·|x'), y)``, spread evenly over the pixels whose ``|∇|`` is at or above the
``sparsity``-th percentile (99: about the top 1 %, 8 of MNIST's 784 pixels)::

    x_{t+1} = clip(x_t + eps_iter · sign(g) ⊙ 1[|g| ≥ q] / Σ 1[|g| ≥ q]),   q = percentile(|g|, s)

then ``δ`` is scaled back onto the L1 ball (``δ ← δ · min(1, ε/‖δ‖₁)``, cleverhans's ``renorm``,
a valid but not the closest point of the ball) and clipped to [0, 1] again. Gradient components
that would push a pixel already at 0 or 1 further out are zeroed first (``clip_grad``), so a step
is not wasted on MNIST's black background. No random start. Its parameters are declared in
:class:`~bayesgate.attacks.methods.parameters.SLIDEParameters`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.methods.base import CLIP_MAX, CLIP_MIN, Attack, AttackInput
from bayesgate.attacks.methods.parameters import SLIDEParameters


@dataclass(frozen=True)
class SLIDE(SLIDEParameters, Attack):
    """Untargeted SLIDE on ``log p̄`` as logits; see the module docstring."""

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        from cleverhans.torch.attacks.sparse_l1_descent import sparse_l1_descent

        adv = sparse_l1_descent(
            batch.model_fn,
            batch.x,
            eps=self.eps,
            eps_iter=self.eps_iter,
            nb_iter=self.steps,
            y=batch.y,
            targeted=False,
            clip_min=CLIP_MIN,
            clip_max=CLIP_MAX,
            rand_init=False,
            clip_grad=True,
            grad_sparsity=self.sparsity,
            sanity_checks=False,  # the inputs are checked by Attack.__call__
        )
        return adv.clamp(CLIP_MIN, CLIP_MAX)
