"""Every bad input gets a 4xx whose message names the field and what was expected — and never
reaches the model (the worker's engine-call counter stays at zero)."""

from __future__ import annotations

import base64
import io
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

from bayesgate.service.middleware import content_encoding_error, transfer_coding_error
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

GOOD = [0.5] * 784


def png(size: tuple[int, int] = (28, 28), mode: str = "L", fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format=fmt)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# (case id, JSON body or raw bytes, expected status, substrings of the error message)
JSON_CASES: list[tuple[str, Any, int, list[str]]] = [
    ("flat 783", {"instances": [[0.5] * 783]}, 422, ["instances[0]", "783", "784"]),
    ("27x28", {"instances": [[[0.5] * 28] * 27]}, 422, ["instances[0]", "28×28", "27×28"]),
    ("3-d wrong", {"instances": [[[[0.5] * 28] * 28] * 2]}, 422, ["1×28×28", "2×28×28"]),
    ("scalar", {"instances": [0.5]}, 422, ["instances[0]", "a scalar"]),
    ("ragged", {"instances": [[[0.5] * 28, [0.5] * 27]]}, 422, ["instances[0]", "ragged"]),
    ("strings", {"instances": [["a"] * 784]}, 422, ["instances[0]", "numbers", "strings"]),
    ("booleans", {"instances": [[True] * 784]}, 422, ["instances[0]", "booleans"]),
    ("nulls", {"instances": [[None] * 784]}, 422, ["instances[0]", "numbers"]),
    (
        "above 1",
        {"instances": [GOOD, [*GOOD[:5], 1.5, *GOOD[6:]]]},
        422,
        ["instances[1]", "[0, 1]", "1.5", "index [0, 0, 5] of 1×28×28"],
    ),
    ("below 0", {"instances": [[-0.01] * 784]}, 422, ["instances[0]", "[0, 1]"]),
    ("NaN", b'{"instances": [[NaN' + b", 0.5" * 783 + b"]]}", 422, ["instances[0]", "finite"]),
    ("Infinity", b'{"instances": [[Infinity' + b", 0.5" * 783 + b"]]}", 422, ["finite"]),
    ("too many", {"instances": [GOOD] * 5}, 413, ["instances", "5 images", "at most 4"]),
    ("empty", {"instances": []}, 422, ["instances", "at least one"]),
    ("both", {"instances": [GOOD], "images": [b64(png())]}, 422, ["exactly one"]),
    ("neither", {"mc_samples": 3}, 422, ["exactly one"]),
    (
        "K zero",
        {"instances": [GOOD], "mc_samples": 0},
        422,
        ["mc_samples", "greater than or equal to 1", "got 0"],
    ),
    ("K too big", {"instances": [GOOD], "mc_samples": 31}, 422, ["mc_samples", "equal to 30"]),
    ("K text", {"instances": [GOOD], "mc_samples": "many"}, 422, ["mc_samples", "integer"]),
    ("K float", {"instances": [GOOD], "mc_samples": 2.5}, 422, ["mc_samples"]),
    ("seed < 0", {"instances": [GOOD], "seed": -1}, 422, ["seed", "greater than or equal"]),
    ("extra field", {"instances": [GOOD], "k": 3}, 422, ["body: unknown field 'k'"]),
    ("instances not list", {"instances": "abc"}, 422, ["instances", "list"]),
    ("bad base64", {"images": ["not*base64!"]}, 422, ["images[0]", "base64"]),
    ("base64 of text", {"images": [b64(b"hello world")]}, 422, ["images[0]", "PNG"]),
    ("image not string", {"images": [[1, 2]]}, 422, ["images[0]", "valid string"]),
    ("JPEG", {"images": [b64(png(fmt="JPEG"))]}, 422, ["images[0]", "expected a PNG", "JPEG"]),
    ("RGB PNG", {"images": [b64(png(mode="RGB"))]}, 422, ["images[0]", "grayscale", "RGB"]),
    ("16-bit PNG", {"images": [b64(png(mode="I;16"))]}, 422, ["images[0]", "mode L"]),
    ("32x32 PNG", {"images": [b64(png(size=(32, 32)))]}, 422, ["images[0]", "28×28", "32×32"]),
    ("PNG header only", {"images": [b64(png()[:40])]}, 422, ["images[0]", "PNG"]),
    ("truncated PNG", {"images": [b64(png()[:-20])]}, 422, ["images[0]", "PNG"]),
    ("broken JSON", b'{"instances": [[0.5,', 422, ["body", "not valid JSON"]),
    ("JSON array", b"[1, 2]", 422, ["body", "JSON object"]),
]


