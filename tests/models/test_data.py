"""Tests for bayesgate.models.data.mnist: IDX reader, data directory, splits and fingerprint."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesgate.models.data import mnist as data
from bayesgate.models.data.mnist import (
    DataError,
    data_dir,
    load_mnist,
    mnist_fingerprint,
    read_idx_images,
    read_idx_labels,
    read_mnist,
    split_indices,
)

PUBLISHED_MD5 = {  # of the decompressed files, as published with MNIST
    "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
}
TEST_HISTOGRAM = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
TRAIN_HISTOGRAM = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
# sha256 of the four decompressed files concatenated (train images, labels, test images, labels).
FINGERPRINT = "b2d8f5bf39174ee5ffeefa97e42d673c35432b411bb5d1f74fbbeddae7f1690a"
# sha256 of the default 10k validation indices as little-endian int64 (pinned split).
VAL_SHA256 = "3d8fae35b78b7147b5a6b8f00648f7bbb6eb87faabc92218b7465b9d1df5a53e"


@pytest.fixture(scope="module")
def real_root(mnist_root: Path) -> Path:
    """The folder holding the real mnist/ files (``mnist_root`` comes from conftest.py)."""
    return mnist_root


# --- synthetic IDX files --------------------------------------------------------------------


def idx_bytes(magic: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    """An IDX file: big-endian magic, dimension sizes, then the payload."""
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in shape)
    return header + payload


def write(path: Path, content: bytes) -> Path:
    """Write content, gzipped when the name ends in .gz."""
    path.write_bytes(gzip.compress(content) if path.suffix == ".gz" else content)
    return path


def synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    return images, rng.integers(0, 10, size=n, dtype=np.uint8)


def write_pair(folder: Path, images: np.ndarray, labels: np.ndarray, *, prefix: str, gz: bool):
    suffix = ".gz" if gz else ""
    img = write(
        folder / f"{prefix}-images-idx3-ubyte{suffix}",
        idx_bytes(0x803, images.shape, images.tobytes()),
    )
    lbl = write(
        folder / f"{prefix}-labels-idx1-ubyte{suffix}",
        idx_bytes(0x801, labels.shape, labels.tobytes()),
    )
    return img, lbl


@pytest.mark.parametrize("gz", [True, False])
def test_reads_synthetic_pair(tmp_path: Path, gz: bool) -> None:
    images, labels = synthetic(7)
    img, lbl = write_pair(tmp_path, images, labels, prefix="train", gz=gz)
    x, y = read_mnist(img, lbl)
    assert x.shape == (7, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (7,) and y.dtype == torch.int64
    assert x[0, 0, 0, 0] == 0.0 and x[0, 0, 0, 1] == 1.0
    torch.testing.assert_close(x[:, 0], torch.from_numpy(images).float() / 255)
    assert y.tolist() == labels.tolist()


def test_empty_files_are_valid(tmp_path: Path) -> None:
    img, lbl = write_pair(
        tmp_path, np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.uint8), prefix="t", gz=False
    )
    x, y = read_mnist(img, lbl)
    assert x.shape == (0, 1, 28, 28) and y.shape == (0,)


def _expect_error(path: Path, reader, *needles: str) -> DataError:
    with pytest.raises(DataError) as info:
        reader(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    for needle in needles:
        assert needle in message.lower()
    return info.value


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_wrong_magic(tmp_path: Path, suffix: str) -> None:
    labels = write(tmp_path / f"labels{suffix}", idx_bytes(0x801, (3,), b"\x01\x02\x03"))
    err = _expect_error(labels, read_idx_images, "magic", "0x00000801", "0x00000803", "label file")
    assert isinstance(err, Exception) and not isinstance(err, (OSError, ValueError))
    junk = write(tmp_path / f"junk{suffix}", b"hello world, not idx")
    _expect_error(junk, read_idx_labels, "magic")


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_truncated_payload(tmp_path: Path, suffix: str) -> None:
    images, _ = synthetic(3)
    content = idx_bytes(0x803, (3, 28, 28), images.tobytes())[:-10]
    path = write(tmp_path / f"images{suffix}", content)
    _expect_error(path, read_idx_images, "truncated")


def test_truncated_header_and_empty_file(tmp_path: Path) -> None:
    _expect_error(write(tmp_path / "short", b"\x00\x00\x08\x03\x00"), read_idx_images, "truncated")
    _expect_error(write(tmp_path / "empty", b""), read_idx_labels, "truncated")


def test_truncated_gzip_stream(tmp_path: Path) -> None:
    images, _ = synthetic(50)
    packed = gzip.compress(idx_bytes(0x803, images.shape, images.tobytes()))
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) // 2])
    _expect_error(path, read_idx_images, "gzip")


def test_trailing_bytes_wrong_shape_and_label_range(tmp_path: Path) -> None:
    extra = write(tmp_path / "extra", idx_bytes(0x801, (2,), b"\x01\x02\x03"))
    _expect_error(extra, read_idx_labels, "unexpected bytes")
    small = write(tmp_path / "small", idx_bytes(0x803, (1, 27, 28), bytes(27 * 28)))
    _expect_error(small, read_idx_images, "27x28")
    bad = write(tmp_path / "bad", idx_bytes(0x801, (2,), b"\x01\x0a"))
    _expect_error(bad, read_idx_labels, "out of range")


def test_count_mismatch(tmp_path: Path) -> None:
    images, labels = synthetic(5)
    img, lbl = write_pair(tmp_path, images, labels[:4], prefix="x", gz=True)
    with pytest.raises(DataError, match=r"5 images but x-labels-idx1-ubyte\.gz has 4 labels"):
        read_mnist(img, lbl)


def test_missing_file(tmp_path: Path) -> None:
    _expect_error(tmp_path / "nope.gz", read_idx_images, "cannot read")


def test_changed_file_is_reread(tmp_path: Path) -> None:
    path = write(tmp_path / "labels", idx_bytes(0x801, (2,), b"\x01\x02"))
    assert read_idx_labels(path).tolist() == [1, 2]
    write(path, idx_bytes(0x801, (3,), b"\x03\x04\x05"))
    assert read_idx_labels(path).tolist() == [3, 4, 5]


# --- data directory -------------------------------------------------------------------------


def test_data_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    assert data.mnist_dir() == tmp_path / "d" / "mnist"
    monkeypatch.delenv("BAYESGATE_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "bayesgate" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home" / ".cache" / "bayesgate" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("BAYESGATE_DATA_DIR", "")
    assert data_dir() == tmp_path / "home" / ".cache" / "bayesgate" / "data"


# --- load_mnist on synthetic data -----------------------------------------------------------


@pytest.fixture
def synthetic_root(tmp_path: Path) -> Path:
    folder = tmp_path / "mnist"
    folder.mkdir()
    write_pair(folder, *synthetic(100, seed=1), prefix="train", gz=True)
    write_pair(folder, *synthetic(30, seed=2), prefix="t10k", gz=False)  # un-gzipped names
    return tmp_path


def test_load_synthetic_splits(synthetic_root: Path) -> None:
    def load(split: str, **kw):
        return load_mnist(split, data_dir=synthetic_root, val_size=20, download=False, **kw)

    x_all, y_all = load("train+val")
    x_tr, y_tr = load("train")
    x_val, _ = load("val")
    x_te, _ = load("test")
    assert (len(x_all), len(x_tr), len(x_val), len(x_te)) == (100, 80, 20, 30)
    val_idx = split_indices("val", n=100, val_size=20)
    torch.testing.assert_close(x_val, x_all[val_idx])
    assert y_tr.tolist() == y_all[split_indices("train", n=100, val_size=20)].tolist()
    assert load("train", limit=5)[0].shape == (5, 1, 28, 28)
    torch.testing.assert_close(load("val", limit=3)[0], x_val[:3])
    assert load("test", limit=0)[0].shape == (0, 1, 28, 28)


def test_load_errors(synthetic_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"train, val, test, train\+val"):
        load_mnist("validation", data_dir=synthetic_root, download=False)
    with pytest.raises(ValueError, match="val_size"):
        load_mnist("train", data_dir=synthetic_root, download=False)  # 10k of 100 images
    with pytest.raises(ValueError, match="limit"):
        load_mnist("test", data_dir=synthetic_root, download=False, limit=-1)
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz.*download disabled"):
        load_mnist("test", data_dir=tmp_path / "empty", download=False)


def test_returned_tensors_do_not_share_the_cache(synthetic_root: Path) -> None:
    x, y = load_mnist("test", data_dir=synthetic_root, download=False)
    expected = x.clone()
    x.fill_(7.0)
    y.fill_(3)
    x2, _ = load_mnist("test", data_dir=synthetic_root, download=False)
    torch.testing.assert_close(x2, expected)


# --- splits ---------------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_complete() -> None:
    train, val = split_indices("train"), split_indices("val")
    assert len(train) == 50_000 and len(val) == 10_000
    assert np.intersect1d(train, val).size == 0
    assert np.array_equal(np.union1d(train, val), np.arange(60_000))
    assert np.array_equal(np.sort(val), val)
    data._val_rank.cache_clear()
    assert np.array_equal(split_indices("val"), val)
    assert np.array_equal(split_indices("train"), train)
    # Pinned: these change only if VAL_SPLIT_SEED or the ranking rule changes, which would
    # silently change every model's validation data.
    assert val[:8].tolist() == [3, 10, 16, 20, 25, 30, 33, 43]
    assert hashlib.sha256(val.astype("<i8").tobytes()).hexdigest() == VAL_SHA256
    # A smaller validation set is a subset of the larger one.
    assert np.isin(split_indices("val", val_size=1000), val).all()
    assert np.array_equal(split_indices("train+val"), np.arange(60_000))
    assert split_indices("val", val_size=0).size == 0


def test_split_indices_errors() -> None:
    with pytest.raises(ValueError, match="split"):
        split_indices("test")
    with pytest.raises(ValueError, match="val_size"):
        split_indices("val", val_size=60_000)


# --- real MNIST -----------------------------------------------------------------------------


def test_real_files_match_published_md5(real_root: Path) -> None:
    for name, md5 in PUBLISHED_MD5.items():
        path = real_root / "mnist" / name
        assert hashlib.md5(data.read_file_bytes(path)).hexdigest() == md5
        assert data.MNIST_FILES[name].raw_md5 == md5
        gz = path.read_bytes()
        assert (len(gz), hashlib.sha256(gz).hexdigest()) in data.MNIST_FILES[name].gz_variants


def test_real_test_set(real_root: Path) -> None:
    x, y = load_mnist("test", data_dir=real_root, download=False)
    assert x.shape == (10_000, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (10_000,) and y.dtype == torch.int64
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert torch.bincount(y, minlength=10).tolist() == TEST_HISTOGRAM
    assert int(torch.bincount(y).sum()) == 10_000


def test_real_train_val_split(real_root: Path) -> None:
    x_all, y_all = load_mnist("train+val", data_dir=real_root, download=False)
    x_tr, y_tr = load_mnist("train", data_dir=real_root, download=False)
    x_val, y_val = load_mnist("val", data_dir=real_root, download=False)
    assert x_all.shape == (60_000, 1, 28, 28) and x_tr.shape[0] == 50_000
    assert x_val.shape[0] == 10_000
    assert torch.bincount(y_all, minlength=10).tolist() == TRAIN_HISTOGRAM
    assert (torch.bincount(y_tr, minlength=10) + torch.bincount(y_val, minlength=10)).tolist() == (
        TRAIN_HISTOGRAM
    )
    val = torch.from_numpy(split_indices("val"))
    assert torch.equal(x_val, x_all[val]) and torch.equal(y_val, y_all[val])
    assert float(x_tr.min()) >= 0.0 and float(x_tr.max()) <= 1.0
    x_lim, _ = load_mnist("train", data_dir=real_root, download=False, limit=64)
    assert torch.equal(x_lim, x_tr[:64])


def test_real_fingerprint(real_root: Path) -> None:
    assert data.MNIST_FINGERPRINT == FINGERPRINT
    assert mnist_fingerprint(real_root, download=False) == FINGERPRINT
