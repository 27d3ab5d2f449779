"""MC dropout: dropout that can stay on at inference and draw its masks from a given generator.

``nn.Dropout`` is tied to ``module.training`` and the global RNG. The MC engine needs dropout on
while everything else (e.g. future batch-norm layers) is in eval mode, and it needs reproducible
masks from an explicit ``torch.Generator``. Both are set for a block of code with
:func:`mc_sampling`; the state lives in a context variable, so concurrent threads do not see each
other's generator.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from bayesgate.errors import InvalidArgument

# (sampling active, generator or None, may mask in place)
_MC_STATE: contextvars.ContextVar[tuple[bool, torch.Generator | None, bool]] = (
    contextvars.ContextVar("bayesgate_mc_state", default=(False, None, False))
)


@contextlib.contextmanager
def mc_sampling(
    generator: torch.Generator | None = None, *, inplace: bool = False
) -> Iterator[None]:
    """Keep every :class:`MCDropout` active inside the block, drawing masks from ``generator``.

    ``inplace=True`` lets dropout overwrite its input (one buffer less). Only a caller that owns
    every activation the head sees may ask for it — the MC engine does, since it feeds the head
    fresh rows under inference mode; code calling a network on its own tensors must not.
    """
    token = _MC_STATE.set((True, generator, inplace))
    try:
        yield
    finally:
        _MC_STATE.reset(token)


def mc_state() -> tuple[bool, torch.Generator | None]:
    """``(sampling, generator)`` of the innermost :func:`mc_sampling` block, for stochastic
    layers other than :class:`MCDropout` (e.g. the Bayes-by-Backprop layers)."""
    sampling, generator, _ = _MC_STATE.get()
    return sampling, generator


class MCDropout(nn.Module):
    """Inverted dropout ``x ⊙ z / (1−p)``, ``z_i ~ Bernoulli(1−p)`` independently per element.

    Active in training mode and inside :func:`mc_sampling`; the identity otherwise (the
    deterministic weight-scaling approximation, since weights are trained for the rescaled input).
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise InvalidArgument(f"dropout rate p must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sampling, generator, inplace = _MC_STATE.get()
        if self.p == 0.0 or not (self.training or sampling):
            return x
        inplace = inplace and torch.is_inference_mode_enabled()
        if generator is None and x.is_cuda:
            return F.dropout(x, self.p, training=True, inplace=inplace)  # fused kernel
        # z = 1[u ≥ p], u ~ U[0, 1), so P(z = 1) = 1 − p. On the CPU a uniform draw and a compare
        # cost about a quarter of bernoulli_ (which F.dropout uses): the masks were half the MC
        # engine's time. Drawn in float32 so that half-precision rounding cannot bias P(z = 1).
        mask = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
        mask = mask.ge_(self.p).mul_(1.0 / (1.0 - self.p)).to(x.dtype)
        return x.mul_(mask) if inplace else x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"
