"""Request payloads → one validated float32 tensor ``B×(card input shape)`` in the card's range.

Nothing reaches the model before passing these checks: every rejection is an
:class:`~bayesgate.service.errors.InvalidInput` naming the field (``instances[3]``, ``images[0]``)
and
what was expected.

- ``instances``: each image as nested lists in the card's shape (``1×28×28``), the same without
  leading singleton axes (``28×28``), or flat (``784``); finite numbers in the card's range.
- ``images``: base64 PNG files (optionally a ``data:image/png;base64,`` URL), grayscale (bit
  depth 1, 2, 4 or 8) of the card's height × width, scaled to [0, 1] (``/255`` at 8 bits). Each
  file is checked chunk by chunk (CRCs, an IEND chunk, image data that inflates to exactly what
  the image needs) before Pillow decodes it.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import struct
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from bayesgate.service.errors import InvalidInput, TooManyInstances


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
    *,
    source: bytes | None = None,
) -> torch.Tensor:
    """Nested-list images → float32 tensor ``B×shape``; raises :class:`InvalidInput`.

    ``source`` is the JSON text ``instances`` was parsed from, when known: if it holds no
    ``true``/``false`` literal (:func:`may_hold_booleans`, one byte scan) the per-number boolean
    check is skipped; otherwise, and without ``source``, every instance is checked for booleans
    mixed with numbers (numpy reads ``[true, 0.5]`` as ``[1.0, 0.5]``)."""
    check_count("instances", len(instances), max_instances)
    shapes = accepted_shapes(shape)
    booleans = source is None or may_hold_booleans(source)
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
        if booleans:
            reject_booleans(field, item)
        out[i] = arr.reshape(shape)
    check_values("instances", out, value_range)
    return torch.from_numpy(out.astype(np.float32))


def may_hold_booleans(text: bytes) -> bool:
    """False when the JSON ``text`` cannot hold a ``true`` or ``false`` literal — the only way a
    boolean gets into parsed JSON. Each literal is looked for at a byte that numbers never hold
    (``u``, ``f``; ``memchr``-fast), so a body of numbers costs one scan of its bytes; a key or
    string that happens to read ``true``/``false`` only makes the caller check exactly."""
    for literal, pivot in ((b"true", 2), (b"false", 0)):
        byte = literal[pivot : pivot + 1]
        at = text.find(byte)
        while at != -1:
            if at >= pivot and text[at - pivot : at - pivot + len(literal)] == literal:
                return True
            at = text.find(byte, at + 1)
    return False


def reject_booleans(field: str, value: Any) -> None:
    """:class:`InvalidInput` naming the first boolean in the nested lists ``value``: numpy turns
    booleans mixed with numbers into 0/1 (``np.asarray([True, 0.5])`` is ``[1.0, 0.5]``), so the
    array's dtype cannot tell. A set of the element types per list (C speed) finds them."""
    where = _boolean_at(value)
    if where is not None:
        raise InvalidInput(
            f"{field}: expected numbers, got a boolean at index {where} (JSON true/false is not "
            "a pixel value)"
        )


def _boolean_at(value: Any) -> list[int] | None:
    """Index path of the first ``bool`` in nested lists ``value`` (None when there is none)."""
    if type(value) is bool:
        return []
    if type(value) is not list:
        return None
    types = set(map(type, value))
    if bool in types:
        return [next(i for i, v in enumerate(value) if type(v) is bool)]
    if list in types:
        for i, item in enumerate(value):
            found = _boolean_at(item)
            if found is not None:
                return [i, *found]
    return None


