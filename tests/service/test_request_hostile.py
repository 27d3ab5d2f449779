"""Request parsing against careless or hostile clients (the audit's defects 5–10): each input the
service used to take loosely, or answered with a message that did not name the problem, is a 4xx
naming it and never reaches the model; what a well-behaved client sends is still taken.

- booleans mixed with numbers in ``instances`` and ``/v2`` ``data`` (numpy reads them as 0/1);
- PNG files checked to their IEND chunk, CRCs included, their image data bounded to what the
  image needs (a 28×28 PNG whose IDAT inflates to 20 MB; one cut before IEND);
- ``Inference-Header-Content-Length``: ASCII digits only, two copies that disagree refused, and
  a binary body without it told that it needs it;
- multipart form fields: strict decimal integers, no empty values, no field sent twice;
- messages: the exact value outside [0, 1], integers beyond 64 bits "out of range" with the
  range, "number too long", ``data:`` URLs that are not PNG, ``file`` sent as text, the admin
  threshold's Content-Type;
- ``GET /static/<unknown>``: the service's JSON 404.
"""

from __future__ import annotations

import base64
import io
import json
import random
import re
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hostile_inputs import PNG_SIGNATURE, gray_png, png_idat_bomb, png_without_iend
from PIL import Image, PngImagePlugin

from bayesgate.service.errors import InvalidInput
from bayesgate.service.inputs import check_png_chunks, decode_png, may_hold_booleans
from bayesgate.service.oip_binary import header_byte_count
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

GOOD = [0.5] * 784
ZEROS = [0.0] * 783
INFER = "/v2/models/tiny-mlp/infer"
HEADER = "inference-header-content-length"
KEY = "0123456789abcdef-admin"
MAX_K = 30
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2))
ADAM7 += ((0, 1, 1, 2),)


