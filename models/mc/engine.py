"""Vectorised Monte Carlo dropout inference: K stochastic passes as one batched forward.

For a network split as ``head(trunk(x))`` (see :mod:`bayesgate.models.networks.dropout`) the trunk
runs once on the
``B`` inputs; its output is repeated to ``K·B`` rows (row ``b·K + k`` is sample k of example b)
and the head runs once on them. Every row draws its own dropout masks, so each of the K passes
uses an independent mask per example — the same distribution as K sequential passes. Rows are
processed in chunks of at most ``max_rows`` so large K or B never exhausts memory.

Outputs follow the project convention ``B×K×C``.

:func:`mc_predict_features` returns, from the same K passes, the features a detector reads
(:mod:`bayesgate.models.detection`): the network's ``feature_layers``, ``"trunk"`` =
``model.trunk_features(trunk(x))`` computed once per input (the CNN's conv output, ``B×D``),
``"trunk_2x2"`` = ``model.trunk_grid_features(trunk(x))`` (the same maps pooled to 2×2 cells), and
``"penultimate"`` = the MC average ``(1/K) Σ_k z_k`` of the head's last hidden activations
``z_k = head[:model.penultimate_at](·)`` (``B×D``), taken before the final dropout/weight layer.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterator
from typing import NamedTuple

import torch
from torch import nn

from bayesgate.models.mc.dropout import mc_sampling

DEFAULT_MAX_ROWS = 8192
INPUT_LAYER = "input"
"""Feature name of the flattened input image, which every network's features include."""
TRUNK_GRID = 2
"""Cells per side of the spatially pooled trunk features: the coarsest grid that keeps the layout
a 90° rotation changes (each quadrant moves to another); ``4·channels`` values."""
TRUNK_GRID_LAYER = f"trunk_{TRUNK_GRID}x{TRUNK_GRID}"
"""Feature name of the trunk's conv maps averaged over ``TRUNK_GRID²`` cells (networks whose
``feature_layers`` name it: the CNNs' ``trunk_grid_features``), computed once per input."""
PENULTIMATE = "penultimate"
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class MCPrediction(NamedTuple):
    """MC predictive samples, both ``B×K×C``: ``probs = exp(log_probs)``."""

    probs: torch.Tensor
    log_probs: torch.Tensor


class MCFeaturePrediction(NamedTuple):
    """:class:`MCPrediction` plus ``features``: layer name → ``B×D`` float32 features."""

    probs: torch.Tensor
    log_probs: torch.Tensor
    features: dict[str, torch.Tensor]


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
    log_p, _ = _predict(model, x, k, generator, max_rows, precision, with_features=False)
    return MCPrediction(log_p.exp(), log_p)


def mc_predict_features(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    *,
    generator: torch.Generator | None = None,
    max_rows: int | None = None,
    precision: str = "fp32",
    layers: Collection[str] | None = None,
) -> MCFeaturePrediction:
    """:func:`mc_predict` plus the detector's features from the same K passes (no second forward).

    ``features["input"]`` is the flattened image (:data:`INPUT_LAYER`, every network);
    ``features["trunk"]`` and ``features["trunk_2x2"]`` (:data:`TRUNK_GRID_LAYER`; networks whose
    ``feature_layers`` name them) are computed once per input;
    ``features["penultimate"] = (1/K) Σ_k head[:penultimate_at](trunk(x))`` over the K passes
    that give the probabilities. Same masks as :func:`mc_predict` for the same generator state.
    ``layers``: compute only these of them (the ones a detector reads; ``None``: all) — the
    probabilities and every layer computed are the same as in the full call.
    """
    log_p, features = _predict(
        model, x, k, generator, max_rows, precision, with_features=True, layers=layers
    )
    if _wants(layers, INPUT_LAYER):
        features = {**(features or {}), INPUT_LAYER: _input_features(x).detach()}
    return MCFeaturePrediction(log_p.exp(), log_p, features or {})


