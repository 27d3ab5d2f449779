"""Untargeted Carlini–Wagner L2 (2017) through cleverhans."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.methods.base import CLIP_MAX, CLIP_MIN, Attack, AttackInput
from bayesgate.attacks.methods.parameters import CWL2Parameters


@dataclass(frozen=True)
class CWL2(CWL2Parameters, Attack):
    """Carlini–Wagner L2 on ``log p̄`` as logits.

    Minimises ``‖x' − x‖²₂ + c·max(log p̄(y|x') − max_{c'≠y} log p̄(c'|x') + κ, 0)`` over
    ``x' = (tanh(w) + 1)/2`` with Adam (``lr``, ``iterations`` per binary-search step on ``c``,
    starting at ``const``). Examples it never makes adversarial come back unchanged. The
    defaults are cut down from the paper's (1000 iterations, 9 binary steps) for CPU time. The
    margin ``κ = confidence = 1`` nat matters for dropout nets: with ``κ = 0`` the attack stops on
    the decision boundary of *one* draw of masks, and fresh masks put most such images back.
    Its parameters are declared in :class:`~bayesgate.attacks.methods.parameters.CWL2Parameters`.
    """

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        from cleverhans.torch.attacks.carlini_wagner_l2 import carlini_wagner_l2

        with torch.no_grad():
            n_classes = batch.model_fn(batch.x[:1]).shape[1]
        adv = carlini_wagner_l2(
            batch.model_fn,
            batch.x,
            n_classes,
            y=batch.y,
            targeted=False,
            lr=self.lr,
            confidence=self.confidence,
            clip_min=CLIP_MIN,
            clip_max=CLIP_MAX,
            initial_const=self.const,
            binary_search_steps=self.binary_steps,
            max_iterations=self.iterations,
        )
        return adv.clamp(CLIP_MIN, CLIP_MAX)
