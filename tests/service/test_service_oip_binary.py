"""The binary tensor data extension on ``/v2/models/{name}/infer`` in-process: bodies built by the
stock ``tritonclient.http`` with its defaults (binary input, binary outputs) and decoded by it,
equal to ``/v1/predict`` for the same seed; hand-built byte bodies, good and malformed; the Triton
model configuration."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

INFER = "/v2/models/tiny-mlp/infer"
K, SEED = 7, 13
HEADER = "inference-header-content-length"


def _images(n: int) -> np.ndarray:
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(5)).numpy()


def _binary_body(header: dict[str, Any], *parts: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(parts), {HEADER: str(len(head))}


def _binary_input(x: np.ndarray, size: int | None = None, datatype: str = "FP32") -> dict:
    raw = x.astype("<f4").tobytes()
    return {
        "name": "input",
        "datatype": datatype,
        "shape": list(x.shape),
        "parameters": {"binary_data_size": len(raw) if size is None else size},
    }


async def test_stock_tritonclient_defaults_equal_v1(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    import tritonclient.http as triton

    x = _images(3)
    tensor = triton.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)  # default binary_data=True
    names = ["probabilities", "label", "adversarial", "score", "mutual_information"]
    requested = [triton.InferRequestedOutput(name) for name in names]  # default binary_data=True
    params = {"mc_samples": K, "seed": SEED}
    chosen, chosen_len = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=requested, parameters=params
    )
    everything, everything_len = triton.InferenceServerClient.generate_request_body(
        [tensor], parameters=params
    )
    assert chosen_len is not None  # the client really sends binary input
    async with serving(make_settings()) as (_, client):
        r1 = await client.post(INFER, content=chosen, headers={HEADER: str(chosen_len)})
        r2 = await client.post(INFER, content=everything, headers={HEADER: str(everything_len)})
        v1 = await client.post("/v1/predict", json={"instances": x.tolist(), **params})
    assert r1.status_code == r2.status_code == v1.status_code == 200, (r1.text, r2.text)
    results = []
    for r in (r1, r2):
        assert r.headers["content-type"] == "application/octet-stream"
        results.append(
            triton.InferenceServerClient.parse_response_body(
                r.content, header_length=int(r.headers[HEADER])
            )
        )
    rows = v1.json()["predictions"]
    for result in results:
        head = result.get_response()
        assert all("data" not in o and o["parameters"]["binary_data_size"] for o in head["outputs"])
        probs = result.as_numpy("probabilities")
        assert probs.dtype == np.float32 and probs.shape == (3, 10)
        assert probs.tolist() == np.asarray([r["probabilities"] for r in rows], np.float32).tolist()
        assert result.as_numpy("label").dtype == np.int64
        assert result.as_numpy("label").tolist() == [r["label"] for r in rows]
        assert result.as_numpy("adversarial").tolist() == [r["adversarial"] for r in rows]
        for name in ("score", "mutual_information"):
            expected = np.asarray([r[name] for r in rows], np.float32)
            np.testing.assert_array_equal(result.as_numpy(name), expected)
    assert len(results[1].get_response()["outputs"]) == 9  # binary_data_output: all of them


async def test_hand_built_binary_body_and_mixed_outputs(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    x = _images(2)
    header = {
        "inputs": [_binary_input(x)],
        "outputs": [
            {"name": "label", "parameters": {"binary_data": True}},
            {"name": "adversarial", "parameters": {"binary_data": True}},
            {"name": "probabilities"},  # JSON: binary_data_output is not set
        ],
        "parameters": {"mc_samples": K, "seed": SEED},
    }
    body, headers = _binary_body(header, x.astype("<f4").tobytes())
    json_header = {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": [2, 1, 28, 28],
                "data": x.ravel().tolist(),
            }
        ],
        "parameters": {"mc_samples": K, "seed": SEED},
    }
    async with serving(make_settings()) as (_, client):
        r = await client.post(INFER, content=body, headers=headers)
        reference = await client.post(INFER, json=json_header)
    assert r.status_code == 200, r.text
    n = int(r.headers[HEADER])
    head, tail = json.loads(r.content[:n]), r.content[n:]
    by_name = {o["name"]: o for o in head["outputs"]}
    assert by_name["label"]["parameters"] == {"binary_data_size": 2 * 8}  # INT64
    assert by_name["adversarial"]["parameters"] == {"binary_data_size": 2}  # BOOL: 1 byte each
    assert len(tail) == 18
    labels = np.frombuffer(tail[:16], "<i8")
    flags = np.frombuffer(tail[16:], "|b1")
    ref = {o["name"]: o["data"] for o in reference.json()["outputs"]}
    assert labels.tolist() == ref["label"] and flags.tolist() == ref["adversarial"]
    assert by_name["probabilities"]["data"] == ref["probabilities"]


def _bad_cases() -> list[tuple[str, bytes, dict[str, str], str]]:
    x = _images(1)
    raw = x.astype("<f4").tobytes()
    good = {"inputs": [_binary_input(x)]}
    head = json.dumps(good).encode()
    cases = [
        (
            "size not shape×dtype",
            *_binary_body({"inputs": [_binary_input(x, 3000)]}, raw[:3000]),
            "3000 bytes, but the shape 1×1×28×28 of FP32 takes 3136",
        ),
        ("bytes missing", *_binary_body(good, raw[:100]), "runs past the body"),
        ("bytes left over", *_binary_body(good, raw + b"\0" * 8), "8 bytes after the JSON header"),
        (
            "header beyond body",
            head + raw,
            {HEADER: str(len(head) + len(raw) + 1)},
            "not within the body",
        ),
        ("header not a number", head + raw, {HEADER: "abc"}, "expected a byte count"),
        ("header cuts the JSON", head + raw, {HEADER: str(len(head) - 5)}, "not valid JSON"),
        (
            "unsupported dtype",
            *_binary_body({"inputs": [_binary_input(x, datatype="BYTES")]}, raw),
            "Input should be 'FP32' (got 'BYTES')",
        ),
        (
            "size not an integer",
            *_binary_body({"inputs": [_binary_input(x, -1)]}, raw),
            "binary_data_size: Input should be greater than or equal to 0",
        ),
        (
            "data and binary",
            *_binary_body({"inputs": [{**_binary_input(x), "data": [0.5] * 784}]}, raw),
            "not both",
        ),
        (
            "unknown input parameter",
            *_binary_body({"inputs": [{**_binary_input(x), "parameters": {"shm": 1}}]}, raw),
            "'shm'",
        ),
        (
            "no data at all",
            *_binary_body(
                {"inputs": [{k: v for k, v in _binary_input(x).items() if k != "parameters"}]}, raw
            ),
            "missing field 'data'",
        ),
        ("NaN in the bytes", *_binary_body(good, np.full(784, np.nan, "<f4").tobytes()), "finite"),
        ("binary without the header", head + raw, {}, "not valid JSON"),
    ]
    return [(name, body, headers, fragment) for name, body, headers, fragment in cases]


@pytest.mark.parametrize(
    ("body", "headers", "fragment"), [c[1:] for c in _bad_cases()], ids=[c[0] for c in _bad_cases()]
)
async def test_malformed_binary_bodies_are_400(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    body: bytes,
    headers: dict[str, str],
    fragment: str,
) -> None:
    async with serving(make_settings()) as (app, client):
        r = await client.post(INFER, content=body, headers=headers)
        assert app.state.worker.stats.snapshot()["engine_calls"] == 0
    assert r.status_code == 400, r.text
    assert list(r.json()) == ["error"] and fragment in r.json()["error"], r.json()


async def test_model_config_is_what_the_model_takes(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(max_instances=5)) as (_, client):
        config = (await client.get("/v2/models/tiny-mlp/config")).json()
        meta = (await client.get("/v2/models/tiny-mlp")).json()
        unknown = await client.get("/v2/models/other/config")
    assert config["name"] == "tiny-mlp" and config["max_batch_size"] == 5
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [1, 28, 28]}]
    assert config["output"] == [
        {"name": o["name"], "data_type": "TYPE_" + o["datatype"], "dims": o["shape"][1:]}
        for o in meta["outputs"]
    ]
    assert {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]} in config["output"]
    assert unknown.status_code == 404 and "'other'" in unknown.json()["error"]