@pytest.fixture
async def served(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> AsyncIterator[tuple[Any, Any]]:
    settings = make_settings(max_instances=4, max_mc_samples=MAX_K, api_key=KEY)
    async with serving(settings) as (app, client):
        yield app, client


def engine_calls(app: Any) -> int:
    return app.state.worker.stats.snapshot()["engine_calls"]


def assert_error(response: Any, status: int, *fragments: str, v2: bool = False) -> str:
    """The response is ``status`` with the service's error body holding every fragment."""
    assert response.status_code == status, response.text
    body = response.json()
    if v2:
        assert list(body) == ["error"], body
    else:
        assert body["error"] == body["detail"] and body["code"], body
    for fragment in fragments:
        assert fragment in body["error"], (fragment, body["error"])
    return body["error"]


def digit_pixels(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (28, 28), dtype=np.uint8)


def pillow_png(pixels: np.ndarray, **save: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, format="PNG", **save)
    return buffer.getvalue()


def scanlines(pixels: np.ndarray) -> bytes:
    """Filter byte 0 and the row, for each row."""
    return b"".join(b"\0" + row.tobytes() for row in pixels)


def adam7_scanlines(pixels: np.ndarray) -> bytes:
    """The seven Adam7 passes' scanlines of ``pixels``, filter byte 0."""
    return b"".join(
        scanlines(pixels[y0::dy, x0::dx]) for x0, y0, dx, dy in ADAM7 if pixels[y0::dy, x0::dx].size
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def upload(data: bytes) -> dict[str, Any]:
    return {"file": ("digit.png", data, "image/png")}


# --- 5. booleans among the numbers --------------------------------------------------------------

NESTED_FALSE = np.full((1, 28, 28), 0.25).tolist()
NESTED_FALSE[0][3][5] = False
BOOLEANS_V1: list[tuple[str, dict[str, Any], list[str]]] = [
    ("true first", {"instances": [[True, *ZEROS]], "mc_samples": 2}, ["instances[0]", "[0]"]),
    ("false last", {"instances": [[*ZEROS, False]]}, ["instances[0]", "index [783]"]),
    ("nested", {"instances": [NESTED_FALSE]}, ["instances[0]", "index [0, 3, 5]"]),
    (
        "second image, return_samples given",
        {"instances": [GOOD, [*GOOD[:9], True, *GOOD[10:]]], "return_samples": False},
        ["instances[1]", "index [9]"],
    ),
]


@pytest.mark.parametrize(
    ("body", "fragments"), [c[1:] for c in BOOLEANS_V1], ids=[c[0] for c in BOOLEANS_V1]
)
async def test_a_boolean_among_numbers_is_not_a_pixel(
    served: tuple[Any, Any], body: dict[str, Any], fragments: list[str]
) -> None:
    app, client = served
    r = await client.post("/v1/predict", json=body)
    assert_error(r, 422, "expected numbers, got a boolean", *fragments)
    assert engine_calls(app) == 0


async def test_a_boolean_in_v2_data_is_not_a_pixel(served: tuple[Any, Any]) -> None:
    app, client = served
    flat = {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [True, *ZEROS]}
    nested = {**flat, "data": [NESTED_FALSE]}
    for tensor, where in ((flat, "index [0]"), (nested, "index [0, 0, 3, 5]")):
        r = await client.post(INFER, json={"inputs": [tensor], "parameters": {"mc_samples": 2}})
        assert_error(r, 400, "inputs[0].data: expected numbers, got a boolean", where, v2=True)
    assert engine_calls(app) == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
async def test_a_json_body_not_in_utf8_is_refused(served: tuple[Any, Any], encoding: str) -> None:
    """JSON between systems is UTF-8 (RFC 8259). ``json.loads`` guesses UTF-16/32 from a body's
    first bytes and reads it; such a body used to slip a ``true`` past the boolean check (which
    scans the UTF-8 bytes) and be answered 200 with ``true`` read as pixel 1.0."""
    app, client = served
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [True, *ZEROS]}
    for route, body, status in (
        ("/v1/predict", {"instances": [[True, *ZEROS]], "mc_samples": 2}, 422),
        (INFER, {"inputs": [tensor]}, 400),
        ("/v1/predict", {"instances": [GOOD]}, 422),  # no boolean: refused all the same
    ):
        text = json.dumps(body).encode(encoding)
        r = await client.post(route, content=text, headers={"content-type": "application/json"})
        assert_error(r, status, "body: not valid JSON (JSON must be UTF-8", v2=route == INFER)
    assert engine_calls(app) == 0
    r = await client.post("/v1/predict", json={"instances": [GOOD], "mc_samples": 2})
    assert r.status_code == 200, r.text


async def test_a_utf8_body_with_a_byte_order_mark_is_read(served: tuple[Any, Any]) -> None:
    """RFC 8259 lets a parser ignore a UTF-8 BOM (Windows tools write one); orjson refuses it, so
    such a body takes the ``json`` path — where its booleans must still be caught."""
    _, client = served
    headers = {"content-type": "application/json"}
    good = json.dumps({"instances": [GOOD], "mc_samples": 2, "seed": 1}).encode("utf-8-sig")
    r = await client.post("/v1/predict", content=good, headers=headers)
    assert r.status_code == 200, r.text
    plain = await client.post("/v1/predict", json={"instances": [GOOD], "mc_samples": 2, "seed": 1})
    assert r.json()["predictions"] == plain.json()["predictions"]
    bad = json.dumps({"instances": [[True, *ZEROS]]}).encode("utf-8-sig")
    r = await client.post("/v1/predict", content=bad, headers=headers)
    assert_error(r, 422, "expected numbers, got a boolean")


async def test_integers_zero_and_one_are_still_pixels(served: tuple[Any, Any]) -> None:
    _, client = served
    r = await client.post("/v1/predict", json={"instances": [[1, *[0] * 783]], "mc_samples": 2})
    assert r.status_code == 200, r.text
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [1] + [0] * 783}
    r = await client.post(INFER, json={"inputs": [tensor], "parameters": {"mc_samples": 2}})
    assert r.status_code == 200, r.text


