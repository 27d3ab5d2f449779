"""Adversarial training: the inner attack stays in the ε-ball and [0, 1], ε ramps linearly, a
step on the adversarial batch lowers its BB-α energy, and a resumed adversarial run continues
exactly as the uninterrupted one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bayesgate.cli import main
from bayesgate.models.mc.engine import mc_logits
from bayesgate.models.mc.losses import bbalpha_softmax_loss
from bayesgate.models.training import checkpoint as ckpt
from bayesgate.models.training.adversarial import (
    AdversarialBatch,
    AdversarialConfig,
    energy_attack,
    monitor_accuracy,
    ramped_eps,
)
from bayesgate.models.training.train import TrainConfig, train
from tests.models.adversarial_helpers import Data, energy, small_net, split_digits


@pytest.fixture(scope="module")
def data(mnist_root: Path) -> tuple[Data, Data]:
    return split_digits(mnist_root)


@pytest.mark.parametrize("method", ["pgd", "fgsm-rs"])
@pytest.mark.parametrize("preset", ["mlp-2x32", "cnn-wide"])
def test_inner_attack_stays_in_the_ball_and_the_box(
    data: tuple[Data, Data], method: str, preset: str
) -> None:
    (x, y), _ = data
    x, y = x[:16], y[:16]
    net = small_net(preset).train()
    config = AdversarialConfig(method=method, eps=0.3, steps=5)
    adv, y_out = AdversarialBatch(config, steps_per_epoch=10)(net, x, y)
    assert torch.equal(y_out, y)
    assert float((adv - x).abs().max()) <= 0.3 + 1e-6
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    assert float((adv - x).abs().max()) > 0.25  # it moved: signed steps reach the boundary
    assert all(p.grad is None for p in net.parameters())  # ∇_x only


def test_the_attack_raises_the_energy_it_ascends(data: tuple[Data, Data]) -> None:
    (x, y), _ = data
    net = small_net()
    config = TrainConfig(epochs=5, k_train=3, batch_size=50, lr=5e-3)
    train(net, (x, y), None, config, progress=False)  # a model with a meaningful energy
    assert energy(net, x, y) < 1.5
    net.train()
    adv = energy_attack(net, x, y, 0.2, 10, 0.05, k=1)
    assert energy(net, adv, y) > energy(net, x, y) + 0.5


def test_eps_ramps_linearly_per_minibatch() -> None:
    assert ramped_eps(0.3, 2, step=1, steps_per_epoch=10) == pytest.approx(0.3 / 20)
    assert ramped_eps(0.3, 2, step=10, steps_per_epoch=10) == pytest.approx(0.15)
    assert ramped_eps(0.3, 2, step=20, steps_per_epoch=10) == pytest.approx(0.3)
    assert ramped_eps(0.3, 2, step=35, steps_per_epoch=10) == pytest.approx(0.3)
    assert ramped_eps(0.3, 0, step=1, steps_per_epoch=10) == 0.3
    transform = AdversarialBatch(AdversarialConfig(eps=0.3, eps_ramp_epochs=1), 4)
    net = small_net().train()
    x = torch.full((3, 1, 28, 28), 0.5)
    for step in (1, 2):
        adv, _ = transform(net, x, torch.zeros(3, dtype=torch.int64))
        assert float((adv - x).abs().max()) <= 0.3 * step / 4 + 1e-6
    assert transform.done == 2


def test_clean_mix_leaves_the_first_examples_clean(data: tuple[Data, Data]) -> None:
    (x, y), _ = data
    x, y = x[:10], y[:10]
    config = AdversarialConfig(eps=0.2, steps=2, clean_mix=0.3)
    adv, _ = AdversarialBatch(config, 1)(small_net().train(), x, y)
    assert torch.equal(adv[:3], x[:3])
    assert (adv[3:] - x[3:]).abs().flatten(1).amax(1).min() > 0


def test_a_step_on_the_adversarial_batch_lowers_itsenergy(data: tuple[Data, Data]) -> None:
    (x, y), _ = data
    x, y = x[:64], y[:64]
    net = small_net().train()
    adv, _ = AdversarialBatch(AdversarialConfig(eps=0.3, steps=5), 1)(net, x, y)
    before = energy(net, adv, y)
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    loss = bbalpha_softmax_loss(mc_logits(net, adv, 10), y, 0.5)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert energy(net, adv, y) < before


def test_resumed_adversarial_run_equals_the_uninterrupted_one(
    data: tuple[Data, Data], tmp_path: Path
) -> None:
    train_data, val_data = data
    # the ramp (2.5 epochs) is still running when the run resumes after epoch 2
    adv = AdversarialConfig(eps=0.2, steps=2, eps_ramp_epochs=2.5, clean_mix=0.25)
    steps_per_epoch = math.ceil(200 / 64)

    def config(epochs: int) -> TrainConfig:
        return TrainConfig(epochs=epochs, k_train=3, k_val=3, batch_size=64, seed=3)

    reference = small_net()
    train(reference, train_data, val_data, config(3), progress=False,
          batch_transform=AdversarialBatch(adv, steps_per_epoch))  # fmt: skip

    spec = ckpt.Checkpointing(tmp_path / "run", settings={"adversarial": adv.as_dict()})
    first = small_net()
    train(first, train_data, val_data, config(2), progress=False, checkpointing=spec,
          batch_transform=AdversarialBatch(adv, steps_per_epoch))  # fmt: skip
    resumed = small_net()  # fresh weights: everything comes from the checkpoint
    spec.resume = True
    continued = AdversarialBatch(adv, steps_per_epoch, done=2 * steps_per_epoch)
    train(resumed, train_data, val_data, config(3), progress=False, checkpointing=spec,
          batch_transform=continued)  # fmt: skip
    for (name, a), b in zip(
        reference.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_monitor_reports_clean_above_robust(data: tuple[Data, Data]) -> None:
    (x, y), (xv, yv) = data
    net = small_net()
    config = TrainConfig(epochs=5, k_train=3, batch_size=50, lr=5e-3)
    train(net, (x, y), None, config, progress=False)
    row = monitor_accuracy(net, xv, yv, AdversarialConfig(eps=0.3), k=5)
    assert 0.3 < row["monitor_clean_acc"] <= 1.0
    assert row["monitor_robust_acc"] < row["monitor_clean_acc"]


def test_cli_adversarial_run_logs_robust_accuracy_and_resumes(
    mnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    log = tmp_path / "epochs.jsonl"
    args = ["train", "--preset", "mlp-2x32", "--limit", "256", "--val-size", "1000",
            "--k-train", "2", "--k-val", "2", "--adversarial", "pgd", "--eps", "0.1",
            "--attack-steps", "2", "--eps-ramp-epochs", "1", "--monitor-size", "50",
            "--epoch-log", str(log), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--out", str(tmp_path / "model"), "--no-progress", "--threads", "1"]  # fmt: skip
    assert main([*args, "--epochs", "1"]) == 0
    assert main([*args, "--epochs", "2", "--resume"]) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert all(0 <= r["monitor_robust_acc"] <= r["monitor_clean_acc"] for r in rows)
    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert card["training"]["adversarial"]["eps"] == 0.1
    # another attack setting does not resume this checkpoint
    changed = [a if a != "0.1" else "0.2" for a in args]
    assert main([*changed, "--epochs", "3", "--resume"]) == 2
