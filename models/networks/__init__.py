"""Networks: the dropout MLP and CNN (:mod:`.dropout`), their presets and the architecture dict →
network registry (:mod:`.registry`), and the Bayes-by-Backprop CNNs (:mod:`.bbb`, imported only
when a ``bbb_*`` network is built)."""

from bayesgate.models.networks.dropout import MNIST_SHAPE, DropoutCNN, DropoutMLP, WideDropoutCNN
from bayesgate.models.networks.registry import (
    DETERMINISTIC_SUFFIX,
    PRESETS,
    build_network,
    preset_architecture,
    preset_names,
)

__all__ = [
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
