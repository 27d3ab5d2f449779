"""MNIST in the original IDX format: reading, the fixed validation split and the checksummed
download from mirrors (:mod:`.download`, imported when a file is missing); where the data lives
and which mirrors to use come from :mod:`.settings`."""

from bayesgate.models.data.mnist import (
    DEFAULT_VAL_SIZE,
    SPLITS,
    DataError,
    data_dir,
    load_mnist,
    mnist_fingerprint,
)
from bayesgate.models.data.settings import DataSettings, data_settings

__all__ = [
    "DEFAULT_VAL_SIZE",
    "SPLITS",
    "DataError",
    "DataSettings",
    "data_dir",
    "data_settings",
    "load_mnist",
    "mnist_fingerprint",
]
