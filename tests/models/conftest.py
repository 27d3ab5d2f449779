"""Shared fixtures for the models tests: the MNIST data root and small helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _mnist_root() -> Path:
    env = os.environ.get("BAYESGATE_DATA_DIR")
    return Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """Root directory holding ``mnist/`` (``$BAYESGATE_DATA_DIR`` or the shared data folder)."""
    root = _mnist_root()
    assert (root / "mnist").is_dir(), f"MNIST data not found under {root}"
    return root
