"""Network presets, the trunk/head split, and MCDropout."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from bayesgate.models.mc.dropout import MCDropout, mc_sampling
from bayesgate.models.networks.dropout import DropoutCNN, DropoutMLP
from bayesgate.models.networks.registry import build_network, preset_architecture, preset_names

BASES = ["mlp-3x1000", "mlp-4x1024", "mlp-2x100", "mlp-2x32", "cnn", "cnn-wide"]


def _mlp_params(widths: list[int]) -> int:
    """Σ over consecutive layers of d_in·d_out + d_out."""
    return sum(a * b + b for a, b in itertools.pairwise(widths))


# hand computation: weights + biases of every layer
EXPECTED_PARAMS = {
    "mlp-3x1000": 784 * 1000 + 1000 + 2 * (1000 * 1000 + 1000) + 1000 * 10 + 10,
    "mlp-4x1024": 784 * 1024 + 1024 + 3 * (1024 * 1024 + 1024) + 1024 * 10 + 10,
    "mlp-2x100": 784 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10,
    "mlp-2x32": 784 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10,
    # conv 1→32 3×3, conv 32→32 3×3, dense 32·12·12 → 100, dense 100 → 10
    "cnn": (1 * 32 * 9 + 32) + (32 * 32 * 9 + 32) + (32 * 12 * 12 * 100 + 100) + (100 * 10 + 10),
    # conv 1→32 5×5, pool, conv 32→64 5×5, pool, dense 64·7·7 → 256, dense 256 → 10
    "cnn-wide": (1 * 32 * 25 + 32)
    + (32 * 64 * 25 + 64)
    + (64 * 7 * 7 * 256 + 256)
    + (256 * 10 + 10),
}


def test_cnn_wide_parameter_count_as_documented() -> None:
    assert EXPECTED_PARAMS["cnn-wide"] == 857_738


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_hand_counts_agree_with_the_layer_formula() -> None:
    assert EXPECTED_PARAMS["mlp-3x1000"] == _mlp_params([784, 1000, 1000, 1000, 10])
    assert EXPECTED_PARAMS["mlp-2x32"] == _mlp_params([784, 32, 32, 10])


@pytest.mark.parametrize("name", BASES)
def test_preset_parameter_counts(name: str) -> None:
    net = build_network(preset_architecture(name))
    det = build_network(preset_architecture(name + "-det"))
    assert _count(net) == EXPECTED_PARAMS[name]
    assert _count(det) == EXPECTED_PARAMS[name]
    assert net.stochastic is True
    assert det.stochastic is False


@pytest.mark.parametrize("name", [n for n in BASES if n.startswith("mlp")])
def test_mlp_has_dropout_before_every_linear(name: str) -> None:
    net = build_network(preset_architecture(name))
    assert isinstance(net, DropoutMLP)
    hidden = preset_architecture(name)["hidden"]
    layers = list(net.head)
    linear_at = [i for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
    assert len(linear_at) == len(hidden) + 1
    for i in linear_at:
        assert i > 0 and isinstance(layers[i - 1], MCDropout), f"no dropout before layer {i}"
    assert sum(isinstance(m, MCDropout) for m in layers) == len(linear_at)
    assert isinstance(layers[0], MCDropout)  # the input itself is dropped
    # the trunk holds no randomness and no parameters
    assert not any(isinstance(m, MCDropout) for m in net.trunk.modules())
    assert _count(net.trunk) == 0
    p = preset_architecture(name)["p"]
    assert all(m.p == p for m in layers if isinstance(m, MCDropout))


def test_cnn_shapes_and_split() -> None:
    torch.manual_seed(0)
    net = build_network(preset_architecture("cnn"))
    assert isinstance(net, DropoutCNN)
    x = torch.rand(3, 1, 28, 28)
    features = net.trunk(x)
    assert features.shape == (3, 32 * 12 * 12)
    assert net.head[1].in_features == 32 * 12 * 12
    net.eval()
    assert net(x).shape == (3, 10)
    assert torch.equal(net(x), net.head(net.trunk(x)))
    assert not any(isinstance(m, MCDropout) for m in net.trunk.modules())
    head = list(net.head)
    for i, m in enumerate(head):
        if isinstance(m, nn.Linear):
            assert isinstance(head[i - 1], MCDropout)
    # a different input size changes the feature count consistently
    small = DropoutCNN(channels=4, hidden=5, in_shape=(3, 10, 12), classes=2).eval()
    assert small.trunk(torch.rand(2, 3, 10, 12)).shape == (2, 4 * 3 * 4)
    assert small(torch.rand(2, 3, 10, 12)).shape == (2, 2)


def test_unknown_preset_lists_the_valid_names() -> None:
    names = preset_names()
    assert len(names) == 2 * len(BASES)
    assert set(names) == set(BASES) | {b + "-det" for b in BASES}
    with pytest.raises(ValueError, match="unknown preset 'mlp-9x9'") as info:
        preset_architecture("mlp-9x9")
    for name in names:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="unknown preset"):
        preset_architecture("-det")


@pytest.mark.parametrize("name", preset_names())
def test_build_network_round_trips_from_the_architecture(name: str) -> None:
    arch = preset_architecture(name)
    stored = json.loads(json.dumps(arch))  # as it comes back from card.json
    assert stored == arch
    assert stored["preset"] == name
    assert stored["stochastic"] is (not name.endswith("-det"))
    assert stored["in_shape"] == [1, 28, 28] and stored["classes"] == 10
    torch.manual_seed(0)
    a = build_network(arch)
    b = build_network(stored)
    assert type(a) is type(b)
    assert a.in_shape == b.in_shape == (1, 28, 28)
    assert a.stochastic == b.stochastic
    b.load_state_dict(a.state_dict(), strict=True)
    a.eval()
    b.eval()
    x = torch.rand(2, 1, 28, 28)
    assert torch.equal(a(x), b(x))


def test_dropout_rate_override() -> None:
    arch = preset_architecture("mlp-2x100", p=0.1)
    assert arch["p"] == 0.1
    net = build_network(arch)
    assert {m.p for m in net.modules() if isinstance(m, MCDropout)} == {0.1}
    # the preset table is not modified by an override
    assert preset_architecture("mlp-2x100")["p"] == 0.5


def test_build_network_rejects_bad_architectures() -> None:
    with pytest.raises(ValueError, match="unknown network type 'resnet'"):
        build_network({"type": "resnet"})
    with pytest.raises(ValueError, match="unknown network type"):
        build_network({"hidden": [3]})
    with pytest.raises(ValueError, match="DropoutMLP"):
        build_network({"type": "dropout_mlp", "hidden": [3], "depth": 2})
    with pytest.raises(ValueError, match="hidden widths"):
        build_network({"type": "dropout_mlp", "hidden": [0]})
    with pytest.raises(ValueError, match="dropout rate"):
        build_network({"type": "dropout_mlp", "hidden": [3], "p": 1.0})


def test_registry_names_the_bbb_networks_it_imports_lazily() -> None:
    from bayesgate.models.networks.bbb.networks import BAYES_NETWORK_TYPES
    from bayesgate.models.networks.registry import (
        BBB_NETWORK_TYPES,
        BBB_PRESET_NAMES,
        network_class,
        network_types,
    )

    assert set(BBB_NETWORK_TYPES) == set(BAYES_NETWORK_TYPES)
    assert set(network_types()) == {
        "dropout_mlp",
        "dropout_cnn",
        "dropout_cnn_wide",
        *BAYES_NETWORK_TYPES,
    }
    for name, cls in BAYES_NETWORK_TYPES.items():
        assert network_class(name) is cls
    for name in BBB_PRESET_NAMES:
        assert preset_architecture(name)["type"] in BAYES_NETWORK_TYPES


def test_dropout_networks_registry_and_store_do_not_import_bayes_by_backprop() -> None:
    code = (
        "import sys\n"
        "from bayesgate.models.networks import build_network, preset_architecture, preset_names\n"
        "import bayesgate.models.mc, bayesgate.models.store.directory\n"
        "build_network(preset_architecture('cnn'))\n"
        "assert 'bbb-lenet5' in preset_names(bbb=True)\n"
        "before = sorted(m for m in sys.modules if '.bbb' in m)\n"
        "build_network(preset_architecture('bbb-lenet5'))\n"
        "after = sorted(m for m in sys.modules if '.bbb' in m)\n"
        "print(before, 'bayesgate.models.networks.bbb.networks' in after)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split() == ["[]", "True"]


# ---------------------------------------------------------------- MCDropout


def test_mcdropout_is_identity_in_eval_and_active_inside_mc_sampling() -> None:
    drop = MCDropout(0.5).eval()
    x = torch.rand(64, 100) + 0.5
    assert torch.equal(drop(x), x)
    with mc_sampling():
        y = drop(x)
    assert not torch.equal(y, x)
    assert torch.equal(drop(x), x)  # off again after the block
    zero = y == 0
    assert 0.3 < zero.double().mean().item() < 0.7
    assert torch.allclose(y[~zero], 2 * x[~zero])  # kept units scaled by 1/(1−p)
    # training mode: active without mc_sampling
    drop.train()
    assert (drop(x) == 0).any()


def test_mc_sampling_state_is_restored_after_an_exception() -> None:
    drop = MCDropout(0.5).eval()
    x = torch.ones(10, 10)
    with pytest.raises(RuntimeError, match="boom"), mc_sampling():
        raise RuntimeError("boom")
    assert torch.equal(drop(x), x)


def test_mcdropout_p_zero_and_invalid_p() -> None:
    x = torch.rand(5, 5)
    with mc_sampling():
        assert torch.equal(MCDropout(0.0).train()(x), x)
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="dropout rate p"):
            MCDropout(p)


def test_mcdropout_generator_is_reproducible() -> None:
    drop = MCDropout(0.3).eval()
    x = torch.ones(50, 40)

    def draw(seed: int) -> torch.Tensor:
        with mc_sampling(torch.Generator().manual_seed(seed)):
            return drop(x)

    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))
    # the global RNG plays no part when a generator is given
    torch.manual_seed(0)
    a = draw(5)
    torch.manual_seed(99)
    assert torch.equal(a, draw(5))


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("use_generator", [True, False])
def test_mcdropout_keeps_the_expected_scale(p: float, use_generator: bool) -> None:
    n = 1_000_000
    drop = MCDropout(p).eval()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0) if use_generator else None
    with mc_sampling(generator):
        y = drop(torch.ones(n, dtype=torch.float64))
    # each element is 0 or 1/(1−p), mean 1, variance p/(1−p): allow 5 standard errors
    se_mean = (p / (1 - p) / n) ** 0.5
    assert abs(y.mean().item() - 1.0) < 5 * se_mean
    dropped = (y == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5
    assert torch.allclose(y[y != 0], torch.full((1,), 1 / (1 - p), dtype=torch.float64))


@pytest.mark.parametrize("name", ["mlp-2x32", "cnn"])
def test_mc_forward_under_inference_mode_leaves_the_input_alone(name: str) -> None:
    # MCDropout masks its own activations in place under inference mode; the caller's input
    # (which the MLP trunk only flattens, i.e. views) must never be touched.
    torch.manual_seed(0)
    net = build_network(preset_architecture(name)).eval()
    x = torch.rand(3, 1, 28, 28)
    before = x.clone()
    with torch.inference_mode(), mc_sampling(torch.Generator().manual_seed(0)):
        a = net(x)
        b = net(x)
    assert torch.equal(x, before)
    assert not torch.equal(a, b)  # dropout was on
