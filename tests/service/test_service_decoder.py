"""Decoder failures are 422 naming the limit, never 500: decompression bombs (base64 and upload),
a header that trips Pillow's own bomb check, and a decoder that raises something unexpected."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hostile_inputs import bmp_bomb, png_bomb
from PIL import Image

from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return png_bomb()


@pytest.fixture
async def client(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> AsyncIterator[Any]:
    async with serving(make_settings()) as (app, client):
        yield client
        assert app.state.worker.stats.snapshot()["engine_calls"] == 0  # nothing reached the model


def assert_422(response: Any, *fragments: str) -> None:
    assert response.status_code == 422, response.text
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_the_bomb_is_what_it_claims(bomb: bytes) -> None:
    """Independent check of the fixture: Pillow reads a 20000×20000 grayscale PNG from 389 kB."""
    assert len(bomb) < 400_000
    Image.MAX_IMAGE_PIXELS, saved = None, Image.MAX_IMAGE_PIXELS
    try:
        image = Image.open(io.BytesIO(bomb))
        assert (image.format, image.mode, image.size) == ("PNG", "L", (20000, 20000))
    finally:
        Image.MAX_IMAGE_PIXELS = saved


async def test_png_bomb_as_base64_is_422(client: Any, bomb: bytes) -> None:
    r = await client.post("/v1/predict", json={"images": [base64.b64encode(bomb).decode()]})
    assert_422(r, "images[0]", "28×28", "20000×20000", "refused before decoding")


async def test_png_bomb_as_upload_is_422(client: Any, bomb: bytes) -> None:
    r = await client.post("/v1/predict/file", files={"file": ("bomb.png", bomb, "image/png")})
    assert_422(r, "file", "28×28", "20000×20000")


async def test_a_file_that_is_not_a_png_never_reaches_a_decoder(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BMP whose header claims 20000×20000 (Pillow's BMP decoder would have to refuse it by its
    bomb limit) is refused by its first bytes: Pillow is never called."""
    opened: list[Any] = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **kw: opened.append(a) or real_open(*a, **kw))
    data = base64.b64encode(bmp_bomb()).decode()
    r = await client.post("/v1/predict", json={"images": [data]})
    assert_422(r, "images[0]", "expected a PNG file, got BMP")
    assert opened == []


async def test_pillows_own_pixel_limit_is_422_naming_it(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind the header check, Pillow's ``MAX_IMAGE_PIXELS`` still holds (here set below a
    digit's 784 pixels, so that a 28×28 PNG trips it)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="PNG")
    r = await client.post("/v1/predict/file", files={"file": ("a.png", buffer.getvalue())})
    assert_422(r, "file", "size limit of 300 pixels")


async def test_any_decoder_failure_is_422(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("decoder ran out of memory")

    monkeypatch.setattr(Image, "open", broken)
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="PNG")
    r = await client.post("/v1/predict/file", files={"file": ("a.png", buffer.getvalue())})
    assert_422(r, "file", "not a readable PNG", "decoder ran out of memory")
