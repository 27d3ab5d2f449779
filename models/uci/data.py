"""UCI regression benchmarks in the Hernández-Lobato / Gal folder format, read in place.

A dataset folder ``<data_dir>/uci/<name>/`` holds ``data.txt`` (whitespace-separated rows),
``index_features.txt`` and ``index_target.txt`` (0-based column numbers), the standard splits
``index_train_<i>.txt`` / ``index_test_<i>.txt`` for ``i < n_splits`` (``n_splits.txt``; 0-based
row numbers, written as floats in some folders) and the per-dataset hyper-parameter grid
(``dropout_rates.txt``, ``tau_values.txt``, ``n_hidden.txt``, ``n_epochs.txt``).

Inputs and targets are standardised with the statistics of the **training** rows only
(:class:`Standardiser`); a feature that is constant on them keeps scale 1 (as in Gal's code).
Every problem with a file raises :class:`UCIDataError` naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bayesgate.models.data.mnist import DataError, data_dir

# Short names accepted on the command line → folder names of the standard benchmark.
ALIASES = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "red-wine": "wine-quality-red",
    "yacht": "yacht",
}


class UCIDataError(DataError):
    """A UCI dataset folder or one of its files is missing or malformed."""


@dataclass(frozen=True)
class HyperGrid:
    """The folder's grid: dropout rates, τ values (original target units), width, epochs."""

    dropout_rates: tuple[float, ...]
    tau_values: tuple[float, ...]
    n_hidden: int
    n_epochs: int


