"""Adversarial attacks on one batch, as thin wrappers over ``cleverhans.torch.attacks``.

Every attack takes ``model`` (a network with a trunk/head split, attacked through its MC
log-predictive over ``k`` dropout passes — see :mod:`bayesgate.attacks.model_fn` — or a plain
callable
returning log-probabilities/logits), images ``x`` (B×…, in [0, 1]) and returns adversarial
images of the same shape, clipped to [0, 1].

- :func:`fgs` — untargeted Fast Gradient Sign (Goodfellow et al. 2015), one step
  ``x' = clip(x − η·sgn ∇_x log p̄(y|x))`` with ``y`` the model's own prediction.
- :func:`targeted_iterative_fgs` — the paper's targeted attack
  ``x_t = clip(x_{t−1} + η·sgn ∇_x log p̄(y_target|x_{t−1}))``, ``t = 1…steps``.
- :func:`pgd` — untargeted L∞ PGD (Madry et al. 2018): random start in the ε-ball, steps of
  ``eps_iter``, projection onto the ball.
- :func:`cw_l2` — untargeted Carlini–Wagner L2 (2017).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from cleverhans.torch.attacks.carlini_wagner_l2 import carlini_wagner_l2
from cleverhans.torch.attacks.fast_gradient_method import fast_gradient_method
from cleverhans.torch.attacks.projected_gradient_descent import projected_gradient_descent
from torch import nn

from bayesgate.attacks.model_fn import ModelFn, frozen_parameters, log_predictive_fn

StepCallback = Callable[[int, torch.Tensor], None]
"""Called as ``callback(t, x_t)`` after step ``t`` (and with ``t = 0`` for the start point)."""

CLIP_MIN, CLIP_MAX = 0.0, 1.0


def _check_images(x: torch.Tensor) -> None:
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise ValueError("images must be a floating-point tensor")
    if x.numel() == 0:
        raise ValueError("no images to attack")
    if x.min() < CLIP_MIN or x.max() > CLIP_MAX:
        raise ValueError(
            f"images must lie in [0, 1]; got values in [{float(x.min()):.3g}, {float(x.max()):.3g}]"
        )


def _check_labels(y: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    y = torch.as_tensor(y, device=x.device)
    if y.dtype != torch.int64 or y.shape != (x.shape[0],):
        raise ValueError(f"{name} must be int64 of shape ({x.shape[0]},), got {y.dtype} {y.shape}")
    return y


def _own_prediction(fn: ModelFn, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return fn(x).argmax(dim=1)


def fgs(
    model: nn.Module | ModelFn,
    x: torch.Tensor,
    eta: float,
    *,
    k: int = 10,
    y: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Untargeted FGS ``clip(x − η·sgn ∇_x log p̄(y|x), 0, 1)``, shape of ``x``.

    ``y`` (B, int64) defaults to the model's own prediction ``argmax_c log p̄(c|x)`` (one
    ``k``-pass evaluation), avoiding label leaking. cleverhans' untargeted step ascends
    ``−log p̄(y|x)``, i.e. descends ``log p̄(y|x)`` — the same update.
    """
    _check_images(x)
    if eta < 0:
        raise ValueError(f"step size eta must be ≥ 0, got {eta}")
    fn = log_predictive_fn(model, k, generator=generator)
    if eta == 0:
        return x.detach().clone()
    with frozen_parameters(model):
        y = _own_prediction(fn, x) if y is None else _check_labels(y, x, "labels y")
        adv = fast_gradient_method(
            fn, x, eta, np.inf, clip_min=CLIP_MIN, clip_max=CLIP_MAX, y=y, targeted=False
        )
    return adv.detach()


def targeted_iterative_fgs(
    model: nn.Module | ModelFn,
    x: torch.Tensor,
    target: torch.Tensor,
    eta: float = 0.01,
    steps: int = 40,
    *,
    k: int = 10,
    generator: torch.Generator | None = None,
    callback: StepCallback | None = None,
) -> torch.Tensor:
    """The paper's targeted iterative FGS, ``steps`` steps of size ``eta``; returns ``x_steps``.

    ``x_t = clip(x_{t−1} + η·sgn ∇_x log p̄(y_target|x_{t−1}), 0, 1)``. There is no ε-ball
    other than the one the steps imply (``‖x_t − x‖_∞ ≤ t·η``). Each step is cleverhans'
    ``projected_gradient_descent(targeted=True, rand_init=False, nb_iter=1, eps=eps_iter=η)``
    started from ``x_{t−1}``, which equals step t of one run with ``nb_iter=steps`` and
    ``eps=steps·η`` (tested); running step by step lets ``callback(t, x_t)`` see every
    intermediate image for the step sweep (it also gets ``t = 0, x``).
    """
    _check_images(x)
    target = _check_labels(target, x, "target labels")
    if eta <= 0 or eta > CLIP_MAX - CLIP_MIN:
        raise ValueError(f"step size eta must be in (0, 1], got {eta}")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    fn = log_predictive_fn(model, k, generator=generator)
    x_t = x.detach().clone()
    if callback:
        callback(0, x_t)
    with frozen_parameters(model):
        for t in range(1, steps + 1):
            x_t = projected_gradient_descent(
                fn,
                x_t,
                eps=eta,
                eps_iter=eta,
                nb_iter=1,
                norm=np.inf,
                clip_min=CLIP_MIN,
                clip_max=CLIP_MAX,
                y=target,
                targeted=True,
                rand_init=False,
                sanity_checks=False,
            ).detach()
            if callback:
                callback(t, x_t)
    return x_t


