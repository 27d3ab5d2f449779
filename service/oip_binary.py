"""The Open Inference Protocol's binary tensor data extension (Triton ``binary_tensor_data``).

A request or response body is a JSON header followed by raw tensor bytes::

    body = header JSON (Inference-Header-Content-Length bytes) ‖ tensor₁ bytes ‖ tensor₂ bytes …

An input (or output) carried in the binary part has no ``data``; its ``parameters`` hold
``binary_data_size`` = its byte count, which must equal ``∏ shape × itemsize(datatype)``. The
binary parts follow in the order of the tensors that have one. Values are little-endian, BOOL is
one byte per element. Outputs are sent binary when the output's ``parameters.binary_data`` is
true, or — for outputs that do not say — when the request's ``parameters.binary_data_output`` is.

This module only splits and joins bytes; the JSON header is validated by
:class:`bayesgate.service.inference_protocol.InferRequest`, which also says what the tensors mean.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import orjson

from bayesgate.service.errors import InvalidInput

HEADER = "inference-header-content-length"
HEADER_NAME = "Inference-Header-Content-Length"
MAX_HEADER_DIGITS = 18  # a byte count past 10¹⁸ is beyond any body; int() never sees more

# OIP datatype → little-endian numpy dtype (BYTES, i.e. length-prefixed strings, is not offered)
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("|b1"),
    "UINT8": np.dtype("|u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("|i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


def split_body(body: bytes, header_length: str | Sequence[str] | None) -> tuple[bytes, memoryview]:
    """``(JSON header, binary rest)`` of a request body; no header → all JSON, empty rest.

    ``header_length`` is the ``Inference-Header-Content-Length`` value, or every value the
    request sent it with (Starlette's ``headers.getlist``); see :func:`header_byte_count`."""
    n = header_byte_count(header_length)
    if n is None:
        return body, memoryview(b"")
    if not 0 < n <= len(body):
        raise InvalidInput(f"{HEADER_NAME}: {n} is not within the body of {len(body)} bytes")
    view = memoryview(body)
    return bytes(view[:n]), view[n:]


def header_byte_count(values: str | Sequence[str] | None) -> int | None:
    """The byte count of ``Inference-Header-Content-Length`` (None when absent).

    A value is ASCII digits only, as ``Content-Length``: ``+151``, ``1_51``, ``151.0`` or
    non-ASCII digits, which Python's ``int()`` would take, are a 400. Only the optional white
    space around a field value (spaces and tabs, RFC 9110 §5.5), which is not part of the value
    and which h11 strips before the app sees it, is ignored. The header sent twice with
    different values is a 400 naming it (the same value twice is that value)."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    counts = {value.strip(" \t") for value in values}
    if not counts:
        return None
    if len(counts) > 1:
        shown = ", ".join(repr(v[:40]) for v in sorted(counts))
        raise InvalidInput(
            f"{HEADER_NAME}: sent {len(values)} times with different values ({shown}); send it once"
        )
    (count,) = counts
    if not (count.isascii() and count.isdigit()):
        raise InvalidInput(
            f"{HEADER_NAME}: expected a byte count (ASCII digits only), got {count[:40]!r}"
        )
    if len(count) > MAX_HEADER_DIGITS:
        raise InvalidInput(f"{HEADER_NAME}: {count[:40]}… bytes is beyond any body")
    return int(count)


def tensor_from_bytes(
    blob: memoryview, offset: int, size: int, datatype: str, shape: Sequence[int], where: str
) -> np.ndarray:
    """The ``size`` bytes at ``offset`` of the binary part as an array of ``shape``; 400 when
    ``size ≠ ∏ shape × itemsize`` or the bytes run past the body."""
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise InvalidInput(
            f"{where}.datatype: {datatype!r} is not supported as binary data; "
            f"supported: {', '.join(DTYPES)}"
        )
    expected = math.prod(shape) * dtype.itemsize
    if size != expected:
        dims = "×".join(map(str, shape))
        raise InvalidInput(
            f"{where}.parameters.binary_data_size: {size} bytes, but the shape {dims} of "
            f"{datatype} takes {expected}"
        )
    if offset + size > len(blob):
        raise InvalidInput(
            f"{where}: binary data runs past the body ({offset + size} bytes needed after the "
            f"JSON header, {len(blob)} there)"
        )
    return np.frombuffer(blob[offset : offset + size], dtype=dtype).reshape(tuple(shape))


def check_consumed(blob: memoryview, used: int) -> None:
    """400 when bytes are left after the last binary tensor (a wrong header length)."""
    if used != len(blob):
        raise InvalidInput(
            f"body: {len(blob) - used} bytes after the JSON header belong to no input "
            "(check Inference-Header-Content-Length and binary_data_size)"
        )


def join_body(header: dict[str, Any], binary: Collection[str]) -> tuple[bytes, int | None]:
    """Move the ``data`` of the outputs named in ``binary`` to raw bytes after the JSON header
    (orjson-encoded).

    Returns ``(body, header length)``; the length is ``None`` when nothing went binary (a plain
    JSON body)."""
    parts: list[bytes] = []
    for output in header["outputs"]:
        if output["name"] not in binary:
            continue
        raw = raw_bytes(output.pop("data"), output["datatype"])
        output["parameters"] = {"binary_data_size": len(raw)}
        parts.append(raw)
    head = orjson.dumps(header)
    if not parts:
        return head, None
    return b"".join([head, *parts]), len(head)


# datatype → array.array typecode of the same little-endian layout (BOOL: one byte per element)
_TYPECODES = {"FP32": "f", "FP64": "d", "INT64": "q", "INT32": "i", "BOOL": "b"}


def raw_bytes(data: list[Any], datatype: str) -> bytes:
    """A flat list of numbers as little-endian ``datatype`` bytes. ``array.array`` packs a short
    list several times faster than building a numpy array; numpy does the rest (and big-endian
    hosts)."""
    code = _TYPECODES.get(datatype)
    native = code is not None and array(code).itemsize == DTYPES[datatype].itemsize
    if not native or sys.byteorder != "little":
        return np.asarray(data, dtype=DTYPES[datatype]).tobytes()
    return array(code, data).tobytes()
