"""Where the data lives and where MNIST is downloaded from, read from the environment.

| variable | default | meaning |
|---|---|---|
| ``BAYESGATE_DATA_DIR`` | ``$XDG_CACHE_HOME/bayesgate/data`` | data root: ``mnist/`` and ``uci/`` |
| ``BAYESGATE_MNIST_MIRRORS`` | :data:`DEFAULT_MIRRORS` | comma-separated base URLs, in order |

``XDG_CACHE_HOME`` counts only when it is an absolute path (else ``~/.cache``, as the XDG spec
says). Blank values count as unset. The environment is read on every :func:`data_settings` call,
so a changed variable takes effect without a restart.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, BeforeValidator, Field
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "BAYESGATE_"
DATA_DIR_ENV = f"{ENV_PREFIX}DATA_DIR"
MIRRORS_ENV = f"{ENV_PREFIX}MNIST_MIRRORS"
DEFAULT_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)


def _blank_is_none(value: object) -> object:
    return None if isinstance(value, str) and not value.strip() else value


def _comma_separated(value: object) -> object:
    """``" http://a , ,https://b "`` → ``("http://a", "https://b")``; blank → the defaults."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
        return tuple(value) or DEFAULT_MIRRORS
    return value


class DataSettings(BaseSettings):
    """The data directory and the MNIST mirrors (each field is ``BAYESGATE_<FIELD>``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, case_sensitive=False, extra="ignore", frozen=True
    )

    data_dir: Annotated[Path | None, BeforeValidator(_blank_is_none)] = Field(
        None, description="data root holding mnist/ and uci/; unset = the user cache"
    )
    mnist_mirrors: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_separated)] = Field(
        DEFAULT_MIRRORS, description="MNIST base URLs tried in order (comma-separated)"
    )
    xdg_cache_home: Annotated[Path | None, BeforeValidator(_blank_is_none)] = Field(
        None,
        validation_alias=AliasChoices("XDG_CACHE_HOME"),
        description="the XDG user cache (only an absolute path counts)",
    )

    @property
    def cache_root(self) -> Path:
        """``$XDG_CACHE_HOME/bayesgate`` (``~/.cache/bayesgate`` when unset or not absolute)."""
        xdg = self.xdg_cache_home
        cache = xdg if xdg is not None and xdg.is_absolute() else Path.home() / ".cache"
        return cache / "bayesgate"

    @property
    def data_root(self) -> Path:
        """``$BAYESGATE_DATA_DIR`` made absolute, else ``<cache root>/data``."""
        if self.data_dir is not None:
            return Path(os.path.abspath(self.data_dir.expanduser()))
        return self.cache_root / "data"


def data_settings() -> DataSettings:
    """The data settings as the environment gives them now."""
    return DataSettings()
