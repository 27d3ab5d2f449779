"""A real ``bayesgate serve --workers 2`` on 127.0.0.1: the official Triton client, a catalogue of
malformed requests, the body limit before parsing, metrics summed over processes, admin changes
reaching every process, and JSON logs with request ids."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_text import samples
from serve_process import API_KEY, Server, per_process, start_server

from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.store.calibration import read_calibration, write_calibration
from bayesgate.models.store.directory import load_model

MAX_BODY = 64 * 1024
MAX_INSTANCES = 8
MAX_K = 30
K, SEED = 6, 99


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Two worker processes sharing ``runtime_dir``; the model directory is a copy (tests edit
    its calibration)."""
    root = tmp_path_factory.mktemp("live")
    store = root / "tiny-mlp"
    shutil.copytree(tiny_model_dir, store)
    runtime = root / "run"
    server = start_server(
        store,
        root,
        workers=2,
        runtime_dir=runtime,
        api_key=API_KEY,
        max_body_bytes=MAX_BODY,
        max_instances=MAX_INSTANCES,
        max_mc_samples=MAX_K,
        drain_delay_s=0,
    )
    try:
        metrics_dir = runtime / "metrics"
        deadline = time.monotonic() + 60  # both processes up (each marks itself ready)
        while sorted(per_process(metrics_dir, "bayesgate_ready").values()) != [1.0, 1.0]:
            assert time.monotonic() < deadline, per_process(metrics_dir, "bayesgate_ready")
            time.sleep(0.2)
        yield {"server": server, "store": store, "metrics_dir": metrics_dir}
    finally:
        code = server.stop()
    assert code == 0, server.log_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> dict[str, Any]:
    """Three noise images and their MC predictive mean at (K, SEED) from the engine itself."""
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(8))
    net = load_model(tiny_model_dir).network
    probs = mc_predict(net, x, K, generator=torch.Generator().manual_seed(SEED)).probs
    return {"x": x, "mean": probs.mean(dim=1).numpy()}


def test_triton_client_liveness_readiness_metadata_and_inference(
    live: dict, reference: dict[str, Any]
) -> None:
    import tritonclient.http as triton

    server: Server = live["server"]
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("tiny-mlp") and not client.is_model_ready("other")
        assert not client.is_model_ready("tiny-mlp", "1")  # unversioned: a JSON 404
        assert client.get_model_repository_index() == [
            {"name": "tiny-mlp", "version": "", "state": "READY"}
        ]
        for model in ("", "tiny-mlp"):
            with pytest.raises(triton.InferenceServerException, match="statistics extension"):
                client.get_inference_statistics(model)
        assert client.get_server_metadata()["name"] == "bayesgate"
        meta = client.get_model_metadata("tiny-mlp")
        assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}
        config = client.get_model_config("tiny-mlp")
        x = reference["x"].numpy()
        tensor = triton.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)  # the client's default: binary tensor data
        outputs = [
            triton.InferRequestedOutput(name)  # default: binary_data=True
            for name in ("probabilities", "label", "mutual_information", "adversarial")
        ]
        result = client.infer(
            "tiny-mlp",
            [tensor],
            outputs=outputs,
            request_id="triton-1",
            parameters={"mc_samples": K, "seed": SEED},
        )
        everything = client.infer(
            "tiny-mlp", [tensor], parameters={"mc_samples": K, "seed": SEED}, timeout=10**7
        )  # Triton's per-request timeout (µs), as tritonclient sends it
        as_json = triton.InferInput("input", list(x.shape), "FP32")
        as_json.set_data_from_numpy(x, binary_data=False)
        json_result = client.infer(
            "tiny-mlp",
            [as_json],
            outputs=[triton.InferRequestedOutput("probabilities", binary_data=False)],
            parameters={"mc_samples": K, "seed": SEED},
        )
        with pytest.raises(triton.InferenceServerException) as unknown:
            client.infer("other", [tensor])
    finally:
        client.close()
    assert unknown.value.status() == "404" and "'other'" in unknown.value.message()
    assert config["max_batch_size"] == MAX_INSTANCES
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [1, 28, 28]}]
    assert {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]} in config["output"]
    response = result.get_response()
    assert response["id"] == "triton-1"
    assert all(o["parameters"]["binary_data_size"] > 0 for o in response["outputs"])
    np.testing.assert_array_equal(
        json_result.as_numpy("probabilities"), result.as_numpy("probabilities")
    )
    probs = result.as_numpy("probabilities")
    assert probs.dtype == np.float32 and probs.shape == (3, 10)
    np.testing.assert_allclose(probs, reference["mean"], atol=1e-6)
    v1 = httpx.post(
        f"{server.base}/v1/predict",
        json={"instances": reference["x"].tolist(), "mc_samples": K, "seed": SEED},
        trust_env=False,
    ).json()["predictions"]
    # The same numbers as /v1/predict, bit for bit (float32 both ways).
    assert probs.tolist() == np.asarray([r["probabilities"] for r in v1], np.float32).tolist()
    assert result.as_numpy("label").tolist() == [r["label"] for r in v1]
    assert result.as_numpy("adversarial").tolist() == [r["adversarial"] for r in v1]
    np.testing.assert_array_equal(
        result.as_numpy("mutual_information"),
        np.asarray([r["mutual_information"] for r in v1], np.float32),
    )
    # No outputs requested: the client asks for binary outputs (binary_data_output), all nine.
    assert everything.as_numpy("variation_ratio").shape == (3,)
    for name in ("aleatoric_variance", "epistemic_variance"):  # Kwon et al., as in /v1
        np.testing.assert_array_equal(
            everything.as_numpy(name), np.asarray([r[name] for r in v1], np.float32)
        )
    np.testing.assert_array_equal(everything.as_numpy("probabilities"), probs)


