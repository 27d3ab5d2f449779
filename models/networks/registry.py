"""The architecture dict → network registry.

An architecture is a plain dict (stored in the model card, made from a preset by
:func:`~bayesgate.models.networks.presets.preset_architecture`): ``type`` picks the class,
``preset`` records the name it came from, every other key is a constructor argument.
:func:`build_network` rebuilds the network from it. The dropout networks (:mod:`.dropout`) are
imported here; the Bayes-by-Backprop CNNs (:mod:`.bbb`) only when a ``bbb_*`` architecture is
built, so the dropout networks, the MC engine and the model store never load them. The presets
(torch-free, :mod:`.presets`) are re-exported.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from bayesgate.models.networks.dropout import DropoutCNN, DropoutMLP, WideDropoutCNN
from bayesgate.models.networks.presets import (
    BBB_PRESET_NAMES,
    DETERMINISTIC_SUFFIX,
    PRESETS,
    preset_architecture,
    preset_names,
)

__all__ = [
    "BBB_NETWORK_TYPES",
    "BBB_PRESET_NAMES",
    "DETERMINISTIC_SUFFIX",
    "DROPOUT_NETWORK_TYPES",
    "PRESETS",
    "build_network",
    "network_class",
    "network_types",
    "preset_architecture",
    "preset_names",
]

DROPOUT_NETWORK_TYPES: dict[str, type[nn.Module]] = {
    "dropout_mlp": DropoutMLP,
    "dropout_cnn": DropoutCNN,
    "dropout_cnn_wide": WideDropoutCNN,
}
# Bayes-by-Backprop types, by name only: their classes live in
# bayesgate.models.networks.bbb.networks (BAYES_NETWORK_TYPES), imported on use.
BBB_NETWORK_TYPES: tuple[str, ...] = ("bbb_lenet5", "bbb_alexnet")
_BBB_MODULE = "bayesgate.models.networks.bbb.networks"


def network_types() -> list[str]:
    """Every architecture ``type`` :func:`build_network` knows."""
    return [*DROPOUT_NETWORK_TYPES, *BBB_NETWORK_TYPES]


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