@dataclass(frozen=True)
class UCIDataset:
    """Features ``x`` (``N×D`` float64), targets ``y`` (``N`` float64), splits and grid."""

    name: str
    directory: Path
    x: np.ndarray
    y: np.ndarray
    n_splits: int
    grid: HyperGrid

    def split(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row indices ``(train, test)`` (int64, file order) of standard split ``i``."""
        if not 0 <= i < self.n_splits:
            raise UCIDataError(
                f"{self.name}: split {i} out of range, the dataset has {self.n_splits}"
            )
        n = self.x.shape[0]
        train = _read_indices(self.directory / f"index_train_{i}.txt", n)
        test = _read_indices(self.directory / f"index_test_{i}.txt", n)
        overlap = np.intersect1d(train, test)
        if overlap.size:
            raise UCIDataError(
                f"{self.name}: split {i} has {overlap.size} rows in both train and test "
                f"(e.g. row {int(overlap[0])})"
            )
        return train, test


@dataclass(frozen=True)
class Standardiser:
    """``x ↦ (x − μ_x)/σ_x`` and ``y ↦ (y − μ_y)/σ_y`` with training-split statistics.

    ``σ`` is the population standard deviation (``ddof=0``, as numpy and Gal's code); features
    with ``σ_x = 0`` on the training rows get ``σ_x = 1``. Predictions are mapped back with
    :meth:`inverse_y`, ``y = μ_y + σ_y · y_n``.
    """

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> Standardiser:
        """Statistics of ``x`` (``N×D``) and ``y`` (``N``); needs ``N ≥ 2`` and non-constant y."""
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise ValueError(f"need x N×D and y N, got {x.shape} and {y.shape}")
        if x.shape[0] < 2:
            raise ValueError(f"need at least 2 training rows to standardise, got {x.shape[0]}")
        x_std = x.std(axis=0)
        x_std[x_std == 0] = 1.0
        y_std = float(y.std())
        if y_std == 0:
            raise ValueError("the training targets are constant; cannot standardise them")
        return cls(x.mean(axis=0), x_std, float(y.mean()), y_std)

    def transform_x(self, x: np.ndarray) -> np.ndarray:
        return (x - self.x_mean) / self.x_std

    def transform_y(self, y: np.ndarray) -> np.ndarray:
        return (y - self.y_mean) / self.y_std

    def inverse_y(self, y_n: np.ndarray) -> np.ndarray:
        return y_n * self.y_std + self.y_mean


def uci_root(root: Path | str | None = None) -> Path:
    """``<root>/uci``, with ``root`` defaulting to :func:`bayesgate.models.data.mnist.data_dir`
    (``$BAYESGATE_DATA_DIR``)."""
    return (Path(root) if root is not None else data_dir()) / "uci"


def available_datasets(root: Path | str | None = None) -> list[str]:
    """Names of the dataset folders (those holding a ``data.txt``) under :func:`uci_root`."""
    base = uci_root(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "data.txt").is_file())


def resolve_name(name: str, root: Path | str | None = None) -> Path:
    """The folder of dataset ``name`` (a folder name or an alias such as ``boston``)."""
    base = uci_root(root)
    for candidate in (name, ALIASES.get(name.lower(), "")):
        if candidate and (base / candidate / "data.txt").is_file():
            return base / candidate
    found = available_datasets(root)
    listing = ", ".join(found) if found else "none"
    aliases = ", ".join(sorted(k for k, v in ALIASES.items() if v in found))
    raise UCIDataError(
        f"unknown UCI dataset {name!r} in {base}; available: {listing}"
        + (f" (aliases: {aliases})" if aliases else "")
    )


def load_uci(name: str, root: Path | str | None = None) -> UCIDataset:
    """Read dataset ``name`` from ``<root>/uci/<name>/`` (``root`` defaults to
    ``$BAYESGATE_DATA_DIR``); checks column indices, split count and grid files."""
    folder = resolve_name(name, root)
    data = _read_matrix(folder / "data.txt")
    n_cols = data.shape[1]
    features = _read_indices(folder / "index_features.txt", n_cols, what="column")
    target = _read_indices(folder / "index_target.txt", n_cols, what="column")
    if target.size != 1:
        raise UCIDataError(f"{folder / 'index_target.txt'}: expected one column, got {target.size}")
    if int(target[0]) in set(features.tolist()):
        raise UCIDataError(f"{folder}: the target column {int(target[0])} is also a feature")
    n_splits = _read_int(folder / "n_splits.txt")
    for i in range(n_splits):
        for kind in ("train", "test"):
            path = folder / f"index_{kind}_{i}.txt"
            if not path.is_file():
                raise UCIDataError(f"{path} is missing (n_splits.txt says {n_splits} splits)")
    grid = HyperGrid(
        dropout_rates=_read_floats(folder / "dropout_rates.txt", low=0.0, high=1.0),
        tau_values=_read_floats(folder / "tau_values.txt", low=0.0, high=np.inf),
        n_hidden=_read_int(folder / "n_hidden.txt"),
        n_epochs=_read_int(folder / "n_epochs.txt"),
    )
    return UCIDataset(
        name=folder.name,
        directory=folder,
        x=np.ascontiguousarray(data[:, features]),
        y=np.ascontiguousarray(data[:, int(target[0])]),
        n_splits=n_splits,
        grid=grid,
    )


# --- file readers ---------------------------------------------------------------------------


def _load_text(path: Path) -> np.ndarray:
    if not path.is_file():
        raise UCIDataError(f"{path} is missing")
    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as exc:
        raise UCIDataError(f"{path}: not a whitespace-separated table of numbers ({exc})") from None


def _read_matrix(path: Path) -> np.ndarray:
    if not path.is_file():
        raise UCIDataError(f"{path} is missing")
    try:
        data = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as exc:
        raise UCIDataError(f"{path}: not a whitespace-separated table of numbers ({exc})") from None
    if data.shape[0] < 2 or data.shape[1] < 2:
        raise UCIDataError(f"{path}: need at least 2 rows and 2 columns, got {data.shape}")
    if not np.isfinite(data).all():
        raise UCIDataError(f"{path}: contains NaN or infinite values")
    return data


def _read_indices(path: Path, limit: int, what: str = "row") -> np.ndarray:
    """0-based integer indices (possibly written as floats) in ``[0, limit)``, no duplicates."""
    values = _load_text(path).ravel()
    if values.size == 0:
        raise UCIDataError(f"{path} is empty")
    if not np.all(np.isfinite(values)) or not np.all(values == np.round(values)):
        raise UCIDataError(f"{path}: {what} indices must be whole numbers")
    idx = values.astype(np.int64)
    if idx.min() < 0 or idx.max() >= limit:
        raise UCIDataError(
            f"{path}: {what} index out of range [0, {limit}) "
            f"(min {int(idx.min())}, max {int(idx.max())})"
        )
    if np.unique(idx).size != idx.size:
        raise UCIDataError(f"{path}: repeated {what} indices")
    return idx


def _read_int(path: Path) -> int:
    values = _load_text(path).ravel()
    if values.size != 1 or values[0] != round(values[0]) or values[0] < 1:
        raise UCIDataError(f"{path}: expected one positive integer, got {values.tolist()}")
    return int(values[0])


def _read_floats(path: Path, low: float, high: float) -> tuple[float, ...]:
    values = _load_text(path).ravel()
    if values.size == 0 or not np.all((values > low) & (values < high)):
        raise UCIDataError(
            f"{path}: expected numbers in ({low:g}, {high:g}), got {values.tolist()}"
        )
    return tuple(float(v) for v in values)
