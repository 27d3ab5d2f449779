"""The network presets: their names and architecture dicts, without torch.

A preset is a named architecture dict (stored in the model card): ``type`` picks the network class
(:func:`bayesgate.models.networks.registry.build_network`), every other key is a constructor
argument. :data:`PRESETS` are the dropout networks, each also in a deterministic form
(``<preset>-det``); :data:`BAYES_PRESETS` the Bayes-by-Backprop CNNs, choosing among
:data:`SAMPLING_MODES`, with :data:`DEFAULT_PRIOR`.

Why a module of its own: it is plain data, which ``bayesgate train`` offers (``--preset``,
``--sampling``) and checks (``--p``, ``--sampling`` and ``--beta-schedule`` apply to some presets
only) before anything is trained. Read from here, its ``--help`` and those refusals answer without
importing torch (~3 s); the networks themselves (:mod:`.dropout`, :mod:`.bbb`) import it.
"""

from __future__ import annotations

import copy
from typing import Any

from bayesgate.errors import InvalidArgument

MNIST_SHAPE = (1, 28, 28)
"""``in_shape`` of every preset: one channel of 28×28 pixels."""
SAMPLING_MODES = ("local", "weights")
"""How a Bayes-by-Backprop layer draws a network sample (:mod:`.bbb.layers`)."""
DEFAULT_PRIOR: dict[str, Any] = {"kind": "gaussian", "sigma": 0.1}
"""The weight prior of a Bayes-by-Backprop layer given none (:func:`.bbb.layers.make_prior`)."""

PRESETS: dict[str, dict[str, Any]] = {
    "mlp-3x1000": {"type": "dropout_mlp", "hidden": [1000, 1000, 1000], "p": 0.5},
    "mlp-4x1024": {"type": "dropout_mlp", "hidden": [1024, 1024, 1024, 1024], "p": 0.5},
    "mlp-2x100": {"type": "dropout_mlp", "hidden": [100, 100], "p": 0.5},
    "mlp-2x32": {"type": "dropout_mlp", "hidden": [32, 32], "p": 0.2},
    "cnn": {"type": "dropout_cnn", "channels": 32, "hidden": 100, "p": 0.5},
    # Madry et al.'s adversarial-training CNN (5×5 conv 32, 64, max-pooling), hidden 256
    "cnn-wide": {"type": "dropout_cnn_wide", "channels": [32, 64], "hidden": 256, "p": 0.5},
}
DETERMINISTIC_SUFFIX = "-det"

BAYES_PRESETS: dict[str, dict[str, Any]] = {
    "bbb-lenet5": {
        "type": "bbb_lenet5",
        "sampling": "local",
        "activation": "softplus",
        "prior": dict(DEFAULT_PRIOR),
        "rho_init": -5.0,
        "mu_init_std": 0.1,
    },
    "bbb-alexnet": {
        "type": "bbb_alexnet",
        "sampling": "local",
        "activation": "softplus",
        "prior": dict(DEFAULT_PRIOR),
        "rho_init": -5.0,
        "mu_init_std": 0.1,
        "conv1_padding": 7,
    },
}
"""The Bayes-by-Backprop presets (:mod:`.bbb.networks`; no ``-det`` form)."""
BBB_PRESET_NAMES: tuple[str, ...] = tuple(BAYES_PRESETS)


def preset_names(*, bbb: bool = False) -> list[str]:
    """All dropout preset names, including the deterministic (``-det``) baselines; with
    ``bbb=True`` also the Bayes-by-Backprop presets (which have no ``-det`` form)."""
    names = [n for base in PRESETS for n in (base, base + DETERMINISTIC_SUFFIX)]
    return names + list(BBB_PRESET_NAMES) if bbb else names


def preset_architecture(name: str, p: float | None = None) -> dict[str, Any]:
    """Architecture dict of a preset; ``<preset>-det`` is the deterministic baseline.

    A deterministic baseline is the same network trained by maximum likelihood (K=1, dropout as a
    regulariser) and evaluated with dropout off.
    """
    if name in BBB_PRESET_NAMES:
        return _bbb_preset_architecture(name, p)
    base, det = name, False
    if name.endswith(DETERMINISTIC_SUFFIX):
        base, det = name[: -len(DETERMINISTIC_SUFFIX)], True
    if base not in PRESETS:
        raise InvalidArgument(
            f"unknown preset {name!r}; choose one of {', '.join(preset_names(bbb=True))}"
        )
    arch = {**PRESETS[base], "preset": name, "stochastic": not det}
    if p is not None:
        arch["p"] = p
    arch.setdefault("in_shape", list(MNIST_SHAPE))
    arch.setdefault("classes", 10)
    return arch


def _bbb_preset_architecture(name: str, p: float | None) -> dict[str, Any]:
    if p is not None:
        raise InvalidArgument(f"preset {name!r} has no dropout: a dropout rate p does not apply")
    arch = {**copy.deepcopy(BAYES_PRESETS[name]), "preset": name, "stochastic": True}
    return {**arch, "in_shape": list(MNIST_SHAPE), "classes": 10}
