"""Image files → one batch for :class:`~bayesgate.service.gate.Gate` (``bayesgate predict``).

- ``.png``: one grayscale PNG of the model's height × width, checked and decoded exactly as the
  service decodes an uploaded one (:func:`~bayesgate.service.inputs.decode_png`: chunk walk,
  CRCs, size read from the header before decoding; bit depth 1–8, ``v / (2^d − 1)``).
- ``.npy``: one image or ``N`` images (``N×28×28``, ``N×784``, ``N×1×28×28``; ``uint8`` read as
  ``v / 255``, other numbers in [0, 1]); loaded with ``allow_pickle=False``.
- ``.npz``: the array named ``key``; without one, ``x_adv`` when there is one (the adversarial
  images ``bayesgate attack`` writes), else the file's only array.
- a folder: its ``.png``, ``.npy`` and ``.npz`` files (not its sub-folders), in name order.

Every problem is an :class:`~bayesgate.errors.InvalidArgument` naming the file (and the image in
it), raised before any image is scored.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bayesgate.errors import InvalidArgument
from bayesgate.service.errors import InvalidInput
from bayesgate.service.gate import Gate
from bayesgate.service.inputs import accepted_shapes, decode_png

SUFFIXES = (".png", ".npy", ".npz")
ATTACK_ARRAY = "x_adv"  # the adversarial images in a ``bayesgate attack`` .npz
MAX_PNG_BYTES = 1 << 20  # a 28×28 digit's PNG is under 1 kB; the service's upload limit is 1 MiB


@dataclass(frozen=True)
class Source:
    """Where an image came from: its ``file`` and, for an array of images, its ``index``."""

    file: str
    index: int | None


@dataclass(frozen=True)
class InputBatch:
    """The images of every file (``N×(input shape)``, float32) and where each came from."""

    images: torch.Tensor
    sources: list[Source]

    @property
    def files(self) -> int:
        return len({s.file for s in self.sources})


def read_inputs(paths: Sequence[Path], gate: Gate, key: str | None = None) -> InputBatch:
    """Every image of ``paths`` (files or folders, see the module's docstring), in order."""
    parts: list[torch.Tensor] = []
    sources: list[Source] = []
    for path in expand(paths):
        images, indexed = _read_file(path, gate, key)
        parts.append(images)
        name = str(path)
        sources += [Source(name, i if indexed else None) for i in range(len(images))]
    return InputBatch(torch.cat(parts), sources)


def expand(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with each folder replaced by its image files, in name order."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES
            )
            if not found:
                raise InvalidArgument(f"{path}: no {', '.join(SUFFIXES)} files in this folder")
            out += found
        elif path.is_file():
            if path.suffix.lower() not in SUFFIXES:
                raise InvalidArgument(
                    f"{path}: unknown kind of file (expected {', '.join(SUFFIXES)} or a folder)"
                )
            out.append(path)
        else:
            raise InvalidArgument(f"{path}: no such file or folder")
    return out


def _read_file(path: Path, gate: Gate, key: str | None) -> tuple[torch.Tensor, bool]:
    """``(images N×shape, whether they are indexed)`` of one file."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".png":
            return _read_png(path, gate), False
        array = _read_npy(path) if suffix == ".npy" else _read_npz(path, key)
        images = gate.images(array, field=str(path))
    except InvalidInput as exc:
        raise InvalidArgument(str(exc)) from None
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot read ({exc.strerror or exc})") from None
    return images, tuple(array.shape) not in accepted_shapes(gate.model.input_shape)


def _read_png(path: Path, gate: Gate) -> torch.Tensor:
    size = path.stat().st_size
    if size > MAX_PNG_BYTES:
        raise InvalidArgument(f"{path}: {size} bytes, more than a digit's PNG ({MAX_PNG_BYTES})")
    pixels = decode_png(path.read_bytes(), str(path), gate.model.input_shape)
    return torch.from_numpy(pixels).unsqueeze(0)


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:  # object arrays (pickles), a bad header
        raise InvalidArgument(f"{path}: not a readable .npy array ({exc})") from None


def _read_npz(path: Path, key: str | None) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as arrays:
            names = list(arrays.files)
            name = _array_name(path, names, key)
            return arrays[name]
    except (ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InvalidArgument(f"{path}: not a readable .npz archive ({exc})") from None


def _array_name(path: Path, names: list[str], key: str | None) -> str:
    """The array of the archive to score (see the module's docstring)."""
    if key is not None:
        if key not in names:
            raise InvalidArgument(f"{path}: no array {key!r} (--key); it has {', '.join(names)}")
        return key
    if ATTACK_ARRAY in names:
        return ATTACK_ARRAY
    if len(names) == 1:
        return names[0]
    listed = ", ".join(names) or "none"
    raise InvalidArgument(f"{path}: which array? it has {listed} (choose one with --key)")
