"""Hostile request bodies shared by the tests and ``bench/hostile.py``."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_bomb(width: int = 20000, height: int = 20000, rows_per_step: int = 100) -> bytes:
    """A valid 8-bit grayscale PNG of ``width × height`` zeros (20000² → 389 kB, 400 MB decoded).

    Built row block by row block with zlib, never holding the decoded image in memory.
    """
    compressor = zlib.compressobj(9)
    block = (b"\0" * (width + 1)) * rows_per_step  # filter byte 0 + a row of zeros
    parts = [compressor.compress(block) for _ in range(height // rows_per_step)]
    parts.append(compressor.compress((b"\0" * (width + 1)) * (height % rows_per_step)))
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", b"".join(parts))
        + _chunk(b"IEND", b"")
    )


def bmp_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A 28×28 BMP whose header claims ``width × height`` (Pillow's own bomb check fires)."""
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="BMP")
    data = bytearray(buffer.getvalue())
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def gray_png(
    pixels: bytes,
    width: int = 28,
    height: int = 28,
    *,
    interlaced: bool = False,
    trailing: bytes = b"",
) -> bytes:
    """An 8-bit grayscale PNG whose IDAT is ``pixels`` (the filtered scanlines, a filter byte per
    row; for ``interlaced``, the seven Adam7 passes' scanlines in order) compressed by zlib, and
    ``trailing`` after the zlib stream, as given: more or fewer bytes than the image needs make a
    malformed file on purpose."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, int(interlaced))
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(pixels, 9) + trailing)
        + _chunk(b"IEND", b"")
    )


def png_idat_bomb(inflated: int = 20_000_000, width: int = 28, height: int = 28) -> bytes:
    """A valid-looking 28×28 grayscale PNG (CRCs right, IEND present) whose IDAT inflates to
    ``inflated`` bytes of zeros beyond the 28 × 29 the image needs (≈ 20 kB for 20 MB). Pillow
    decodes the first rows and ignores the rest."""
    return gray_png(b"\0" * ((width + 1) * height + inflated), width, height)


def png_without_iend(data: bytes) -> bytes:
    """``data`` (a PNG ending with its 12-byte IEND chunk) cut before that chunk."""
    assert data[-8:-4] == b"IEND"
    return data[:-12]
