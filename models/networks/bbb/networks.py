"""Bayes-by-Backprop CNNs of Shridhar et al. (2018): every conv and dense layer is Bayesian.

Both networks follow the ``trunk``/``head`` convention of :mod:`bayesgate.models.networks.dropout`.
Since the very
first layer is stochastic, the trunk is empty (``nn.Identity``) and the head is the whole network.
``per_example_noise`` tells the MC engine whether K passes may be vectorised by replicating rows
(local reparameterisation: yes) or must be K separate calls (weight sampling: no).

- ``bbb_lenet5`` (preset ``bbb-lenet5``): ``conv 6@5×5 → act → maxpool 2 → conv 16@5×5 → act →
  maxpool 2 → flatten → dense 120 → act → dense 84 → act → dense classes``; act = softplus.
  On 28×28 input the flattened features are 16·4·4 = 256 (Shridhar resize MNIST to 32×32: 400).
- ``bbb_alexnet`` (preset ``bbb-alexnet``), their small AlexNet: ``conv 64@11×11 stride 4 → act →
  maxpool 2 → conv 192@5×5 pad 2 → act → maxpool 2 → conv 384@3×3 pad 1 → act → conv 256@3×3
  pad 1 → act → conv 128@3×3 pad 1 → act → maxpool 2 → flatten → dense classes``. Their first
  convolution pads by 5 on 32×32 images; on 28×28 MNIST we pad by 7 (= 2 pixels of canvas + 5),
  which gives the same 8×8 → 4 → 2 → 1 feature-map sizes and 128 features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bayesgate.models.networks.bbb.layers import (
    BayesConv2d,
    BayesLinear,
    check_sampling,
    make_prior,
    set_sampling,
)
from bayesgate.models.networks.presets import MNIST_SHAPE

ACTIVATIONS: dict[str, type[nn.Module]] = {"softplus": nn.Softplus, "relu": nn.ReLU}


class _BayesCNN(nn.Module):
    """Common part: config checks, the empty trunk, the sampling switch.

    Detector features: ``penultimate`` = the input of the final dense layer (``head[:-1]``).
    """

    feature_layers = ("penultimate",)

    def __init__(
        self,
        in_shape: Sequence[int],
        classes: int,
        sampling: str,
        prior: dict[str, Any] | None,
        rho_init: float,
        mu_init_std: float | None,
        activation: str,
        stochastic: bool,
    ) -> None:
        super().__init__()
        check_sampling(sampling)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
            )
        if len(in_shape) != 3 or any(d <= 0 for d in in_shape):
            raise ValueError(f"in_shape must be C×H×W with positive sizes, got {list(in_shape)}")
        if classes < 2:
            raise ValueError(f"classes must be ≥ 2, got {classes}")
        self.in_shape = tuple(in_shape)
        self.stochastic = stochastic
        self._sampling = sampling
        self._layer_kwargs = {
            "prior": make_prior(prior),
            "sampling": sampling,
            "rho_init": rho_init,
            "mu_init_std": mu_init_std,
        }
        self._act = ACTIVATIONS[activation]
        self.trunk = nn.Identity()

    @property
    def sampling(self) -> str:
        return self._sampling

    @sampling.setter
    def sampling(self, mode: str) -> None:
        set_sampling(self, mode)
        self._sampling = mode

    @property
    def penultimate_at(self) -> int:
        """``head[:penultimate_at]`` ends just before the final dense layer."""
        return len(self.head) - 1

    @property
    def per_example_noise(self) -> bool:
        """True when every row draws its own noise, so K passes = one forward on K·B rows."""
        return self._sampling == "local"

    def _conv(self, *args: int, **kwargs: int) -> BayesConv2d:
        return BayesConv2d(*args, **kwargs, **self._layer_kwargs)

    def _dense(self, d_in: int, d_out: int) -> BayesLinear:
        return BayesLinear(d_in, d_out, **self._layer_kwargs)

    def _features(self, convs: nn.Sequential) -> int:
        """Flattened size of ``convs`` on one input of ``in_shape`` (a dry run, no sampling)."""
        was_training = convs.training
        convs.eval()
        try:
            with torch.no_grad():
                out = convs(torch.zeros(1, *self.in_shape))
        except RuntimeError as exc:
            raise ValueError(
                f"input shape {list(self.in_shape)} is too small for {type(self).__name__}: {exc}"
            ) from exc
        finally:
            convs.train(was_training)
        return math.prod(out.shape[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


class BBBLeNet5(_BayesCNN):
    """Shridhar's Bayesian LeNet-5 (see the module docstring); ``x`` ``B×C×H×W`` → logits
    ``B×classes``."""

    def __init__(
        self,
        in_shape: Sequence[int] = MNIST_SHAPE,
        classes: int = 10,
        sampling: str = "local",
        prior: dict[str, Any] | None = None,
        rho_init: float = -5.0,
        mu_init_std: float | None = None,
        activation: str = "softplus",
        stochastic: bool = True,
    ) -> None:
        super().__init__(
            in_shape, classes, sampling, prior, rho_init, mu_init_std, activation, stochastic
        )
        convs = nn.Sequential(
            self._conv(self.in_shape[0], 6, 5),
            self._act(),
            nn.MaxPool2d(2),
            self._conv(6, 16, 5),
            self._act(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        features = self._features(convs)
        self.head = nn.Sequential(
            *convs,
            self._dense(features, 120),
            self._act(),
            self._dense(120, 84),
            self._act(),
            self._dense(84, classes),
        )


class BBBAlexNet(_BayesCNN):
    """Shridhar's small Bayesian AlexNet (see the module docstring); ``conv1_padding`` 7 sizes it
    for 28×28 input."""

    def __init__(
        self,
        in_shape: Sequence[int] = MNIST_SHAPE,
        classes: int = 10,
        sampling: str = "local",
        prior: dict[str, Any] | None = None,
        rho_init: float = -5.0,
        mu_init_std: float | None = None,
        activation: str = "softplus",
        conv1_padding: int = 7,
        stochastic: bool = True,
    ) -> None:
        super().__init__(
            in_shape, classes, sampling, prior, rho_init, mu_init_std, activation, stochastic
        )
        convs = nn.Sequential(
            self._conv(self.in_shape[0], 64, 11, stride=4, padding=conv1_padding),
            self._act(),
            nn.MaxPool2d(2),
            self._conv(64, 192, 5, padding=2),
            self._act(),
            nn.MaxPool2d(2),
            self._conv(192, 384, 3, padding=1),
            self._act(),
            self._conv(384, 256, 3, padding=1),
            self._act(),
            self._conv(256, 128, 3, padding=1),
            self._act(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        features = self._features(convs)
        self.head = nn.Sequential(*convs, self._dense(features, classes))


BAYES_NETWORK_TYPES: dict[str, type[nn.Module]] = {
    "bbb_lenet5": BBBLeNet5,
    "bbb_alexnet": BBBAlexNet,
}
