"""Bayes-by-Backprop CNNs through the project's machinery: presets, the MC engine (K samples per
example in both sampling modes), training with the ELBO, the model store and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesgate.models.mc.engine import mc_log_predictive, mc_logits, mc_predict
from bayesgate.models.mc.uncertainty import kwon_uncertainty, kwon_variance
from bayesgate.models.networks.bbb.layers import (
    BayesConv2d,
    BayesLinear,
    bayes_layers,
    kl_divergence,
)
from bayesgate.models.networks.bbb.networks import BBBAlexNet, BBBLeNet5
from bayesgate.models.networks.registry import build_network, preset_architecture, preset_names
from bayesgate.models.store.directory import ModelCard, load_model, save_model
from bayesgate.models.training.train import TrainConfig, train


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _noisy(net: nn.Module, rho: float = -2.0) -> nn.Module:
    """Widen every posterior (σ ≈ softplus(rho)) so that the MC samples differ visibly."""
    with torch.no_grad():
        for layer in bayes_layers(net):
            layer.weight_rho.fill_(rho)
            layer.bias_rho.fill_(rho)
    return net.eval()


def test_presets_build_the_published_architectures() -> None:
    assert {"bbb-lenet5", "bbb-alexnet"} <= set(preset_names(bbb=True))
    assert "bbb-lenet5" not in preset_names()  # the dropout list (and its -det forms) is unchanged
    lenet = build_network(preset_architecture("bbb-lenet5"))
    assert isinstance(lenet, BBBLeNet5) and isinstance(lenet.trunk, nn.Identity)
    convs = [m for m in lenet.modules() if isinstance(m, BayesConv2d)]
    dense = [m for m in lenet.modules() if isinstance(m, BayesLinear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (1, 6, 5),
        (6, 16, 5),
    ]
    assert [(d.in_features, d.out_features) for d in dense] == [(256, 120), (120, 84), (84, 10)]
    assert sum(isinstance(m, nn.Softplus) for m in lenet.modules()) == 4
    alex = build_network(preset_architecture("bbb-alexnet"))
    assert isinstance(alex, BBBAlexNet)
    convs = [m for m in alex.modules() if isinstance(m, BayesConv2d)]
    assert [c.out_channels for c in convs] == [64, 192, 384, 256, 128]
    assert [(d.in_features, d.out_features) for d in bayes_layers(alex)[-1:]] == [(128, 10)]
    # every weight layer is Bayesian: no deterministic conv or dense layer is left
    for net in (lenet, alex):
        assert not any(type(m) in (nn.Conv2d, nn.Linear) for m in net.modules())
        assert net.stochastic and net.per_example_noise
        assert net.eval()(torch.rand(3, 1, 28, 28)).shape == (3, 10)


def test_bad_architectures_are_rejected() -> None:
    with pytest.raises(ValueError, match="no dropout"):
        preset_architecture("bbb-lenet5", p=0.5)
    with pytest.raises(ValueError, match="too small"):
        BBBLeNet5(in_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="sampling mode"):
        build_network({**preset_architecture("bbb-lenet5"), "sampling": "flipout"})
    with pytest.raises(ValueError, match="activation"):
        BBBLeNet5(activation="tanh")
    with pytest.raises(ValueError, match="bbb-lenet5"):
        preset_architecture("bbb-nope")  # the error lists the BBB presets too


@pytest.mark.parametrize("mode", ["local", "weights"])
def test_k_samples_differ_per_example_in_both_sampling_modes(mode: str) -> None:
    """The classic bug: a batch replicated K times through weight-sampling layers gives K identical
    samples per example. Both modes must give K different samples for every example."""
    torch.manual_seed(0)
    net = _noisy(build_network({**preset_architecture("bbb-lenet5"), "sampling": mode}))
    x = torch.rand(1, 1, 28, 28, generator=_gen(1)).expand(5, -1, -1, -1)  # 5 copies
    probs = mc_predict(net, x, 6, generator=_gen(2), max_rows=12).probs
    assert probs.shape == (5, 6, 10)
    for b in range(5):
        for i in range(6):
            for j in range(i + 1, 6):
                assert not torch.allclose(probs[b, i], probs[b, j]), f"{mode}: b={b} k={i},{j}"
    _, epistemic = kwon_uncertainty(probs)
    assert (epistemic > 1e-6).all()
    if mode == "local":  # per-example noise: copies of one image get different samples
        assert not torch.allclose(probs[0], probs[1])
    else:  # one weight sample per pass, shared by the batch: copies get the same K samples
        assert torch.allclose(probs[0], probs[1])
    # training forward and attack forward follow the same rule
    net.train()
    logits = mc_logits(net, x, 4)
    assert logits.shape == (5, 4, 10) and not torch.allclose(logits[0, 0], logits[0, 1])
    net.eval()
    x_req = x.clone().requires_grad_(True)
    mc_log_predictive(net, x_req, 3).sum().backward()
    assert x_req.grad is not None and x_req.grad.abs().sum() > 0


def test_replicated_rows_through_weight_sampling_would_be_caught() -> None:
    """Force the vectorised path on a weight-sampling net: the K samples collapse, which the test
    above detects (so it can fail)."""
    net = _noisy(build_network({**preset_architecture("bbb-lenet5"), "sampling": "weights"}))
    net.__class__ = type("Buggy", (BBBLeNet5,), {"per_example_noise": property(lambda s: True)})
    probs = mc_predict(net, torch.rand(2, 1, 28, 28, generator=_gen(1)), 4, generator=_gen(0)).probs
    assert torch.allclose(probs[:, :1].expand(-1, 4, -1), probs)


def test_mc_engine_is_reproducible_and_eval_mode_is_the_posterior_mean() -> None:
    net = _noisy(build_network(preset_architecture("bbb-lenet5")))
    x = torch.rand(3, 1, 28, 28, generator=_gen(0))
    a = mc_predict(net, x, 4, generator=_gen(5)).probs
    b = mc_predict(net, x, 4, generator=_gen(5)).probs
    assert torch.equal(a, b)
    assert net.training is False
    # outside mc_sampling, eval mode is the posterior-mean network
    with torch.no_grad():
        mean_net = net(x)
        ref = x
        for m in net.head:
            if isinstance(m, BayesConv2d):
                ref = F.conv2d(ref, m.weight_mu, m.bias_mu, m.stride, m.padding)
            elif isinstance(m, BayesLinear):
                ref = F.linear(ref, m.weight_mu, m.bias_mu)
            else:
                ref = m(ref)
    assert torch.allclose(mean_net, ref, atol=1e-6)


def test_store_round_trip_of_a_bbb_network(tmp_path: Path) -> None:
    for mode in ("local", "weights"):
        arch = {**preset_architecture("bbb-lenet5"), "sampling": mode}
        torch.manual_seed(0)
        net = _noisy(build_network(arch))
        card = ModelCard(name=f"tiny-bbb-{mode}", architecture=json.loads(json.dumps(arch)))
        save_model(net, card, tmp_path / mode)
        loaded = load_model(tmp_path / mode)
        assert type(loaded.network) is BBBLeNet5
        assert loaded.network.sampling == mode
        assert loaded.network.per_example_noise is (mode == "local")
        for key, value in net.state_dict().items():
            assert torch.equal(loaded.network.state_dict()[key], value)
        x = torch.rand(2, 1, 28, 28, generator=_gen(3))
        p1 = mc_predict(net, x, 5, generator=_gen(9)).probs
        p2 = mc_predict(loaded.network, x, 5, generator=_gen(9)).probs
        assert torch.equal(p1, p2)


def test_train_uses_nll_plus_scheduled_kl_over_n() -> None:
    """With σ ≈ 0 (ρ = −30) and a learning rate too small to move the weights, the logged loss of
    an epoch of two minibatches is ``NLL + (β₁·B₁ + β₂·B₂)/N · KL/N``; Blundell's β = (2/3, 1/3)."""
    torch.manual_seed(0)
    net = _noisy(BBBLeNet5(in_shape=(1, 16, 16), classes=3), rho=-30.0)
    x = torch.rand(64, 1, 16, 16, generator=_gen(0))
    y = torch.randint(0, 3, (64,), generator=_gen(1))
    with torch.no_grad():
        nll = float(F.cross_entropy(net.eval()(x).double(), y))
        kl = float(kl_divergence(net))
    for schedule, weight in (("blundell", (2 / 3 + 1 / 3) / 2), ("uniform", 0.5), ("2", 2.0)):
        config = TrainConfig(
            alpha=0.0,
            loss="elbo",
            k_train=2,
            epochs=1,
            batch_size=32,
            optimizer="sgd",
            lr=1e-30,
            beta_schedule=schedule,
        )
        result = train(net, (x, y), None, config, progress=False)
        expected = nll + weight * kl / 64
        assert math.isclose(result.history[0]["train_loss"], expected, rel_tol=1e-4), schedule
    with pytest.raises(ValueError, match="α = 0"):
        TrainConfig(alpha=0.5, loss="elbo")
    with pytest.raises(ValueError, match="beta schedule"):
        TrainConfig(beta_schedule="soenderby")


