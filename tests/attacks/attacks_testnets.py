"""Hand-checkable networks for the attacks tests, and a recorder of query-only attacks' queries."""

from __future__ import annotations

from collections.abc import Callable

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


class Queries:
    """``score_fn`` of a deterministic network and a detector ``detector(x)`` for the query-only
    adaptive attacks; records the rows of every query and fails if autograd is on or the images
    carry a graph."""

    def __init__(self, net: nn.Module, detector: Callable[[torch.Tensor], torch.Tensor]):
        self.net, self.detector = net, detector
        self.rows: list[int] = []

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert not torch.is_grad_enabled(), "queried with autograd on"
        assert not x.requires_grad
        self.rows.append(x.shape[0])
        return torch.log_softmax(self.net(x), dim=1), self.detector(x)
