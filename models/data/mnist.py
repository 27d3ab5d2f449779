"""MNIST data: IDX reader, data directory, deterministic validation split, fingerprint.

Files live in ``<data_dir>/mnist/`` under their original names (gzipped or not), where
``data_dir`` is ``$BAYESGATE_DATA_DIR`` or a per-user cache directory (see :func:`data_dir`).
Missing files are downloaded by :mod:`bayesgate.models.data.download` unless ``download=False``.

Every problem with a data file (missing, wrong magic number, truncated, mismatched counts,
failed download) raises :class:`DataError` with a one-line message naming the file.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bayesgate.errors import DataError, InvalidArgument
from bayesgate.models.data.settings import DATA_DIR_ENV, data_settings
from bayesgate.models.data.splits import DEFAULT_VAL_SIZE, SPLITS, TRAIN_SIZE

IMAGES_MAGIC = 0x00000803  # IDX: unsigned bytes, 3 dimensions (count, rows, cols)
LABELS_MAGIC = 0x00000801  # IDX: unsigned bytes, 1 dimension (count)
IMAGE_SIZE = 28
NUM_CLASSES = 10

# The validation split ranks the 60k training indices i by the first 8 bytes (big-endian) of
# sha256(VAL_SPLIT_SEED + i as 4 big-endian bytes) and holds out the val_size lowest ranks.
# Plain hashing gives the same indices on every machine and library version (unlike a seeded
# RNG permutation, whose stream numpy/torch do not promise to keep), and a smaller val_size
# gives a subset of a larger one. Changing this seed changes every model's validation data.
VAL_SPLIT_SEED = b"bayesgate/mnist/val-split/v1:"

# sha256 of the four decompressed IDX files concatenated in MNIST_FILES order, i.e.
# `for f in train-images train-labels t10k-images t10k-labels; do zcat $f-*.gz; done | sha256sum`
MNIST_FINGERPRINT = "b2d8f5bf39174ee5ffeefa97e42d673c35432b411bb5d1f74fbbeddae7f1690a"


@dataclass(frozen=True)
class MnistFile:
    """One of the four MNIST files and the checksums it is verified against.

    ``gz_variants`` lists the accepted ``(size, sha256)`` of the ``.gz`` archive: the original
    distribution (as served by the usual mirrors) and the re-compressed copy in the project's
    shared data, which has the same content but different gzip bytes. ``raw_md5`` is the
    published MD5 of the decompressed IDX file, which both variants share.
    """

    name: str
    raw_md5: str
    gz_variants: tuple[tuple[int, str], ...]

    @property
    def raw_name(self) -> str:
        """The un-gzipped file name (``train-images-idx3-ubyte``)."""
        return self.name.removesuffix(".gz")


MNIST_FILES: dict[str, MnistFile] = {
    f.name: f
    for f in (
        MnistFile(
            "train-images-idx3-ubyte.gz",
            "6bbc9ace898e44ae57da46a324031adb",
            (
                (9_912_422, "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
                (9_630_634, "db8f937d487057fb14a9f0fbe97f0bc8d311ab41b750d41e1ff37c43b9e55e19"),
            ),
        ),
        MnistFile(
            "train-labels-idx1-ubyte.gz",
            "a25bea736e30d166cdddb491f175f624",
            (
                (28_881, "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
                (28_902, "51fc562b6747b666fbf6e84ce29d43c3cb5f9c388c664d43b33f02095313405a"),
            ),
        ),
        MnistFile(
            "t10k-images-idx3-ubyte.gz",
            "2646ac647ad5339dbf082846283269ea",
            (
                (1_648_877, "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
                (1_602_073, "cfeddb84311ecf044fc6a5b0f6ee8a24d265d4e83e388400186eb114082f4209"),
            ),
        ),
        MnistFile(
            "t10k-labels-idx1-ubyte.gz",
            "27ae3e4e09519cfbb04c329615203637",
            (
                (4_542, "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
                (4_540, "e41c74e484045d39b462a7790a4af51301bd9b0b24f0154798d713ec68c45920"),
            ),
        ),
    )
}
_SOURCES = {  # which (images, labels) file pair each source split reads
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


# --- data directory -------------------------------------------------------------------------


def data_dir() -> Path:
    """Root data directory: ``$BAYESGATE_DATA_DIR`` if set, else a per-user cache directory.

    The cache directory is ``$XDG_CACHE_HOME/bayesgate/data`` (``~/.cache/bayesgate/data`` when
    XDG_CACHE_HOME is unset or not absolute). MNIST files live in its ``mnist/`` subfolder.
    """
    return data_settings().data_root


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/bayesgate`` (``~/.cache/bayesgate`` when XDG_CACHE_HOME is unset or not
    absolute): data, and training checkpoints under ``checkpoints/``."""
    return data_settings().cache_root