def test_training_a_tiny_bbb_net_learns() -> None:
    """Two separable classes on 16×16 images: BB-α (α = 0.5, K = 3) fits them in a few epochs."""
    torch.manual_seed(0)
    x = torch.rand(256, 1, 16, 16, generator=_gen(0)) * 0.3
    y = torch.randint(0, 2, (256,), generator=_gen(1))
    x[y == 1, :, :8] += 0.7  # class 1: bright upper half
    net = build_network(
        {
            "type": "bbb_lenet5",
            "in_shape": [1, 16, 16],
            "classes": 2,
            "activation": "relu",
            "prior": {"kind": "scale_mixture", "pi": 0.5, "sigma1": 1.0, "sigma2": 0.01},
        }
    )
    config = TrainConfig(alpha=0.5, k_train=3, epochs=8, batch_size=32, lr=3e-3)
    train(net, (x, y), None, config, progress=False)
    probs = mc_predict(net, x, 8, generator=_gen(0)).probs
    accuracy = float((probs.mean(1).argmax(1) == y).double().mean())
    assert accuracy > 0.95


def test_kwon_totals_match_the_sample_formula() -> None:
    """Shridhar's per-image code: ``diag(p̄) − p̂ᵀp̂/T`` and ``(p̂ − p̄)ᵀ(p̂ − p̄)/T`` (float64)."""
    g = _gen(0)
    probs = torch.softmax(2 * torch.randn(4, 7, 5, generator=g, dtype=torch.float64), -1)
    aleatoric, epistemic = kwon_uncertainty(probs)
    for b in range(4):
        p_hat = probs[b]
        p_bar = p_hat.mean(0)
        ale = torch.diag(torch.diag(p_bar) - p_hat.T @ p_hat / 7).sum()
        epi = torch.diag((p_hat - p_bar).T @ (p_hat - p_bar) / 7).sum()
        assert math.isclose(float(aleatoric[b]), float(ale), rel_tol=1e-12)
        assert math.isclose(float(epistemic[b]), float(epi), rel_tol=1e-12)
        total = 1 - float((p_bar**2).sum())
        assert math.isclose(float(aleatoric[b] + epistemic[b]), total, rel_tol=1e-12)
    assert torch.allclose(kwon_variance(probs)[0].sum(-1), aleatoric)