def test_the_boolean_prefilter_never_misses_one() -> None:
    """:func:`may_hold_booleans` may only say False for text whose parsed JSON holds no bool:
    random documents with booleans, keys and strings, serialised by json and orjson."""
    rng = random.Random(3)
    words = ["true", "false", "u", "f", "inputs", "outputs", "return_samples", "tru", "alse"]

    def value(depth: int) -> Any:
        kind = rng.randrange(6 if depth < 3 else 4)
        if kind == 0:
            return rng.random() if rng.random() < 0.5 else rng.randrange(-5, 5)
        if kind == 1:
            return rng.choice([True, False])
        if kind == 2:
            return rng.choice(words)
        if kind == 3:
            return None
        if kind == 4:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(words): value(depth + 1) for _ in range(rng.randrange(4))}

    def holds_bool(item: Any) -> bool:
        if isinstance(item, bool):
            return True
        if isinstance(item, list):
            return any(holds_bool(v) for v in item)
        if isinstance(item, dict):
            return any(holds_bool(v) for v in item.values())
        return False

    seen = 0
    for _ in range(2000):
        document = value(0)
        for text in (orjson.dumps(document), json.dumps(document, indent=1).encode()):
            if holds_bool(document):
                seen += 1
                assert may_hold_booleans(text), text
    assert seen > 500
    numbers = orjson.dumps({"instances": [GOOD], "mc_samples": 3, "seed": 1})
    v2 = orjson.dumps({"inputs": [{"data": GOOD, "shape": [1, 784]}], "outputs": [{"name": "a"}]})
    for text in (numbers, v2, b"[1e-05, 2E+3, -0.5]", b'"tru"', b""):
        assert not may_hold_booleans(text), text
    for text in (b"true", b"false", b"[1,true]", b'{"a":false}'):
        assert may_hold_booleans(text), text


# --- 6. PNG files checked to their end ----------------------------------------------------------


async def test_a_png_cut_before_iend_is_422(served: tuple[Any, Any]) -> None:
    app, client = served
    cut = png_without_iend(pillow_png(digit_pixels()))
    r = await client.post("/v1/predict/file", files=upload(cut))
    assert_error(r, 422, "file: truncated PNG", "before its IEND chunk")
    r = await client.post("/v1/predict", json={"images": [b64(cut)]})
    assert_error(r, 422, "images[0]: truncated PNG", "IEND")
    assert engine_calls(app) == 0


async def test_a_png_whose_image_data_inflates_to_20_mb_is_422(served: tuple[Any, Any]) -> None:
    app, client = served
    bomb = png_idat_bomb(20_000_000)
    assert len(bomb) < 40_000
    message = "PNG image data inflates to more than the 812 bytes the image needs"
    r = await client.post("/v1/predict/file", files=upload(bomb))
    assert_error(r, 422, "file: " + message)
    r = await client.post("/v1/predict", json={"images": [b64(bomb)]})
    assert_error(r, 422, "images[0]: " + message)
    assert engine_calls(app) == 0


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data).to_bytes(4, "big")
    return len(data).to_bytes(4, "big") + kind + data + crc


def _with_idat(data: bytes, idat: bytes) -> bytes:
    """``data`` (one IDAT chunk) with that chunk's contents replaced by ``idat``, CRC right."""
    start = data.index(b"IDAT") - 4
    length = int.from_bytes(data[start : start + 4], "big")
    return data[:start] + _chunk(b"IDAT", idat) + data[start + 12 + length :]


def _idat(data: bytes) -> tuple[int, bytes]:
    """(offset, contents) of the one IDAT chunk of ``data``."""
    start = data.index(b"IDAT") + 4
    return start, data[start : start + int.from_bytes(data[start - 8 : start - 4], "big")]


