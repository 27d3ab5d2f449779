"""What the adversarial-training tests share: 300 training digits split 200/100, a small
network with fixed initial weights, and a BB-α energy comparable across calls."""

from __future__ import annotations

from pathlib import Path

import torch

from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.mc.engine import mc_logits
from bayesgate.models.mc.losses import bbalpha_softmax_loss
from bayesgate.models.networks.registry import build_network, preset_architecture

Data = tuple[torch.Tensor, torch.Tensor]


def split_digits(mnist_root: Path) -> tuple[Data, Data]:
    """The first 300 training digits: 200 to train on, 100 held out."""
    x, y = load_mnist("train", data_dir=mnist_root, limit=300)
    return (x[:200], y[:200]), (x[200:], y[200:])


def small_net(preset: str = "mlp-2x32", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_network(preset_architecture(preset))


def energy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """BB-α energy (α = 0.5, K = 50) with masks from a fixed generator: comparable across calls."""
    net.eval()
    with torch.no_grad(), mc_sampling(torch.Generator().manual_seed(7)):
        return float(bbalpha_softmax_loss(mc_logits(net, x, 50), y, 0.5))
