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
