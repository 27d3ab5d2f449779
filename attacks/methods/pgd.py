"""Untargeted L∞ PGD (Madry et al. 2018) through cleverhans, random start from a generator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from bayesgate.attacks.methods.base import CLIP_MAX, CLIP_MIN, Attack, AttackInput
from bayesgate.attacks.methods.parameters import PGDParameters


@dataclass(frozen=True)
class PGD(PGDParameters, Attack):
    """Start uniformly in the ε-ball, then ``steps`` projected FGS steps of ``eps_iter``.

    ``x_0 = clip(x + U(−ε, ε))``; ``x_t = clip(Π_ε(x_{t−1} − eps_iter·sgn ∇ log p̄(y|x_{t−1})))``
    with ``Π_ε`` the projection onto ``‖· − x‖_∞ ≤ ε``. cleverhans draws the random start from
    torch's global RNG; the attack lends it the state of ``generator`` (and takes the advanced
    state back), so the start comes from ``generator`` and the caller's global RNG is untouched.
    Its parameters are declared in :class:`~bayesgate.attacks.methods.parameters.PGDParameters`.
    """

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        with global_rng_from(batch.generator, batch.x.device):
            return linf_pgd(
                batch,
                eps=self.eps,
                eps_iter=self.eps_iter,
                steps=self.steps,
                targeted=False,
                random_start=True,
            )


def linf_pgd(
    batch: AttackInput,
    *,
    eps: float,
    eps_iter: float,
    steps: int,
    targeted: bool,
    random_start: bool,
    x: torch.Tensor | None = None,
) -> torch.Tensor:
    """cleverhans' L∞ ``projected_gradient_descent`` in the [0, 1] box, from ``x`` (default
    ``batch.x``), towards (targeted) or away from ``batch.y``."""
    from cleverhans.torch.attacks.projected_gradient_descent import projected_gradient_descent

    return projected_gradient_descent(
        batch.model_fn,
        batch.x if x is None else x,
        eps=eps,
        eps_iter=eps_iter,
        nb_iter=steps,
        norm=np.inf,
        clip_min=CLIP_MIN,
        clip_max=CLIP_MAX,
        y=batch.y,
        targeted=targeted,
        rand_init=random_start,
        sanity_checks=False,
    )


@contextlib.contextmanager
def global_rng_from(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """Inside the block torch's global RNG of ``device`` draws ``generator``'s stream.

    The global state is forked (restored afterwards); ``generator`` is advanced by what was drawn.
    Without a generator the block draws from a copy of the global state.
    """
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        if generator is not None:
            _set_state(generator.get_state(), device)
        yield
        if generator is not None:
            generator.set_state(_get_state(device))


def _set_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.random.set_rng_state(state)


def _get_state(device: torch.device) -> torch.Tensor:
    return (
        torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.random.get_rng_state()
    )
