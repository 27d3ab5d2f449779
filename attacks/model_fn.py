"""The function the attacks differentiate: the MC-averaged log-predictive of a dropout network.

For a stochastic network and K dropout passes with masks ``ω_k``::

    f(x) = log p̄(·|x) = logsumexp_k log softmax(f^{ω_k}(x)) − log K        (B×C)

(:func:`bayesgate.models.mc.engine.mc_log_predictive`), fresh masks at every call; for a
deterministic network
``f(x) = log softmax(f(x))``. cleverhans treats ``f`` as logits and applies a cross-entropy,
``−log softmax(f(x))_y = −log p̄(y|x)`` because ``Σ_c p̄_c = 1`` — so its attacks act on the MC
predictive exactly as the paper's do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from bayesgate.models.mc.engine import mc_log_predictive

ModelFn = Callable[[torch.Tensor], torch.Tensor]
"""``x`` (B×…) ↦ log-probabilities or logits (B×C), differentiable in ``x``."""


def log_predictive_fn(
    model: nn.Module | ModelFn, k: int = 10, *, generator: torch.Generator | None = None
) -> ModelFn:
    """Wrap a network as ``x ↦ log p̄(·|x)`` over ``k`` passes (masks from ``generator``).

    A plain callable (not an ``nn.Module``) is returned unchanged: it already is a model function.
    """
    if not isinstance(model, nn.Module):
        if not callable(model):
            raise ValueError(f"model must be an nn.Module or a callable, got {type(model)}")
        return model
    if not hasattr(model, "trunk") or not hasattr(model, "head"):
        raise ValueError(
            f"{type(model).__name__} has no trunk/head split; build it with "
            "bayesgate.models.networks"
        )

    def fn(x: torch.Tensor) -> torch.Tensor:
        return mc_log_predictive(model, x, k, generator=generator)

    return fn


@contextlib.contextmanager
def frozen_parameters(model: nn.Module | ModelFn) -> Iterator[None]:
    """No parameter gradients inside the block: attacks need ``∇_x`` only (saves ~⅓ of backward)."""
    if not isinstance(model, nn.Module):
        yield
        return
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