def mnist_dir(root: Path | None = None) -> Path:
    """The folder holding the MNIST files: ``<root or data_dir()>/mnist``."""
    return (Path(root) if root is not None else data_dir()) / "mnist"


def find_mnist_file(folder: Path, name: str) -> Path | None:
    """Path of ``name`` (a ``.gz`` name) in ``folder``, or of its un-gzipped form; else None."""
    spec = MNIST_FILES[name]
    for candidate in (folder / spec.name, folder / spec.raw_name):
        if candidate.is_file():
            return candidate
    return None


# --- IDX reading ----------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed if it is gzip (detected by magic bytes, not name)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                f.seek(0)
                return f.read()
            f.seek(0)
            with gzip.GzipFile(fileobj=f) as gz:
                return gz.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(
            f"{path}: corrupt or truncated gzip data ({e}); run `bayesgate fetch-data` (with the "
            "same data directory) to check the files and fetch a bad one again"
        ) from e
    except OSError as e:
        raise DataError(f"{path}: cannot read file ({e.strerror or e})") from e


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> bytes:
    """Decompressed bytes, cached per (path, mtime, size) so a changed file is re-read."""
    return _read_bytes(Path(path))


def read_file_bytes(path: Path) -> bytes:
    """Decompressed content of an IDX file (``.gz`` or raw), cached in-process."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise DataError(f"{path}: cannot read file ({e.strerror or e})") from e
    return _read_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


def _parse_idx(data: bytes, path: Path, magic: int, ndim: int) -> np.ndarray:
    """Check an unsigned-byte IDX file's header and size; return a read-only uint8 view."""
    header = 4 + 4 * ndim
    if len(data) < 4:
        raise DataError(f"{path}: truncated header ({len(data)} bytes, need {header})")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        kind = {IMAGES_MAGIC: "an image file", LABELS_MAGIC: "a label file"}.get(found)
        hint = f", this is {kind}" if kind else ""
        raise DataError(f"{path}: wrong magic number 0x{found:08x}, expected 0x{magic:08x}{hint}")
    if len(data) < header:
        raise DataError(f"{path}: truncated header ({len(data)} bytes, need {header})")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(data) < expected:
        raise DataError(
            f"{path}: truncated: {len(data)} bytes but the header promises {expected}"
            f" ({shape[0]} items)"
        )
    if len(data) > expected:
        raise DataError(f"{path}: {len(data) - expected} unexpected bytes after {shape[0]} items")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx_images(path: Path) -> np.ndarray:
    """Read an IDX image file (magic 0x00000803) as a read-only ``N×28×28`` uint8 array."""
    path = Path(path)
    images = _parse_idx(read_file_bytes(path), path, IMAGES_MAGIC, 3)
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        rows, cols = images.shape[1:]
        raise DataError(f"{path}: images are {rows}x{cols}, expected {IMAGE_SIZE}x{IMAGE_SIZE}")
    return images


def read_idx_labels(path: Path) -> np.ndarray:
    """Read an IDX label file (magic 0x00000801) as a read-only ``N`` uint8 array of 0-9."""
    path = Path(path)
    labels = _parse_idx(read_file_bytes(path), path, LABELS_MAGIC, 1)
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise DataError(f"{path}: label {int(labels.max())} out of range 0-{NUM_CLASSES - 1}")
    return labels


def _read_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels as uint8 arrays, checked to have the same count."""
    images, labels = read_idx_images(images_path), read_idx_labels(labels_path)
    if len(images) != len(labels):
        raise DataError(
            f"{images_path}: {len(images)} images but {Path(labels_path).name}"
            f" has {len(labels)} labels"
        )
    return images, labels


def _to_tensors(
    images: np.ndarray, labels: np.ndarray, index: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh (never cache-sharing) float32 ``N×1×28×28`` tensor in [0, 1] and int64 labels."""
    x = torch.from_numpy(images[index].astype(np.float32)).div_(255.0).unsqueeze(1)
    return x, torch.from_numpy(labels[index].astype(np.int64))


