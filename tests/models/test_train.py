"""Training loop on small MNIST subsets, early stopping, config checks, evaluation metrics."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.training.evaluate import evaluate, expected_calibration_error, metrics_from_mc
from bayesgate.models.training.train import TrainConfig, train

Data = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def train_data(mnist_root: Path) -> Data:
    return load_mnist("train", data_dir=mnist_root, limit=2000)


@pytest.fixture(scope="module")
def val_data(mnist_root: Path) -> Data:
    return load_mnist("val", data_dir=mnist_root, limit=1000)


def _net(preset: str = "mlp-2x32", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_network(preset_architecture(preset))


def test_tiny_mlp_learns_mnist(train_data: Data, val_data: Data) -> None:
    net = _net()
    config = TrainConfig(alpha=0.5, k_train=10, epochs=2, batch_size=50, lr=5e-3, k_val=10)
    result = train(net, train_data, val_data, config, progress=False)
    assert [row["epoch"] for row in result.history] == [1, 2]
    losses = [row["train_loss"] for row in result.history]
    assert losses[1] < losses[0] < math.log(10)  # below the loss of a uniform guess
    assert result.best_epoch == 2
    assert result.val_metrics["accuracy"] > 0.80
    assert result.val_metrics == {
        key[4:]: value for key, value in result.history[-1].items() if key.startswith("val_")
    }
    assert result.samples_per_second > 0 and result.seconds > 0
    assert not net.training
    # independent check of the reported accuracy: MC-averaged predictive with other masks
    probs = mc_predict(net, val_data[0], 20, generator=torch.Generator().manual_seed(99)).probs
    accuracy = (probs.mean(1).argmax(1) == val_data[1]).double().mean().item()
    assert accuracy > 0.80
    assert abs(accuracy - result.val_metrics["accuracy"]) < 0.03


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_alpha_zero_and_one_train(train_data: Data, alpha: float) -> None:
    net = _net()
    x, y = train_data[0][:1000], train_data[1][:1000]
    config = TrainConfig(alpha=alpha, k_train=4, epochs=2, batch_size=50, lr=5e-3, k_val=4)
    result = train(net, (x, y), (x[:200], y[:200]), config, progress=False)
    losses = [row["train_loss"] for row in result.history]
    assert all(math.isfinite(v) for v in losses)
    assert losses[1] < losses[0]
    assert result.val_metrics["accuracy"] > 0.5
    assert all(torch.isfinite(p).all() for p in net.parameters())


def _head_rows(net: torch.nn.Module) -> list[int]:
    rows: list[int] = []
    net.head.register_forward_hook(lambda _m, inputs, _o: rows.append(inputs[0].shape[0]))
    return rows


@pytest.mark.parametrize(("preset", "k_expected"), [("mlp-2x32-det", 1), ("mlp-2x32", 3)])
def test_deterministic_preset_trains_with_k_one(train_data: Data, preset: str, k_expected: int):
    net = _net(preset)
    rows = _head_rows(net)
    x, y = train_data[0][:230], train_data[1][:230]
    config = TrainConfig(k_train=3, epochs=1, batch_size=100)
    result = train(net, (x, y), None, config, progress=False)
    # batches of 100, 100, 30 examples; K head rows per example
    assert rows == [100 * k_expected, 100 * k_expected, 30 * k_expected]
    assert result.val_metrics == {}
    assert result.best_epoch == 1


def _noisy_label_run(
    train_data: Data, val_data: Data, **changes: object
) -> tuple[torch.nn.Module, object, dict[int, dict[str, torch.Tensor]], tuple[torch.Tensor, ...]]:
    """Random training labels: the net memorises noise, so the validation log-likelihood on the
    true labels peaks early and then falls. Returns the net, the result, the weights after every
    epoch and the validation data."""
    x = train_data[0][:500]
    y_noise = torch.randint(0, 10, (500,), generator=torch.Generator().manual_seed(0))
    xv, yv = val_data[0][:300], val_data[1][:300]
    net = _net()
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def on_epoch(row: dict[str, float]) -> None:
        snapshots[int(row["epoch"])] = copy.deepcopy(net.state_dict())

    config = TrainConfig(batch_size=50, lr=1e-2, k_train=2, k_val=5, weight_decay=0.0, **changes)
    result = train(net, (x, y_noise), (xv, yv), config, progress=False, on_epoch=on_epoch)
    return net, result, snapshots, (xv, yv)


def _assert_best_weights_kept(net: torch.nn.Module, result, snapshots) -> int:
    """The run reports and holds the weights of its best validation LL; returns that epoch."""
    ll = [row["val_log_likelihood"] for row in result.history]
    best = int(np.argmax(ll)) + 1
    assert result.best_epoch == best
    final = net.state_dict()
    for name, tensor in snapshots[best].items():
        assert torch.equal(final[name], tensor)
    assert result.val_metrics["log_likelihood"] == ll[best - 1]
    return best


def test_early_stopping_keeps_the_best_weights(train_data: Data, val_data: Data) -> None:
    net, result, snapshots, (xv, yv) = _noisy_label_run(train_data, val_data, epochs=8, patience=2)
    best = _assert_best_weights_kept(net, result, snapshots)
    # it stopped `patience` epochs after the best one, before the epoch budget ran out
    assert len(result.history) == best + 2 < 8
    last = snapshots[len(result.history)]
    assert any(not torch.equal(net.state_dict()[n], t) for n, t in last.items())
    # the reported metrics are those of the weights kept
    again = evaluate(net, xv, yv, k=5, seed=0)
    assert again["log_likelihood"] == pytest.approx(result.val_metrics["log_likelihood"])


def test_keep_best_trains_every_epoch_and_ends_with_the_best_weights(
    train_data: Data, val_data: Data
) -> None:
    net, result, snapshots, _ = _noisy_label_run(train_data, val_data, epochs=6, keep_best=True)
    best = _assert_best_weights_kept(net, result, snapshots)
    assert len(result.history) == 6  # every epoch ran: keep_best never stops
    assert best < 6  # so the check above was not the trivial "last epoch" one


def test_without_patience_the_last_weights_are_kept(train_data: Data) -> None:
    x, y = train_data[0][:300], train_data[1][:300]
    net = _net()
    result = train(
        net, (x, y), (x[:100], y[:100]), TrainConfig(epochs=2, k_train=2, k_val=2), progress=False
    )
    assert result.best_epoch == 2 == len(result.history)


def test_training_is_reproducible_from_the_seed(train_data: Data) -> None:
    x, y = train_data[0][:300], train_data[1][:300]
    config = TrainConfig(epochs=1, k_train=3, batch_size=64, seed=7)
    a, b = _net(seed=1), _net(seed=1)
    train(a, (x, y), None, config, progress=False)
    train(b, (x, y), None, config, progress=False)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_lr_schedule_follows_the_formula(train_data: Data, schedule: str) -> None:
    """Cosine: lr_t = lr·½(1 + cos(π t/T)) after t of T minibatches — ½·lr after the first of two
    epochs, 0 at the end; constant: lr throughout."""
    x, y = train_data[0][:256], train_data[1][:256]  # 4 minibatches of 64 per epoch, T = 8
    lr = 4e-3
    config = TrainConfig(epochs=2, k_train=1, batch_size=64, lr=lr, lr_schedule=schedule)
    result = train(_net(), (x, y), None, config, progress=False)
    got = [row["lr"] for row in result.history]
    if schedule == "cosine":
        assert got == pytest.approx([lr * 0.5 * (1 + math.cos(math.pi * 4 / 8)), 0.0], abs=1e-12)
    else:
        assert got == [lr, lr]


def test_weight_decay_shrinks_the_weights(train_data: Data) -> None:
    x, y = train_data[0][:300], train_data[1][:300]

    def weight_norm(decay: float) -> float:
        net = _net(seed=2)
        train(
            net,
            (x, y),
            None,
            TrainConfig(epochs=1, k_train=2, weight_decay=decay, lr=1e-2),
            progress=False,
        )
        return sum(
            float(p.detach().pow(2).sum())
            for n, p in net.named_parameters()
            if n.endswith("weight")
        )

    assert weight_norm(1.0) < 0.5 * weight_norm(0.0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("alpha", -0.5, "alpha must be a finite number ≥ 0"),
        ("alpha", math.nan, "alpha must be a finite number ≥ 0"),
        ("k_train", 0, "k-train must be ≥ 1"),
        ("epochs", 0, "epochs must be ≥ 1"),
        ("batch_size", 0, "batch size must be ≥ 1"),
        ("optimizer", "rmsprop", "optimizer must be one of"),
        ("lr", 0.0, "learning rate must be > 0"),
        ("lr", -1e-3, "learning rate must be > 0"),
        ("momentum", -0.1, "momentum must be ≥ 0"),
        ("weight_decay", -1e-6, "weight decay must be ≥ 0"),
        ("patience", -1, "patience must be ≥ 0"),
        ("k_val", 0, "k-val must be ≥ 1"),
        ("lr_schedule", "step", "lr schedule must be one of"),
    ],
)
def test_train_config_rejects_invalid_values(field: str, value, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        TrainConfig(**{field: value})
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_train_config_defaults_are_valid() -> None:
    config = TrainConfig()
    assert (config.alpha, config.k_train, config.weight_decay) == (0.5, 10, 1e-6)


# ---------------------------------------------------------------- evaluation metrics


def _ref_metrics(probs: np.ndarray, y: np.ndarray, bins: int = 15) -> dict[str, float]:
    """Accuracy, log-likelihood, Brier, ECE, mean H and MI with explicit loops in float64."""
    n, k, c = probs.shape
    acc = ll = brier = h_sum = mi_sum = 0.0
    conf, correct = [], []
    for i in range(n):
        mean = probs[i].mean(0)
        pred = int(np.argmax(mean))
        acc += pred == y[i]
        ll += math.log(mean[y[i]])
        brier += sum((mean[j] - (j == y[i])) ** 2 for j in range(c))
        h = -sum(p * math.log(p) for p in mean if p > 0)
        e = np.mean([-sum(p * math.log(p) for p in probs[i, s] if p > 0) for s in range(k)])
        h_sum += h
        mi_sum += max(h - e, 0.0)
        conf.append(mean[pred])
        correct.append(pred == y[i])
    ece = 0.0
    conf_a, correct_a = np.array(conf), np.array(correct, dtype=float)
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = (conf_a >= lo) & ((conf_a < hi) if b < bins - 1 else (conf_a <= hi))
        if members.any():
            ece += members.mean() * abs(correct_a[members].mean() - conf_a[members].mean())
    return {
        "accuracy": acc / n,
        "log_likelihood": ll / n,
        "nll": -ll / n,
        "brier": brier / n,
        "ece": ece,
        "mean_predictive_entropy": h_sum / n,
        "mean_mutual_information": mi_sum / n,
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_a_bruteforce_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet([0.4] * 5, size=(40, 6))
    # make some examples confidently right so that accuracy and ECE are not trivial
    y = np.where(rng.random(40) < 0.6, probs.mean(1).argmax(1), rng.integers(0, 5, 40))
    ref = _ref_metrics(probs, y)
    t = torch.from_numpy(probs)
    got = metrics_from_mc(t, t.log(), torch.from_numpy(y).long())
    assert set(got) == set(ref)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_ece_hand_example() -> None:
    # confidences 0.9, 0.9 (one right, one wrong) and 0.55 (right), 15 bins:
    # ECE = (2/3)·|0.5 − 0.9| + (1/3)·|1 − 0.55| = 0.26667 + 0.15 = 0.41667
    mean = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.55, 0.45]], dtype=torch.float64)
    y = torch.tensor([0, 0, 0])
    assert expected_calibration_error(mean, y) == pytest.approx(2 / 3 * 0.4 + 1 / 3 * 0.45)


def test_evaluate_equals_metrics_of_the_seeded_mc_samples(val_data: Data) -> None:
    net = _net().eval()
    x, y = val_data[0][:60], val_data[1][:60]
    out = mc_predict(net, x, 5, generator=torch.Generator().manual_seed(3))
    expected = metrics_from_mc(out.probs, out.log_probs, y)
    assert evaluate(net, x, y, k=5, seed=3, batch_size=100) == expected
    # batching changes the masks but not the meaning: same seed → reproducible
    a = evaluate(net, x, y, k=5, seed=3, batch_size=7)
    assert a == evaluate(net, x, y, k=5, seed=3, batch_size=7)
    assert a["accuracy"] == pytest.approx(expected["accuracy"], abs=0.1)
