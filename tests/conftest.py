"""Fixtures shared by every test package: where the MNIST files are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """Root directory holding ``mnist/``: ``$BAYESGATE_DATA_DIR``, else ``../shared/data`` beside
    the checkout (where CI puts it)."""
    env = os.environ.get("BAYESGATE_DATA_DIR")
    root = Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()
    assert (root / "mnist").is_dir(), f"MNIST data not found under {root}"
    return root
