"""Fixtures for the service tests: a tiny trained + calibrated model and a running app.

The model is ``mlp-2x32`` trained for one epoch on 3,000 MNIST images (a few seconds), saved with
:func:`bayesgate.models.store.directory.save_model`; its ``calibration.json`` holds thresholds at a
5 % false-positive
rate computed from the scores of 1,000 validation images. Tests never rely on it being good.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi import FastAPI

from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.calibration import Calibration, write_calibration
from bayesgate.models.store.directory import ModelCard, save_model
from bayesgate.models.training.train import TrainConfig, train
from bayesgate.service.app import create_app
from bayesgate.service.engine import Engine
from bayesgate.service.settings import Settings

TARGET_FPR = 0.05
CAL_K = 10


def _auroc(negatives: np.ndarray, positives: np.ndarray) -> float:
    """P(score(positive) > score(negative)) + ½ P(tie), by brute force over all pairs."""
    diff = positives[:, None] - negatives[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def mnist_test(mnist_root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The first 200 MNIST test images and labels."""
    return load_mnist("test", data_dir=mnist_root, download=False, limit=200)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> Path:
    """A trained mlp-2x32 with its card and calibration.json in a temporary model directory."""
    root = mnist_root
    x, y = load_mnist("train", data_dir=root, download=False, limit=3000)
    xv, _ = load_mnist("val", data_dir=root, download=False, limit=1000)
    arch = preset_architecture("mlp-2x32")
    torch.manual_seed(0)
    net = build_network(arch)
    config = TrainConfig(alpha=0.5, k_train=2, epochs=1, batch_size=128, lr=3e-3, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only add contention
    try:
        train(net, (x, y), None, config, progress=False)
    finally:
        torch.set_num_threads(threads)
    card = ModelCard(name="tiny-mlp", architecture=arch, training={"config": vars(config)})
    directory = tmp_path_factory.mktemp("models") / "tiny-mlp"
    card = save_model(net, card, directory)

    val = mc_predict(net, xv, CAL_K, generator=torch.Generator().manual_seed(1)).probs
    noise = torch.rand(500, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    ood = mc_predict(net, noise, CAL_K, generator=torch.Generator().manual_seed(3)).probs
    thresholds, aurocs = {}, {}
    for name, fn in SCORES.items():
        clean, noisy = fn(val).double().numpy(), fn(ood).double().numpy()
        thresholds[name] = float(np.quantile(clean, 1 - TARGET_FPR))
        aurocs[name] = _auroc(clean, noisy)
    calibration = Calibration(
        model_sha256=card.weights_sha256,
        score="mutual_information",
        target_fpr=TARGET_FPR,
        k=CAL_K,
        thresholds=thresholds,
        validation={"images": len(xv)},
        attacks=[{"attack": "uniform-noise", "auroc": aurocs["mutual_information"]}],
    )
    write_calibration(calibration, directory)
    return directory


@pytest.fixture
def make_settings(tiny_model_dir: Path) -> Callable[..., Settings]:
    """Settings for the tiny model on the CPU; keyword arguments override fields."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "model_dir": tiny_model_dir,
            "device": "cpu",
            "max_queue_delay_ms": 2.0,
            "max_batch_size": 16,
        }
        values.update(overrides)
        return Settings(**values)

    return make


def _slowed(engine: Engine, seconds: float, calls: int = 1) -> Engine:
    """``engine`` that holds its answer ``seconds`` (in the worker thread) on its first ``calls``
    calls."""
    count = 0

    def run(net: torch.nn.Module, x: torch.Tensor, k: int, g: torch.Generator | None):
        nonlocal count
        count += 1
        probs = engine(net, x, k, g)
        if count <= calls:
            time.sleep(seconds)
        return probs

    return run


@asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app with its lifespan run (model loaded, warmed up) and an in-process client."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield app, client


@pytest.fixture
def serving() -> Callable[[Settings], Any]:
    """``async with serving(settings) as (app, client)``: see :func:`running_app`."""
    return running_app


@pytest.fixture
def slowed() -> Callable[..., Engine]:
    """``slowed(engine, seconds, calls=1)``: the engine, sleeping on its first calls."""
    return _slowed