def pgd(
    model: nn.Module | ModelFn,
    x: torch.Tensor,
    eps: float = 0.3,
    eps_iter: float = 0.01,
    steps: int = 40,
    *,
    k: int = 10,
    y: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> torch.Tensor:
    """Untargeted L∞ PGD: start uniformly in the ε-ball, then ``steps`` projected FGS steps.

    ``x_0 = clip(x + U(−ε, ε))``; ``x_t = clip(Π_ε(x_{t−1} − eps_iter·sgn ∇ log p̄(y|x_{t−1})))``
    with ``Π_ε`` the projection onto ``‖· − x‖_∞ ≤ ε``. cleverhans draws the random start from
    torch's global RNG: with ``seed`` it is drawn from a forked RNG seeded so (reproducible, and the
    caller's global RNG is left untouched).
    """
    _check_images(x)
    if not 0 < eps_iter <= eps:
        raise ValueError(f"need 0 < eps_iter ≤ eps, got eps_iter={eps_iter}, eps={eps}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    fn = log_predictive_fn(model, k, generator=generator)
    devices = [x.device] if x.device.type == "cuda" else []
    with frozen_parameters(model), torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        y = _own_prediction(fn, x) if y is None else _check_labels(y, x, "labels y")
        adv = projected_gradient_descent(
            fn,
            x,
            eps=eps,
            eps_iter=eps_iter,
            nb_iter=steps,
            norm=np.inf,
            clip_min=CLIP_MIN,
            clip_max=CLIP_MAX,
            y=y,
            targeted=False,
            rand_init=True,
            sanity_checks=False,
        )
    return adv.detach()


def cw_l2(
    model: nn.Module | ModelFn,
    x: torch.Tensor,
    *,
    k: int = 10,
    y: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    iterations: int = 100,
    binary_steps: int = 3,
    lr: float = 0.1,
    initial_const: float = 10.0,
    confidence: float = 1.0,
) -> torch.Tensor:
    """Untargeted Carlini–Wagner L2 on ``log p̄`` as logits.

    Minimises ``‖x' − x‖²₂ + c·max(log p̄(y|x') − max_{c'≠y} log p̄(c'|x') + κ, 0)`` over
    ``x' = (tanh(w) + 1)/2`` with Adam (``lr``, ``iterations`` per binary-search step on ``c``,
    starting at ``initial_const``). Examples it never makes adversarial come back unchanged. The
    defaults are cut down from the paper's (1000 iterations, 9 binary steps) for CPU time. The
    margin ``κ = 1`` nat matters for dropout nets: with ``κ = 0`` the attack stops on the decision
    boundary of *one* draw of masks, and fresh masks put most such images back.
    """
    _check_images(x)
    if iterations < 1 or binary_steps < 1:
        raise ValueError("cw needs iterations ≥ 1 and binary_steps ≥ 1")
    fn = log_predictive_fn(model, k, generator=generator)
    with frozen_parameters(model):
        y = _own_prediction(fn, x) if y is None else _check_labels(y, x, "labels y")
        n_classes = int(_own_logits_width(fn, x))
        adv = carlini_wagner_l2(
            fn,
            x,
            n_classes,
            y=y,
            targeted=False,
            lr=lr,
            confidence=confidence,
            clip_min=CLIP_MIN,
            clip_max=CLIP_MAX,
            initial_const=initial_const,
            binary_search_steps=binary_steps,
            max_iterations=iterations,
        )
    return adv.detach().clamp(CLIP_MIN, CLIP_MAX)


def _own_logits_width(fn: ModelFn, x: torch.Tensor) -> int:
    with torch.no_grad():
        return fn(x[:1]).shape[1]