DIGIT = gray_png(scanlines(digit_pixels(5)))
AT, STREAM = _idat(DIGIT)
BROKEN_PNGS: list[tuple[str, bytes, list[str]]] = [
    ("one byte too many", gray_png(b"\0" * (29 * 28 + 1)), ["inflates to more than the 812"]),
    ("one byte short", gray_png(b"\0" * (29 * 28 - 1)), ["inflates to 811 bytes", "needs 812"]),
    ("bytes after the zlib stream", gray_png(b"\0" * 812, trailing=b"xy"), ["2 bytes after"]),
    (
        "zlib stream cut",
        _with_idat(DIGIT, STREAM[: len(STREAM) // 2]),
        ["truncated PNG: the image data ends early", "of the 812 bytes"],
    ),
    (
        "zlib checksum missing",
        _with_idat(DIGIT, STREAM[:-4]),
        ["truncated PNG: the image data's zlib stream is unfinished"],
    ),
    (
        "CRC",
        DIGIT[:AT] + bytes([DIGIT[AT] ^ 1]) + DIGIT[AT + 1 :],
        ["chunk IDAT fails its CRC check"],
    ),
    ("cut inside IDAT", DIGIT[: AT + 100], ["chunk IDAT", "runs past the end of the file"]),
    ("no IDAT", DIGIT[:33] + DIGIT[-12:], ["no image data (IDAT chunk)"]),
    ("garbage chunk type", DIGIT[:33] + b"\0\0\0\0\x01\x02\x03\x04" + bytes(8), ["no chunk type"]),
]


TEXT_FIRST = _chunk(b"tEXt", b"Comment\0first")  # a chunk before IHDR: Pillow reads past it
BROKEN_PNGS += [
    (
        "a chunk before IHDR, cut before IEND",
        png_without_iend(DIGIT[:8] + TEXT_FIRST + DIGIT[8:]),
        ["the first chunk is not a valid IHDR"],
    ),
    (
        "a chunk before IHDR, IDAT CRC zeroed",
        DIGIT[:8]
        + TEXT_FIRST
        + DIGIT[8 : AT + len(STREAM)]
        + bytes(4)
        + DIGIT[AT + len(STREAM) + 4 :],
        ["the first chunk is not a valid IHDR"],
    ),
]


@pytest.mark.parametrize(
    ("data", "fragments"), [c[1:] for c in BROKEN_PNGS], ids=[c[0] for c in BROKEN_PNGS]
)
async def test_broken_png_structure_is_422_naming_it(
    served: tuple[Any, Any], data: bytes, fragments: list[str]
) -> None:
    app, client = served
    r = await client.post("/v1/predict/file", files=upload(data))
    assert_error(r, 422, "file: ", *fragments)
    assert engine_calls(app) == 0


def test_well_formed_pngs_pass_the_chunk_walk() -> None:
    """What encoders write passes: every Pillow mode and compression (text chunks, several IDAT
    chunks), an Adam7-interlaced image (decoded to the same pixels), bytes after IEND."""
    rng = np.random.default_rng(1)
    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "test")
    info.add_text("Comment", "x" * 2000, zip=True)
    for mode in ("L", "1", "P", "RGB", "RGBA", "LA", "I;16"):
        for size in ((28, 28), (1, 1), (13, 7)):
            for level in (0, 6, 9):
                pixels = rng.integers(0, 256, size[::-1], dtype=np.uint8)
                buffer = io.BytesIO()
                Image.fromarray(pixels, "L").convert(mode).save(
                    buffer, format="PNG", compress_level=level, pnginfo=info
                )
                check_png_chunks(buffer.getvalue(), "f")
    pixels = digit_pixels(2)
    interlaced = gray_png(adam7_scanlines(pixels), interlaced=True)
    decoded = decode_png(interlaced, "f", (1, 28, 28))
    assert np.array_equal(np.rint(decoded[0] * 255).astype(np.uint8), pixels)
    decode_png(pillow_png(pixels) + b"after IEND", "f", (1, 28, 28))


def _low_depth_png(levels: np.ndarray, depth: int) -> bytes:
    """A 28×28 grayscale PNG of bit depth ``depth`` holding the samples ``levels`` (0 … 2^d − 1),
    rows packed most significant bit first as the PNG format packs them."""
    rows = []
    for row in levels:
        bits = "".join(format(int(v), f"0{depth}b") for v in row)
        bits += "0" * (-len(bits) % 8)
        rows.append(b"\0" + int(bits, 2).to_bytes(len(bits) // 8, "big"))
    header = struct.pack(">IIBBBBB", 28, 28, depth, 0, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + _chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_a_grayscale_png_of_fewer_bits_reads_as_its_8_bit_twin(depth: int) -> None:
    """A sample ``v`` of bit depth ``d`` is the pixel ``v / (2^d − 1)`` (PNG spec, sample depth
    scaling): the same image as the 8-bit PNG of ``round(255 v / (2^d − 1))``. Optimisers save
    a black-and-white digit at depth 1, which Pillow reads as booleans (mode ``1``)."""
    top = 2**depth - 1
    levels = np.random.default_rng(depth).integers(0, top + 1, (28, 28))
    low = decode_png(_low_depth_png(levels, depth), "f", (1, 28, 28))
    twin = decode_png(pillow_png((levels * (255 // top)).astype(np.uint8)), "f", (1, 28, 28))
    assert np.array_equal(low, twin)
    assert np.array_equal(low[0], (levels / top).astype(np.float32))


def test_a_png_of_16_bits_or_colour_is_refused() -> None:
    for mode in ("I;16", "RGB", "LA", "P"):
        buffer = io.BytesIO()
        Image.fromarray(digit_pixels(), "L").convert(mode).save(buffer, format="PNG")
        with pytest.raises(
            InvalidInput,
            match=f"grayscale PNG of bit depth 1, 2, 4 or 8.*got mode {re.escape(mode)}",
        ):
            decode_png(buffer.getvalue(), "f", (1, 28, 28))


def test_a_png_of_many_chunks_is_refused_early() -> None:
    good = gray_png(b"\0" * 812)
    text = _chunk(b"tEXt", b"k\0v")
    many = good[:33] + text * 300 + good[33:]
    with pytest.raises(InvalidInput, match="more than 256 chunks"):
        check_png_chunks(many, "f")


async def test_an_interlaced_png_answers_as_the_plain_one(served: tuple[Any, Any]) -> None:
    """The chunk walk's size for Adam7 is right: the same pixels, interlaced or not, get the same
    answer for the same seed."""
    _, client = served
    pixels = digit_pixels(4)
    options = {"mc_samples": "4", "seed": "9"}
    answers = []
    for data in (pillow_png(pixels), gray_png(adam7_scanlines(pixels), interlaced=True)):
        r = await client.post("/v1/predict/file", files=upload(data), data=options)
        assert r.status_code == 200, r.text
        answers.append(r.json()["predictions"])
    assert answers[0] == answers[1]


# --- 7. Inference-Header-Content-Length ---------------------------------------------------------


def _binary_request(value: float = 0.0) -> tuple[bytes, int]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 1, 28, 28],
                    "parameters": {"binary_data_size": 784 * 4},
                }
            ],
            "parameters": {"mc_samples": 2},
        }
    ).encode()
    pixels = np.zeros(784, "<f4")
    pixels[0] = value
    return head + pixels.tobytes(), len(head)


@pytest.mark.parametrize("shape", ["+{n}", "{a}_{b}", "{n}.0", "0x{h}", "-{n}", "{n} {n}"])
async def test_the_header_length_is_ascii_digits_only(served: tuple[Any, Any], shape: str) -> None:
    app, client = served
    body, n = _binary_request()
    text = str(n)
    value = shape.format(n=n, a=text[0], b=text[1:], h=format(n, "x"))
    r = await client.post(INFER, content=body, headers={HEADER: value})
    assert_error(r, 400, "Inference-Header-Content-Length", "ASCII digits only", v2=True)
    arabic = "".join(chr(0x660 + int(d)) for d in text).encode()  # ١٥١: int() would take it
    r = await client.post(INFER, content=body, headers=[(HEADER.encode(), arabic)])
    assert_error(r, 400, "Inference-Header-Content-Length", "ASCII digits only", v2=True)
    assert engine_calls(app) == 0


async def test_two_header_lengths_must_agree(served: tuple[Any, Any]) -> None:
    app, client = served
    body, n = _binary_request()
    r = await client.post(INFER, content=body, headers=[(HEADER, str(n)), (HEADER, "5")])
    assert_error(
        r, 400, "Inference-Header-Content-Length: sent 2 times with different values", v2=True
    )
    assert engine_calls(app) == 0
    same = await client.post(INFER, content=body, headers=[(HEADER, str(n)), (HEADER, str(n))])
    assert same.status_code == 200, same.text


async def test_white_space_around_the_header_length_is_not_part_of_it(
    served: tuple[Any, Any],
) -> None:
    """RFC 9110 §5.5: optional white space around a field value is not part of it (h11 strips
    it before the app sees it; httptools leaves the trailing part); the digits are the value."""
    _, client = served
    body, n = _binary_request()
    r = await client.post(INFER, content=body, headers={HEADER: f" {n}\t"})
    assert r.status_code == 200, r.text


def test_header_byte_count_units() -> None:
    assert header_byte_count(None) is None and header_byte_count([]) is None
    assert header_byte_count("151") == 151 == header_byte_count(["151", " 151"])
    assert header_byte_count("0007") == 7
    for bad in ("", "+1", "1_0", "1.0", "１５", "٣", "1e3", "\x0b151", "\xa0151", "151, 151"):
        with pytest.raises(InvalidInput, match="ASCII digits only"):
            header_byte_count(bad)
    with pytest.raises(InvalidInput, match="beyond any body"):
        header_byte_count("9" * 5000)


async def test_a_binary_body_without_the_header_is_told_it_needs_it(
    served: tuple[Any, Any],
) -> None:
    app, client = served
    body, _ = _binary_request()
    for content_type in ("application/octet-stream", None):
        headers = {"content-type": content_type} if content_type else {}
        r = await client.post(INFER, content=body, headers=headers)
        assert_error(
            r,
            400,
            "body: not valid JSON",
            "binary tensor data needs the Inference-Header-Content-Length header",
            v2=True,
        )
    assert engine_calls(app) == 0


# --- 8. multipart form fields -------------------------------------------------------------------

LOOSE_FORMS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("K 1_0", {"mc_samples": "1_0"}, ["mc_samples: expected a decimal integer", "'1_0'"]),
    ("K 2.0", {"mc_samples": "2.0"}, ["mc_samples: expected a decimal integer", "'2.0'"]),
    ("K +3", {"mc_samples": "+3"}, ["mc_samples: expected a decimal integer"]),
    ("K spaces", {"mc_samples": " 3 "}, ["mc_samples: expected a decimal integer"]),
    ("K arabic 3", {"mc_samples": "٣"}, ["mc_samples: expected a decimal integer"]),
    ("K empty", {"mc_samples": ""}, ["mc_samples: empty value", "leave the field out"]),
    ("K twice", {"mc_samples": ["2", "3"]}, ["mc_samples: form field sent 2 times"]),
    ("K twice, same", {"mc_samples": ["2", "2"]}, ["mc_samples: form field sent 2 times"]),
    ("seed 1_0", {"seed": "1_0"}, ["seed: expected a decimal integer"]),
    ("seed empty", {"seed": ""}, ["seed: empty value"]),
    ("seed twice", {"seed": ["1", "2"]}, ["seed: form field sent 2 times"]),
    (
        "seed 26 digits",
        {"seed": "1" + "0" * 25},
        ["seed: integer out of range (26 digits)", "0 … 9223372036854775807"],
    ),
    ("seed 2^63", {"seed": str(2**63)}, ["seed", "less than or equal to 9223372036854775807"]),
    ("seed -1", {"seed": "-1"}, ["seed", "greater than or equal to 0"]),
    ("samples empty", {"return_samples": ""}, ["return_samples: empty value"]),
    ("samples yes", {"return_samples": "yes"}, ["return_samples: expected true or false"]),
    ("samples 1", {"return_samples": "1"}, ["return_samples: expected true or false, got '1'"]),
    ("samples True", {"return_samples": "True"}, ["return_samples: expected true or false"]),
]


@pytest.mark.parametrize(
    ("data", "fragments"), [c[1:] for c in LOOSE_FORMS], ids=[c[0] for c in LOOSE_FORMS]
)
async def test_form_fields_are_strict(
    served: tuple[Any, Any], data: dict[str, Any], fragments: list[str]
) -> None:
    app, client = served
    r = await client.post("/v1/predict/file", files=upload(pillow_png(digit_pixels())), data=data)
    assert_error(r, 422, *fragments)
    assert engine_calls(app) == 0


async def test_plain_decimal_form_fields_are_taken(served: tuple[Any, Any]) -> None:
    _, client = served
    data = {"mc_samples": "05", "seed": "7", "return_samples": "true"}
    r = await client.post("/v1/predict/file", files=upload(pillow_png(digit_pixels())), data=data)
    assert r.status_code == 200, r.text
    assert r.json()["mc_samples"] == 5 and r.json()["seed"] == 7
    assert len(r.json()["predictions"][0]["samples"]) == 5


async def test_file_sent_as_a_text_field_says_so(served: tuple[Any, Any]) -> None:
    app, client = served
    body = (
        b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nhello\r\n'
        b'--b\r\nContent-Disposition: form-data; name="seed"\r\n\r\n1\r\n--b--\r\n'
    )
    r = await client.post(
        "/v1/predict/file",
        content=body,
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    message = assert_error(r, 422, "file: must be an uploaded file part", "got a text field")
    assert "UploadFile" not in message
    assert engine_calls(app) == 0


async def test_a_truncated_upload_says_so(served: tuple[Any, Any]) -> None:
    """A form cut before its closing boundary used to parse as the fields before the cut and be
    answered "file: Field required"; the whole form still answers."""
    app, client = served
    png = pillow_png(digit_pixels())
    whole = (
        b'--b\r\nContent-Disposition: form-data; name="seed"\r\n\r\n1\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="d.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + png + b"\r\n--b--\r\n"
    )
    headers = {"content-type": "multipart/form-data; boundary=b"}
    for cut in (whole[: whole.index(png) + 40], whole[:-8], whole[: whole.index(b"--b\r\nC", 5)]):
        r = await client.post("/v1/predict/file", content=cut, headers=headers)
        assert_error(r, 422, "body: unreadable multipart form", "ends before its closing boundary")
    assert engine_calls(app) == 0
    r = await client.post("/v1/predict/file", content=whole, headers=headers)
    assert r.status_code == 200, r.text


# --- 9. messages that name the problem ----------------------------------------------------------


async def test_a_value_out_of_range_is_shown_exactly(served: tuple[Any, Any]) -> None:
    app, client = served
    r = await client.post("/v1/predict", json={"instances": [[1.00000000001, *ZEROS]]})
    assert_error(r, 422, "values must lie in [0, 1], found 1.00000000001 at index [0, 0, 0]")
    body, n = _binary_request(float(np.float32(1.0000001)))
    r = await client.post(INFER, content=body, headers={HEADER: str(n)})
    assert_error(r, 400, "found 1.0000001 at", v2=True)  # the float32's shortest text
    assert engine_calls(app) == 0


HUGE = 2**64
OUT_OF_RANGE: list[tuple[str, str, bytes, list[str]]] = [
    (
        "v1 seed",
        "/v1/predict",
        b'{"instances": [[%s]], "seed": %d}' % (b"0.5," * 783 + b"0.5", HUGE),
        ["seed: integer out of range", "beyond 64 bits", "allowed 0 … 9223372036854775807"],
    ),
    (
        "v1 K",
        "/v1/predict",
        b'{"instances": [[%s]], "mc_samples": -%d}' % (b"0.5," * 783 + b"0.5", HUGE),
        ["mc_samples: integer out of range", f"allowed 1 … {MAX_K}"],
    ),
    (
        "v2 seed",
        INFER,
        json.dumps(
            {
                "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": GOOD}],
                "parameters": {"seed": HUGE},
            }
        ).encode(),
        ["parameters.seed: integer out of range", "allowed 0 … 9223372036854775807"],
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "fragments"),
    [c[1:] for c in OUT_OF_RANGE],
    ids=[c[0] for c in OUT_OF_RANGE],
)
async def test_an_integer_beyond_64_bits_is_out_of_range(
    served: tuple[Any, Any], path: str, body: bytes, fragments: list[str]
) -> None:
    app, client = served
    r = await client.post(path, content=body, headers={"content-type": "application/json"})
    v2 = path.startswith("/v2")
    message = assert_error(r, 400 if v2 else 422, *fragments, v2=v2)
    assert "valid integer" not in message
    assert engine_calls(app) == 0


async def test_a_number_too_long_says_so(served: tuple[Any, Any]) -> None:
    app, client = served
    pixels = b"0.5," * 783 + b"0.5"
    for body in (
        b'{"instances": [[%s]], "seed": %s}' % (pixels, b"9" * 5000),
        b'{"instances": [[%s, %s]]}' % (pixels[:-4], b"1" * 5000),
    ):
        r = await client.post(
            "/v1/predict", content=body, headers={"content-type": "application/json"}
        )
        message = assert_error(r, 422, "body: number too long", "more than 4300 digits")
        assert "set_int_max_str_digits" not in message
    assert engine_calls(app) == 0


async def test_data_urls_other_than_png_base64_say_what_is_accepted(
    served: tuple[Any, Any],
) -> None:
    app, client = served
    png = b64(pillow_png(digit_pixels()))
    refused = [
        ("data:image/jpeg;base64," + png, ["media type 'image/jpeg' is not accepted"]),
        ("data:;base64," + png, ["media type none"]),
        ("data:image/png," + png, ["without ;base64"]),
        ("data:image/png;base64" + png, ["needs a comma"]),
    ]
    for text, fragments in refused:
        r = await client.post("/v1/predict", json={"images": [text]})
        assert_error(r, 422, "images[0]: a data: URL", *fragments, "data:image/png;base64,")
    assert engine_calls(app) == 0
    for prefix in ("data:image/png;base64,", "DATA:Image/PNG;BASE64,"):
        r = await client.post("/v1/predict", json={"images": [prefix + png], "mc_samples": 2})
        assert r.status_code == 200, r.text


async def test_the_admin_threshold_needs_json_content_type(served: tuple[Any, Any]) -> None:
    _, client = served
    auth = {"authorization": f"Bearer {KEY}"}
    body = b'{"threshold": 0.5}'
    r = await client.put(
        "/admin/threshold", content=body, headers={**auth, "content-type": "text/plain"}
    )
    assert_error(r, 415, "Content-Type must be application/json, got text/plain")
    r = await client.put("/admin/threshold", content=body, headers=auth)
    assert_error(r, 415, "Content-Type must be application/json, got none")
    anonymous = await client.put(
        "/admin/threshold", content=body, headers={"content-type": "text/plain"}
    )
    assert anonymous.status_code == 401  # the key is checked first
    ok = await client.put(
        "/admin/threshold", content=body, headers={**auth, "content-type": "application/json"}
    )
    assert ok.status_code == 200 and ok.json()["threshold"] == 0.5, ok.text


# --- 10. the static files' 404 ------------------------------------------------------------------


async def test_an_unknown_static_file_is_a_json_404(served: tuple[Any, Any]) -> None:
    _, client = served
    r = await client.get("/static/nope.js")
    assert r.headers["content-type"] == "application/json"
    assert_error(r, 404, "no static file 'nope.js'", "app.js")
    assert r.json()["code"] == "http_error"
    assert (await client.get("/static/app.js")).status_code == 200
