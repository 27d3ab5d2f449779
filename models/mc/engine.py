"""Vectorised Monte Carlo dropout inference: K stochastic passes as one batched forward.

For a network split as ``head(trunk(x))`` (see :mod:`bayesgate.models.networks.dropout`) the trunk
runs once on the
``B`` inputs; its output is repeated to ``K·B`` rows (row ``b·K + k`` is sample k of example b)
and the head runs once on them. Every row draws its own dropout masks, so each of the K passes
uses an independent mask per example — the same distribution as K sequential passes. Rows are
processed in chunks of at most ``max_rows`` so large K or B never exhausts memory.

Outputs follow the project convention ``B×K×C``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import nn

from bayesgate.models.mc.dropout import mc_sampling

DEFAULT_MAX_ROWS = 8192
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class MCPrediction(NamedTuple):
    """MC predictive samples, both ``B×K×C``: ``probs = exp(log_probs)``."""

    probs: torch.Tensor
    log_probs: torch.Tensor


def mc_logits(model: nn.Module, x: torch.Tensor, k: int) -> torch.Tensor:
    """``B×K×C`` logits of K passes in one forward over ``K·B`` head rows (autograd allowed).

    Dropout is active when the model is in training mode or inside :func:`mc_sampling`; this is
    the forward the training loop differentiates.
    """
    _check_k(k)
    return _head_samples(model, model.trunk(x), k)


def mc_predict(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    *,
    generator: torch.Generator | None = None,
    max_rows: int | None = None,
    precision: str = "fp32",
) -> MCPrediction:
    """K stochastic predictions per input, dropout on, everything else in eval mode.

    Returns :class:`MCPrediction` with ``B×K×C`` probabilities and log-probabilities. With a
    ``generator`` the masks are drawn from it, so the same generator state, input, K and
    ``max_rows`` give bit-identical results on the same device. A deterministic network (card
    ``stochastic: false``) is run once and its answer expanded to K identical samples.
    """
    _check_k(k)
    max_rows = DEFAULT_MAX_ROWS if max_rows is None else max_rows
    if max_rows < 1:
        raise ValueError(f"max_rows must be ≥ 1, got {max_rows}")
    with torch.inference_mode(), _eval_mode(model), _autocast(x.device, precision):
        if not getattr(model, "stochastic", True):
            log_p = torch.cat([_log_softmax(model(c)) for c in x.split(max_rows)])
            log_p = log_p.unsqueeze(1).expand(-1, k, -1)
            return MCPrediction(log_p.exp(), log_p)
        # the head only ever sees fresh rows here, so dropout may mask them in place (a head
        # run k times on the same rows, the weight-sampling branch, must not)
        with mc_sampling(generator, inplace=getattr(model, "per_example_noise", True)):
            log_p = _stochastic_log_probs(model, x, k, max_rows)
    return MCPrediction(log_p.exp(), log_p)


def mc_log_predictive(
    model: nn.Module, x: torch.Tensor, k: int, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """MC-averaged log-predictive ``log p̄(c|x) = logsumexp_k(log p_k(c|x)) − log K``, ``B×C``.

    Gradients flow to ``x`` (attack mode): this is the model function the attacks differentiate.
    Dropout is on for stochastic networks, off for deterministic ones (then plain log-softmax).
    """
    _check_k(k)
    with _eval_mode(model):
        if not getattr(model, "stochastic", True):
            return _log_softmax(model(x))
        with mc_sampling(generator):
            log_p = _log_softmax(mc_logits(model, x, k))
    return torch.logsumexp(log_p, dim=1) - math.log(k)


def _stochastic_log_probs(model: nn.Module, x: torch.Tensor, k: int, max_rows: int) -> torch.Tensor:
    """Fill a preallocated ``B×K×C`` tensor chunk by chunk; the trunk runs once per example."""
    b = x.shape[0]
    out: torch.Tensor | None = None
    per_chunk = max(1, max_rows // k)  # examples per chunk when K fits in the row budget
    k_step = min(k, max_rows)  # samples per chunk when a single example's K does not fit
    for start in range(0, b, per_chunk):
        h = model.trunk(x[start : start + per_chunk])
        nb = h.shape[0]
        for k0 in range(0, k, k_step):
            kk = min(k_step, k - k0)
            log_p = _log_softmax(_head_samples(model, h, kk))
            if out is None:
                out = torch.empty(b, k, log_p.shape[-1], dtype=torch.float32, device=x.device)
            out[start : start + nb, k0 : k0 + kk] = log_p
    if out is None:
        raise ValueError("mc_predict needs at least one input row")
    return out


def _head_samples(model: nn.Module, h: torch.Tensor, k: int) -> torch.Tensor:
    """``b×k×…`` head outputs of ``k`` passes over the trunk output ``h`` (``b×…``).

    Per-example noise (dropout, local reparameterisation): one forward over ``k·b`` rows, row
    ``b·k + j`` being sample j of example b. Weight-sampling layers (``model.per_example_noise``
    false) draw one weight sample per forward, shared by all rows, so replicated rows would be k
    identical samples: there the head runs k times on the ``b`` rows instead.
    """
    b = h.shape[0]
    if not getattr(model, "per_example_noise", True):
        return torch.stack([model.head(h) for _ in range(k)], dim=1)
    # repeat_interleave, not expand+reshape: the latter can alias x (K = 1) or give a
    # stride-0 view (one example per chunk), which in-place masking must not touch
    rows = h.repeat_interleave(k, dim=0)
    out = model.head(rows)
    return out.view(b, k, *out.shape[1:])


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def _check_k(k: int) -> None:
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"number of MC samples k must be a positive integer, got {k!r}")


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Put the model in eval mode for the block and restore the caller's mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
