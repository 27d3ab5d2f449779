"""Open Inference Protocol (``/v2``) in-process: metadata from the card, inference equal to the MC
engine called directly and to ``/v1/predict``, outputs selection, id and parameters, errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.mc.uncertainty import mutual_information, predictive_entropy, variation_ratio
from bayesgate.models.store.directory import load_model
from bayesgate.service.app import create_app
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

INFER = "/v2/models/tiny-mlp/infer"


def infer_body(x: torch.Tensor, **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.flatten().tolist(),
            }
        ],
        **extra,
    }


def outputs_of(body: dict[str, Any]) -> dict[str, np.ndarray]:
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in body["outputs"]}


async def test_server_and_model_metadata_come_from_the_card(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tiny_model_dir: Path
) -> None:
    card = json.loads((tiny_model_dir / "card.json").read_text())
    classes = len(card["classes"])
    async with serving(make_settings()) as (app, client):
        server = (await client.get("/v2")).json()
        meta = (await client.get("/v2/models/tiny-mlp")).json()
        live = await client.get("/v2/health/live")
        ready = await client.get("/v2/health/ready")
        model_ready = await client.get("/v2/models/tiny-mlp/ready")
        unknown = await client.get("/v2/models/other")
        unknown_ready = await client.get("/v2/models/other/ready")
    assert server == {
        "name": "bayesgate",
        "version": app.version,
        "extensions": ["parameters", "binary_tensor_data", "model_configuration"],
    }
    assert meta["name"] == card["name"] == "tiny-mlp"
    assert meta["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, *card["input"]["shape"]]}
    ]
    assert meta["inputs"][0]["shape"] == [-1, 1, 28, 28]
    assert meta["outputs"] == [
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, classes]},
        {"name": "label", "datatype": "INT64", "shape": [-1]},
        {"name": "predictive_entropy", "datatype": "FP32", "shape": [-1]},
        {"name": "mutual_information", "datatype": "FP32", "shape": [-1]},
        {"name": "variation_ratio", "datatype": "FP32", "shape": [-1]},
        {"name": "aleatoric_variance", "datatype": "FP32", "shape": [-1]},
        {"name": "epistemic_variance", "datatype": "FP32", "shape": [-1]},
        {"name": "adversarial", "datatype": "BOOL", "shape": [-1]},
        {"name": "score", "datatype": "FP32", "shape": [-1]},
    ]
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert model_ready.json() == {"name": "tiny-mlp", "ready": True}
    assert unknown.status_code == unknown_ready.status_code == 404
    assert unknown.json() == {"error": "unknown model 'other'; this server serves 'tiny-mlp'"}


async def test_not_ready_is_503_with_the_protocol_error_body(
    make_settings: Callable[..., Settings],
) -> None:
    app = create_app(make_settings())  # lifespan not run: nothing loaded
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/v2/health/live")).json() == {"live": True}
        for path in ("/v2/health/ready", "/v2/models/tiny-mlp/ready", "/v2/models/tiny-mlp"):
            r = await client.get(path)
            assert r.status_code == 503, path
            assert list(r.json()) == ["error"] and "not loaded" in r.json()["error"]
        r = await client.post(INFER, json=infer_body(torch.zeros(1, 1, 28, 28)))
        assert r.status_code == 503 and list(r.json()) == ["error"]


async def test_infer_equals_the_engine_and_v1_for_the_same_seed(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    tiny_model_dir: Path,
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x = torch.cat(
        [mnist_test[0][:3], torch.rand(1, 1, 28, 28, generator=torch.Generator().manual_seed(4))]
    )
    k, seed = 9, 21
    probs = mc_predict(
        load_model(tiny_model_dir).network, x, k, generator=torch.Generator().manual_seed(seed)
    ).probs.double()
    calibration = json.loads((tiny_model_dir / "calibration.json").read_text())
    threshold = calibration["thresholds"][calibration["score"]]
    params = {"mc_samples": k, "seed": seed}
    async with serving(make_settings()) as (_, client):
        flat = await client.post(INFER, json=infer_body(x, id="req-7", parameters=params))
        nested = await client.post(
            INFER,
            json={
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": [4, 1, 28, 28],
                        "data": x.tolist(),
                    }
                ],
                "parameters": params,
            },
        )
        v1 = await client.post("/v1/predict", json={"instances": x.tolist(), **params})
    assert flat.status_code == nested.status_code == v1.status_code == 200, flat.text
    body = flat.json()
    assert body["model_name"] == "tiny-mlp" and body["id"] == "req-7"
    assert body["parameters"] == {
        "mc_samples": k,
        "calibration_mc_samples": calibration["k"],
        "score_name": calibration["score"],
        "threshold": threshold,
        "weights_sha256": calibration["model_sha256"],
        "seed": seed,
    }
    out = outputs_of(body)
    assert [o["name"] for o in body["outputs"]] == [
        "probabilities",
        "label",
        "predictive_entropy",
        "mutual_information",
        "variation_ratio",
        "aleatoric_variance",
        "epistemic_variance",
        "adversarial",
        "score",
    ]
    assert [o["datatype"] for o in body["outputs"]] == [
        "FP32",
        "INT64",
        "FP32",
        "FP32",
        "FP32",
        "FP32",
        "FP32",
        "BOOL",
        "FP32",
    ]
    mean = probs.mean(dim=1)
    np.testing.assert_allclose(out["probabilities"], mean.numpy(), atol=1e-6)
    assert out["label"].tolist() == mean.argmax(1).tolist()
    np.testing.assert_allclose(
        out["predictive_entropy"], predictive_entropy(probs).numpy(), atol=1e-5
    )
    mi = mutual_information(probs).numpy()
    np.testing.assert_allclose(out["mutual_information"], mi, atol=1e-5)
    np.testing.assert_allclose(out["variation_ratio"], variation_ratio(probs).numpy(), atol=1e-6)
    # Kwon et al.: traces of diag(p̄) − E[p pᵀ] and E[(p − p̄)(p − p̄)ᵀ], from the samples directly
    second_moment = (probs**2).sum(-1).mean(1)
    np.testing.assert_allclose(out["aleatoric_variance"], (1 - second_moment).numpy(), atol=1e-5)
    epistemic = (second_moment - (mean**2).sum(-1)).numpy()
    np.testing.assert_allclose(out["epistemic_variance"], epistemic, atol=1e-5)
    assert out["adversarial"].tolist() == (out["mutual_information"] > threshold).tolist()
    assert out["score"].tolist() == out["mutual_information"].tolist()  # the calibrated score
    # Nested data: the same numbers; /v1/predict: the same numbers, bit for bit.
    assert nested.json()["outputs"] == body["outputs"]
    v1_rows = v1.json()["predictions"]
    assert out["probabilities"].tolist() == [row["probabilities"] for row in v1_rows]
    for name in (
        "label",
        "predictive_entropy",
        "mutual_information",
        "variation_ratio",
        "aleatoric_variance",
        "epistemic_variance",
        "adversarial",
        "score",
    ):
        assert out[name].tolist() == [row[name] for row in v1_rows], name


async def test_outputs_selection_and_defaults(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    x = torch.full((2, 1, 28, 28), 0.3)
    async with serving(make_settings(default_mc_samples=6)) as (_, client):
        chosen = await client.post(
            INFER,
            json=infer_body(
                x,
                outputs=[
                    {"name": "adversarial", "parameters": {"binary_data": False}},
                    {"name": "probabilities"},
                ],
                parameters={"binary_data_output": False},
            ),
        )
        unseeded = await client.post(INFER, json=infer_body(x))
    assert chosen.status_code == 200, chosen.text
    assert chosen.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in chosen.headers
    body = chosen.json()
    assert [o["name"] for o in body["outputs"]] == ["adversarial", "probabilities"]
    assert body["outputs"][1]["shape"] == [2, 10] and len(body["outputs"][1]["data"]) == 20
    assert "id" not in body and "seed" not in body["parameters"]
    assert body["parameters"]["mc_samples"] == 6
    assert unseeded.status_code == 200 and len(unseeded.json()["outputs"]) == 9


BAD_V2: list[tuple[str, Any, list[str]]] = [
    ("no inputs", {}, ["inputs: Field required"]),
    ("two inputs", {"inputs": [{}, {}]}, ["exactly one", "got 2"]),
    (
        "wrong name",
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784], "data": []}]},
        ["inputs[0].name", "'input'", "got 'x'"],
    ),
    (
        "wrong datatype",
        {
            "inputs": [
                {"name": "input", "datatype": "FP64", "shape": [1, 1, 28, 28], "data": [0.5] * 784}
            ]
        },
        ["datatype", "FP32", "FP64"],
    ),
    (
        "flat shape",
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0.5] * 784}]},
        ["shape", "[B, 1, 28, 28]", "[1, 784]"],
    ),
    (
        "zero batch",
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [0, 1, 28, 28], "data": []}]},
        ["at least 1"],
    ),
    (
        "too many",
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [5, 1, 28, 28], "data": [0.5] * 3920}
            ]
        },
        ["5 instances", "at most 4"],
    ),
    (
        "short data",
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.5] * 783}
            ]
        },
        ["784 numbers", "783"],
    ),
    (
        "strings",
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": ["a"] * 784}
            ]
        },
        ["numbers", "strings"],
    ),
    (
        "booleans",
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [True] * 784}
            ]
        },
        ["booleans"],
    ),
    (
        "out of range",
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 1, 28, 28],
                    "data": [0.5] * 783 + [2.0],
                }
            ]
        },
        ["inputs[0].data[0]", "[0, 1]", "2"],
    ),
    (
        "ragged",
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [2, 1, 28, 28],
                    "data": [[0.5] * 784, [0.5]],
                }
            ]
        },
        ["inputs[0].data"],
    ),
    (
        "unknown output",  # checked against the model's outputs, after the body's types
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.5] * 784}
            ],
            "outputs": [{"name": "label"}, {"name": "logits"}],
        },
        ["outputs[1].name", "unknown output 'logits'", "adversarial"],
    ),
    (
        "duplicate output",
        {"inputs": [], "outputs": [{"name": "label"}, {"name": "label"}]},
        ["outputs", "'label' requested twice"],
    ),
    (
        "classification",
        {"inputs": [], "outputs": [{"name": "label", "parameters": {"classification": 3}}]},
        ["classification"],
    ),
    (
        "unknown parameter",
        {"inputs": [], "parameters": {"k": 3}},
        ["parameters: unknown field 'k'"],
    ),
    ("K text", {"inputs": [], "parameters": {"mc_samples": "3"}}, ["mc_samples", "integer"]),
    ("seed negative", {"inputs": [], "parameters": {"seed": -1}}, ["seed"]),
    ("id not string", {"id": 5, "inputs": []}, ["id", "string"]),
    ("unknown field", {"inputs": [], "model": "x"}, ["unknown field", "'model'"]),
    ("not an object", [1, 2], ["JSON object"]),
]


@pytest.mark.parametrize(("body", "fragments"), [c[1:] for c in BAD_V2], ids=[c[0] for c in BAD_V2])
async def test_bad_infer_requests_are_400_with_the_protocol_body(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    body: Any,
    fragments: list[str],
) -> None:
    async with serving(make_settings(max_instances=4, max_mc_samples=30)) as (app, client):
        r = await client.post(INFER, json=body)
        assert app.state.worker.stats.snapshot()["engine_calls"] == 0  # never reached the model
    assert r.status_code == 400, r.text
    assert list(r.json()) == ["error"]
    for fragment in fragments:
        assert fragment in r.json()["error"], (fragment, r.json()["error"])


async def test_an_unexpected_exception_is_a_json_500(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_: Any) -> Any:
        raise RuntimeError("bug with a secret path /srv/x")

    monkeypatch.setattr("bayesgate.service.routes.v2.model_metadata", broken)
    monkeypatch.setattr(
        "bayesgate.service.served_model.ServedModel.summary", broken
    )  # /v1/models/{name}
    app = create_app(make_settings())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            v2 = await client.get("/v2/models/tiny-mlp")
            v1 = await client.get("/v1/models/tiny-mlp")
            ok = await client.get("/v2/health/ready")
    assert v2.status_code == 500 and v2.json() == {"error": "internal error: RuntimeError"}
    assert v1.status_code == 500
    assert v1.json() == {
        "error": "internal error: RuntimeError",
        "detail": "internal error: RuntimeError",
        "code": "internal_error",
    }
    assert ok.status_code == 200  # and the server goes on
