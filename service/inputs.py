"""Request payloads → one validated float32 tensor ``B×(card input shape)`` in the card's range.

Nothing reaches the model before passing these checks: every rejection is an
:class:`~bayesgate.service.errors.InvalidInput` naming the field (``instances[3]``, ``images[0]``)
and
what was expected.

- ``instances``: each image as nested lists in the card's shape (``1×28×28``), the same without
  leading singleton axes (``28×28``), or flat (``784``); finite numbers in the card's range.
- ``images``: base64 PNG files (optionally a ``data:image/png;base64,`` URL), 8-bit grayscale of
  the card's height × width, scaled to [0, 1] by ``/255``.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import struct
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from bayesgate.service.errors import InvalidInput, TooManyInstances

_DATA_URL_PREFIX = "data:image/png;base64,"


def accepted_shapes(shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Shapes accepted for one instance: the full shape, without leading 1s, and flat."""
    shape = tuple(shape)
    out = [shape]
    trimmed = shape
    while len(trimmed) > 1 and trimmed[0] == 1:
        trimmed = trimmed[1:]
        out.append(trimmed)
    flat = (math.prod(shape),)
    if flat not in out:
        out.append(flat)
    return out


def _shape_text(shapes: list[tuple[int, ...]]) -> str:
    return " or ".join("×".join(map(str, s)) for s in shapes)


def check_count(field: str, n: int, max_instances: int) -> None:
    if n == 0:
        raise InvalidInput(f"{field}: expected at least one image, got an empty list")
    if n > max_instances:
        raise TooManyInstances(
            f"{field}: {n} images in one request, at most {max_instances} allowed "
            "(split the request or raise BAYESGATE_MAX_INSTANCES)"
        )


def decode_instances(
    instances: list[Any],
    shape: Sequence[int],
    value_range: tuple[float, float],
    max_instances: int,
) -> torch.Tensor:
    """Nested-list images → float32 tensor ``B×shape``; raises :class:`InvalidInput`."""
    check_count("instances", len(instances), max_instances)
    shapes = accepted_shapes(shape)
    out = np.empty((len(instances), *shape), dtype=np.float64)
    for i, item in enumerate(instances):
        field = f"instances[{i}]"
        try:
            arr = np.asarray(item)
        except (ValueError, TypeError, RecursionError):
            raise InvalidInput(
                f"{field}: ragged or too deeply nested lists; expected an array of shape "
                f"{_shape_text(shapes)}"
            ) from None
        if arr.dtype.kind not in "iuf":
            raise InvalidInput(
                f"{field}: expected numbers (an array of shape {_shape_text(shapes)}), "
                f"got {kind_text(arr)}"
            )
        if arr.shape not in shapes:
            got = "×".join(map(str, arr.shape)) or "a scalar"
            raise InvalidInput(f"{field}: expected shape {_shape_text(shapes)}, got {got}")
        out[i] = arr.reshape(shape)
    check_values("instances", out, value_range)
    return torch.from_numpy(out.astype(np.float32))


def check_values(field: str, batch: np.ndarray, value_range: tuple[float, float]) -> None:
    """Reject NaN/±Inf and values outside ``value_range`` in ``batch`` (``B×…``, float64).

    Two vectorised reductions (min and max; a NaN propagates into both and fails the test) over
    the whole batch; only on failure is the first bad value located,
    and reported as ``<field>[b]`` with its index inside that instance.
    """
    lo, hi = value_range
    if batch.size and lo <= batch.min() and batch.max() <= hi:  # False when a NaN is there
        return
    with np.errstate(invalid="ignore"):
        ok = (batch >= lo) & (batch <= hi)  # False for NaN as well
    if ok.all():
        return
    flat = int(np.argmin(ok.reshape(-1)))
    b, pos = divmod(flat, int(np.prod(batch.shape[1:])))
    where = f"index {list(map(int, np.unravel_index(pos, batch.shape[1:])))} of " + "×".join(
        map(str, batch.shape[1:])
    )
    value = float(batch.reshape(-1)[flat])
    if not np.isfinite(value):
        raise InvalidInput(f"{field}[{b}]: values must be finite, found {value} at {where}")
    raise InvalidInput(
        f"{field}[{b}]: values must lie in [{lo:g}, {hi:g}], found {value:g} at {where}"
    )