def test_cli_trains_and_evaluates_a_bbb_preset(
    tmp_path: Path, mnist_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from bayesgate.cli import main

    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    out = tmp_path / "bbb"
    common = ["--limit", "256", "--val-size", "200", "--epochs", "1", "--no-progress"]
    args = [
        "train",
        "--preset",
        "bbb-lenet5",
        "--loss",
        "elbo",
        "--k-train",
        "1",
        "--out",
        str(out),
    ]
    assert main([*args, "--beta-schedule", "uniform", "--sampling", "weights", *common]) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["architecture"]["type"] == "bbb_lenet5"
    assert card["architecture"]["sampling"] == "weights"
    assert card["training"]["loss"] == "elbo" and card["training"]["alpha"] == 0.0
    assert card["training"]["beta_schedule"] == "uniform"
    assert card["inference"] == {"k_test": 100, "k_attack": 10}
    capsys.readouterr()
    assert main(["evaluate", str(out), "--k", "3", "--limit", "40", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    total = 1 - report["mean_kwon_aleatoric"] - report["mean_kwon_epistemic"]
    assert report["mean_kwon_epistemic"] > 0 and 0 <= total <= 1
    # user errors: exit code 2 with a message naming the problem
    assert main(["train", "--preset", "mlp-2x32", "--sampling", "weights", *common]) == 2
    assert "--sampling" in capsys.readouterr().err
    assert main([*args, "--alpha", "0.5", *common]) == 2
    assert "α = 0" in capsys.readouterr().err
    assert main([*args, "--beta-schedule", "sometimes", *common]) == 2
    assert "beta schedule" in capsys.readouterr().err
