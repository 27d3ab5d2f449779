"""``bayesgate serve --ray`` for real: a local single-node Ray instance (CPU only), two replicas
of the tiny model behind Ray's HTTP proxy on 127.0.0.1.

Concurrent seeded requests through the proxy must get exactly the single-process service's
answers (same inputs, seeds and K), on ``/v1`` and ``/v2``; both replicas must have served some;
SIGTERM must stop everything with exit code 0. Start-up is bounded (Ray takes ~30 s here).
Then ``--address --detach`` against a cluster started by ``ray start``: the replicas must get
their settings from the deploying command (the cluster's processes never saw its environment),
and the application must keep serving after that command has exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from serve_process import Server, bayesgate_command, free_port, start_server

from bayesgate.service.ray_app import REPLICA_HEADER

READY_TIMEOUT_S = 240.0
SETTINGS = {"max_batch_size": 8, "max_queue_delay_ms": 20.0, "device": "cpu"}
# Ray Serve's controller kills its HTTP proxy after 3 missed checks in a row
# (PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD), each check timing out after
# RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S (5 s) while the proxy starts, then
# RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S (10 s) — ray/serve/_private/constants.py, used in
# ray/serve/_private/proxy_state.py. On a CPU-starved host the proxy's worker process is still
# importing Ray after 3 × 5 s: it is killed before it ever ran, and `serve.start` in the deploying
# command fails with ActorDiedError (seen with three busy loops on two cores). The controller reads
# these when it imports Serve, from the environment its raylet was started with (`ray start`'s, or
# a local `bayesgate serve --ray`'s); the deploying command's runtime_env carries only BAYESGATE_*.
# Startup stays bounded: `serve.start` itself waits at most 60 s for the proxy
# (HTTP_PROXY_TIMEOUT, same file) and READY_TIMEOUT_S bounds the rest.
PATIENT_PROXY_CHECKS = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
}


def wait_for_log(server: Server, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in server.log_path.read_text(errors="replace"):
        assert server.proc.poll() is None, server.log_path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ray_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(
        tiny_model_dir,
        tmp_path_factory.mktemp("ray-logs"),
        ready_timeout=READY_TIMEOUT_S,
        args=("--ray",),
        extra_env=PATIENT_PROXY_CHECKS,  # this process starts the local Ray instance
        ray_num_replicas=2,
        **SETTINGS,
    )
    try:
        # /readyz answers once one replica is up; the driver logs this when the app is RUNNING,
        # i.e. every replica has loaded the model and run its warm-up batch.
        wait_for_log(server, "ready on Ray", READY_TIMEOUT_S)
        yield server
    finally:
        server.stop(timeout=90)


def bodies(x: torch.Tensor) -> list[dict[str, Any]]:
    """Seeded requests of one or two images at a few K (each answer depends only on its own
    input, seed and K)."""
    out = []
    for i in range(24):
        images = x[i : i + 1 + i % 2].tolist()
        out.append({"instances": images, "mc_samples": (5, 10, 20)[i % 3], "seed": 1000 + i})
    return out


def assert_same_predictions(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert (g["label"], g["adversarial"]) == (w["label"], w["adversarial"])
        assert g["probabilities"] == pytest.approx(w["probabilities"], abs=1e-6)
        for key in ("predictive_entropy", "mutual_information", "variation_ratio"):
            assert g[key] == pytest.approx(w[key], abs=1e-6), key


@pytest.mark.anyio
async def test_replicas_answer_like_the_single_process_service(
    ray_server: Server,
    make_settings: Any,
    serving: Any,
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x, _ = mnist_test
    requests = bodies(x)
    async with serving(make_settings(**SETTINGS)) as (_, client):
        reference = [(await client.post("/v1/predict", json=b)).json() for b in requests]

    def post(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{ray_server.base}/v1/predict", json=body, timeout=60, trust_env=False)

    with ThreadPoolExecutor(8) as pool:  # concurrent: the replicas batch what they receive
        answers = list(pool.map(post, requests))
    replicas = set()
    for answer, want in zip(answers, reference, strict=True):
        assert answer.status_code == 200, answer.text
        replicas.add(answer.headers[REPLICA_HEADER])
        assert_same_predictions(answer.json()["predictions"], want["predictions"])
        assert answer.json()["mc_samples"] == want["mc_samples"]
    assert len(replicas) == 2, f"only {replicas} served the 24 requests"


@pytest.mark.anyio
async def test_v2_and_model_routes_are_served_unchanged(
    ray_server: Server,
    make_settings: Any,
    serving: Any,
    mnist_test: tuple[torch.Tensor, torch.Tensor],
) -> None:
    x, _ = mnist_test
    infer = {
        "inputs": [
            {
                "name": "input",
                "shape": [2, 1, 28, 28],
                "datatype": "FP32",
                "data": x[:2].flatten().tolist(),
            }
        ],
        "parameters": {"mc_samples": 10, "seed": 7},
    }
    async with serving(make_settings(**SETTINGS)) as (_, client):
        name = (await client.get("/v1/models")).json()["models"][0]["name"]
        want_infer = (await client.post(f"/v2/models/{name}/infer", json=infer)).json()
        want_meta = (await client.get(f"/v2/models/{name}")).json()
    with httpx.Client(base_url=ray_server.base, timeout=60, trust_env=False) as proxy:
        got_infer = proxy.post(f"/v2/models/{name}/infer", json=infer)
        got_meta = proxy.get(f"/v2/models/{name}")
        bad = proxy.post("/v1/predict", json={"instances": [[0.5] * 3]})
    assert got_meta.status_code == 200 and got_meta.json() == want_meta
    assert got_infer.status_code == 200, got_infer.text
    got, want = got_infer.json(), want_infer
    assert [o["name"] for o in got["outputs"]] == [o["name"] for o in want["outputs"]]
    for g, w in zip(got["outputs"], want["outputs"], strict=True):
        assert g["shape"] == w["shape"]
        assert g["data"] == pytest.approx(w["data"], abs=1e-6), g["name"]
    # the app's own 4xx errors come back through the proxy untouched, one request id
    assert bad.status_code == 422 and "instances" in bad.text
    assert len(bad.headers.get_list("x-request-id")) == 1


def test_sigterm_deletes_the_application_and_exits_0(ray_server: Server) -> None:
    code = ray_server.stop(signal.SIGTERM, timeout=90)
    log = ray_server.log_path.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "deleting application bayesgate" in log
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert not [r for r in records if r.get("level") == "error"], records
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{ray_server.base}/healthz", timeout=2, trust_env=False)


def test_detached_deploy_onto_a_running_cluster(tiny_model_dir: Path) -> None:
    ray = str(Path(sys.executable).parent / "ray")
    gcs_port, http_port = free_port(), free_port()
    # The cluster is started without any BAYESGATE_* variable: whatever the replicas know of the
    # settings must come from `bayesgate serve --ray` (its runtime_env).
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("BAYESGATE_", "RAY_"))}
    head = [ray, "start", "--head", f"--port={gcs_port}", "--num-cpus=1"]
    started = subprocess.run(
        [*head, "--include-dashboard=false", "--disable-usage-stats"],
        env={**clean, **PATIENT_PROXY_CHECKS},  # the cluster's Serve controller inherits these
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        env = {
            **clean,
            "BAYESGATE_MODEL_DIR": str(tiny_model_dir),
            "BAYESGATE_DEVICE": "cpu",
            "BAYESGATE_NUM_THREADS": "1",
            "BAYESGATE_MAX_BATCH_SIZE": "4",
            # `ray start` made a token (~/.ray/auth_token); a client naming the address opts in
            "RAY_AUTH_MODE": "token",
        }
        deploy = [*bayesgate_command(), "serve", "--ray", "--detach"]
        deploy += ["--address", f"127.0.0.1:{gcs_port}", "--host", "127.0.0.1"]
        done = subprocess.run(
            [*deploy, "--port", str(http_port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "ready on Ray" in done.stderr and "detached" in done.stderr
        # The deploying command has exited; the application serves on, with its model.
        base = f"http://127.0.0.1:{http_port}"
        models = httpx.get(f"{base}/v1/models", timeout=30, trust_env=False)
        assert models.status_code == 200, models.text
        assert [m["name"] for m in models.json()["models"]] == ["tiny-mlp"]
        answer = httpx.post(
            f"{base}/v1/predict",
            json={"instances": [[0.0] * 784], "mc_samples": 4, "seed": 1},
            timeout=30,
            trust_env=False,
        )
        assert answer.status_code == 200 and answer.headers[REPLICA_HEADER]
    finally:
        subprocess.run([ray, "stop", "--force"], env=clean, capture_output=True, timeout=120)
