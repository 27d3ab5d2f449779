"""Fixtures shared by every test package: where the MNIST files are, and a private user cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def private_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Point ``XDG_CACHE_HOME`` at a fresh directory for the whole run.

    Training commands write checkpoints to ``$XDG_CACHE_HOME/bayesgate/checkpoints/NAME`` by
    default, so a test that does not pass ``--checkpoint-dir`` would otherwise write into (or
    ``--resume`` from) the user's real cache, where long runs live. Matplotlib keeps its real
    cache (``MPLCONFIGDIR``) so its font cache is not rebuilt.
    """
    cache = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as mp:
        if "MPLCONFIGDIR" not in os.environ:
            mp.setenv("MPLCONFIGDIR", str(Path.home() / ".cache" / "matplotlib"))
        mp.setenv("XDG_CACHE_HOME", str(cache))
        yield cache


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """Root directory holding ``mnist/``: ``$BAYESGATE_DATA_DIR``, else ``../shared/data`` beside
    the checkout (where CI puts it)."""
    env = os.environ.get("BAYESGATE_DATA_DIR")
    root = Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()
    assert (root / "mnist").is_dir(), f"MNIST data not found under {root}"
    return root
