"""Resumable training: an interrupted run continued from its checkpoint ends with bit-identical
weights to an uninterrupted one; checkpoints are safetensors + JSON, written atomically."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.training import checkpoint as ckpt
from bayesgate.models.training.train import HISTORY_FILE, TrainConfig, train

Data = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def data(mnist_root: Path) -> tuple[Data, Data]:
    x, y = load_mnist("train", data_dir=mnist_root, limit=300)
    return (x[:200], y[:200]), (x[200:], y[200:])


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_network(preset_architecture("mlp-2x32"))


def _config(optimizer: str, schedule: str, **changes) -> TrainConfig:
    lr = 3e-3 if optimizer == "adam" else 5e-2
    base = TrainConfig(epochs=3, k_train=3, k_val=3, batch_size=64, optimizer=optimizer, lr=lr,
                       lr_schedule=schedule, seed=3, patience=2)  # fmt: skip
    return replace(base, **changes)


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, ta), tb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(ta, tb), name


class _Interrupt(RuntimeError):
    pass


def _fail_at_call(n: int):
    """A batch transform (identity) that raises on its n-th call: an exception mid-epoch."""
    calls = [0]

    def transform(model, x, y):
        calls[0] += 1
        if calls[0] == n:
            raise _Interrupt
        return x, y

    return transform


@pytest.mark.parametrize(
    ("optimizer", "schedule"), [("adam", "constant"), ("sgd", "constant"), ("adam", "cosine")]
)
def test_exception_mid_epoch_then_resume_is_bit_identical(
    data: tuple[Data, Data], tmp_path: Path, optimizer: str, schedule: str
) -> None:
    train_data, val_data = data
    config = _config(optimizer, schedule)
    reference = _net()
    expected = train(reference, train_data, val_data, config, progress=False)

    spec = ckpt.Checkpointing(tmp_path / "run")
    net = _net()
    with pytest.raises(_Interrupt):  # 4 batches per epoch: call 6 is in epoch 2
        train(net, train_data, val_data, config, progress=False, checkpointing=spec,
              batch_transform=_fail_at_call(6))  # fmt: skip
    saved = json.loads((spec.directory / ckpt.STATE_FILE).read_text())
    assert saved["epoch"] == 1

    resumed = _net()  # fresh weights: everything must come from the checkpoint
    torch.manual_seed(12345)  # and the global RNG state, too
    result = train(resumed, train_data, val_data, config, progress=False,
                   checkpointing=replace(spec, resume=True))  # fmt: skip
    _assert_same_weights(reference, resumed)
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    keys = ("train_loss", "val_log_likelihood", "lr")
    assert [[r[k] for k in keys] for r in result.history] == [
        [r[k] for k in keys] for r in expected.history
    ]
    assert result.best_epoch == expected.best_epoch
    lines = (spec.directory / HISTORY_FILE).read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_one_epoch_then_resume_to_three_is_bit_identical(
    data: tuple[Data, Data], tmp_path: Path, optimizer: str
) -> None:
    """With a constant learning rate a finished run may be extended (``--epochs`` grows)."""
    train_data, val_data = data
    reference = _net()
    train(reference, train_data, val_data, _config(optimizer, "constant"), progress=False)

    spec = ckpt.Checkpointing(tmp_path / "run")
    net = _net()
    train(net, train_data, val_data, _config(optimizer, "constant", epochs=1), progress=False,
          checkpointing=spec)  # fmt: skip
    assert not _same(net, reference)
    resumed = _net()
    train(resumed, train_data, val_data, _config(optimizer, "constant"), progress=False,
          checkpointing=replace(spec, resume=True))  # fmt: skip
    _assert_same_weights(reference, resumed)


def test_keep_best_survives_an_interruption(data: tuple[Data, Data], tmp_path: Path) -> None:
    """The best weights live in the checkpoint: a run interrupted after its best epoch and
    resumed ends with the same weights and best epoch as an uninterrupted one."""
    train_data, val_data = data
    config = _config("adam", "constant", epochs=4, patience=0, keep_best=True, lr=0.1)
    reference = _net()
    expected = train(reference, train_data, val_data, config, progress=False)
    assert expected.best_epoch < 4  # the best weights are not simply the last ones

    spec = ckpt.Checkpointing(tmp_path / "run")
    with pytest.raises(_Interrupt):  # 4 batches per epoch: call 14 is in epoch 4
        train(_net(), train_data, val_data, config, progress=False, checkpointing=spec,
              batch_transform=_fail_at_call(14))  # fmt: skip
    resumed = _net()
    result = train(resumed, train_data, val_data, config, progress=False,
                   checkpointing=replace(spec, resume=True))  # fmt: skip
    _assert_same_weights(reference, resumed)
    assert result.best_epoch == expected.best_epoch
    assert len(result.history) == 4


def test_patience_of_a_keep_best_run_may_change_on_resume(
    data: tuple[Data, Data], tmp_path: Path
) -> None:
    """With the best weights kept, patience is only a stopping rule: a run trained without it and
    resumed with ``patience=1`` stops where an uninterrupted ``patience=1`` run stops, with the
    same best weights; resumed again with ``patience=0`` it goes on to ``epochs``."""
    train_data, val_data = data
    config = _config("adam", "constant", epochs=8, patience=1, keep_best=True, lr=0.1)
    reference = _net()
    expected = train(reference, train_data, val_data, config, progress=False)
    stop = len(expected.history)
    assert stop < 8 and expected.best_epoch == stop - 1  # early stopping fired, one stale epoch

    spec = ckpt.Checkpointing(tmp_path / "run")
    train(_net(), train_data, val_data, replace(config, patience=0, epochs=stop), progress=False,
          checkpointing=spec)  # fmt: skip
    resumed = _net()
    result = train(resumed, train_data, val_data, config, progress=False,
                   checkpointing=replace(spec, resume=True))  # fmt: skip
    _assert_same_weights(reference, resumed)
    assert (len(result.history), result.best_epoch) == (stop, expected.best_epoch)

    longer = train(_net(), train_data, val_data, replace(config, patience=0), progress=False,
                   checkpointing=replace(spec, resume=True))  # fmt: skip
    assert len(longer.history) == 8


def test_checkpoints_from_before_keep_best_still_resume(
    data: tuple[Data, Data], tmp_path: Path
) -> None:
    """A checkpoint whose settings have no ``keep_best`` key (written before the option) resumes
    a run without it, and is refused for a run with it."""
    train_data, val_data = data
    spec = ckpt.Checkpointing(tmp_path / "run")
    config = _config("adam", "constant", epochs=1, patience=0)
    train(_net(), train_data, val_data, config, progress=False, checkpointing=spec)
    saved = json.loads((spec.directory / ckpt.STATE_FILE).read_text())
    assert "keep_best" not in saved["settings"] and "patience" in saved["settings"]
    train(_net(), train_data, val_data, replace(config, epochs=2), progress=False,
          checkpointing=replace(spec, resume=True))  # fmt: skip
    with pytest.raises(ckpt.CheckpointError, match="keep_best"):
        train(_net(), train_data, val_data, replace(config, epochs=3, keep_best=True),
              progress=False, checkpointing=replace(spec, resume=True))  # fmt: skip


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def test_checkpoint_files_are_safetensors_and_json(data: tuple[Data, Data], tmp_path: Path):
    train_data, val_data = data
    spec = ckpt.Checkpointing(tmp_path / "run")
    train(_net(), train_data, val_data, _config("adam", "cosine", epochs=2), progress=False,
          checkpointing=spec)  # fmt: skip
    names = sorted(p.name for p in spec.directory.iterdir())
    assert names == [ckpt.STATE_FILE, "epoch-0002.safetensors", HISTORY_FILE]  # no temporaries
    tensors, state = ckpt.read_checkpoint(spec.directory)
    assert {"optimizer.0.exp_avg", "optimizer.0.exp_avg_sq", "optimizer.0.step"} <= set(tensors)
    assert state["progress"]["epoch"] == 2 and state["schedule"]["last_epoch"] == 8
    assert set(state["rng"]) >= {"torch_cpu", "data_order"}


def test_a_corrupt_tensor_file_is_refused(data: tuple[Data, Data], tmp_path: Path) -> None:
    train_data, _ = data
    spec = ckpt.Checkpointing(tmp_path / "run")
    train(_net(), train_data, None, _config("sgd", "constant", epochs=1, patience=0),
          progress=False, checkpointing=spec)  # fmt: skip
    blob = spec.directory / "epoch-0001.safetensors"
    blob.write_bytes(blob.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ckpt.CheckpointError, match="does not match the sha256"):
        ckpt.read_checkpoint(spec.directory)


@pytest.mark.parametrize(
    ("changes", "setting"),
    [({"lr": 1e-2}, "lr"), ({"momentum": 0.5}, "momentum"), ({"epochs": 4}, "epochs"),
     ({"k_train": 2}, "k_train"), ({"seed": 4}, "seed")],
)  # fmt: skip
def test_resuming_with_other_settings_is_refused(
    data: tuple[Data, Data], tmp_path: Path, changes: dict, setting: str
) -> None:
    """(``epochs`` is a setting of a cosine run: its schedule spans all epochs.)"""
    train_data, val_data = data
    spec = ckpt.Checkpointing(tmp_path / "run", settings={"preset": "mlp-2x32"})
    config = _config("sgd", "cosine")
    with pytest.raises(_Interrupt):
        train(_net(), train_data, val_data, config, progress=False, checkpointing=spec,
              batch_transform=_fail_at_call(6))  # fmt: skip
    with pytest.raises(ckpt.CheckpointError, match=rf"with {setting}=.*this run has {setting}="):
        train(_net(), train_data, val_data, replace(config, **changes), progress=False,
              checkpointing=replace(spec, resume=True))  # fmt: skip
    other = replace(spec, resume=True, settings={"preset": "mlp-2x100"})
    with pytest.raises(ckpt.CheckpointError, match="preset='mlp-2x32'"):
        train(_net(), train_data, val_data, config, progress=False, checkpointing=other)
    # without --resume an unfinished checkpoint is not overwritten
    with pytest.raises(ckpt.CheckpointError, match=r"unfinished run .* --resume"):
        train(_net(), train_data, val_data, config, progress=False, checkpointing=spec)


def test_resume_without_a_checkpoint_starts_fresh(data: tuple[Data, Data], tmp_path: Path):
    train_data, _ = data
    config = _config("adam", "constant", epochs=1, patience=0)
    a, b = _net(), _net()
    train(a, train_data, None, config, progress=False)
    spec = ckpt.Checkpointing(tmp_path / "new", resume=True)
    train(b, train_data, None, config, progress=False, checkpointing=spec)
    _assert_same_weights(a, b)


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    ckpt.atomic_write(target, b"one")
    ckpt.atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_atomic_write_fsyncs_the_file_and_then_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[bool] = []  # is the fsync'ed descriptor a folder?
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ckpt.atomic_write(tmp_path / "x.json", b"one")
    assert synced == [False, True]
