"""The issue-19 native front-end prototype (``bench/native_front_proto``: HTTP, validation,
batching and encoding in Rust, Python once per batch) answers ``/v2`` binary requests with the
service's bytes for the same seed, takes only the requests it can answer exactly, and relays every
other request to the service unchanged — else its load figures would measure something else.

Its answers are told from the service's by the ``server`` header: uvicorn sends one, the front end
does not. Needs ``cargo`` (the crate has no dependencies and builds offline)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from bayesgate.service.engine import mc_engine
from bayesgate.service.prediction import predictions
from bayesgate.service.served_model import load_served_model
from tests.bench_scripts import BENCH, load_bench
from tests.service.test_front_end_protos import infer

PROTO = BENCH / "native_front_proto"
BUNDLED = Path(__file__).resolve().parents[2] / "models" / "pretrained" / "bayesgate-robust"
HAS_CARGO = shutil.which("cargo") is not None or (Path.home() / ".cargo/bin/cargo").is_file()
pytestmark = pytest.mark.skipif(not HAS_CARGO, reason="cargo (Rust) is not installed")

ENV = {"BAYESGATE_LOG_LEVEL": "warning", "BAYESGATE_NUM_THREADS": "1"}
NATIVE_ENV = {**ENV, "PYTHONPATH": str(PROTO), "BAYESGATE_NATIVE_PROTO": "1"}


@pytest.fixture()
def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return load_bench("load")


@pytest.fixture()
def native(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(PROTO))
    sys.modules.pop("native_front", None)
    import native_front

    return native_front


def post(base: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()


def binary_body(x: torch.Tensor, parameters: dict, outputs: list | None = None) -> tuple:
    raw = x.numpy().astype("<f4").tobytes()
    header: dict = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": len(raw)}}],
        "parameters": parameters,
    }  # fmt: skip
    if outputs is not None:
        header["outputs"] = outputs
    head = json.dumps(header).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


def test_the_crate_s_own_tests_pass(native: ModuleType) -> None:
    """``cargo test`` of the crate: its JSON parser, the fast-path rules one by one, the response
    bytes, the batching rules, and loopback round trips through the C ABI (pipelining, relay,
    400/431/502/503/504)."""
    env = {**os.environ, "CARGO_TARGET_DIR": str(native.TARGET_DIR)}
    done = subprocess.run(
        [native.cargo(), "test", "--release", "--offline", "--quiet"],
        cwd=native.CRATE, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    passed = sum(int(m) for m in re.findall(r"test result: ok\. (\d+) passed", done.stdout))
    assert passed >= 30, done.stdout[-2000:]


def test_batch_outputs_are_the_predictions_of_the_worker(
    native: ModuleType, mnist_test: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Every output array of a batch (bundled model: detector scores, float64 decision) equals
    the per-image :class:`Prediction` values the service encodes, bit for bit."""
    served = load_served_model(BUNDLED, device="cpu")
    noise = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    x = torch.cat([mnist_test[0][:4], noise])  # digits (not flagged) and noise (flagged)
    out = mc_engine(served.network, x, 6, torch.Generator().manual_seed(3),
                    features=served.detector.layers)  # fmt: skip
    arrays = native.batch_outputs(served, out.probs, out.features)
    rows = predictions(out.probs, served, out.features)
    assert list(arrays) == list(native.output_table(served))
    for name, array in arrays.items():
        if name == "probabilities":
            values = [p.probabilities for p in rows]
        elif hasattr(rows[0], name):  # label, the uncertainty measures, score, adversarial
            values = [getattr(p, name) for p in rows]
        else:  # the detector's scores
            values = [p.scores[name] for p in rows]
        assert array.tobytes() == np.array(values).astype(array.dtype).tobytes(), name
    # the worker path's arrays, made from those per-image answers, are the same bytes
    again = native.prediction_outputs(served, rows)
    assert {k: v.tobytes() for k, v in again.items()} == {k: v.tobytes() for k, v in arrays.items()}
    assert arrays["adversarial"].any() and not arrays["adversarial"].all()