def _tensor(data: Any, shape: list[int], datatype: str = "FP32") -> dict[str, Any]:
    return {"inputs": [{"name": "input", "datatype": datatype, "shape": shape, "data": data}]}


GOOD = [0.5] * 784
DEEP = b"[" * 20_000 + b"]" * 20_000  # 40 kB: far past the JSON parser's depth limit
# (id, method, path, headers, body bytes, status, fragment of the error)
V1 = "/v1/predict"
V2 = "/v2/models/tiny-mlp/infer"
JSON_CT = {"content-type": "application/json"}


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


CATALOGUE: list[tuple[str, str, str, dict[str, str], bytes, int, str]] = [
    ("v1 truncated JSON", "POST", V1, JSON_CT, b'{"instances": [[0.5,', 422, "not valid JSON"),
    ("v2 truncated JSON", "POST", V2, JSON_CT, b'{"inputs": [', 400, "not valid JSON"),
    ("v1 not UTF-8", "POST", V1, JSON_CT, b'{"instances": "\xff\xfe"}', 422, "not valid JSON"),
    ("v1 instances a string", "POST", V1, JSON_CT, _j({"instances": "abc"}), 422, "instances"),
    ("v2 shape of strings", "POST", V2, JSON_CT, _j(_tensor(GOOD, ["1", 784])), 400, "shape"),
    (
        "v2 datatype INT8",
        "POST",
        V2,
        JSON_CT,
        _j(_tensor(GOOD, [1, 1, 28, 28], "INT8")),
        400,
        "datatype",
    ),
    (
        "v1 1e400 overflows",
        "POST",
        V1,
        JSON_CT,
        b'{"instances": [[1e400' + b", 0.5" * 783 + b"]]}",
        422,
        "finite",
    ),
    (
        "v2 K = 10**30",
        "POST",
        V2,
        JSON_CT,
        _j({**_tensor(GOOD, [1, 1, 28, 28]), "parameters": {"mc_samples": 10**30}}),
        400,
        "mc_samples",
    ),
    (
        "v2 batch 10**12",
        "POST",
        V2,
        JSON_CT,
        _j(_tensor(GOOD, [10**12, 1, 28, 28])),
        400,
        f"at most {MAX_INSTANCES}",
    ),
    ("v1 seed 2**64", "POST", V1, JSON_CT, _j({"instances": [GOOD], "seed": 2**64}), 422, "seed"),
    (
        "v1 NaN",
        "POST",
        V1,
        JSON_CT,
        b'{"instances": [[NaN' + b", 0.5" * 783 + b"]]}",
        422,
        "finite",
    ),
    (
        "v2 NaN in data",
        "POST",
        V2,
        JSON_CT,
        _j(_tensor(GOOD, [1, 1, 28, 28])).replace(b"0.5]", b"NaN]"),
        400,
        "finite",
    ),
    (
        "v1 deep nesting",
        "POST",
        V1,
        JSON_CT,
        b'{"instances": ' + DEEP + b"}",
        422,
        "nested too deeply",
    ),
    (
        "v2 deep nesting",
        "POST",
        V2,
        JSON_CT,
        b'{"inputs": ' + DEEP + b"}",
        400,
        "nested too deeply",
    ),
    (
        "v2 70-deep data",
        "POST",
        V2,
        JSON_CT,
        _j(_tensor(json.loads("[" * 70 + "0.5" + "]" * 70), [1, 1, 28, 28])),
        400,
        "inputs[0].data",
    ),
    ("v1 empty instances", "POST", V1, JSON_CT, _j({"instances": []}), 422, "at least one"),
    ("v2 empty inputs", "POST", V2, JSON_CT, _j({"inputs": []}), 400, "exactly one"),
    ("v2 empty data", "POST", V2, JSON_CT, _j(_tensor([], [1, 1, 28, 28])), 400, "784 numbers"),
    (
        "v1 oversize body",
        "POST",
        V1,
        JSON_CT,
        _j({"instances": [GOOD] * 30}),
        413,
        "exceeds the limit",
    ),
    (
        "v2 oversize body",
        "POST",
        V2,
        JSON_CT,
        _j(_tensor([0.5] * 784 * 30, [30, 1, 28, 28])),
        413,
        "exceeds the limit",
    ),
    ("v1 bad base64", "POST", V1, JSON_CT, _j({"images": ["not*base64!"]}), 422, "base64"),
    ("v1 base64 of text", "POST", V1, JSON_CT, _j({"images": ["aGVsbG8gd29ybGQ="]}), 422, "PNG"),
    (
        "v1 upload GIF bytes",
        "POST",
        "/v1/predict/file",
        {"content-type": "multipart/form-data; boundary=xx"},
        b'--xx\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n'
        b"GIF89a....\r\n--xx--\r\n",
        422,
        "PNG",
    ),
    (
        "v1 text/plain",
        "POST",
        V1,
        {"content-type": "text/plain"},
        _j({"instances": [GOOD]}),
        415,
        "application/json",
    ),
    (
        "v2 text/plain",
        "POST",
        V2,
        {"content-type": "text/plain"},
        _j(_tensor(GOOD, [1, 1, 28, 28])),
        400,
        "Content-Type",
    ),
    (
        "v1 unknown field",
        "POST",
        V1,
        JSON_CT,
        _j({"instances": [GOOD], "k": 3}),
        422,
        "unknown field 'k'",
    ),
    (
        "v2 unknown field",
        "POST",
        V2,
        JSON_CT,
        _j({**_tensor(GOOD, [1, 1, 28, 28]), "k": 3}),
        400,
        "unknown field",
    ),
    (
        "v1 negative K",
        "POST",
        V1,
        JSON_CT,
        _j({"instances": [GOOD], "mc_samples": -3}),
        422,
        "mc_samples",
    ),
    (
        "v2 negative K",
        "POST",
        V2,
        JSON_CT,
        _j({**_tensor(GOOD, [1, 1, 28, 28]), "parameters": {"mc_samples": -3}}),
        400,
        "mc_samples",
    ),
    (
        "v2 binary header past the body",
        "POST",
        V2,
        {"inference-header-content-length": "100"},
        b'{"inputs":[]}',
        400,
        "Inference-Header-Content-Length: 100",
    ),
    (
        "v2 unknown model",
        "POST",
        "/v2/models/nope/infer",
        JSON_CT,
        _j(_tensor(GOOD, [1, 1, 28, 28])),
        404,
        "'nope'",
    ),
    ("admin without key", "POST", "/admin/reload", {}, b"", 401, "API key"),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "fragment"),
    [c[1:] for c in CATALOGUE],
    ids=[c[0] for c in CATALOGUE],
)
def test_malformed_request_gets_its_4xx_and_the_next_valid_one_is_right(
    live: dict,
    reference: dict[str, Any],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
    fragment: str,
) -> None:
    server: Server = live["server"]
    with httpx.Client(base_url=server.base, trust_env=False, timeout=30) as client:
        bad = client.request(method, path, content=body, headers=headers)
        assert bad.status_code == status, bad.text
        error = bad.json()
        if path.startswith("/v2"):
            assert list(error) == ["error"]
        else:
            assert error["error"] == error["detail"] and error["code"]
        assert fragment in error["error"], error["error"]
        # The same client (keep-alive connection where the server kept it) asks a valid question.
        x = reference["x"]
        if path.startswith("/v2"):
            ok = client.post(
                V2,
                json={
                    **_tensor(x.flatten().tolist(), [3, 1, 28, 28]),
                    "parameters": {"mc_samples": K, "seed": SEED},
                },
            )
            assert ok.status_code == 200, ok.text
            out = {o["name"]: o for o in ok.json()["outputs"]}["probabilities"]
            got = np.asarray(out["data"]).reshape(out["shape"])
        else:
            ok = client.post(V1, json={"instances": x.tolist(), "mc_samples": K, "seed": SEED})
            assert ok.status_code == 200, ok.text
            got = np.asarray([r["probabilities"] for r in ok.json()["predictions"]])
        np.testing.assert_allclose(got, reference["mean"], atol=1e-6)


