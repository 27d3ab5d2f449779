"""Hand-checkable networks for the attacks tests."""

from __future__ import annotations

import torch
from torch import nn


class LinearNet(nn.Module):
    """Deterministic softmax regression ``logits = W·vec(x) + b`` with the trunk/head split.

    ``∇_x log softmax(Wx + b)_y = W_y − Σ_c p_c W_c`` is known in closed form, so attack steps
    can be computed by hand.
    """

    def __init__(self, in_shape: tuple[int, ...] = (1, 4, 4), classes: int = 3, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        d = int(torch.tensor(in_shape).prod())
        self.in_shape = in_shape
        self.stochastic = False
        self.trunk = nn.Flatten()
        self.head = nn.Linear(d, classes)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(classes, d, generator=gen))
            self.head.bias.copy_(torch.randn(classes, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))
