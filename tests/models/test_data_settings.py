"""Data settings: the data directory and the MNIST mirrors, read from the environment through
one pydantic-settings class (defaults, overrides, blank values)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bayesgate.models.data.settings import DEFAULT_MIRRORS, DataSettings, data_settings

MODULES = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("BAYESGATE_DATA_DIR", "BAYESGATE_MNIST_MIRRORS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_defaults(clean_env: Path) -> None:
    settings = data_settings()
    assert settings.data_dir is None
    assert settings.cache_root == clean_env / "home" / ".cache" / "bayesgate"
    assert settings.data_root == clean_env / "home" / ".cache" / "bayesgate" / "data"
    assert settings.mnist_mirrors == DEFAULT_MIRRORS
    assert all(url.endswith("/mnist/") for url in DEFAULT_MIRRORS)


def test_environment_overrides(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "xdg"))
    assert data_settings().data_root == clean_env / "xdg" / "bayesgate" / "data"
    assert data_settings().cache_root == clean_env / "xdg" / "bayesgate"  # checkpoints live here
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(clean_env / "d"))  # wins over XDG
    assert data_settings().data_root == clean_env / "d"
    monkeypatch.chdir(clean_env)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", "rel/data")  # made absolute against the cwd
    assert data_settings().data_root == clean_env / "rel" / "data"
    monkeypatch.setenv("BAYESGATE_DATA_DIR", "~/data")
    assert data_settings().data_root == clean_env / "home" / "data"
    monkeypatch.setenv("BAYESGATE_MNIST_MIRRORS", " http://a/x , ,file:///m ")
    assert data_settings().mnist_mirrors == ("http://a/x", "file:///m")


def test_blank_or_relative_values_fall_back_to_the_defaults(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", "  ")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: absolute only
    monkeypatch.setenv("BAYESGATE_MNIST_MIRRORS", " , ")
    settings = data_settings()
    assert settings.data_root == clean_env / "home" / ".cache" / "bayesgate" / "data"
    assert settings.mnist_mirrors == DEFAULT_MIRRORS
    assert DataSettings(mnist_mirrors=["http://c/"]).mnist_mirrors == ("http://c/",)


def test_no_module_reads_the_environment_directly() -> None:
    # configuration goes through the settings classes (data here, the service's own)
    pattern = re.compile(r"os\.environ|getenv\(")
    offenders = [
        str(path.relative_to(MODULES))
        for folder in ("models", "attacks", "bayesgate")
        for path in (MODULES / folder).rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert offenders == []