def test_body_over_the_limit_is_refused_before_it_is_sent(live: dict) -> None:
    """Content-Length alone decides: the 413 arrives while the client has sent no body byte."""
    server: Server = live["server"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/tiny-mlp/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), reply
    assert json.loads(payload)["error"].startswith("request body of 1000000000 bytes exceeds")


def _metrics(server: Server) -> dict[tuple[str, frozenset], float]:
    return samples(httpx.get(f"{server.base}/metrics", trust_env=False).text)


PREDICT_OK = {"method": "POST", "route": "/v1/predict", "status": "200"}


def test_metrics_are_summed_over_the_worker_processes(live: dict) -> None:
    server: Server = live["server"]
    metrics_dir: Path = live["metrics_dir"]
    key = ("bayesgate_http_requests_total", frozenset(PREDICT_OK.items()))
    before_total = _metrics(server).get(key, 0.0)
    before = per_process(metrics_dir, "bayesgate_http_requests_total", PREDICT_OK)
    body = {"instances": [GOOD, [0.0] * 784], "mc_samples": 3}

    def one(_: int) -> bool:  # a fresh connection each time: the kernel picks the process
        r = httpx.post(f"{server.base}/v1/predict", json=body, trust_env=False, timeout=30)
        assert r.status_code == 200, r.text
        return sum(row["adversarial"] for row in r.json()["predictions"])

    sent = 0
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(15):  # until both processes have answered some
            list(pool.map(one, range(8)))
            sent += 8
            now = per_process(metrics_dir, "bayesgate_http_requests_total", PREDICT_OK)
            if len(now) == 2 and all(now[p] > before.get(p, 0) for p in now):
                break
    served = {p: now[p] - before.get(p, 0) for p in now}
    assert len(served) == 2 and min(served.values()) > 0, served  # both processes served
    assert sum(served.values()) == sent
    # Whichever process answers /metrics reports the sum over both.
    for _ in range(4):
        assert _metrics(server)[key] - before_total == sent