@pytest.fixture
async def client(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> AsyncIterator[Any]:
    settings = make_settings(max_instances=4, max_mc_samples=30, max_body_bytes=64 * 1024)
    async with serving(settings) as (app, client):
        yield client
        # None of the rejected inputs reached the model.
        assert app.state.worker.stats.snapshot()["engine_calls"] == 0


def assert_error(response: Any, status: int, fragments: list[str]) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == body["detail"]
    for fragment in fragments:
        assert fragment in body["error"], (fragment, body["error"])


@pytest.mark.parametrize(
    ("body", "status", "fragments"),
    [case[1:] for case in JSON_CASES],
    ids=[case[0] for case in JSON_CASES],
)
async def test_bad_json_input_is_rejected(
    client: Any, body: Any, status: int, fragments: list[str]
) -> None:
    if isinstance(body, bytes):
        r = await client.post(
            "/v1/predict", content=body, headers={"content-type": "application/json"}
        )
    else:
        r = await client.post("/v1/predict", json=body)
    assert_error(r, status, fragments)


async def test_wrong_content_types_are_415(client: Any) -> None:
    text = await client.post(
        "/v1/predict", content=b'{"instances": []}', headers={"content-type": "text/plain"}
    )
    assert_error(text, 415, ["application/json", "text/plain"])
    missing = await client.post("/v1/predict", content=b"{}", headers={"content-type": ""})
    assert_error(missing, 415, ["application/json"])
    form = await client.post("/v1/predict", files={"file": ("a.png", png(), "image/png")})
    assert_error(form, 415, ["application/json", "multipart/form-data", "/v1/predict/file"])
    json_to_upload = await client.post("/v1/predict/file", json={"instances": [GOOD]})
    assert_error(json_to_upload, 415, ["multipart/form-data", "application/json"])


async def test_a_compressed_body_is_415_naming_the_encoding(client: Any) -> None:
    """tritonclient's ``request_compression_algorithm="gzip"`` (or curl with a gzipped file): the
    answer names the Content-Encoding, not the gzip bytes as bad JSON or a bad tensor header."""
    import gzip
    import json

    body = gzip.compress(json.dumps({"instances": [GOOD]}).encode())
    for path, content_type, status in [
        ("/v1/predict", "application/json", 415),
        ("/v1/predict/file", "multipart/form-data; boundary=x", 415),
        ("/v2/models/tiny-mlp/infer", "application/octet-stream", 400),  # /v2 errors are 400s
    ]:
        headers = {"content-type": content_type, "content-encoding": "gzip"}
        r = await client.post(path, content=body, headers=headers)
        assert r.status_code == status, r.text
        assert r.json()["error"] == (
            "Content-Encoding gzip is not supported: send the body uncompressed"
        )
    # identity is no coding, and a body-less method is not judged
    assert content_encoding_error("POST", [(b"Content-Encoding", b"identity")]) is None
    assert content_encoding_error("GET", [(b"content-encoding", b"gzip")]) is None
    both = content_encoding_error("POST", [(b"content-encoding", b"identity, br")])
    assert both is not None and "Content-Encoding identity, br" in both.message


async def test_a_transfer_coding_other_than_chunked_is_501_naming_it(client: Any) -> None:
    """``Transfer-Encoding: gzip, chunked``: the HTTP parser undoes the chunking only, so the
    body used to reach the route still gzipped and be refused as "not valid JSON"."""
    for path in ("/v1/predict", "/v2/models/tiny-mlp/infer"):
        headers = {"content-type": "application/json", "transfer-encoding": "gzip, chunked"}
        r = await client.post(path, content=b"{}", headers=headers)
        assert r.status_code == 501, r.text
        assert r.json()["error"] == (
            "Transfer-Encoding gzip, chunked is not supported: only chunked; send the body "
            "uncompressed"
        )
    assert transfer_coding_error([(b"Transfer-Encoding", b"chunked")]) is None
    assert transfer_coding_error([(b"content-type", b"gzip")]) is None


async def test_bad_uploads_are_rejected(client: Any) -> None:
    no_file = await client.post("/v1/predict/file", data={"seed": "1"}, files={"other": b"x"})
    assert_error(no_file, 422, ["file: Field required", "unknown field 'other'"])
    not_png = await client.post("/v1/predict/file", files={"file": ("a.png", b"GIF89a....")})
    assert_error(not_png, 422, ["file", "PNG"])
    empty = await client.post("/v1/predict/file", files={"file": ("a.png", b"")})
    assert_error(empty, 422, ["file", "empty"])
    rgb = await client.post("/v1/predict/file", files={"file": ("a.png", png(mode="RGB"))})
    assert_error(rgb, 422, ["file", "grayscale"])
    bad_option = await client.post(
        "/v1/predict/file", files={"file": ("a.png", png())}, data={"mc_samples": "31"}
    )
    assert_error(bad_option, 422, ["mc_samples", "equal to 30", "got '31'"])
    extra = await client.post(
        "/v1/predict/file", files={"file": ("a.png", png())}, data={"colour": "red"}
    )
    assert_error(extra, 422, ["unknown field 'colour'"])


async def test_an_upload_over_a_mebibyte_is_read_in_memory_not_spooled_to_disk(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Starlette writes an uploaded file over 1 MiB to a temporary file; under the Kubernetes
    manifests /tmp is a small ``emptyDir`` that concurrent uploads could fill. The service keeps
    it in memory (bounded by the body limit, as JSON is): no temporary file is made, and the
    answer is the PNG's own error."""
    made: list[Any] = []

    def no_disk(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        raise OSError(28, "No space left on device")  # what a full /tmp would say

    monkeypatch.setattr(tempfile, "TemporaryFile", no_disk)
    big = b"\x89PNG\r\n\x1a\n" + bytes(3 * 1024 * 1024)  # 3 MiB: not a real PNG
    async with serving(make_settings(max_body_bytes=4 * 1024 * 1024)) as (_, client):
        r = await client.post("/v1/predict/file", files={"file": ("a.png", big, "image/png")})
        assert made == []
        assert_error(r, 422, ["file"])
        small = await client.post("/v1/predict/file", files={"file": ("a.png", png())})
        assert small.status_code == 200, small.text


async def test_oversized_bodies_are_413(client: Any) -> None:
    big = np.full((30, 784), 0.5).tolist()  # ~ 100 kB of JSON, limit 64 kB
    declared = await client.post("/v1/predict", json={"instances": big})
    assert_error(declared, 413, ["exceeds the limit of 65536 bytes", "MAX_BODY_BYTES"])

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"instances": ['
        for _ in range(200):
            yield b"[" + b"0.5," * 783 + b"0.5],"
        yield b"]}"

    streamed = await client.post(
        "/v1/predict", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(streamed, 413, ["exceeds the limit of 65536 bytes"])


async def test_unknown_routes_and_methods_get_json_errors(client: Any) -> None:
    missing = await client.get("/v1/nothing")
    assert_error(missing, 404, ["Not Found"])
    # Under /v2 the Open Inference Protocol's error body: exactly {"error": ...}.
    v2_missing = await client.get("/v2/nothing")
    assert v2_missing.status_code == 404
    assert v2_missing.json() == {"error": "Not Found"}
    wrong_method = await client.get("/v1/predict")
    assert_error(wrong_method, 405, ["Method Not Allowed"])
