"""Fixtures for the attacks tests: MNIST location, a linear net, tiny trained model directories."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from attacks_testnets import LinearNet

from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.directory import ModelCard, save_model
from bayesgate.models.training.train import TrainConfig, train


@pytest.fixture(scope="session", autouse=True)
def data_env(mnist_root: Path) -> Iterator[Path]:
    """Point ``BAYESGATE_DATA_DIR`` at the shared MNIST files for code that loads data itself."""
    mp = pytest.MonkeyPatch()
    mp.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    yield mnist_root
    mp.undo()


@pytest.fixture
def linear_net() -> LinearNet:
    return LinearNet()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread (the reductions' order, so the numbers, do not depend on the machine or
    on what an earlier test left set; tiny tensors on two contended threads also run ~50×
    slower), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train_tiny(preset: str, out: Path, epochs: int) -> Path:
    from bayesgate.models.data.mnist import load_mnist

    x, y = load_mnist("train", limit=3000)
    arch = preset_architecture(preset)
    torch.manual_seed(0)  # the initial weights come from the global RNG, before train() seeds it
    net = build_network(arch)
    config = TrainConfig(alpha=0.5, k_train=10, epochs=epochs, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same weights whatever the machine's core count
    try:
        train(net, (x, y), None, config, progress=False)
    finally:
        torch.set_num_threads(threads)
    card = ModelCard(
        name=f"tiny-{preset}",
        architecture=arch,
        training={**vars(config), "val_size": 10_000},
        inference={"k_test": 30, "k_attack": 10},
    )
    save_model(net, card, out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mlp-2x32`` (p = 0.2), BB-α α = 0.5, 3 epochs on 3000 MNIST images (a few seconds)."""
    return _train_tiny("mlp-2x32", tmp_path_factory.mktemp("tiny") / "stochastic", epochs=3)


@pytest.fixture(scope="session")
def tiny_det_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Deterministic ``mlp-2x32-det`` trained the same way (2 epochs)."""
    return _train_tiny("mlp-2x32-det", tmp_path_factory.mktemp("tiny") / "det", epochs=2)


@pytest.fixture(scope="session")
def tiny_cnn_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The paper's ``cnn`` (32 channels, 2×2 grid features of 12×12 maps) trained 1 epoch."""
    return _train_tiny("cnn", tmp_path_factory.mktemp("tiny") / "cnn", epochs=1)


@pytest.fixture
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model directory (calibration writes into it)."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