def test_admin_changes_reach_every_worker_process(live: dict, reference: dict[str, Any]) -> None:
    server: Server = live["server"]
    metrics_dir: Path = live["metrics_dir"]
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def thresholds_become(value: float) -> None:
        deadline = time.monotonic() + 10
        while True:
            seen = per_process(metrics_dir, "bayesgate_adversarial_threshold")
            if len(seen) == 2 and all(v == value for v in seen.values()):
                return
            assert time.monotonic() < deadline, (value, seen)
            time.sleep(0.1)

    put = httpx.put(
        f"{server.base}/admin/threshold", json={"threshold": -1.0}, headers=headers, trust_env=False
    )
    assert put.status_code == 200, put.text
    assert put.json()["scope"].startswith("all worker processes")
    thresholds_become(-1.0)
    for _ in range(6):  # fresh connections: either process answers, both flag everything
        rows = httpx.post(
            f"{server.base}/v1/predict", json={"instances": [GOOD]}, trust_env=False
        ).json()["predictions"]
        assert rows[0]["threshold"] == -1.0 and rows[0]["adversarial"] is True
    # A reload reads the store again in every process and drops the override.
    store: Path = live["store"]
    cal = read_calibration(store)
    cal.thresholds[cal.score] = 0.4321
    write_calibration(cal, store)
    reloaded = httpx.post(
        f"{server.base}/admin/reload", headers={"X-API-Key": API_KEY}, trust_env=False
    )
    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json()["threshold"] == 0.4321 and reloaded.json()["override"] is None
    thresholds_become(0.4321)


def test_logs_are_json_lines_with_the_request_id(live: dict) -> None:
    server: Server = live["server"]
    r = httpx.get(
        f"{server.base}/v1/models/tiny-mlp", headers={"X-Request-ID": "live-log-7"}, trust_env=False
    )
    assert r.headers["x-request-id"] == "live-log-7"
    # A form whose boundary is not the declared one: python-multipart logs a warning of its own,
    # which used to reach stderr as a bare text line (Python's last-resort handler).
    bad_form = httpx.post(
        f"{server.base}/v1/predict/file",
        content=b"--XXXX\r\ncontent-disposition: form-data; name=file\r\n\r\nx\r\n--XXXX--\r\n",
        headers={
            "content-type": "multipart/form-data; boundary=AAAA",
            "X-Request-ID": "live-log-8",
        },
        trust_env=False,
    )
    assert bad_form.status_code == 422, bad_form.text
    deadline = time.monotonic() + 5
    while True:
        records = server.log_records()  # every line must parse as JSON
        mine = [rec for rec in records if rec.get("request_id") == "live-log-7"]
        library = [
            rec
            for rec in records
            if rec.get("request_id") == "live-log-8"
            and rec["logger"].startswith("python_multipart")
        ]
        if (mine and library) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(mine) == 1
    assert mine[0]["route"] == "/v1/models/{name}" and mine[0]["status"] == 200
    assert library and library[0]["level"] == "warning", library
    assert "boundary" in library[0]["message"]
    assert {rec["logger"] for rec in records} >= {
        "bayesgate.access",
        "bayesgate.service",
        "uvicorn.error",
    }
    assert API_KEY not in server.log_path.read_text()