def check_values(
    field: str, batch: np.ndarray, value_range: tuple[float, float], indexed: bool = True
) -> None:
    """Reject NaN/±Inf and values outside ``value_range`` in ``batch`` (``B×…``, float64).

    Two vectorised reductions (min and max; a NaN propagates into both and fails the test) over
    the whole batch; only on failure is the first bad value located,
    and reported as ``<field>[b]`` (``<field>`` alone when not ``indexed``: one image) with its
    index inside that instance.
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
    value = batch.reshape(-1)[flat]
    name = f"{field}[{b}]" if indexed else field
    if not np.isfinite(value):
        raise InvalidInput(f"{name}: values must be finite, found {value!s} at {where}")
    # str() of a numpy scalar: the shortest text that reads back as that value in its own dtype
    # (1.00000000001, not the 1 of ``:g``; a float32 1.0000001 as such)
    raise InvalidInput(f"{name}: values must lie in [{lo:g}, {hi:g}], found {value!s} at {where}")


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
    """PNG bytes → float32 array of ``shape`` in [0, 1] (a sample ``v`` of bit depth ``d`` is
    ``v / (2**d − 1)``: ``pixel / 255`` at 8 bits).

    The file must be a grayscale PNG of bit depth 1, 2, 4 or 8 and exactly the card's height ×
    width. The size is read from the PNG header before Pillow sees the file, so a decompression
    bomb (say a 20000×20000 PNG of zeros, 389 kB) is refused without decoding. The whole file is
    then checked chunk by chunk (:func:`check_png_chunks`: IHDR first, CRCs, an IEND chunk, image
    data that inflates to exactly the bytes the image needs), so a truncated file or a 28×28
    image whose data inflates to megabytes is refused before Pillow decodes it, and only
    Pillow's PNG decoder is ever used (:func:`_open_png`). Any failure of the decoder itself
    (Pillow's own pixel limit, corrupt data) is an :class:`InvalidInput` (422) too, never a 500.
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
    if not data.startswith(_PNG_SIGNATURE):  # no decoder but PNG's ever sees a request's bytes
        raise InvalidInput(f"{field}: expected a PNG file, got {_kind_of_file(data)}")
    check_png_chunks(data, field)  # IHDR elsewhere than first is refused here too
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


MAX_PNG_CHUNKS = 256  # a digit's PNG has 3 to 10; the walk stays short whatever the file says
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type → samples per pixel
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def check_png_chunks(data: bytes, field: str) -> None:
    """Walk a PNG file (``data`` starts with the signature and IHDR) chunk by chunk, as a strict
    decoder would; :class:`InvalidInput` naming the problem.

    Pillow decodes the pixels as soon as it has enough image data: it reads no further than the
    IDAT chunks, checks no CRC after them and ignores data that inflates beyond the image. Here,
    every chunk must fit in the file and pass its CRC, the file must reach its IEND chunk (bytes
    after IEND are ignored, as by every decoder), and the IDAT data must be one complete zlib
    stream that inflates to exactly the bytes the image needs (:func:`png_raw_size`), inflated
    at most one byte beyond that.
    """
    pos, chunks, size = len(_PNG_SIGNATURE), 0, len(data)
    header, idat = b"", []
    while True:
        if pos + 12 > size:
            raise InvalidInput(
                f"{field}: truncated PNG: the file ends after {size} bytes, before its IEND chunk"
            )
        length, kind = struct.unpack_from(">I4s", data, pos)
        name = kind.decode("latin-1")
        if not kind.isalpha():
            raise InvalidInput(f"{field}: corrupt PNG: no chunk type at byte {pos + 4} ({kind!r})")
        end = pos + 12 + length
        if end > size:
            raise InvalidInput(
                f"{field}: truncated PNG: chunk {name} of {length} bytes runs past the end of "
                f"the file ({size} bytes), before its IEND chunk"
            )
        body = data[pos + 8 : end - 4]
        if zlib.crc32(body, zlib.crc32(kind)) != int.from_bytes(data[end - 4 : end], "big"):
            raise InvalidInput(f"{field}: corrupt PNG: chunk {name} fails its CRC check")
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise InvalidInput(f"{field}: PNG with more than {MAX_PNG_CHUNKS} chunks refused")
        if kind == b"IEND":
            break
        if chunks == 1:
            if kind != b"IHDR" or length != 13:
                raise InvalidInput(f"{field}: corrupt PNG: the first chunk is not a valid IHDR")
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        pos = end
    if not idat:
        raise InvalidInput(f"{field}: corrupt PNG: no image data (IDAT chunk)")
    _check_image_data(b"".join(idat), png_raw_size(header, field), field)


def png_raw_size(header: bytes, field: str) -> int:
    """Bytes of filtered scanlines (a filter byte per row) the image of this 13-byte IHDR
    inflates to, for a plain or an Adam7-interlaced image."""
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    channels = _PNG_CHANNELS.get(colour)
    if channels is None:
        raise InvalidInput(f"{field}: corrupt PNG: unknown colour type {colour}")
    bits = depth * channels

    def rows(w: int, h: int) -> int:
        return h * (1 + (w * bits + 7) // 8) if w and h else 0

    if interlace != 1:
        return rows(width, height)
    return sum(
        rows(max(0, -(-(width - x0) // dx)), max(0, -(-(height - y0) // dy)))
        for x0, y0, dx, dy in _ADAM7
    )


def _check_image_data(stream: bytes, expected: int, field: str) -> None:
    """The zlib ``stream`` of the IDAT chunks inflates to exactly ``expected`` bytes and ends
    where the data ends; never more than ``expected + 1`` bytes are inflated."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(stream, expected + 1)
    except zlib.error as exc:
        raise InvalidInput(
            f"{field}: corrupt PNG: the image data does not inflate ({exc})"
        ) from None
    if len(raw) > expected:
        raise InvalidInput(
            f"{field}: PNG image data inflates to more than the {expected} bytes the image needs "
            "(refused before decoding)"
        )
    if not inflater.eof and len(raw) < expected:
        raise InvalidInput(
            f"{field}: truncated PNG: the image data ends early (inflates to {len(raw)} of the "
            f"{expected} bytes the image needs)"
        )
    if not inflater.eof:
        raise InvalidInput(
            f"{field}: truncated PNG: the image data's zlib stream is unfinished (no end and "
            "checksum)"
        )
    if len(raw) < expected:
        raise InvalidInput(
            f"{field}: corrupt PNG: the image data inflates to {len(raw)} bytes, the image needs "
            f"{expected}"
        )
    if inflater.unused_data:
        raise InvalidInput(
            f"{field}: corrupt PNG: {len(inflater.unused_data)} bytes after the end of the "
            "compressed image data"
        )


# what a file that is not a PNG most likely is, by its first bytes (for the message only)
_OTHER_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
)


def _kind_of_file(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _OTHER_SIGNATURES if data.startswith(magic)), "unknown")


def _open_png(data: bytes, field: str, height: int, width: int) -> Image.Image:
    """Open and fully decode ``data`` as mode ``L``; :class:`InvalidInput` unless a grayscale PNG
    of this size. Only Pillow's PNG decoder is asked (``formats=["PNG"]``; :func:`decode_png`
    has refused a file without the PNG signature already), so its other decoders — BMP, TIFF,
    ICO, … — are never reached from a request."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(data), formats=["PNG"])
        mode, size = image.mode, image.size
        if size != (width, height):
            raise InvalidInput(
                f"{field}: expected a {height}×{width} image, got {size[1]}×{size[0]}"
            )
        if mode not in ("L", "1"):
            raise InvalidInput(
                f"{field}: expected a grayscale PNG of bit depth 1, 2, 4 or 8 (Pillow mode L or "
                f"1), got mode {mode}"
            )
        image.load()
    # Pillow scales 2- and 4-bit gray to 0 … 255 in mode L; a 1-bit image (mode 1, as PNG
    # optimisers save a black-and-white digit) reads as booleans, so it is scaled the same way
    return image.convert("L") if mode == "1" else image


def decode_base64(text: str, field: str) -> bytes:
    """Strict base64 (standard alphabet, padding) → bytes; a ``data:image/png;base64,`` URL
    prefix is allowed (:func:`data_url_payload`)."""
    if text[:5].lower() == "data:":
        text = data_url_payload(text, field)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{field}: not valid base64 ({exc})") from None
    if not data:
        raise InvalidInput(f"{field}: empty image")
    return data


def data_url_payload(text: str, field: str) -> str:
    """The base64 payload of a ``data:`` URL (RFC 2397) of a PNG, such as a canvas's
    ``toDataURL()``: media type ``image/png`` (any case) and ``;base64``; any other data URL is
    an :class:`InvalidInput` saying what is accepted."""
    accepted = "send the PNG's base64 alone, or as data:image/png;base64,<base64>"
    head, comma, payload = text.partition(",")
    if not comma:
        raise InvalidInput(f"{field}: a data: URL needs a comma before its data; {accepted}")
    media, *parameters = head[5:].split(";")
    media = media.strip().lower()
    if media != "image/png":
        shown = repr(media[:40]) if media else "none"
        raise InvalidInput(
            f"{field}: a data: URL of media type {shown} is not accepted, only PNG images are; "
            f"{accepted}"
        )
    if "base64" not in (p.strip().lower() for p in parameters):
        raise InvalidInput(f"{field}: a data: URL without ;base64 is not accepted; {accepted}")
    return payload


def decode_images(images: list[str], shape: Sequence[int], max_instances: int) -> torch.Tensor:
    """Base64 PNG strings → float32 tensor ``B×shape`` in [0, 1]."""
    check_count("images", len(images), max_instances)
    out = np.empty((len(images), *shape), dtype=np.float32)
    for i, text in enumerate(images):
        field = f"images[{i}]"
        out[i] = decode_png(decode_base64(text, field), field, shape)
    return torch.from_numpy(out)
