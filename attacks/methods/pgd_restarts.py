"""L∞ PGD with random restarts for robust evaluation (Madry et al. 2018, their PGD-100 × restarts).

Per restart: ``x⁽⁰⁾ = P_S(x + U(−ε, ε))`` then ``steps`` times
``x⁽ᵗ⁺¹⁾ = P_S(x⁽ᵗ⁾ + a·sgn ∇ CE(log p̄(·|x⁽ᵗ⁾), y))`` with ``S`` the ε-ball ∩ [0, 1] and the
gradient through the MC log-predictive (fresh masks at every query: EOT). The default step
``a = 0.01`` is Madry et al.'s at ε = 0.3 (``evaluate-robust`` takes ``a = ε/30``): 100 steps
travel 3.3·ε, enough to cross the ball several times. Each run keeps its largest-loss iterate
(as APGD does); a restart only attacks the examples whose kept iterate the attacker's own query
still classifies correctly, and replaces it when it reaches a larger loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bayesgate.attacks.losses import cross_entropy_loss
from bayesgate.attacks.methods.apgd import BestIterate
from bayesgate.attacks.methods.base import Attack, AttackInput
from bayesgate.attacks.methods.parameters import PGDRestartsParameters
from bayesgate.attacks.model_fn import ModelFn
from bayesgate.models.training.adversarial import linf_ascent_step, project_linf


@dataclass(frozen=True)
class PGDRestarts(PGDRestartsParameters, Attack):
    """PGD-``steps`` × ``restarts`` on the cross-entropy of the model function, the robust
    evaluation's PGD (the module docstring). Its parameters are declared in
    :class:`~bayesgate.attacks.methods.parameters.PGDRestartsParameters`."""

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        x, y = batch.x.detach(), batch.y
        best = BestIterate(x.clone(), torch.full((x.shape[0],), -torch.inf, device=x.device))
        fooled = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        for _ in range(self.restarts):
            todo = (~fooled).nonzero().squeeze(1)
            if todo.numel() == 0:
                break
            adv, loss, hit = _one_run(batch.model_fn, x[todo], y[todo], self.eps, self.steps,
                                      self.eps_iter, batch.generator)  # fmt: skip
            better = loss > best.f[todo]
            best.x[todo[better]], best.f[todo[better]] = adv[better], loss[better]
            fooled[todo[better]] = hit[better]
        return best.x


def _one_run(
    fn: ModelFn,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One random start and ``steps`` ascent steps (``steps + 1`` queries); returns the
    largest-loss iterate, its loss, and whether its query saw it misclassified."""
    u = torch.rand(x.shape, generator=generator, device=x.device) * 2 - 1
    x_adv = project_linf(x + eps * u, x, eps)
    best = BestIterate(x_adv.clone(), torch.full((x.shape[0],), -torch.inf, device=x.device))
    fooled = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for t in range(steps + 1):
        x_adv = x_adv.detach().requires_grad_(True)
        z = fn(x_adv)
        loss = cross_entropy_loss(z, y)
        better = loss.detach() > best.f
        best.update(x_adv.detach(), loss.detach())
        fooled = torch.where(better, z.detach().argmax(dim=1) != y, fooled)
        if t == steps:
            break
        (grad,) = torch.autograd.grad(loss.sum(), x_adv)
        x_adv = linf_ascent_step(x_adv, x, grad, step_size, eps)
    return best.x, best.f, fooled