def mc_logits_features(
    model: nn.Module, x: torch.Tensor, k: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``B×K×C`` logits and the detector features (``B×D`` each) with autograd (attack mode).

    Dropout is active in training mode or inside :func:`mc_sampling`, as for :func:`mc_logits`;
    an adaptive attack differentiates the detector's scores through this function.
    """
    _check_k(k)
    h = model.trunk(x)
    out, pen_sum = _head_pass(model, h, k, with_features=True)
    return out, {**_feature_dict(model, h, pen_sum, k), INPUT_LAYER: _input_features(x)}


def _input_features(x: torch.Tensor) -> torch.Tensor:
    """The pixels themselves, ``B×(H·W·…)`` float32: the input layer a detector can read."""
    return x.reshape(x.shape[0], -1).float()


def _predict(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    generator: torch.Generator | None,
    max_rows: int | None,
    precision: str,
    *,
    with_features: bool,
    layers: Collection[str] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """``B×K×C`` log-probabilities (and features: ``layers`` of them, all when ``None``) under
    inference mode, dropout on."""
    _check_k(k)
    max_rows = DEFAULT_MAX_ROWS if max_rows is None else max_rows
    if max_rows < 1:
        raise ValueError(f"max_rows must be ≥ 1, got {max_rows}")
    with torch.inference_mode(), _eval_mode(model), _autocast(x.device, precision):
        if not getattr(model, "stochastic", True):
            return _deterministic_log_probs(model, x, k, max_rows, with_features, layers)
        # the head only ever sees fresh rows here, so dropout may mask them in place (a head
        # run k times on the same rows, the weight-sampling branch, must not)
        with mc_sampling(generator, inplace=getattr(model, "per_example_noise", True)):
            return _stochastic_log_probs(model, x, k, max_rows, with_features, layers)


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


def _deterministic_log_probs(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    max_rows: int,
    with_features: bool,
    layers: Collection[str] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """A deterministic network runs once; its answer is expanded to K identical samples."""
    if not with_features:
        log_p = torch.cat([_log_softmax(model(c)) for c in x.split(max_rows)])
        return log_p.unsqueeze(1).expand(-1, k, -1), None
    parts = []
    for c in x.split(max_rows):
        h = model.trunk(c)
        out, pen = _head_pass(model, h, 1, with_features=_wants(layers, PENULTIMATE))
        parts.append((_log_softmax(out[:, 0]), _feature_dict(model, h, pen, 1, layers)))
    log_p = torch.cat([p for p, _ in parts]).unsqueeze(1).expand(-1, k, -1)
    return log_p, {name: torch.cat([f[name] for _, f in parts]) for name in parts[0][1]}


def _stochastic_log_probs(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    max_rows: int,
    with_features: bool = False,
    layers: Collection[str] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """Fill a preallocated ``B×K×C`` tensor chunk by chunk; the trunk runs once per example.

    With ``with_features`` the penultimate activations are summed over the K passes as they go
    by and divided by K at the end; the trunk features are taken once per chunk of examples.
    """
    b = x.shape[0]
    out: torch.Tensor | None = None
    chunks: list[dict[str, torch.Tensor]] = []
    with_penultimate = with_features and _wants(layers, PENULTIMATE)
    per_chunk = max(1, max_rows // k)  # examples per chunk when K fits in the row budget
    k_step = min(k, max_rows)  # samples per chunk when a single example's K does not fit
    for start in range(0, b, per_chunk):
        h = model.trunk(x[start : start + per_chunk])
        nb = h.shape[0]
        pen_sum: torch.Tensor | None = None
        for k0 in range(0, k, k_step):
            kk = min(k_step, k - k0)
            logits, pen = _head_pass(model, h, kk, with_penultimate)
            log_p = _log_softmax(logits)
            if pen is not None:
                pen_sum = pen if pen_sum is None else pen_sum + pen
            if out is None:
                out = torch.empty(b, k, log_p.shape[-1], dtype=torch.float32, device=x.device)
            out[start : start + nb, k0 : k0 + kk] = log_p
        if with_features:
            chunks.append(_feature_dict(model, h, pen_sum, k, layers))
    if out is None:
        raise ValueError("mc_predict needs at least one input row")
    if not with_features:
        return out, None
    return out, {name: torch.cat([c[name] for c in chunks]) for name in chunks[0]}


def _head_pass(
    model: nn.Module, h: torch.Tensor, k: int, with_features: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``b×k×C`` head outputs and, with features, ``Σ_k`` of the penultimate activations (b×D).

    The head is run as ``tail(body(·))`` with ``body = head[:penultimate_at]``: the same modules
    in the same order as ``head(·)``, so the masks drawn are the same as without features.
    """
    if not with_features:
        return _head_samples(model, h, k), None
    body, tail = _split_head(model)
    b = h.shape[0]
    if not getattr(model, "per_example_noise", True):
        outs, pen = [], None
        for _ in range(k):
            z = body(h)
            pen = z.float() if pen is None else pen + z.float()
            outs.append(tail(z))
        return torch.stack(outs, dim=1), pen
    rows = h.repeat_interleave(k, dim=0)
    z = body(rows)
    pen = z.float().view(b, k, -1).sum(dim=1)  # before the tail: its dropout masks z in place
    out = tail(z)
    return out.view(b, k, *out.shape[1:]), pen


def _split_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(head[:penultimate_at], head[penultimate_at:])``; a clear error for other networks."""
    at = getattr(model, "penultimate_at", None)
    if at is None or not isinstance(model.head, nn.Sequential):
        raise ValueError(
            f"{type(model).__name__} does not expose detector features (penultimate_at)"
        )
    return model.head[:at], model.head[at:]


def _wants(layers: Collection[str] | None, name: str) -> bool:
    return layers is None or name in layers


def _feature_dict(
    model: nn.Module,
    h: torch.Tensor,
    pen_sum: torch.Tensor | None,
    k: int,
    wanted: Collection[str] | None = None,
) -> dict[str, torch.Tensor]:
    """``{"trunk": trunk_features(h), "trunk_2x2": trunk_grid_features(h), "penultimate":
    pen_sum / k}`` for the model's layers (those of them in ``wanted``, all when ``None``)."""
    features: dict[str, torch.Tensor] = {}
    layers = [n for n in getattr(model, "feature_layers", ()) if _wants(wanted, n)]
    if "trunk" in layers:
        features["trunk"] = model.trunk_features(h).float()
    if TRUNK_GRID_LAYER in layers:
        features[TRUNK_GRID_LAYER] = model.trunk_grid_features(h).float()
    if pen_sum is not None:
        features["penultimate"] = pen_sum / k
    return features


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
