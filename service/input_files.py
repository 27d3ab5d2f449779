"""Image files → one batch for :class:`~bayesgate.service.gate.Gate` (``bayesgate predict``).

- ``.png``: one grayscale PNG of the model's height × width, checked and decoded exactly as the
  service decodes an uploaded one (:func:`~bayesgate.service.inputs.decode_png`: chunk walk,
  CRCs, size read from the header before decoding; bit depth 1–8, ``v / (2^d − 1)``), at most
  :data:`MAX_PNG_BYTES`.
- ``.npy``: one image or ``N`` images (``N×28×28``, ``N×784``, ``N×1×28×28``; ``uint8`` read as
  ``v / 255``, other numbers in [0, 1]).
- ``.npz``: the array named ``key``; without one, ``x_adv`` when there is one (the adversarial
  images ``bayesgate attack`` writes), else the file's only array.
- a folder: its ``.png``, ``.npy`` and ``.npz`` files (not its sub-folders, not its hidden
  files), in name order.

An array file is told by its first bytes (``\\x93NUMPY`` or a zip archive), whatever its suffix.
Its header is read first: an object array (a pickle inside) is refused without being loaded,
and the images it claims count against :data:`MAX_IMAGES` before any memory is taken for them.
Every problem is an :class:`~bayesgate.errors.InvalidArgument` naming the file (and the image in
it), raised before any image is scored.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import torch

from bayesgate.errors import InvalidArgument
from bayesgate.service.errors import InvalidInput
from bayesgate.service.gate import Gate
from bayesgate.service.inputs import decode_png

SUFFIXES = (".png", ".npy", ".npz")
ATTACK_ARRAY = "x_adv"  # the adversarial images in a ``bayesgate attack`` .npz
MAX_PNG_BYTES = 1 << 20  # a 28×28 digit's PNG is under 1 kB; the service's upload limit is 1 MiB
MAX_IMAGES = 100_000  # per run: 314 MB as float32 28×28 images (MNIST's train split is 60,000)
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"  # an archive without members (``np.savez(path)``)
_ZIP_MAGICS = (_ZIP_MAGIC, _EMPTY_ZIP_MAGIC)
_READ_ERRORS = (ValueError, EOFError, zlib.error, zipfile.BadZipFile, MemoryError)


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
    paths: list[Path]  # the files read, folders expanded

    @property
    def files(self) -> int:
        return len({s.file for s in self.sources})


def display(path: Path) -> str:
    """``path`` as text that any output can hold (bytes that are not UTF-8 as ``\\xff``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def read_inputs(paths: Sequence[Path], gate: Gate, key: str | None = None) -> InputBatch:
    """Every image of ``paths`` (files or folders, see the module's docstring), in order."""
    files = expand(paths)
    if key is not None and not any(_magic(p).startswith(_ZIP_MAGICS) for p in files):
        raise InvalidArgument(f"--key {key}: applies to .npz inputs, and none was given")
    parts: list[torch.Tensor] = []
    sources: list[Source] = []
    for path in files:
        images, indexed = _read_file(path, gate, key, MAX_IMAGES - len(sources))
        parts.append(images)
        name = display(path)
        sources += [Source(name, i if indexed else None) for i in range(len(images))]
    return InputBatch(torch.cat(parts), sources, files)


def expand(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with each folder replaced by its image files, in name order."""
    out: list[Path] = []
    for path in paths:
        try:
            if path.is_dir():
                out += _folder_files(path)
            elif path.is_file():
                if path.suffix.lower() not in SUFFIXES:
                    raise InvalidArgument(
                        f"{display(path)}: unknown kind of file (expected {', '.join(SUFFIXES)} "
                        "or a folder)"
                    )
                out.append(path)
            elif path.exists():
                raise InvalidArgument(f"{display(path)}: not a regular file or a folder")
            else:
                raise InvalidArgument(f"{display(path)}: no such file or folder")
        except OSError as exc:
            raise InvalidArgument(f"{display(path)}: cannot read ({exc.strerror or exc})") from None
    return out


def _folder_files(folder: Path) -> list[Path]:
    found = sorted(
        p
        for p in folder.iterdir()
        if not p.name.startswith(".") and p.suffix.lower() in SUFFIXES and p.is_file()
    )
    if not found:
        raise InvalidArgument(f"{display(folder)}: no {', '.join(SUFFIXES)} files in this folder")
    return found


def _read_file(path: Path, gate: Gate, key: str | None, room: int) -> tuple[torch.Tensor, bool]:
    """``(images N×shape, whether they are indexed)`` of one file, which may add at most
    ``room`` images to the run."""
    field = display(path)
    try:
        if path.suffix.lower() == ".png":
            if room < 1:
                raise InvalidArgument(_too_many(field, 1))
            return _read_png(path, gate, field), False
        array = _read_array(path, key, gate, room, field)
        return gate.to_batch(array, field=field), not gate.single_image(array.shape)
    except InvalidInput as exc:
        raise InvalidArgument(str(exc)) from None
    except OSError as exc:
        raise InvalidArgument(f"{field}: cannot read ({exc.strerror or exc})") from None


def _read_png(path: Path, gate: Gate, field: str) -> torch.Tensor:
    size = path.stat().st_size
    if size > MAX_PNG_BYTES:
        raise InvalidArgument(f"{field}: {size} bytes, more than a digit's PNG ({MAX_PNG_BYTES})")
    pixels = decode_png(path.read_bytes(), field, gate.model.input_shape)
    return torch.from_numpy(pixels).unsqueeze(0)


def _read_array(path: Path, key: str | None, gate: Gate, room: int, field: str) -> np.ndarray:
    """The array to score in a ``.npy`` or ``.npz`` file, told by its first bytes."""
    magic = _magic(path)
    try:
        if magic.startswith(_NPY_MAGIC):
            return _checked_array(lambda: path.open("rb"), gate, room, field)
        if magic.startswith(_ZIP_MAGICS):
            with zipfile.ZipFile(path) as archive:
                members = {  # np.savez names each array NAME.npy; nothing else is an array
                    name.removesuffix(".npy"): name
                    for name in archive.namelist()
                    if name.endswith(".npy")
                }
                member = members[_array_name(field, list(members), key)]
                return _checked_array(lambda: archive.open(member), gate, room, field)
    except InvalidArgument:
        raise  # our own refusal (an InvalidArgument is a ValueError too): as it is
    except _READ_ERRORS as exc:
        raise InvalidArgument(f"{field}: not a readable array file ({_reason(exc)})") from None
    kind = "an empty file" if not magic else "neither .npy nor .npz content"
    raise InvalidArgument(f"{field}: {kind} (an array file starts with \\x93NUMPY or PK)")


def _magic(path: Path) -> bytes:
    """The first bytes of ``path``: enough to tell a .npy from a zip archive."""
    try:
        with path.open("rb") as stream:
            return stream.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise InvalidArgument(f"{display(path)}: cannot read ({exc.strerror or exc})") from None


def _checked_array(
    open_stream: Callable[[], IO[bytes]], gate: Gate, room: int, field: str
) -> np.ndarray:
    """The ``.npy`` array ``open_stream()`` reads, its header checked first: no objects (a
    pickle), no more than ``room`` images; only then is its data read."""
    with open_stream() as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    if dtype.hasobject:
        raise InvalidArgument(
            f"{field}: an array of Python objects (a pickle inside); only numbers are read, "
            "and pickles never"
        )
    single = gate.single_image(shape)
    if not single and not (shape and gate.single_image(shape[1:])):
        raise InvalidArgument(gate.shape_message(field, shape))  # before any data is read
    n = 1 if single else shape[0]
    if n > room:
        raise InvalidArgument(_too_many(field, n))
    with open_stream() as stream:
        return np.lib.format.read_array(stream, allow_pickle=False)


def _array_name(field: str, names: list[str], key: str | None) -> str:
    """The array of the archive to score (see the module's docstring)."""
    if not names:
        raise InvalidArgument(f"{field}: no arrays in this archive")
    if key is not None:
        if key not in names:
            listed = ", ".join(names) or "none"
            raise InvalidArgument(f"{field}: no array {key!r} (--key); it has {listed}")
        return key
    if ATTACK_ARRAY in names:
        return ATTACK_ARRAY
    if len(names) == 1:
        return names[0]
    listed = ", ".join(names) or "none"
    raise InvalidArgument(f"{field}: which array? it has {listed} (choose one with --key)")


def _too_many(field: str, n: int) -> str:
    return (
        f"{field}: {n} more image{'s' * (n != 1)} would take the run past {MAX_IMAGES} images "
        "(split the inputs over several runs)"
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "its header claims more data than fits in memory"
    return str(exc) or type(exc).__name__
