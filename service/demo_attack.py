"""The demo page's attack: attacks from the registry on one image, against the served model's MC
predictive.

The attacks are :data:`bayesgate.attacks.ATTACKS` (cleverhans underneath), differentiating
``log p̄(·|x) = logsumexp_k log softmax(f^{ω_k}(x)) − log K`` over ``K`` dropout passes:

- FGS, one image, several step sizes ``η``: ``x'_η = clip(x − η·sgn ∇_x log p̄(y|x), 0, 1)``;
- PGD: ``x_0 = clip(x + U(−ε, ε))``, then ``steps`` projected steps of ``eps_iter``, so
  ``‖x' − x‖_∞ ≤ ε``.

``y`` is the label the service answered for the original image, so the page attacks the label it
shows. Everything here runs in a thread (:func:`run_attacks` is blocking), on a private copy of
the network (:class:`AttackNetwork`): an attack switches ``requires_grad`` off and the network to
eval mode, and the inference worker must never see that.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bayesgate.attacks.methods import ATTACKS, Attack
from bayesgate.attacks.model_fn import frozen_parameters, log_predictive_fn
from bayesgate.models.device import use_process_thread_count
from bayesgate.service.served_model import ServedModel


class AttackNetwork:
    """A private deep copy of the served network, made once per served model (and per reload)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: nn.Module | None = None
        self._copy: nn.Module | None = None

    def for_model(self, served: ServedModel) -> nn.Module:
        with self._lock:
            if self._source is not served.network or self._copy is None:
                self._copy = copy.deepcopy(served.network).eval()
                self._source = served.network
            return self._copy


def make_attack(name: str, **params: Any) -> Attack:
    """The registry's attack ``name`` with ``params``; ``ValueError`` naming a bad parameter."""
    return ATTACKS[name](**params)


def run_attacks(
    network: nn.Module,
    x: torch.Tensor,
    label: int,
    attacks: Sequence[Attack],
    *,
    k: int,
    seed: int,
) -> list[torch.Tensor]:
    """One adversarial version of ``x`` (``1×C×H×W`` in [0, 1]) per attack, pushed away from
    ``label``.

    Every attack starts from the same state: the dropout masks of its ``k``-pass gradient come
    from a generator seeded with ``seed``, and so does its own randomness (PGD's random start).
    The same request gives the same images, and FGS at several η uses one gradient sign ``s``:
    ``x'_η = clip(x − η·s)`` moves along one line, whatever other η the request holds.
    """
    use_process_thread_count()  # a thread of asyncio's pool: compute with the server's count
    device = next(network.parameters()).device
    x = x.to(device)
    y = torch.tensor([label], dtype=torch.int64, device=device)
    out = []
    with frozen_parameters(network):
        for attack in attacks:
            model_fn = log_predictive_fn(network, k, generator=_generator(seed, device))
            out.append(attack(model_fn, x, y, generator=_generator(seed, device)).cpu())
    return out


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def attacks_available() -> str | None:
    """None when the attacks can run, else why not (the ``[attacks]`` extra is missing)."""
    try:
        import cleverhans.torch.attacks.projected_gradient_descent  # noqa: F401
    except ImportError as exc:
        return (
            f"the attack route needs the attacks extra ({exc.name} is not installed): "
            "pip install 'bayesgate[attacks]'"
        )
    return None