def read_mnist(images_path: Path, labels_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Read an MNIST image/label file pair into float32 ``N×1×28×28`` images and int64 labels."""
    images, labels = _read_pair(images_path, labels_path)
    return _to_tensors(images, labels, np.arange(len(images)))


# --- splits ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _val_rank(n: int) -> np.ndarray:
    """Indices 0..n-1 ordered by their VAL_SPLIT_SEED hash (see the comment there)."""
    digests = b"".join(
        hashlib.sha256(VAL_SPLIT_SEED + i.to_bytes(4, "big")).digest()[:8] for i in range(n)
    )
    order = np.argsort(np.frombuffer(digests, dtype=">u8"), kind="stable")
    order.setflags(write=False)
    return order


def split_indices(
    split: str, *, n: int = TRAIN_SIZE, val_size: int = DEFAULT_VAL_SIZE
) -> np.ndarray:
    """Ascending indices into the ``n``-image training file for "train", "val" or "train+val".

    "val" is the ``val_size`` indices of lowest seeded hash rank (:data:`VAL_SPLIT_SEED`),
    "train" the rest, "train+val" all ``n``. Same result on every call and machine.
    """
    if split not in ("train", "val", "train+val"):
        raise ValueError(f"split must be 'train', 'val' or 'train+val' here, not {split!r}")
    if not 0 <= val_size < n:
        raise InvalidArgument(f"val_size must be in [0, {n}), got {val_size}")
    if split == "train+val":
        return np.arange(n)
    in_val = np.zeros(n, dtype=bool)
    in_val[_val_rank(n)[:val_size]] = True
    return np.flatnonzero(in_val if split == "val" else ~in_val)


# --- loading --------------------------------------------------------------------------------


def ensure_mnist_files(
    names: tuple[str, ...], root: Path | None = None, *, download: bool = True
) -> list[Path]:
    """Paths of the named MNIST files (``.gz`` names), downloading missing ones if allowed."""
    folder = mnist_dir(root)
    missing = [name for name in names if find_mnist_file(folder, name) is None]
    if missing and not download:
        raise DataError(
            f"{folder}: missing {', '.join(missing)} (download disabled; set {DATA_DIR_ENV}"
            " or put the original MNIST files there)"
        )
    if missing:
        from .download import (
            download_mnist,  # deferred: bayesgate.models.data.download imports this module
        )

        download_mnist(root, files=missing)
    paths = [find_mnist_file(folder, name) for name in names]
    if any(p is None for p in paths):  # pragma: no cover - download_mnist raises first
        raise DataError(f"{folder}: MNIST files still missing after download")
    return [p for p in paths if p is not None]


def load_mnist(
    split: str = "train",
    *,
    data_dir: Path | None = None,
    val_size: int = DEFAULT_VAL_SIZE,
    download: bool = True,
    limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load an MNIST split as float32 ``N×1×28×28`` images in [0, 1] and int64 labels.

    ``split`` is "train" (the training file minus the validation set, 50k by default), "val"
    (the ``val_size`` held-out training images, see :func:`split_indices`), "train+val" (all
    60k) or "test" (the 10k t10k file). Images keep the files' order. ``data_dir`` is the root
    holding ``mnist/`` (default :func:`data_dir`); ``limit`` keeps the first N of the split.
    Decoded files are cached in-process, so repeated calls only pay for the tensor copy.
    """
    if split not in SPLITS:
        raise InvalidArgument(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if limit is not None and limit < 0:
        raise InvalidArgument(f"limit must be >= 0, got {limit}")
    source = "test" if split == "test" else "train"
    images_path, labels_path = ensure_mnist_files(_SOURCES[source], data_dir, download=download)
    images, labels = _read_pair(images_path, labels_path)
    if split == "test":
        index = np.arange(len(images))
    else:
        index = split_indices(split, n=len(images), val_size=val_size)
    return _to_tensors(images, labels, index[:limit])


def mnist_fingerprint(data_dir: Path | None = None, *, download: bool = True) -> str:
    """sha256 of the four decompressed MNIST files, concatenated in :data:`MNIST_FILES` order.

    Independent of gzip compression, so equal to :data:`MNIST_FINGERPRINT` for the real data.
    """
    paths = ensure_mnist_files(tuple(MNIST_FILES), data_dir, download=download)
    digest = hashlib.sha256()
    for path in paths:
        digest.update(read_file_bytes(path))
    return digest.hexdigest()
