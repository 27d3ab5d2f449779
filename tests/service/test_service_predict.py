"""Prediction routes against independent references: the MC engine called directly with the same
seed, float64 brute-force uncertainty formulas over the returned samples, and calibration.json."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.store.directory import load_model
from bayesgate.service.app import create_app
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio


def png_b64(image: torch.Tensor) -> str:
    """``1×28×28`` in [0,1] → base64 of an 8-bit grayscale PNG (pixel = round(255·x))."""
    pixels = (image.squeeze(0).numpy() * 255).round().astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def quantised(image: torch.Tensor) -> torch.Tensor:
    return (image * 255).round() / 255


async def test_health_and_readiness_before_and_after_start(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
) -> None:
    app = create_app(make_settings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        not_ready = await client.get("/readyz")
        assert not_ready.status_code == 503
        assert "not loaded" in not_ready.json()["error"]
        early = await client.post("/v1/predict", json={"instances": [[0.0] * 784]})
        assert early.status_code == 503
    async with serving(make_settings()) as (_, client):
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["model"] == "tiny-mlp"
        assert (await client.get("/healthz")).status_code == 200


async def test_seeded_prediction_equals_the_engine_called_directly(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    tiny_model_dir: Path,
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x = mnist_test[0][:3]
    reference = mc_predict(
        load_model(tiny_model_dir).network, x, 7, generator=torch.Generator().manual_seed(11)
    ).probs.mean(dim=1)
    card = json.loads((tiny_model_dir / "card.json").read_text())
    async with serving(make_settings()) as (_, client):
        r = await client.post(
            "/v1/predict", json={"instances": x.tolist(), "mc_samples": 7, "seed": 11}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == {"name": "tiny-mlp", "weights_sha256": card["weights_sha256"]}
    assert body["mc_samples"] == 7 and body["seed"] == 11 and body["calibration_mc_samples"] == 10
    got = torch.tensor([p["probabilities"] for p in body["predictions"]])
    assert torch.allclose(got, reference, atol=1e-7, rtol=0)
    assert [p["label"] for p in body["predictions"]] == reference.argmax(1).tolist()
    assert [p["class_name"] for p in body["predictions"]] == [
        card["classes"][i] for i in reference.argmax(1).tolist()
    ]


async def test_uncertainty_fields_match_float64_formulas_over_the_samples(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    tiny_model_dir: Path,
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    calibration = json.loads((tiny_model_dir / "calibration.json").read_text())
    noise = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    x = torch.cat([mnist_test[0][:4], noise])
    async with serving(make_settings()) as (_, client):
        r = await client.post(
            "/v1/predict", json={"instances": x.tolist(), "mc_samples": 20, "return_samples": True}
        )
    assert r.status_code == 200, r.text
    for pred in r.json()["predictions"]:
        p = np.array(pred["samples"], dtype=np.float64)  # K×C
        assert p.shape == (20, 10)
        mean = p.mean(axis=0)
        entropy = -sum(v * math.log(v) for v in mean if v > 0)
        expected = np.mean([-sum(v * math.log(v) for v in row if v > 0) for row in p])
        votes = np.bincount(p.argmax(axis=1), minlength=10)
        assert np.allclose(pred["probabilities"], mean, atol=1e-6)
        assert pred["label"] == int(mean.argmax())
        assert pred["predictive_entropy"] == pytest.approx(entropy, abs=1e-5)
        assert pred["mutual_information"] == pytest.approx(max(entropy - expected, 0), abs=1e-5)
        assert pred["variation_ratio"] == pytest.approx(1 - votes.max() / 20, abs=1e-6)
        # Kwon et al.: traces of diag(p̄) − mean p pᵀ and mean (p − p̄)(p − p̄)ᵀ
        aleatoric = np.trace(np.diag(mean) - np.mean([np.outer(r, r) for r in p], axis=0))
        epistemic = np.trace(np.mean([np.outer(r - mean, r - mean) for r in p], axis=0))
        assert pred["aleatoric_variance"] == pytest.approx(aleatoric, abs=1e-6)
        assert pred["epistemic_variance"] == pytest.approx(epistemic, abs=1e-6)
        assert pred["score_name"] == calibration["score"] == "mutual_information"
        assert pred["score"] == pred["mutual_information"]
        assert pred["threshold"] == calibration["thresholds"]["mutual_information"]
        assert pred["adversarial"] is (pred["score"] > pred["threshold"])


async def test_instance_layouts_give_identical_answers(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    image = mnist_test[0][0]  # 1×28×28
    layouts = [image.tolist(), image[0].tolist(), image.flatten().tolist()]
    async with serving(make_settings()) as (_, client):
        answers = [
            (await client.post("/v1/predict", json={"instances": [inst], "seed": 3})).json()
            for inst in layouts
        ]
    assert answers[0]["predictions"] == answers[1]["predictions"] == answers[2]["predictions"]


async def test_png_images_and_file_upload_equal_the_quantised_instances(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x = mnist_test[0][:2]
    encoded = [png_b64(img) for img in x]
    options = {"seed": 9, "mc_samples": 5}
    async with serving(make_settings()) as (_, client):
        via_instances = await client.post(
            "/v1/predict", json={"instances": quantised(x).tolist(), **options}
        )
        via_images = await client.post(
            "/v1/predict",
            json={"images": [encoded[0], "data:image/png;base64," + encoded[1]], **options},
        )
        one_image = await client.post("/v1/predict", json={"images": encoded[:1], **options})
        via_file = await client.post(
            "/v1/predict/file",
            files={"file": ("digit.png", base64.b64decode(encoded[0]), "image/png")},
            data={"seed": "9", "mc_samples": "5", "return_samples": "true"},
        )
    assert via_instances.status_code == via_images.status_code == via_file.status_code == 200
    assert via_images.json()["predictions"] == via_instances.json()["predictions"]
    upload = via_file.json()
    assert upload["mc_samples"] == 5 and upload["seed"] == 9
    [row] = upload["predictions"]
    assert len(row["samples"]) == 5 and len(row["samples"][0]) == 10
    assert {**row, "samples": None} == one_image.json()["predictions"][0]


async def test_seeded_answer_is_independent_of_concurrent_traffic(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x = mnist_test[0]
    seeded = {"instances": x[:2].tolist(), "seed": 1234, "mc_samples": 10}
    async with serving(make_settings(max_queue_delay_ms=20.0)) as (_, client):
        alone = (await client.post("/v1/predict", json=seeded)).json()
        others = [
            client.post("/v1/predict", json={"instances": x[i : i + 3].tolist(), "mc_samples": 10})
            for i in range(2, 20, 3)
        ]
        crowd = await asyncio.gather(client.post("/v1/predict", json=seeded), *others)
        other_seed = await client.post("/v1/predict", json={**seeded, "seed": 1235})
        assert all(r.status_code == 200 for r in crowd)
    assert crowd[0].json()["predictions"] == alone["predictions"]
    assert other_seed.json()["predictions"] != alone["predictions"]


async def test_default_mc_samples_is_the_calibration_k_unless_set(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
) -> None:
    body = {"instances": [[0.2] * 784]}
    async with serving(make_settings()) as (_, client):
        assert (await client.post("/v1/predict", json=body)).json()["mc_samples"] == 10
    async with serving(make_settings(default_mc_samples=4)) as (_, client):
        assert (await client.post("/v1/predict", json=body)).json()["mc_samples"] == 4


async def test_model_routes_report_card_and_calibration(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tiny_model_dir: Path
) -> None:
    card = json.loads((tiny_model_dir / "card.json").read_text())
    calibration = json.loads((tiny_model_dir / "calibration.json").read_text())
    async with serving(make_settings()) as (_, client):
        listing = (await client.get("/v1/models")).json()
        one = (await client.get("/v1/models/tiny-mlp")).json()
        missing = await client.get("/v1/models/other")
    assert listing["models"] == [one]
    assert one["card"] == card
    summary = one["calibration"]
    assert summary["score"] == "mutual_information"
    assert summary["threshold"] == calibration["thresholds"]["mutual_information"]
    assert summary["target_fpr"] == calibration["target_fpr"] == 0.05
    assert summary["mc_samples"] == 10
    assert summary["auroc"] == {"uniform-noise": calibration["attacks"][0]["auroc"]}
    assert missing.status_code == 404
    assert "'other'" in missing.json()["error"] and "tiny-mlp" in missing.json()["detail"]


async def test_docs_can_be_switched_off(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings()) as (_, client):
        spec = (await client.get("/openapi.json")).json()
        assert {"/v1/predict", "/v1/predict/file", "/v1/models", "/readyz"} <= set(spec["paths"])
        assert (await client.get("/docs")).status_code == 200
    async with serving(make_settings(docs=False)) as (_, client):
        assert (await client.get("/docs")).status_code == 404
        assert (await client.get("/openapi.json")).status_code == 404
