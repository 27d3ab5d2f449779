"""``Gate``: the service's answers from Python, checked against ``POST /v1/predict`` itself.

The reference is the running app (the bundled ``bayesgate-robust``, fused detector included, and
the tiny model without one): the same images, seed and K must give the same ``/v1`` fields, bit
for bit, chunk by chunk. Then the accepted array forms (each the same answers as the float
``N×1×28×28`` batch) and every refusal, by message."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

import bayesgate
from bayesgate.errors import InvalidArgument
from bayesgate.service.gate import Gate
from bayesgate.service.schemas import instance_dict
from bayesgate.service.settings import DEFAULT_MODEL_DIR, Settings

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def robust() -> Gate:
    return Gate.load("bayesgate-robust", "cpu")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Gate:
    return Gate.load(tiny_model_dir, "cpu")


def _v1(prediction: Any) -> dict[str, Any]:
    """A prediction's ``/v1`` fields as the service's JSON encoder writes and reads them."""
    return orjson.loads(orjson.dumps(instance_dict(prediction)))


async def _served(client: Any, images: torch.Tensor, k: int, seed: int) -> list[dict[str, Any]]:
    body = {"instances": images.tolist(), "mc_samples": k, "seed": seed}
    response = await client.post("/v1/predict", json=body)
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


@pytest.mark.parametrize("which", ["robust", "tiny"])
async def test_answers_equal_the_services_chunk_by_chunk(
    which: str,
    request: pytest.FixtureRequest,
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    gate: Gate = request.getfixturevalue(which)
    x = torch.cat([mnist_test[0][:3], torch.rand(2, 1, 28, 28, generator=torch.Generator())])
    model_dir = DEFAULT_MODEL_DIR if which == "robust" else gate.model.directory
    async with serving(make_settings(model_dir=model_dir)) as (_, client):
        whole = await _served(client, x, 7, 123)
        halves = await _served(client, x[:3], 7, 123) + await _served(client, x[3:], 7, 123)
        last_alone = await _served(client, x[4:], 7, 123)
        body = {"instances": x[:2].tolist(), "seed": 9}  # no mc_samples: the service's default K
        default = (await client.post("/v1/predict", json=body)).json()
    assert [_v1(p) for p in gate.predict(x, k=7, seed=123, batch_size=5)] == whole
    # chunks of 3: each chunk is one seeded request, so the answers are the two requests'
    chunked = [_v1(p) for p in gate.predict(x, k=7, seed=123, batch_size=3)]
    assert chunked == halves
    assert chunked[3:] != whole[3:]  # the second chunk's masks are not the whole batch's
    # a last chunk of one image (B = 1) is a one-image request
    assert [_v1(p) for p in gate.predict(x, k=7, seed=123, batch_size=4)][4:] == last_alone
    assert default["mc_samples"] == gate.default_k
    assert [_v1(p) for p in gate.predict(x[:2], seed=9)] == default["predictions"]
    if which == "robust":  # the fused detector's scores and flag, as served
        assert whole[0]["score_name"] == "fused" and "neg_log_kde" in whole[0]["scores"]


def test_the_default_k_is_the_one_the_flag_was_set_at(
    tiny: Gate, mnist_test: tuple[torch.Tensor, torch.Tensor]
) -> None:
    x = mnist_test[0][:4]
    assert tiny.default_k == tiny.model.calibration.k == 10
    default = [_v1(p) for p in tiny.predict(x, seed=1)]
    assert default == [_v1(p) for p in tiny.predict(x, k=10, seed=1)]
    assert default != [_v1(p) for p in tiny.predict(x, k=3, seed=1)]


def test_unseeded_answers_draw_from_torchs_generator(
    tiny: Gate, mnist_test: tuple[torch.Tensor, torch.Tensor]
) -> None:
    x = mnist_test[0][:4]
    torch.manual_seed(5)
    first = [_v1(p) for p in tiny.predict(x)]
    torch.manual_seed(5)
    assert [_v1(p) for p in tiny.predict(x)] == first
    assert [_v1(p) for p in tiny.predict(x)] != first  # the generator moved on


def test_every_accepted_array_form_gives_the_same_answers(
    tiny: Gate, mnist_test: tuple[torch.Tensor, torch.Tensor]
) -> None:
    pixels = (mnist_test[0][:3].numpy() * 255).round().astype(np.uint8)
    floats = torch.from_numpy(pixels.astype(np.float32) / np.float32(255))
    reference = [_v1(p) for p in tiny.predict(floats, seed=2)]
    for form in (
        pixels,  # uint8: v / 255
        pixels.reshape(3, 28, 28),
        pixels.reshape(3, 784),
        floats.numpy().astype(np.float64),
        floats.reshape(3, 784).tolist(),
    ):
        assert [_v1(p) for p in tiny.predict(form, seed=2)] == reference
    bf16 = floats.to(torch.bfloat16)  # a dtype numpy has not: read through float32
    assert tiny.to_batch(bf16).equal(bf16.float())
    one = [_v1(p) for p in tiny.predict(floats[0, 0], seed=2)]  # one 28×28 image
    assert one == [_v1(p) for p in tiny.predict(floats[:1], seed=2)]
    assert tiny.to_batch(floats[0, 0]).shape == (1, 1, 28, 28)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (
            np.zeros((2, 27, 28)),
            "images: expected shape N×1×28×28 or N×28×28 or N×784, got 2×27×28",
        ),
        (np.zeros((0, 784)), "images: no images (the first axis is 0 long)"),
        (np.zeros((2, 784), dtype=bool), "images: expected numbers, got booleans"),
        ([["a"] * 784], "images: expected numbers, got strings"),
        (
            np.full((1, 784), 1.5),
            "images[0]: values must lie in [0, 1], found 1.5 at index [0, 0, 0] of 1×28×28",
        ),
        (
            np.full((2, 784), np.nan),
            "images[0]: values must be finite, found nan at index [0, 0, 0] of 1×28×28",
        ),
        (np.full((1, 784), -1, dtype=np.int16), "images[0]: values must lie in [0, 1], found -1"),
        ([[0.0] * 784, [0.0] * 3], "images: not an array of numbers"),
        ([[True] + [0.5] * 783], "images: expected numbers, got a boolean at index [0, 0]"),
        (np.full((1, 784), 255, dtype=np.int64), "images[0]: values must lie in [0, 1], found 255"),
        (np.float64(0.5), "images: expected shape N×1×28×28 or N×28×28 or N×784, got a scalar"),
        (np.full((28, 28), 2.0), "images: values must lie in [0, 1], found 2.0 at index [0, 0, 0]"),
    ],
)
def test_bad_images_are_refused_by_name(tiny: Gate, images: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        tiny.predict(images)
    assert str(caught.value).startswith(message)


def test_an_integer_array_of_pixels_is_told_to_be_uint8(tiny: Gate) -> None:
    with pytest.raises(InvalidArgument, match=r"\(pixels 0–255: give them as uint8\)$"):
        tiny.to_batch(np.full((1, 784), 255, dtype=np.int64))
    for dtype in (np.float32, np.float64):  # whole-number pixels in a float array: the same hint
        pixels = np.zeros((1, 784), dtype=dtype)
        pixels[0, 3] = 84.0
        with pytest.raises(
            InvalidArgument, match=r"found 84\.0 .*\(pixels 0–255: give them as uint8\)$"
        ):
            tiny.to_batch(pixels)
    with pytest.raises(InvalidArgument) as err:  # not whole numbers: not pixels, no hint
        tiny.to_batch(np.full((1, 784), 1.5))
    assert "uint8" not in str(err.value)
    with pytest.raises(InvalidArgument, match=r"found -1.0 at index \[0, 0, 0\] of 1×28×28$"):
        tiny.to_batch(np.full((1, 784), -1, dtype=np.int16))


def test_a_model_that_cannot_be_served_is_one_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model directory not found"):
        Gate.load(tmp_path / "none")
    (tmp_path / "broken").mkdir()
    with pytest.raises(ValueError, match=r"card\.json"):
        Gate.load(tmp_path / "broken")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be ≥ 1, got 0"),
        ({"k": 2.0}, "k must be an integer, got 2.0"),
        ({"batch_size": 0}, "batch_size must be ≥ 1, got 0"),
        ({"seed": -1}, "seed must be in [0, 9223372036854775807], got -1"),
        ({"seed": 2**63}, "seed must be in [0, 9223372036854775807], got 9223372036854775808"),
        ({"seed": True}, "seed must be an integer, got True"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    tiny: Gate, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        tiny.chunks(np.zeros((1, 784)), **kwargs)
    assert str(caught.value) == message


def test_gate_is_importable_from_the_top_package_without_paying_for_it() -> None:
    code = (
        "import sys, bayesgate; assert 'torch' not in sys.modules; "
        "from bayesgate import Gate; from bayesgate.service.gate import Gate as G; "
        "assert Gate is G; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
    with pytest.raises(AttributeError, match="has no attribute 'Gates'"):
        bayesgate.Gates  # noqa: B018


def test_repr_is_one_short_line(tiny: Gate) -> None:
    text = repr(tiny)
    assert "\n" not in text and len(text) < 300, text
    assert text.startswith(f"Gate({tiny.model.card.name!r} from ")
    assert f"K={tiny.default_k}, flags {tiny.model.decision.score} > " in text
