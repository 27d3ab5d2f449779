"""The issue-19 front-end prototypes (``bench/v2_fast_proto``: the route inside uvicorn's httptools
protocol; ``bench/granian_proto``: the service behind granian's Rust HTTP server) answer ``/v2``
binary requests exactly as the service does (same bytes for the same seed) and leave every other
request to the app — else their load figures would measure something else."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.bench_scripts import BENCH, load_bench

PROTOS = {  # prototype directory → the variable that turns it on
    "v2_fast_proto": "BAYESGATE_FAST_V2_PROTO",
    "granian_proto": "BAYESGATE_GRANIAN_PROTO",
}


@pytest.fixture()
def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return load_bench("load")


def infer(base: str, name: str, x: torch.Tensor, seed: int, content_type: str | None) -> tuple:
    raw = x.numpy().astype("<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                        "parameters": {"binary_data_size": len(raw)}}],
            "parameters": {"mc_samples": 4, "seed": seed, "binary_data_output": True},
        }
    ).encode()  # fmt: skip
    headers = {"Inference-Header-Content-Length": str(len(head))}
    if content_type is not None:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(
        f"{base}/v2/models/{name}/infer", data=head + raw, method="POST", headers=headers
    )
    if content_type is None:  # as tritonclient.http and bench/load.py send binary bodies
        request.add_unredirected_header("Content-Type", "")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=20) as r:
            return r.status, r.headers.get("inference-header-content-length"), r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, None, e.read(), e.headers


@pytest.mark.parametrize("proto", sorted(PROTOS))
def test_the_prototype_answers_as_the_service_does(
    proto: str, load: ModuleType, tiny_model_dir: Path
) -> None:
    name = json.loads((tiny_model_dir / "card.json").read_text())["name"]
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    env = {"BAYESGATE_LOG_LEVEL": "warning", "BAYESGATE_NUM_THREADS": "1"}
    proto_env = {**env, "PYTHONPATH": str(BENCH / proto), PROTOS[proto]: "1"}
    with (
        load.Server(tiny_model_dir, load.free_port(), env) as plain,
        load.Server(tiny_model_dir, load.free_port(), proto_env) as fast,
    ):
        plain.wait_ready()
        fast.wait_ready()
        for n, content_type in ((1, None), (3, "application/octet-stream")):
            a = infer(plain.base, name, x[:n], 7, content_type)
            b = infer(fast.base, name, x[:n], 7, content_type)
            assert a[0] == b[0] == 200 and a[1] == b[1] is not None
            assert a[2] == b[2]  # the same bytes: header and binary outputs
            # …and the prototype did answer it: the app's middleware (request id) was skipped
            assert a[3].get("x-request-id") and b[3].get("x-request-id") is None
        # errors of the fast path are /v2 error bodies with the service's statuses
        status, _, body, _ = infer(fast.base, "nope", x[:1], 1, None)
        assert status == 404 and "unknown model 'nope'" in json.loads(body)["error"]
        bad = infer(fast.base, name, torch.rand(1, 1, 27, 27), 1, None)
        assert bad[0] == 400 and "error" in json.loads(bad[2])
        # a JSON body is not the prototype's: the app answers it, as before
        a = infer(plain.base, name, x[:1], 7, "application/json")
        b = infer(fast.base, name, x[:1], 7, "application/json")
        assert a[0] == b[0] and a[2] == b[2] and b[3].get("x-request-id")
        assert fast.get("/v1/stats")["requests_succeeded"] >= 2


def test_granian_asgi_serves_the_unchanged_app(load: ModuleType, tiny_model_dir: Path) -> None:
    """``BAYESGATE_GRANIAN_PROTO=asgi``: every request goes through the app (its middleware sets
    the request id), and the answers are the service's bytes."""
    name = json.loads((tiny_model_dir / "card.json").read_text())["name"]
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    env = {"BAYESGATE_LOG_LEVEL": "warning", "BAYESGATE_NUM_THREADS": "1"}
    asgi_env = {
        **env,
        "PYTHONPATH": str(BENCH / "granian_proto"),
        "BAYESGATE_GRANIAN_PROTO": "asgi",
    }
    with (
        load.Server(tiny_model_dir, load.free_port(), env) as plain,
        load.Server(tiny_model_dir, load.free_port(), asgi_env) as granian,
    ):
        plain.wait_ready()
        granian.wait_ready()
        assert granian.loop_pid() != granian.proc.pid  # served from granian's worker process
        for content_type in (None, "application/json"):
            a = infer(plain.base, name, x, 3, content_type)
            b = infer(granian.base, name, x, 3, content_type)
            assert a[0] == b[0] == 200 and a[2] == b[2]
            assert b[3].get("x-request-id")
        status, _, body, _ = infer(granian.base, "nope", x[:1], 1, None)
        assert status == 404 and "unknown model 'nope'" in json.loads(body)["error"]
        assert granian.get("/v1/stats")["requests_succeeded"] >= 2
