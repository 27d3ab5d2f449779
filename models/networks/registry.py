"""Named presets and the architecture dict → network registry.

An architecture is a plain dict (stored in the model card): ``type`` picks the class, ``preset``
records the name it came from, every other key is a constructor argument. :func:`build_network`
rebuilds the network from it. The dropout networks (:mod:`.dropout`) are imported here; the
Bayes-by-Backprop CNNs (:mod:`.bbb`) only when a ``bbb_*`` architecture or preset is asked for,
so the dropout networks, the MC engine and the model store never load them.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

from torch import nn

from bayesgate.errors import InvalidArgument
from bayesgate.models.networks.dropout import MNIST_SHAPE, DropoutCNN, DropoutMLP, WideDropoutCNN

DROPOUT_NETWORK_TYPES: dict[str, type[nn.Module]] = {
    "dropout_mlp": DropoutMLP,
    "dropout_cnn": DropoutCNN,
    "dropout_cnn_wide": WideDropoutCNN,
}
# Bayes-by-Backprop types and presets, by name only: their classes and preset dicts live in
# bayesgate.models.networks.bbb.networks (BAYES_NETWORK_TYPES, BAYES_PRESETS), imported on use.
BBB_NETWORK_TYPES: tuple[str, ...] = ("bbb_lenet5", "bbb_alexnet")
BBB_PRESET_NAMES: tuple[str, ...] = ("bbb-lenet5", "bbb-alexnet")
_BBB_MODULE = "bayesgate.models.networks.bbb.networks"

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


def network_types() -> list[str]:
    """Every architecture ``type`` :func:`build_network` knows."""
    return [*DROPOUT_NETWORK_TYPES, *BBB_NETWORK_TYPES]


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


def build_network(arch: dict[str, Any]) -> nn.Module:
    """Rebuild a network from its architecture dict (as stored in a model card)."""
    cls = network_class(arch.get("type"))
    kwargs = {k: v for k, v in arch.items() if k not in ("type", "preset")}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"architecture does not fit {cls.__name__}: {exc}") from exc


def network_class(type_name: object) -> type[nn.Module]:
    """The class of an architecture ``type``; Bayes-by-Backprop classes are imported here."""
    if type_name in DROPOUT_NETWORK_TYPES:
        return DROPOUT_NETWORK_TYPES[type_name]  # type: ignore[index]
    if type_name in BBB_NETWORK_TYPES:
        return importlib.import_module(_BBB_MODULE).BAYES_NETWORK_TYPES[type_name]
    raise ValueError(f"unknown network type {type_name!r}; known: {network_types()}")


def _bbb_preset_architecture(name: str, p: float | None) -> dict[str, Any]:
    if p is not None:
        raise InvalidArgument(f"preset {name!r} has no dropout: a dropout rate p does not apply")
    presets = importlib.import_module(_BBB_MODULE).BAYES_PRESETS
    arch = {**copy.deepcopy(presets[name]), "preset": name, "stochastic": True}
    return {**arch, "in_shape": list(MNIST_SHAPE), "classes": 10}
