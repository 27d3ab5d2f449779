"""Auto-PGD (Croce & Hein 2020, "Reliable evaluation of adversarial robustness with an ensemble
of diverse parameter-free attacks", Algorithm 1), L∞, written from the paper.

For a per-example loss ``f`` (CE or DLR, :mod:`bayesgate.attacks.losses`) of the MC
log-predictive — fresh dropout masks at every query, so each gradient is an EOT estimate over K
passes — and the feasible set ``S = {x' : ‖x' − x‖∞ ≤ ε, x' ∈ [0, 1]}`` with projection ``P_S``::

    x⁽⁰⁾ = P_S(x + ε·u), u ~ U[−1, 1];  η⁽⁰⁾ = 2ε
    z⁽ᵏ⁺¹⁾ = P_S(x⁽ᵏ⁾ + η⁽ᵏ⁾·sgn ∇f(x⁽ᵏ⁾))
    x⁽ᵏ⁺¹⁾ = P_S(x⁽ᵏ⁾ + α·(z⁽ᵏ⁺¹⁾ − x⁽ᵏ⁾) + (1 − α)·(x⁽ᵏ⁾ − x⁽ᵏ⁻¹⁾)),   α = 0.75 (1 at k = 0)

keeping the best point ``x_max`` (largest ``f`` seen). At the checkpoints ``w_j = ⌈p_j·N⌉`` with
``p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)`` the step is halved and
the iterate restarted from ``x_max`` for the examples where

1. ``Σ_{i=w_{j−1}}^{w_j − 1} 1[f(x⁽ⁱ⁺¹⁾) > f(x⁽ⁱ⁾)] < ρ·(w_j − w_{j−1})``, ``ρ = 0.75``, or
2. ``η⁽ʷʲ⁻¹⁾ = η⁽ʷʲ⁾`` and ``f_max⁽ʷʲ⁻¹⁾ = f_max⁽ʷʲ⁾`` (no halving and no progress since the
   last checkpoint).

``N`` is the number of gradient queries. The returned image is ``x_max``. (AutoAttack returns the
first iterate its query sees misclassified instead; for a stochastic predictive that iterate is
often only misclassified under that query's masks, while ``x_max`` is the deepest point found.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bayesgate.attacks.losses import LOSSES, AttackLoss
from bayesgate.attacks.methods.base import Attack, AttackInput
from bayesgate.attacks.methods.parameters import APGDParameters
from bayesgate.attacks.model_fn import ModelFn
from bayesgate.models.training.adversarial import project_linf

MOMENTUM = 0.75
RHO = 0.75


def apgd_checkpoints(n_iter: int) -> list[int]:
    """``w_j = ⌈p_j·N⌉`` for ``p_j ≤ 1`` (``p_0 = 0, p_1 = 0.22``,
    ``p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)``), deduplicated and increasing."""
    if n_iter < 1:
        raise ValueError(f"APGD needs at least 1 iteration, got {n_iter}")
    p = [0.0, 0.22]
    while True:
        nxt = p[-1] + max(p[-1] - p[-2] - 0.03, 0.06)
        if nxt > 1 + 1e-9:
            break
        p.append(nxt)
    # the 1e-9 keeps float noise (0.41000000000000003) from rounding a checkpoint up
    return sorted({math.ceil(q * n_iter - 1e-9) for q in p})


@dataclass(frozen=True)
class APGD(APGDParameters, Attack):
    """APGD-CE (``loss="ce"``) or APGD-DLR (``loss="dlr"``), ``steps`` gradient queries of the
    model function (the MC log-predictive: fresh masks per query), the algorithm above. Its
    parameters are declared in :class:`~bayesgate.attacks.methods.parameters.APGDParameters`."""

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        run = APGDRun(
            batch.model_fn, LOSSES[self.loss], batch.x.detach(), batch.y, self.eps, self.steps,
            batch.generator,
        )  # fmt: skip
        return run.run()


class APGDRun:
    """The state of one APGD run over a batch (per-example step sizes and checkpoints)."""

    def __init__(
        self,
        fn: ModelFn,
        loss_fn: AttackLoss,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        n_iter: int,
        generator: torch.Generator | None,
    ) -> None:
        self.fn, self.loss_fn, self.x, self.y, self.eps = fn, loss_fn, x, y, eps
        self.n_iter = n_iter
        self.checkpoints = apgd_checkpoints(n_iter)[1:]
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        self.eta = torch.full(shape, 2.0 * eps, device=x.device)
        # drawn where the generator lives (a CPU generator may drive an attack on the GPU)
        device = x.device if generator is None else generator.device
        u = torch.rand(x.shape, generator=generator, device=device).to(x.device) * 2 - 1
        self.x_cur = project_linf(x + eps * u, x, eps)

    def query(self, x_adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-example loss and its gradient at ``x_adv``."""
        x_adv = x_adv.detach().requires_grad_(True)
        f = self.loss_fn(self.fn(x_adv), self.y)
        (grad,) = torch.autograd.grad(f.sum(), x_adv)
        return f.detach(), grad

    def run(self) -> torch.Tensor:
        f_cur, grad = self.query(self.x_cur)
        x_prev = self.x_cur
        best = BestIterate(self.x_cur.clone(), f_cur.clone(), grad.clone())
        increases = torch.zeros_like(f_cur)
        last_w, eta_last, f_max_last = 0, self.eta.clone(), best.f.clone()
        for it in range(1, self.n_iter):
            a = 1.0 if it == 1 else MOMENTUM
            with torch.no_grad():
                z = project_linf(self.x_cur + self.eta * grad.sign(), self.x, self.eps)
                step = a * (z - self.x_cur) + (1 - a) * (self.x_cur - x_prev)
                x_new = project_linf(self.x_cur + step, self.x, self.eps)
            f_new, grad_new = self.query(x_new)
            increases += (f_new > f_cur).float()
            best.update(x_new, f_new, grad_new)
            x_prev, self.x_cur, f_cur, grad = self.x_cur, x_new, f_new, grad_new
            if it not in self.checkpoints:
                continue
            cond1 = increases < RHO * (it - last_w)
            cond2 = (eta_last.flatten() == self.eta.flatten()) & (f_max_last == best.f)
            reduce = cond1 | cond2
            self.eta[reduce] /= 2
            # restart the reduced examples from x_max with its gradient and no momentum
            r = _expand(reduce, self.x_cur)
            self.x_cur = torch.where(r, best.x, self.x_cur)
            x_prev = torch.where(r, best.x, x_prev)
            grad = torch.where(r, best.grad, grad)
            f_cur = torch.where(reduce, best.f, f_cur)
            increases.zero_()
            last_w, eta_last, f_max_last = it, self.eta.clone(), best.f.clone()
        return best.x.detach()


class BestIterate:
    """The largest-loss point seen per example, its loss and (optionally) its gradient."""

    def __init__(self, x: torch.Tensor, f: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        self.x, self.f, self.grad = x, f, grad

    def update(self, x: torch.Tensor, f: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        better = f > self.f
        self.x[better], self.f[better] = x[better], f[better]
        if self.grad is not None and grad is not None:
            self.grad[better] = grad[better]


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view((-1,) + (1,) * (like.dim() - 1))
