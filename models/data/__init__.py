"""MNIST in the original IDX format: reading, the fixed validation split and the checksummed
download from mirrors (:mod:`.download`, imported when a file is missing); where the data lives
and which mirrors to use come from :mod:`.settings`.

The names below are imported on first use (:mod:`.mnist` imports torch): importing a light
submodule — :mod:`.settings`, :mod:`.splits` (the splits' names and sizes), or :mod:`.cli`, whose
``bayesgate fetch-data`` parser names the data directory's environment variable — does not import
torch, so ``bayesgate COMMAND --help`` answers in a fraction of a second instead of after torch's
~3 s import."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bayesgate.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, __getattr__ below
    from bayesgate.models.data.mnist import DataError, data_dir, load_mnist, mnist_fingerprint
    from bayesgate.models.data.settings import DataSettings, data_settings
    from bayesgate.models.data.splits import DEFAULT_VAL_SIZE, SPLITS

_SOURCES = {
    "DEFAULT_VAL_SIZE": "splits",
    "SPLITS": "splits",
    "DataError": "mnist",
    "data_dir": "mnist",
    "load_mnist": "mnist",
    "mnist_fingerprint": "mnist",
    "DataSettings": "settings",
    "data_settings": "settings",
}

__all__ = [  # the names of _SOURCES (a test checks that each resolves)
    "DEFAULT_VAL_SIZE",
    "SPLITS",
    "DataError",
    "DataSettings",
    "data_dir",
    "data_settings",
    "load_mnist",
    "mnist_fingerprint",
]

__getattr__, __dir__ = lazy_names(__name__, _SOURCES, globals())
