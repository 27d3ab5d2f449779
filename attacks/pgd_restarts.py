"""L∞ PGD with random restarts for robust evaluation (Madry et al. 2018, their PGD-100 × restarts).

Per restart: ``x⁽⁰⁾ = P_S(x + U(−ε, ε))`` then ``steps`` times
``x⁽ᵗ⁺¹⁾ = P_S(x⁽ᵗ⁾ + a·sgn ∇ CE(log p̄(·|x⁽ᵗ⁾), y))`` with ``S`` the ε-ball ∩ [0, 1] and the
gradient through the MC log-predictive over ``k`` fresh-mask passes (EOT). The default step
``a = ε/30`` is Madry et al.'s 0.01 at ε = 0.3: 100 steps travel 3.3·ε, enough to cross the ball
several times. Each run keeps its largest-loss iterate (as APGD does); a restart only attacks the
examples whose kept iterate the attacker's own query still classifies correctly, and replaces
it when it reaches a larger loss.
"""

from __future__ import annotations

import torch
from torch import nn

from bayesgate.attacks.apgd import BestIterate
from bayesgate.attacks.losses import cross_entropy_loss
from bayesgate.attacks.model_fn import ModelFn, frozen_parameters, log_predictive_fn
from bayesgate.models.training.adversarial import linf_ascent_step, project_linf


def pgd_restarts(
    model: nn.Module | ModelFn,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    *,
    steps: int = 100,
    restarts: int = 5,
    step_size: float | None = None,
    k: int = 10,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Adversarial images (``x``'s shape) of PGD-``steps`` × ``restarts`` on the CE of ``log p̄``."""
    if not 0 < eps <= 1:
        raise ValueError(f"eps must be in (0, 1], got {eps}")
    if steps < 1 or restarts < 1:
        raise ValueError(f"PGD needs steps ≥ 1 and restarts ≥ 1, got {steps}, {restarts}")
    step_size = eps / 30 if step_size is None else step_size
    fn = log_predictive_fn(model, k, generator=generator)
    x = x.detach()
    best = BestIterate(x.clone(), torch.full((x.shape[0],), -torch.inf, device=x.device))
    fooled = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    with frozen_parameters(model):
        for _ in range(restarts):
            todo = (~fooled).nonzero().squeeze(1)
            if todo.numel() == 0:
                break
            adv, loss, hit = _one_run(fn, x[todo], y[todo], eps, steps, step_size, generator)
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
