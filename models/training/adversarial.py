"""Adversarial training of BB-α dropout networks: the inner maximisation as a batch transform.

Madry et al. (2018) train on ``min_θ E max_{‖δ‖∞ ≤ ε} L(θ, x + δ, y)``. Here ``L`` is the BB-α
energy the trainer minimises (:mod:`bayesgate.models.mc.losses`), so the inner attack ascends the
same objective the outer step descends:

- **PGD** (Madry et al.): ``δ_0 ~ U(−ε, ε)``, then ``steps`` times
  ``δ ← Π_ε(δ + a·sgn ∇_δ Σ_n L_n(x + δ))`` with ``x + δ`` clipped to [0, 1]; step ``a`` defaults
  to ``2.5·ε/steps`` (the iterate can cross the ball from one face to the other).
- **FGSM-RS** (Wong, Rice & Kolter 2020, "Fast is better than free"): the same with one step of
  ``a = 1.25·ε`` — the cheap option.

The stochastic network attacks itself with its own dropout masks: the model is in training mode,
so every forward draws fresh masks from the global RNG (which a resumed run restores). Each step
uses **one** MC pass (``attack_k = 1``: ``L_n`` is then the NLL under one mask draw) by default:
the sign of a one-pass gradient is an unbiased-direction EOT sample, and over the steps the
iterate sees ``steps`` independent masks, so PGD-7 averages over 7 draws at the price of 7
single passes instead of 7·K (for ``cnn-wide`` the K = 10 head costs about as much as the conv
trunk, so K passes per step would nearly double the cost of an epoch). ``attack_k > 1`` ascends
the K-pass BB-α energy instead.

ε grows linearly over the first ``eps_ramp_epochs`` epochs, per minibatch:
``ε_t = ε·min(1, t/(E·S))`` for minibatch ``t = 1, 2, …`` of the run and ``S`` minibatches per
epoch (the step size scales with it), so the first minibatch already sees a small ε > 0. With
``clean_mix = f`` the first ``round(f·B)`` examples of every (shuffled) minibatch stay clean, so
the energy is ``(1 − f)·L_adv + f·L_clean`` in expectation and the attack costs ``(1 − f)`` as
much.

**L1 examples beside the L∞ ones** (``l1_eps > 0``; Tramèr & Boneh 2019, "Adversarial training
and robustness for multiple perturbations", their "avg" strategy with the perturbation types
split over a minibatch rather than each example attacked by all): of the attacked examples of a
minibatch, the last ``round(l1_share·n)`` are replaced by :func:`energy_attack_l1`'s — SLIDE
steps (:mod:`.sparse_l1`) ascending the same energy in the L1 ball of radius ``ε₁``, from the
clean image — and the others by the L∞ attack's. The minibatches are shuffled, so which examples
get which attack is random. ``ε₁`` ramps with ``ε`` (the same factor).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bayesgate.models.mc.engine import mc_log_predictive, mc_logits
from bayesgate.models.mc.losses import bbalpha_softmax_loss
from bayesgate.models.training.adversarial_config import AdversarialConfig
from bayesgate.models.training.sparse_l1 import sparse_l1_step


def ramped_eps(eps: float, ramp_epochs: float, step: int, steps_per_epoch: int) -> float:
    """``ε·min(1, t/(E·S))`` for minibatch ``t`` (1-based over the whole run), E ramp epochs, S
    minibatches per epoch; the full ε when there is no ramp."""
    if ramp_epochs <= 0:
        return eps
    return eps * min(1.0, step / (ramp_epochs * steps_per_epoch))


def energy_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    *,
    k: int = 1,
    alpha: float = 0.5,
) -> torch.Tensor:
    """L∞ PGD with a uniform random start ascending ``Σ_n L_n(α)`` over ``k`` passes per step.

    ``δ_0 ~ U(−ε, ε)``; ``δ_{t+1} = Π(δ_t + a·sgn ∇_δ Σ_n L_n(x + δ_t))`` where ``Π`` clips
    ``δ`` to ``[−ε, ε]`` and ``x + δ`` to [0, 1]. Masks follow the model's mode (training mode:
    fresh ones each forward). Only ``∇_x`` is taken, so no parameter gradient accumulates.
    Returns ``x + δ_steps`` (detached).
    """
    if eps == 0:
        return x.detach().clone()
    start = torch.empty_like(x).uniform_(-1.0, 1.0)

    def energy(x_adv: torch.Tensor) -> torch.Tensor:
        return bbalpha_softmax_loss(mc_logits(model, x_adv, k), y, alpha) * x.shape[0]

    return signed_pgd(energy, x, start, eps, steps, step_size)


def energy_attack_l1(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    *,
    sparsity: float = 99.0,
    k: int = 1,
    alpha: float = 0.5,
) -> torch.Tensor:
    """Sparse L1 ascent (SLIDE) of ``Σ_n L_n(α)`` over ``k`` passes per step, from ``x``.

    ``x_{t+1}`` = :func:`~.sparse_l1.sparse_l1_step` of ``x_t`` along ``∇_x Σ_n L_n(x_t)``
    (L1 length ``step_size``, the top ``100 − sparsity`` % of pixels by ``|∇|``), kept in the L1
    ball ``‖x' − x‖₁ ≤ eps`` and [0, 1]. Masks follow the model's mode, as in
    :func:`energy_attack`. Returns ``x_steps`` (detached).
    """
    if eps == 0:
        return x.detach().clone()

    def energy(x_adv: torch.Tensor) -> torch.Tensor:
        return bbalpha_softmax_loss(mc_logits(model, x_adv, k), y, alpha) * x.shape[0]

    return sparse_l1_ascent(energy, x, eps, steps, step_size, sparsity)


def sparse_l1_ascent(
    objective: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    sparsity: float,
) -> torch.Tensor:
    """``x_0 = x``, then ``steps`` times ``x_{t+1}`` = :func:`~.sparse_l1.sparse_l1_step` of
    ``x_t`` along ``∇ objective(x_t)``; detached."""
    x = x.detach()
    x_adv = x.clone()
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(x_adv), x_adv)
        x_adv = sparse_l1_step(x_adv.detach(), x, grad, step_size, eps, sparsity)
    return x_adv


def signed_pgd(
    objective: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    start: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
) -> torch.Tensor:
    """``x_0 = Π(x + ε·start)`` (``start`` in [−1, 1]), then ``steps`` times
    ``x_{t+1} = Π(x_t + a·sgn ∇ objective(x_t))`` with :func:`project_linf`; detached."""
    x = x.detach()
    x_adv = project_linf(x + eps * start, x, eps)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(x_adv), x_adv)
        x_adv = linf_ascent_step(x_adv, x, grad, step_size, eps)
    return x_adv.detach()


class AdversarialBatch:
    """Batch transform ``(model, x, y) → (x', y)`` of adversarial training (the trainer's
    ``batch_transform`` hook).

    It counts the minibatches it has transformed to ramp ε; a resumed run sets ``done`` to the
    minibatches of the epochs already trained (``epochs_done·S``). Examples after the first
    ``round(clean_mix·B)`` are replaced by :func:`energy_attack`'s, or, the last
    ``round(l1_share·n)`` of those ``n`` when ``l1_eps > 0``, by :func:`energy_attack_l1`'s.
    """

    def __init__(self, config: AdversarialConfig, steps_per_epoch: int, done: int = 0) -> None:
        if steps_per_epoch < 1:
            raise ValueError(f"steps per epoch must be ≥ 1, got {steps_per_epoch}")
        self.config = config
        self.steps_per_epoch = steps_per_epoch
        self.done = done

    def eps_at(self, step: int) -> float:
        """ε of minibatch ``step`` (1-based over the run)."""
        c = self.config
        return ramped_eps(c.eps, c.eps_ramp_epochs, step, self.steps_per_epoch)

    def __call__(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        self.done += 1
        eps = self.eps_at(self.done)
        clean = round(c.clean_mix * x.shape[0])
        l1 = c.l1_rows(x.shape[0] - clean)
        cut = x.shape[0] - l1
        parts = [x[:clean]]
        if cut > clean:
            parts.append(
                energy_attack(
                    model, x[clean:cut], y[clean:cut], eps, c.n_steps, c.step_at(eps),
                    k=c.attack_k, alpha=c.alpha,
                )
            )  # fmt: skip
        if l1:
            eps1 = c.l1_eps * eps / c.eps  # ε₁ ramps with ε
            parts.append(
                energy_attack_l1(
                    model, x[cut:], y[cut:], eps1, c.l1_steps, c.l1_step_at(eps1),
                    sparsity=c.l1_sparsity, k=c.attack_k, alpha=c.alpha,
                )
            )  # fmt: skip
        return torch.cat(parts), y


def monitor_accuracy(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: AdversarialConfig,
    *,
    k: int = 10,
    seed: int = 0,
    batch_size: int = 250,
) -> dict[str, float]:
    """Clean and PGD-``steps`` accuracy of the MC predictive on a fixed held-out batch at full ε.

    The attack ascends ``−log p̄(y|x)`` over ``k`` passes (fresh masks per step, from a generator
    seeded with ``seed``, so the number is comparable across epochs); the verdict is
    ``argmax_c p̄(c|x')`` over ``k`` further passes. The step count is the training attack's
    (``1`` for FGSM-RS would flatter the model, so at least 10 steps of ``2.5·ε/steps``).

    With L1 examples (``l1_eps > 0``) also ``monitor_l1_acc``: the accuracy under SLIDE on the same
    loss at full ``ε₁``, at least 20 steps of ``2.5·ε₁/steps`` (the same masks generator).
    """
    steps = max(config.n_steps, 10)
    step_size = 2.5 * config.eps / steps
    generator = torch.Generator(device=x.device).manual_seed(seed)
    clean_hits = robust_hits = l1_hits = 0
    l1_steps = max(config.l1_steps, 20)
    was_training = model.training
    model.eval()
    try:
        for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True):
            clean_hits += _correct(model, xb, yb, k, generator).sum().item()
            adv = _predictive_pgd(model, xb, yb, config.eps, steps, step_size, k, generator)
            robust_hits += _correct(model, adv, yb, k, generator).sum().item()
            if config.l1_eps > 0:
                step = 2.5 * config.l1_eps / l1_steps
                adv = _predictive_slide(model, xb, yb, config, l1_steps, step, k, generator)
                l1_hits += _correct(model, adv, yb, k, generator).sum().item()
    finally:
        model.train(was_training)
    n = max(1, x.shape[0])
    row = {"monitor_clean_acc": clean_hits / n, "monitor_robust_acc": robust_hits / n}
    if config.l1_eps > 0:
        row["monitor_l1_acc"] = l1_hits / n
    return row


def _correct(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    with torch.no_grad():
        return mc_log_predictive(model, x, k, generator=generator).argmax(dim=1) == y


def _predictive_pgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    k: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """PGD on ``−Σ_n log p̄(y_n|x_n)`` (random start and masks drawn from ``generator``)."""
    start = torch.rand(x.shape, generator=generator, device=x.device) * 2 - 1

    def nll(x_adv: torch.Tensor) -> torch.Tensor:
        return -mc_log_predictive(model, x_adv, k, generator=generator).gather(1, y[:, None]).sum()

    return signed_pgd(nll, x, start, eps, steps, step_size)


def _predictive_slide(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: AdversarialConfig,
    steps: int,
    step_size: float,
    k: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """SLIDE on ``−Σ_n log p̄(y_n|x_n)`` from ``x`` (masks drawn from ``generator``)."""

    def nll(x_adv: torch.Tensor) -> torch.Tensor:
        return -mc_log_predictive(model, x_adv, k, generator=generator).gather(1, y[:, None]).sum()

    return sparse_l1_ascent(nll, x, config.l1_eps, steps, step_size, config.l1_sparsity)


def project_linf(x_adv: torch.Tensor, x: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """``clip_[0,1](min(max(x', x − ε), x + ε))``: the projection onto the intersection of the
    L∞ ball of radius ``eps`` around ``x`` with the image box [0, 1] (both are boxes, so
    clipping coordinate-wise is the Euclidean projection). ``eps`` may be per example (B×1×…)."""
    return torch.min(torch.max(x_adv, x - eps), x + eps).clamp_(0.0, 1.0)


def linf_ascent_step(
    x_adv: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, step_size: float, eps: float
) -> torch.Tensor:
    """``Π(x' + a·sgn g)``: one signed-gradient ascent step, projected by :func:`project_linf`."""
    with torch.no_grad():
        return project_linf(x_adv + step_size * grad.sign(), x, eps)
