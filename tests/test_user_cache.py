"""The test run never touches the user's real cache (long training runs keep checkpoints there)."""

from __future__ import annotations

from pathlib import Path

from bayesgate.models.cli import checkpoint_root
from bayesgate.models.data.mnist import cache_dir


def test_checkpoints_default_to_the_private_test_cache(private_user_cache: Path) -> None:
    real = Path.home() / ".cache" / "bayesgate"
    assert cache_dir() == private_user_cache / "bayesgate"
    assert checkpoint_root().is_relative_to(private_user_cache)
    assert not checkpoint_root().is_relative_to(real)
