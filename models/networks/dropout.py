"""Dropout networks of Li & Gal (2017), each split into a deterministic trunk and a stochastic head.

Every network here has ``trunk`` (no randomness: run once per input) and ``head`` (starts at the
first dropout layer: run K times). ``forward(x) = head(trunk(x))``. The MC engine uses the split to
run the trunk on ``B`` rows and only the head on ``K·B`` rows.

Detector features (:mod:`bayesgate.models.detection`): ``feature_layers`` names the layers a
network exposes; ``head[:penultimate_at]`` gives the last hidden activations (before the final
dropout), and the CNN's ``trunk_features`` turns the trunk output into per-channel means,
``trunk_grid_features`` into per-channel means over a ``TRUNK_GRID × TRUNK_GRID`` grid of cells.

The presets and the architecture dict → network registry are in
:mod:`bayesgate.models.networks.registry`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from bayesgate.models.mc.dropout import MCDropout
from bayesgate.models.mc.engine import TRUNK_GRID, TRUNK_GRID_LAYER
from bayesgate.models.networks.presets import MNIST_SHAPE


class DropoutMLP(nn.Module):
    """MLP with dropout before **every** weight layer, the input layer included, and ReLU.

    ``x → flatten → [dropout → linear → relu] × len(hidden) → dropout → linear → logits``.
    The trunk is only the flatten: the input itself is dropped, so everything else is stochastic.
    Detector features: ``penultimate`` = the last ReLU's output (``hidden[-1]`` wide).
    """

    feature_layers = ("penultimate",)

    def __init__(
        self,
        hidden: Sequence[int] = (1000, 1000, 1000),
        p: float = 0.5,
        in_shape: Sequence[int] = MNIST_SHAPE,
        classes: int = 10,
        stochastic: bool = True,
    ) -> None:
        super().__init__()
        if not hidden or any(h <= 0 for h in hidden):
            raise ValueError(f"hidden widths must be positive, got {list(hidden)}")
        self.in_shape = tuple(in_shape)
        self.stochastic = stochastic
        dims = [math.prod(self.in_shape), *hidden]
        layers: list[nn.Module] = []
        for d_in, d_out in itertools.pairwise(dims):
            layers += [MCDropout(p), nn.Linear(d_in, d_out), nn.ReLU(inplace=True)]
        layers += [MCDropout(p), nn.Linear(dims[-1], classes)]
        self.trunk = nn.Flatten()
        self.head = nn.Sequential(*layers)
        self.penultimate_at = len(layers) - 2  # head[:at] ends with the last ReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


def dropout_head(features: int, hidden: int, classes: int, p: float) -> nn.Sequential:
    """``dropout → dense hidden → relu → dropout → dense classes``: the CNNs' stochastic head."""
    return nn.Sequential(
        MCDropout(p),
        nn.Linear(features, hidden),
        nn.ReLU(inplace=True),
        MCDropout(p),
        nn.Linear(hidden, classes),
    )


class _ConvDropoutNet(nn.Module):
    """A conv trunk (``channels`` output channels, flattened) and a :func:`dropout_head`:
    ``forward``, and the detector features both CNNs expose."""

    feature_layers = ("trunk", TRUNK_GRID_LAYER, "penultimate")
    channels: int
    trunk_hw: tuple[int, int]  # spatial size of the trunk's conv maps before flattening
    penultimate_at = 3  # head[:3] = dropout → dense → relu

    def trunk_features(self, h: torch.Tensor) -> torch.Tensor:
        """Per-channel spatial mean of the flattened trunk output ``h`` (``B×(channels·H·W)``),
        ``B×channels``."""
        return h.view(h.shape[0], self.channels, -1).mean(dim=-1)

    def trunk_grid_features(self, h: torch.Tensor, grid: int = TRUNK_GRID) -> torch.Tensor:
        """The trunk's conv maps ``m`` (``h`` unflattened, ``B×channels×H×W``) averaged over a
        ``grid × grid`` array of cells, ``B×(channels·grid²)``, channel-major (``c·grid² + i·grid
        + j``): ``g_{c,i,j} = mean{m_{c,u,v} : u ∈ U_i, v ∈ V_j}`` with the adaptive-pooling cells
        ``U_i = [⌊iH/grid⌋, ⌈(i+1)H/grid⌉)`` (overlapping by a row when ``grid`` does not divide
        ``H``), ``V_j`` likewise. ``grid = 1`` is :meth:`trunk_features`."""
        maps = h.view(h.shape[0], self.channels, *self.trunk_hw)
        return nn.functional.adaptive_avg_pool2d(maps, grid).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


class DropoutCNN(_ConvDropoutNet):
    """The paper's Keras CNN: a deterministic conv stack and a dropout MLP head.

    trunk: ``conv 32@3×3 (valid) → relu → conv 32@3×3 → relu → maxpool 2×2 → flatten``;
    head: ``dropout → dense hidden → relu → dropout → dense classes``.
    Detector features: ``trunk`` = per-channel spatial means of the conv output (``channels``
    wide, the global average pooling of Lee et al. 2018), ``penultimate`` = the dense ReLU output
    (``hidden`` wide).
    """

    def __init__(
        self,
        p: float = 0.5,
        channels: int = 32,
        hidden: int = 100,
        in_shape: Sequence[int] = MNIST_SHAPE,
        classes: int = 10,
        stochastic: bool = True,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        self.in_shape = tuple(in_shape)
        self.stochastic = stochastic
        self.trunk = nn.Sequential(
            nn.Conv2d(c, channels, 3),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.trunk_hw = ((h - 4) // 2, (w - 4) // 2)
        features = channels * self.trunk_hw[0] * self.trunk_hw[1]
        self.head = dropout_head(features, hidden, classes, p)
        self.channels = channels


class WideDropoutCNN(_ConvDropoutNet):
    """Madry et al.'s (2018) MNIST CNN with a dropout head, for adversarial training.

    trunk: ``conv c₁@5×5 (same) → relu → maxpool 2×2 → conv c₂@5×5 (same) → relu → maxpool 2×2
    → flatten`` (``c₂·7·7`` features for MNIST); head: ``dropout → dense hidden → relu → dropout
    → dense classes``. Madry et al. use ``hidden = 1024`` and no dropout; the ``cnn-wide`` preset
    takes 256 so that the weights stay at 3.4 MB (857,738 parameters). Detector features as for
    :class:`DropoutCNN` (``c₂`` channel means, ``hidden`` penultimate units).
    """

    def __init__(
        self,
        p: float = 0.5,
        channels: Sequence[int] = (32, 64),
        hidden: int = 256,
        in_shape: Sequence[int] = MNIST_SHAPE,
        classes: int = 10,
        stochastic: bool = True,
    ) -> None:
        super().__init__()
        c, h, w = in_shape
        c1, c2 = channels
        self.in_shape = tuple(in_shape)
        self.stochastic = stochastic
        self.trunk = nn.Sequential(
            nn.Conv2d(c, c1, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.trunk_hw = (h // 4, w // 4)
        features = c2 * self.trunk_hw[0] * self.trunk_hw[1]
        self.head = dropout_head(features, hidden, classes, p)
        self.channels = c2
