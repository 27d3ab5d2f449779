"""Networks: the dropout MLP and CNN (:mod:`.dropout`), their presets (:mod:`.presets`), the
architecture dict → network registry (:mod:`.registry`), and the Bayes-by-Backprop CNNs
(:mod:`.bbb`, imported only when a ``bbb_*`` network is built).

The names below are imported on first use (the networks import torch): importing the torch-free
:mod:`.presets`, whose presets ``bayesgate train`` offers and checks, does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bayesgate.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, __getattr__ below
    from bayesgate.models.networks.dropout import DropoutCNN, DropoutMLP, WideDropoutCNN
    from bayesgate.models.networks.presets import (
        DETERMINISTIC_SUFFIX,
        MNIST_SHAPE,
        PRESETS,
        preset_architecture,
        preset_names,
    )
    from bayesgate.models.networks.registry import build_network

_SOURCES = {
    "DETERMINISTIC_SUFFIX": "presets",
    "MNIST_SHAPE": "presets",
    "PRESETS": "presets",
    "DropoutCNN": "dropout",
    "DropoutMLP": "dropout",
    "WideDropoutCNN": "dropout",
    "build_network": "registry",
    "preset_architecture": "presets",
    "preset_names": "presets",
}

__all__ = [  # the names of _SOURCES (a test checks that each resolves)
    "DETERMINISTIC_SUFFIX",
    "MNIST_SHAPE",
    "PRESETS",
    "DropoutCNN",
    "DropoutMLP",
    "WideDropoutCNN",
    "build_network",
    "preset_architecture",
    "preset_names",
]

__getattr__, __dir__ = lazy_names(__name__, _SOURCES, globals())