@pytest.mark.parametrize(
    ("model", "bridge"), [("tiny", "direct"), ("bundled", "direct"), ("bundled", "worker")]
)
def test_the_native_front_answers_as_the_service_does(
    model: str, bridge: str, load: ModuleType, tiny_model_dir: Path
) -> None:
    """``direct``: the bridge runs the engine on each batch; ``worker``: each batch is one job of
    the service's own worker (``BAYESGATE_NATIVE_PROTO_PATH=worker``)."""
    directory = tiny_model_dir if model == "tiny" else BUNDLED
    name = json.loads((directory / "card.json").read_text())["name"]
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with (
        load.Server(directory, load.free_port(), ENV) as plain,
        load.Server(
            directory, load.free_port(), {**NATIVE_ENV, "BAYESGATE_NATIVE_PROTO_PATH": bridge}
        ) as fast,
    ):
        plain.wait_ready()
        fast.wait_ready()
        path = f"/v2/models/{name}/infer"
        for n, content_type in ((1, None), (3, "application/octet-stream")):
            a = infer(plain.base, name, x[:n], 7, content_type)
            b = infer(fast.base, name, x[:n], 7, content_type)
            assert a[0] == b[0] == 200 and a[1] == b[1] is not None
            assert a[2] == b[2]  # the same bytes: header and binary outputs
            assert a[3].get("server") == "uvicorn" and b[3].get("server") is None  # native
            assert b[3].get("x-request-id")
        # a chosen subset of outputs in its own order, binary by their own flags
        outputs = [
            {"name": "adversarial", "parameters": {"binary_data": True}},
            {"name": "probabilities", "parameters": {"binary_data": True}},
            {"name": "score", "parameters": {"binary_data": True}},
        ]
        body, headers = binary_body(x[:2], {"seed": 11, "mc_samples": 5}, outputs)
        a, b = post(plain.base, path, body, headers), post(fast.base, path, body, headers)
        assert a[0] == b[0] == 200 and a[1] == b[1] and "server" not in b[2]
        # what the front end does not take goes to the service, which answers as it does alone
        relayed = [
            binary_body(x[:1], {"seed": 1, "binary_data_output": False}),  # JSON outputs
            binary_body(x[:1] * 2, {"seed": 1, "binary_data_output": True}),  # out of range
            binary_body(x[:1], {"seed": 1, "mc_samples": 10**6}),  # K over the bound
            binary_body(torch.rand(1, 1, 27, 27), {"binary_data_output": True}),  # shape
        ]
        for body, headers in relayed:
            a, b = post(plain.base, path, body, headers), post(fast.base, path, body, headers)
            assert a[0] == b[0] and a[1] == b[1] and b[2].get("server") == "uvicorn"
        assert post(fast.base, path, *relayed[1])[0] == 400
        status, _, body, _ = infer(fast.base, "nope", x[:1], 1, None)
        assert status == 404 and "unknown model 'nope'" in json.loads(body)["error"]
        a = infer(plain.base, name, x[:1], 7, "application/json")
        b = infer(fast.base, name, x[:1], 7, "application/json")
        assert a[0] == b[0] == 200 and a[2] == b[2] and b[3].get("server") == "uvicorn"
        # the service's own stats count the native batches' images
        assert fast.get("/v1/stats")["instances"] >= 1 + 3 + 2


def test_keep_alive_and_tritonclient_defaults(load: ModuleType, tiny_model_dir: Path) -> None:
    """Several requests on one connection, and a stock ``tritonclient.http`` call with its
    defaults (binary inputs and outputs), equal to the service's for the same seed."""
    import tritonclient.http as httpclient

    name = json.loads((tiny_model_dir / "card.json").read_text())["name"]
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    with (
        load.Server(tiny_model_dir, load.free_port(), ENV) as plain,
        load.Server(tiny_model_dir, load.free_port(), NATIVE_ENV) as fast,
    ):
        plain.wait_ready()
        fast.wait_ready()
        host, port = fast.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=20)
        answers = []
        for seed in (1, 2, 1):
            body, headers = binary_body(x, {"seed": seed, "binary_data_output": True})
            conn.request("POST", f"/v2/models/{name}/infer", body=body, headers=headers)
            r = conn.getresponse()
            answers.append((r.status, r.read(), r.getheader("server")))
        conn.close()
        assert [a[0] for a in answers] == [200] * 3 and answers[0][1] == answers[2][1]
        assert answers[0][1] != answers[1][1] and {a[2] for a in answers} == {None}

        def triton(base: str) -> dict[str, np.ndarray]:
            client = httpclient.InferenceServerClient(base.removeprefix("http://"))
            tensor = httpclient.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x.numpy())
            result = client.infer(name, [tensor], parameters={"seed": 5})
            return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}

        a, b = triton(plain.base), triton(fast.base)
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
