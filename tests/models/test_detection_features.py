"""Detector features from the MC engine: same K passes, same masks, the right activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.mc.engine import mc_logits_features, mc_predict, mc_predict_features
from bayesgate.models.networks.registry import build_network, preset_architecture


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _net(preset: str, **changes: object) -> nn.Module:
    torch.manual_seed(0)
    net = build_network({**preset_architecture(preset), **changes})
    return net.eval()


@pytest.mark.parametrize(
    ("preset", "layers"),
    [
        ("cnn", {"trunk": 32, "trunk_2x2": 128, "penultimate": 100}),
        ("mlp-2x32", {"penultimate": 32}),
        ("bbb-lenet5", {"penultimate": 84}),
        ("cnn-det", {"trunk": 32, "trunk_2x2": 128, "penultimate": 100}),
        ("cnn-wide", {"trunk": 64, "trunk_2x2": 256, "penultimate": 256}),
    ],
)
@pytest.mark.parametrize("max_rows", [None, 3])
def test_probabilities_are_those_of_mc_predict(
    preset: str, layers: dict[str, int], max_rows: int | None
) -> None:
    """Features ride along: the probabilities are bit-identical to mc_predict's (same masks)."""
    net, x = _net(preset), torch.rand(5, 1, 28, 28, generator=_gen(1))
    plain = mc_predict(net, x, 4, generator=_gen(2), max_rows=max_rows)
    with_features = mc_predict_features(net, x, 4, generator=_gen(2), max_rows=max_rows)
    assert torch.equal(plain.probs, with_features.probs)
    assert {n: tuple(f.shape) for n, f in with_features.features.items()} == {
        n: (5, d) for n, d in {**layers, "input": 784}.items()
    }
    assert torch.equal(with_features.features["input"], x.flatten(1))


@pytest.mark.parametrize("preset", ["cnn", "cnn-det", "mlp-2x32", "bbb-lenet5"])
@pytest.mark.parametrize(
    "wanted", [(), ("trunk",), ("penultimate",), ("trunk", "penultimate"), ("input", "trunk_2x2")]
)
def test_a_layer_subset_computes_only_those_layers_with_the_same_bits(
    preset: str, wanted: tuple[str, ...]
) -> None:
    """``layers=``: exactly the asked layers the network has, each bit-identical to the full
    call's, and the same probabilities (the same masks drawn)."""
    net, x = _net(preset), torch.rand(5, 1, 28, 28, generator=_gen(1))
    full = mc_predict_features(net, x, 4, generator=_gen(2), max_rows=7)
    some = mc_predict_features(net, x, 4, generator=_gen(2), max_rows=7, layers=wanted)
    assert torch.equal(full.probs, some.probs)
    assert set(some.features) == set(wanted) & set(full.features)
    for name, value in some.features.items():
        assert torch.equal(value, full.features[name]), name


def test_weight_sampling_bbb_gives_the_same_probabilities() -> None:
    net = _net("bbb-lenet5")
    net.sampling = "weights"
    x = torch.rand(3, 1, 28, 28, generator=_gen(1))
    plain = mc_predict(net, x, 4, generator=_gen(2))
    with_features = mc_predict_features(net, x, 4, generator=_gen(2))
    assert torch.equal(plain.probs, with_features.probs)


def test_cnn_features_without_dropout_are_the_plain_activations() -> None:
    """p = 0: every pass is the deterministic net; trunk = channel means of the conv output,
    penultimate = relu(dense(conv features)) — computed here layer by layer."""
    net, x = _net("cnn", p=0.0), torch.rand(4, 1, 28, 28, generator=_gen(3))
    conv1, conv2, dense = net.trunk[0], net.trunk[2], net.head[1]
    maps = torch.max_pool2d(torch.relu(conv2(torch.relu(conv1(x)))), 2)
    out = mc_predict_features(net, x, 6, generator=_gen(0)).features
    torch.testing.assert_close(out["trunk"], maps.mean(dim=(2, 3)))
    torch.testing.assert_close(out["penultimate"], torch.relu(dense(maps.flatten(1))))
    # 12×12 maps, 2×2 cells of 6×6: channel-major (c, top-left, top-right, bottom-left, …)
    cells = [maps[:, :, i : i + 6, j : j + 6].mean(dim=(2, 3)) for i in (0, 6) for j in (0, 6)]
    torch.testing.assert_close(out["trunk_2x2"], torch.stack(cells, dim=-1).flatten(1))


@pytest.mark.parametrize(
    ("preset", "size", "cells"),
    [
        # 12×12 maps, m = 12u + v: cells [0,6)×[0,6) → 12·2.5 + 2.5, [0,6)×[6,12) → 30 + 8.5, …
        ("cnn", 12, [32.5, 38.5, 104.5, 110.5]),
        # 7×7 maps, m = 7u + v: adaptive cells [0,4) and [3,7) share row/column 3:
        # rows mean 1.5 or 4.5 → 7·1.5 + 1.5 = 12, 10.5 + 4.5 = 15, 31.5 + 1.5 = 33, 36
        ("cnn-wide", 7, [12.0, 15.0, 33.0, 36.0]),
    ],
)
def test_grid_features_of_a_known_map(preset: str, size: int, cells: list[float]) -> None:
    """``trunk_grid_features`` of ``m_{c,u,v} = c·size² + size·u + v``: the mean of each 2×2
    cell, by hand; ``grid = 1`` is the per-channel mean ``trunk_features``."""
    net = _net(preset)
    c = net.channels
    h = torch.arange(c * size * size, dtype=torch.float32).view(1, -1)
    expected = torch.tensor(cells) + size * size * torch.arange(c, dtype=torch.float32)[:, None]
    torch.testing.assert_close(net.trunk_grid_features(h), expected.view(1, -1))
    torch.testing.assert_close(net.trunk_grid_features(h, grid=1), net.trunk_features(h))


def test_penultimate_is_the_mean_over_the_k_masks() -> None:
    """Same generator state → the same K masks; the penultimate is their average activation."""
    net, x, k = _net("mlp-2x32"), torch.rand(3, 1, 28, 28, generator=_gen(4)), 5
    out = mc_predict_features(net, x, k, generator=_gen(7)).features["penultimate"]
    with torch.no_grad(), mc_sampling(_gen(7)):
        rows = net.trunk(x).repeat_interleave(k, dim=0)
        z = net.head[: net.penultimate_at](rows)
    torch.testing.assert_close(out, z.view(3, k, -1).mean(dim=1))


def test_features_are_differentiable_in_attack_mode() -> None:
    net = _net("cnn")
    x = torch.rand(2, 1, 28, 28, generator=_gen(5), requires_grad=True)
    with mc_sampling(_gen(0)):
        logits, features = mc_logits_features(net, x, 3)
    assert logits.shape == (2, 3, 10)
    (
        features["trunk"].sum() + features["trunk_2x2"].sum() + features["penultimate"].sum()
    ).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    x.grad = None
    features["input"].pow(2).sum().backward()  # the pixels themselves: ∂Σx²/∂x = 2x
    torch.testing.assert_close(x.grad, 2 * x.detach())
