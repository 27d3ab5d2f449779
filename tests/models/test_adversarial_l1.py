"""L1 (SLIDE) examples in adversarial training, and ``train --init-from``: the sparse step
against a hand computation, the L1 ball, box and sparsity of the inner attack, the split of a
minibatch between the L∞ and the L1 attack, ε₁'s ramp, the monitor's L1 accuracy, the command's
checks, and fine-tuning starting from the given model's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bayesgate.cli import main
from bayesgate.models.networks.registry import preset_architecture
from bayesgate.models.store.directory import load_model
from bayesgate.models.training.adversarial import (
    AdversarialBatch,
    AdversarialConfig,
    energy_attack_l1,
    monitor_accuracy,
)
from bayesgate.models.training.init_from import init_source, load_init_weights
from bayesgate.models.training.sparse_l1 import project_l1, sparse_l1_step
from bayesgate.models.training.train import TrainConfig, train
from tests.models.adversarial_helpers import Data, energy, small_net, split_digits


@pytest.fixture(scope="module")
def data(mnist_root: Path) -> tuple[Data, Data]:
    return split_digits(mnist_root)


@pytest.fixture(scope="module")
def trained(data: tuple[Data, Data]) -> torch.nn.Module:
    """A small MLP with a meaningful energy (5 epochs on 200 digits)."""
    (x, y), _ = data
    net = small_net()
    train(net, (x, y), None, TrainConfig(epochs=5, k_train=3, batch_size=50, lr=5e-3),
          progress=False)  # fmt: skip
    return net


def test_sparse_step_by_hand() -> None:
    x = torch.tensor([[0.0, 0.5, 1.0, 0.2, 0.7, 0.9]])
    d = torch.tensor([[-1.0, 3.0, 2.0, -0.5, 0.1, 4.0]])
    # pixel 0 is at 0 and pushed down, pixel 2 at 1 and pushed up: both dropped, |d| becomes
    # [0, 3, 0, 0.5, 0.1, 4]; sparsity 50 keeps |d| ≥ its 3rd smallest (0.1): pixels 1, 3, 4, 5,
    # each moved by 0.4/4 along sgn d → [0, .6, 1, .1, .8, 1.0]; δ = [0, .1, 0, −.1, .1, .1],
    # ‖δ‖₁ = 0.4 > ε = 0.2, so δ halves
    out = sparse_l1_step(x, x, d, step_size=0.4, eps=0.2, sparsity=50)
    expected = torch.tensor([[0.0, 0.55, 1.0, 0.15, 0.75, 0.95]])
    assert torch.allclose(out, expected, atol=1e-6)
    # inside the ball: no rescaling
    out = sparse_l1_step(x, x, d, step_size=0.4, eps=1.0, sparsity=50)
    assert torch.allclose(out, torch.tensor([[0.0, 0.6, 1.0, 0.1, 0.8, 1.0]]), atol=1e-6)


def test_l1_projection_keeps_ball_and_box() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(8, 1, 28, 28, generator=gen)
    far = x + 3 * torch.randn(8, 1, 28, 28, generator=gen)
    out = project_l1(far, x, 10.0)
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    assert float((out - x).flatten(1).abs().sum(1).max()) <= 10.0 + 1e-4
    near = (x + 1e-4).clamp(0, 1)
    assert torch.equal(project_l1(near, x, 10.0), near)  # inside: unchanged


def test_l1_attack_stays_in_the_ball_is_sparse_and_raises_theenergy(
    data: tuple[Data, Data], trained: torch.nn.Module
) -> None:
    (x, y), _ = data
    x, y = x[:64], y[:64]
    trained.train().zero_grad(set_to_none=True)
    adv = energy_attack_l1(trained, x, y, eps=10.0, steps=10, step_size=2.5, k=1)
    delta = (adv - x).flatten(1)
    assert float(delta.abs().sum(1).max()) <= 10.0 + 1e-4
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    # a step moves the pixels at or above the 99th percentile of |∇| (9 of 784 without ties)
    assert int((delta != 0).sum(1).max()) <= 10 * 9
    assert float(delta.abs().max()) > 0.3  # few pixels by much: beyond the L∞ ball of training
    assert all(p.grad is None for p in trained.parameters())  # ∇_x only
    # stronger than random sparse noise of the same L1 mass on the same pixels
    noise = x.clone().flatten(1)
    shuffled = delta[:, torch.randperm(delta.shape[1], generator=torch.Generator().manual_seed(1))]
    noise = project_l1((noise + shuffled).clamp(0, 1).view_as(x), x, 10.0)
    attacked = energy(trained, adv, y)
    clean, random = energy(trained, x, y), energy(trained, noise, y)
    assert attacked > clean + 0.3
    assert attacked > random + 0.3


def test_a_minibatch_is_split_between_the_linf_and_the_l1_attack(data: tuple[Data, Data]) -> None:
    (x, y), _ = data
    x, y = x[:10], y[:10]
    config = AdversarialConfig(eps=0.1, steps=3, clean_mix=0.2, l1_eps=5.0, l1_share=0.5)
    adv, y_out = AdversarialBatch(config, 1)(small_net().train(), x, y)
    assert torch.equal(y_out, y)
    delta = (adv - x).flatten(1)
    assert torch.equal(adv[:2], x[:2])  # clean_mix: 2 of 10; of the 8 attacked, 4 get L1
    linf, l1 = delta[2:6], delta[6:]
    assert float(linf.abs().max()) <= 0.1 + 1e-6
    assert float(linf.abs().sum(1).min()) > 5.0  # dense: far outside the L1 ball
    assert float(l1.abs().sum(1).max()) <= 5.0 + 1e-4
    assert float(l1.abs().amax(1).min()) > 0.1  # sparse: outside the L∞ ball
    assert config.l1_rows(8) == 4 and AdversarialConfig(l1_share=0.5).l1_rows(8) == 0


def test_without_l1_eps_the_l1_settings_change_nothing(data: tuple[Data, Data]) -> None:
    (x, y), _ = data
    x, y = x[:12], y[:12]
    outputs = []
    for config in (AdversarialConfig(eps=0.2, steps=2),
                   AdversarialConfig(eps=0.2, steps=2, l1_share=0.7, l1_steps=3)):  # fmt: skip
        torch.manual_seed(5)
        outputs.append(AdversarialBatch(config, 1)(small_net().train(), x, y)[0])
        assert "l1_eps" not in config.as_dict()  # cards and checkpoints as before
    assert torch.equal(*outputs)
    assert AdversarialConfig(l1_eps=3.0).as_dict()["l1_eps"] == 3.0


def test_l1_radius_ramps_with_eps() -> None:
    config = AdversarialConfig(eps=0.3, eps_ramp_epochs=1, l1_eps=8.0, l1_share=1.0, l1_steps=4)
    transform = AdversarialBatch(config, 4)
    x = torch.full((3, 1, 28, 28), 0.5)
    for step in (1, 2):
        adv, _ = transform(small_net().train(), x, torch.zeros(3, dtype=torch.int64))
        l1 = float((adv - x).flatten(1).abs().sum(1).max())
        assert 8.0 * step / 4 - 1e-3 <= l1 <= 8.0 * step / 4 + 1e-4  # full steps reach the rim
    assert config.l1_step_at(4.0) == pytest.approx(2.5)
    assert AdversarialConfig(l1_eps=8.0, l1_step_size=2.0).l1_step_at(4.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("l1_eps", -1.0), ("l1_share", 0.0), ("l1_share", 1.5), ("l1_steps", 0),
     ("l1_step_size", 0.0), ("l1_sparsity", 100.0)],
)  # fmt: skip
def test_bad_l1_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.replace("_", " ")):
        AdversarialConfig(**{field: value})


def test_monitor_reports_l1_accuracy(data: tuple[Data, Data], trained: torch.nn.Module) -> None:
    _, (xv, yv) = data
    row = monitor_accuracy(trained, xv, yv, AdversarialConfig(eps=0.3, l1_eps=10.0), k=5)
    assert row["monitor_l1_acc"] < row["monitor_clean_acc"]
    assert "monitor_l1_acc" not in monitor_accuracy(trained, xv, yv, AdversarialConfig(), k=5)


def _train_args(tmp_path: Path, name: str) -> list[str]:
    return ["train", "--preset", "mlp-2x32", "--limit", "128", "--val-size", "1000",
            "--k-train", "2", "--k-val", "2", "--epochs", "1", "--no-progress",
            "--threads", "1", "--checkpoint-dir", str(tmp_path / f"ckpt-{name}"),
            "--out", str(tmp_path / name)]  # fmt: skip


def test_cli_l1_run_records_the_settings_and_logs_l1_accuracy(
    mnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    log = tmp_path / "epochs.jsonl"
    adversarial = ["--adversarial", "pgd", "--eps", "0.1", "--attack-steps", "2",
                   "--monitor-size", "40", "--epoch-log", str(log)]  # fmt: skip
    assert (
        main([*_train_args(tmp_path, "l1"), *adversarial, "--l1-eps", "5", "--l1-steps", "2"]) == 0
    )
    card = json.loads((tmp_path / "l1" / "card.json").read_text())
    recorded = card["training"]["adversarial"]
    assert (recorded["l1_eps"], recorded["l1_steps"], recorded["l1_share"]) == (5.0, 2, 0.5)
    assert "--l1-eps 5.0" in card["training"]["command"]
    row = json.loads(log.read_text().splitlines()[0])
    assert 0 <= row["monitor_l1_acc"] <= 1
    # an L∞-only run's card and command carry no L1 settings
    assert main([*_train_args(tmp_path, "linf"), *adversarial]) == 0
    card = json.loads((tmp_path / "linf" / "card.json").read_text())
    assert "l1_eps" not in card["training"]["adversarial"]
    assert "--l1" not in card["training"]["command"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--adversarial", "pgd", "--l1-steps", "3"], "--l1-steps applies with --l1-eps > 0 only"),
     (["--adversarial", "pgd", "--l1-eps", "0", "--l1-share", "0.3"], "--l1-share applies"),
     (["--l1-eps", "10"], "--l1-eps applies with --adversarial only")],
)  # fmt: skip
def test_cli_refuses_l1_flags_that_would_not_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main([*_train_args(tmp_path, "m"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_init_from_starts_from_the_models_weights(
    mnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    assert main(_train_args(tmp_path, "base")) == 0
    base = load_model(tmp_path / "base")
    source = init_source(tmp_path / "base", preset_architecture("mlp-2x32"), "mlp-2x32")
    assert source["weights_sha256"] == base.card.weights_sha256
    net = small_net(seed=123)  # other initial weights
    load_init_weights(net, source)
    for (name, a), b in zip(net.state_dict().items(), base.network.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name

    # fine-tuned: recorded, and trained on from the base (one more epoch moves it a little)
    args = [*_train_args(tmp_path, "tuned"), "--init-from", str(tmp_path / "base"), "--seed", "9"]
    assert main(args) == 0
    tuned = load_model(tmp_path / "tuned")
    assert tuned.card.training.init_from["weights_sha256"] == base.card.weights_sha256
    fresh = small_net(seed=9).state_dict()
    for name, w in tuned.network.state_dict().items():
        from_base = float((w - base.network.state_dict()[name]).abs().mean())
        from_fresh = float((w - fresh[name]).abs().mean())
        assert from_base < from_fresh, name

    # another architecture, or another starting model on --resume, is refused in one line
    capsys.readouterr()
    other = [a if a != "mlp-2x32" else "mlp-2x100" for a in _train_args(tmp_path, "x")]
    assert main([*other, "--init-from", str(tmp_path / "base")]) == 2
    err = capsys.readouterr().err
    assert "--init-from" in err and "preset='mlp-2x32'" in err and "Traceback" not in err
    # resuming the fine-tuning run without its starting model
    assert main([*_train_args(tmp_path, "tuned"), "--seed", "9", "--epochs", "2", "--resume"]) == 2
    assert "init_from" in capsys.readouterr().err
