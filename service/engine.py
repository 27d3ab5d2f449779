"""The engine call the inference worker makes: K dropout passes of a batch.

``engine(network, x, k, generator)`` returns the ``B×K×C`` probabilities;
``engine(network, x, k, generator, features=LAYERS)`` (called when the served model has a fused
detector, with the layers it reads; ``features=True``: every layer) returns
:class:`~bayesgate.models.mc.engine.MCFeaturePrediction`: the same probabilities and, from the
same K passes, those features.

Replaceable per worker (``BatchWorker.engine``): the tests slow it down, gate it or make it fail.

:func:`checkpoints` makes any engine call on a network interruptible between layers: the worker
stops a call whose job's client is gone or whose deadline passed before the next layer runs.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Collection, Iterator

import torch
from torch import nn

from bayesgate.models.mc.engine import MCFeaturePrediction, mc_predict, mc_predict_features

Engine = Callable[..., "torch.Tensor | MCFeaturePrediction"]
"""``engine(network, x, k, generator[, features=True | LAYERS])``, as :func:`mc_engine`."""


def mc_engine(
    network: nn.Module,
    x: torch.Tensor,
    k: int,
    generator: torch.Generator | None,
    *,
    features: bool | Collection[str] = False,
) -> torch.Tensor | MCFeaturePrediction:
    """``B×K×C`` probabilities of K dropout passes (:func:`~bayesgate.models.mc.engine.mc_predict`),
    or with ``features`` :func:`~bayesgate.models.mc.engine.mc_predict_features` (``True``: every
    layer; a collection of layer names: only those)."""
    if features:
        layers = None if features is True else tuple(features)
        return mc_predict_features(network, x, k, generator=generator, layers=layers)
    return mc_predict(network, x, k, generator=generator).probs


class CallStopped(Exception):
    """Raised by a check inside an engine call: a job of the call is to be dropped."""


_ACTIVE = threading.local()  # .check: the current thread's check inside checkpoints()
_HOOKED: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def _before_layer(_module: nn.Module, _inputs: tuple[object, ...]) -> None:
    check = getattr(_ACTIVE, "check", None)
    if check is not None:
        check()


@contextlib.contextmanager
def checkpoints(network: nn.Module, check: Callable[[], None]) -> Iterator[int]:
    """Call ``check()`` before every layer (leaf module) of ``network`` that runs in this thread
    during the block; yields the number of layers hooked.

    ``check`` raises (:class:`CallStopped`) to stop the engine call at that layer, so a call is
    interruptible at the granularity of one layer over at most the engine's row chunk
    (:data:`~bayesgate.models.mc.engine.DEFAULT_MAX_ROWS` head rows, ``max_rows // K`` images
    for the trunk). The check only reads: the masks drawn and every number computed are the same
    as without it (the engine's random stream is untouched).

    The forward pre-hooks are installed once per network, on its first use, and stay: they call
    the check of the thread running the layer, if it is inside this block, else nothing. So other
    threads (the demo's attack copies the network) never see a hook added or removed under them,
    and are never checked.
    """
    layers = _HOOKED.get(network)
    if layers is None:
        leaves = [m for m in network.modules() if next(m.children(), None) is None]
        for module in leaves:
            module.register_forward_pre_hook(_before_layer)
        layers = _HOOKED[network] = len(leaves)
    outer = getattr(_ACTIVE, "check", None)
    _ACTIVE.check = check
    try:
        yield layers
    finally:
        _ACTIVE.check = outer