def kind_text(arr: np.ndarray) -> str:
    """What a non-numeric array holds, for a message (``booleans``, ``strings``, …)."""
    return {"b": "booleans", "U": "strings", "S": "bytes", "O": "non-numeric values"}.get(
        arr.dtype.kind, str(arr.dtype)
    )


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_header_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` from a PNG's IHDR chunk (bytes 16–24), or None when not a PNG header."""
    if len(data) < 24 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return height, width


def decode_png(data: bytes, field: str, shape: Sequence[int]) -> np.ndarray:
    """PNG bytes → float32 array of ``shape`` in [0, 1] (``pixel / 255``).

    The file must be a PNG, 8-bit grayscale (Pillow mode ``L``) and exactly the card's
    height × width. The size is read from the PNG header before Pillow sees the file, so a
    decompression bomb (say a 20000×20000 PNG of zeros, 389 kB) is refused without decoding; any
    failure of the decoder itself (Pillow's own bomb limit for other formats, truncated or corrupt
    data) is an :class:`InvalidInput` (422) too, never a 500.
    """
    height, width = int(shape[-2]), int(shape[-1])
    if math.prod(shape) != height * width:
        raise InvalidInput(f"{field}: this model takes {len(shape)}-D input, not grayscale PNGs")
    declared = png_header_size(data)
    if declared is not None and declared != (height, width):
        raise InvalidInput(
            f"{field}: expected a {height}×{width} image, got {declared[0]}×{declared[1]} "
            f"(images larger than the model's {height}×{width} input are refused before decoding)"
        )
    try:
        image = _open_png(data, field, height, width)
    except InvalidInput:
        raise
    except UnidentifiedImageError:
        raise InvalidInput(f"{field}: not a PNG image (unknown or corrupt file format)") from None
    except Image.DecompressionBombError as exc:
        raise InvalidInput(
            f"{field}: image refused by the decoder's size limit of {Image.MAX_IMAGE_PIXELS} "
            f"pixels ({exc})"
        ) from None
    except Exception as exc:  # any other decoder failure is a bad file, not a server error
        raise InvalidInput(f"{field}: not a readable PNG image ({exc})") from None
    pixels = np.asarray(image, dtype=np.uint8).astype(np.float32) / 255.0
    return pixels.reshape(shape)


def _open_png(data: bytes, field: str, height: int, width: int) -> Image.Image:
    """Open and fully decode ``data``; :class:`InvalidInput` unless an 8-bit PNG of this size."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(data))
        image_format, mode, size = image.format, image.mode, image.size
        if image_format != "PNG":
            raise InvalidInput(f"{field}: expected a PNG file, got {image_format or 'unknown'}")
        if size != (width, height):
            raise InvalidInput(
                f"{field}: expected a {height}×{width} image, got {size[1]}×{size[0]}"
            )
        if mode != "L":
            raise InvalidInput(
                f"{field}: expected an 8-bit grayscale PNG (mode L), got mode {mode}"
            )
        image.load()
    return image


def decode_base64(text: str, field: str) -> bytes:
    """Strict base64 (standard alphabet, padding) → bytes; a ``data:`` URL prefix is allowed."""
    if text.startswith(_DATA_URL_PREFIX):
        text = text[len(_DATA_URL_PREFIX) :]
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{field}: not valid base64 ({exc})") from None
    if not data:
        raise InvalidInput(f"{field}: empty image")
    return data


def decode_images(images: list[str], shape: Sequence[int], max_instances: int) -> torch.Tensor:
    """Base64 PNG strings → float32 tensor ``B×shape`` in [0, 1]."""
    check_count("images", len(images), max_instances)
    out = np.empty((len(images), *shape), dtype=np.float32)
    for i, text in enumerate(images):
        field = f"images[{i}]"
        out[i] = decode_png(decode_base64(text, field), field, shape)
    return torch.from_numpy(out)
