"""The container's command run outside Docker: ``bayesgate serve`` with the environment the image
and docker-compose.yml give it, probed with the health check they both use until ready, then
stopped with SIGTERM as ``docker stop`` does.

Local adjustments, and only these: the model directory (the bundled default model), a free port
on 127.0.0.1 instead of 0.0.0.0:8000, one CPU thread, and ``/opt/venv/bin`` / files the image
copies mapped to this checkout.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from deploy_files import REPO_ROOT, Dockerfile, compose_environment

from bayesgate.models.store.directory import read_card

READY_TIMEOUT_S = 90.0
VENV_BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seconds(duration: str) -> float:
    """Compose durations used here: ``"5s"``, ``"2m"``."""
    units = {"s": 1.0, "m": 60.0}
    return float(duration[:-1]) * units[duration[-1]]


def _local(arg: str, dockerfile: Dockerfile) -> str:
    """An argument of the container's command, mapped to this checkout."""
    if arg.startswith("/opt/venv/bin/"):
        return str(VENV_BIN / arg.removeprefix("/opt/venv/bin/"))
    copies = dockerfile.context_copies()
    if arg in copies:
        return str(REPO_ROOT / copies[arg])
    return arg


def _argv(value: str | list[str]) -> list[str]:
    """A compose ``command``/``entrypoint``: a list as is, a string split like a shell would."""
    return shlex.split(value) if isinstance(value, str) else list(value)


def _command(dockerfile: Dockerfile, service: dict[str, Any]) -> list[str]:
    """ENTRYPOINT + CMD, or the compose file's overrides, with the console script resolved."""
    entrypoint = service.get("entrypoint")
    command = service.get("command")
    if entrypoint is None and command is None:
        argv = dockerfile.final_command()
    else:
        entry = dockerfile.final.all("ENTRYPOINT")
        argv = _argv(entrypoint) if entrypoint is not None else entry[-1].json_args()
        argv += _argv(command or [])
    assert argv[0] == "bayesgate", argv
    script = VENV_BIN / "bayesgate"
    assert script.is_file(), f"console script not installed: {script}"
    return [str(script), *argv[1:]]


def _local_env(
    dockerfile: Dockerfile, service: dict[str, Any], variant: str, model_dir: Path, port: int
) -> dict[str, str]:
    """The image's ENV overlaid with the service's environment, then the local adjustments."""
    container = dockerfile.env({"VARIANT": variant})
    container.update(compose_environment(service, {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAYESGATE_")}
    env.update({k: v for k, v in container.items() if k != "PATH"})
    assert container["PATH"].startswith("/opt/venv/bin:")
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    assert container["BAYESGATE_HOST"] == "0.0.0.0"
    env.update(
        BAYESGATE_MODEL_DIR=str(model_dir),
        BAYESGATE_HOST="127.0.0.1",
        BAYESGATE_PORT=str(port),
        BAYESGATE_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        # the image installs no uvloop, so its `auto` is asyncio's loop (the dev venv has uvloop)
        BAYESGATE_EVENT_LOOP="asyncio",
    )
    return env


def _health(
    dockerfile: Dockerfile, service: dict[str, Any], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run the compose healthcheck command once: ``CompletedProcess``."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", test
    return subprocess.run(
        [_local(a, dockerfile) for a in test[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=_seconds(service["healthcheck"]["timeout"]) + 5,
    )


def _request(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=30) as response:
        return response.status, json.loads(response.read())


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """``launch(argv, env) -> (process, log path)``; whatever is left running is killed after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"server-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(proc)
        return proc, log

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _serve_until_ready(
    dockerfile: Dockerfile,
    service: dict[str, Any],
    env: dict[str, str],
    model_dir: Path,
    launch: Any,
) -> None:
    """Start the command, wait for the health check, check the API, stop with SIGTERM."""
    before = _health(dockerfile, service, env)
    assert before.returncode == 1, "health check passed with no server listening"
    assert before.stdout.startswith("unhealthy:")

    proc, log = launch(_command(dockerfile, service), env)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} before ready:\n{_tail(log)}")
        result = _health(dockerfile, service, env)
        if result.returncode == 0:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"not ready after {READY_TIMEOUT_S:.0f} s ({result.stdout})\n{_tail(log)}")
        time.sleep(0.5)
    port = env["BAYESGATE_PORT"]
    assert result.stdout.strip() == f"healthy: http://127.0.0.1:{port}/readyz: HTTP 200"

    base = f"http://127.0.0.1:{port}"
    card = read_card(model_dir)
    assert _request(f"{base}/healthz") == (200, {"status": "ok"})
    assert _request(f"{base}/readyz") == (
        200,
        {"status": "ready", "model": card.name, "weights_sha256": card.weights_sha256},
    )
    blank = [[[0.0] * 28 for _ in range(28)]]
    status, body = _request(f"{base}/v1/predict", {"instances": [blank], "mc_samples": 4})
    assert status == 200
    (prediction,) = body["predictions"]
    assert len(prediction["probabilities"]) == len(card.classes)
    assert abs(sum(prediction["probabilities"]) - 1.0) < 1e-4
    assert body["mc_samples"] == 4

    proc.send_signal(signal.SIGTERM)  # what `docker stop` sends (tini forwards it with init: true)
    grace = _seconds(service.get("stop_grace_period", "10s"))
    try:
        code = proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pytest.fail(f"server still running {grace:.0f} s after SIGTERM:\n{_tail(log)}")
    # uvicorn shuts down gracefully, then re-raises the signal: exit 0 or "killed by SIGTERM"
    # (Docker shows 143) are both a clean stop; the log says the shutdown ran to the end.
    assert code in {0, -signal.SIGTERM}, _tail(log)
    assert "Application shutdown complete" in log.read_text()
    after = _health(dockerfile, service, env)
    assert after.returncode == 1


def test_cpu_service_command_serves_until_ready_and_stops_cleanly(
    dockerfile: Dockerfile, compose: dict[str, Any], served_model_dir: Path, launch: Any
) -> None:
    service = compose["services"]["bayesgate-cpu"]
    env = _local_env(dockerfile, service, "cpu", served_model_dir, _free_port())
    assert env["BAYESGATE_DEVICE"] == "cpu"
    _serve_until_ready(dockerfile, service, env, served_model_dir, launch)


def test_gpu_service_command_needs_a_gpu(
    dockerfile: Dockerfile, compose: dict[str, Any], served_model_dir: Path, launch: Any
) -> None:
    """With BAYESGATE_DEVICE=cuda the command serves on a GPU host and, on a host without one,
    stops at once with a one-line error instead of quietly serving on the CPU."""
    service = compose["services"]["bayesgate"]
    env = _local_env(dockerfile, service, "gpu", served_model_dir, _free_port())
    assert env["BAYESGATE_DEVICE"] == "cuda"
    if torch.cuda.is_available():
        _serve_until_ready(dockerfile, service, env, served_model_dir, launch)
        return
    proc, log = launch(_command(dockerfile, service), env)
    assert proc.wait(timeout=60) == 2
    output = log.read_text()
    assert "bayesgate: error:" in output and "CUDA is not available" in output, output


def _load_healthcheck() -> ModuleType:
    path = REPO_ROOT / "deploy" / "healthcheck.py"
    spec = importlib.util.spec_from_file_location("bayesgate_healthcheck", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_url_follows_the_serve_settings() -> None:
    hc = _load_healthcheck()
    assert hc.readiness_url({}) == "http://127.0.0.1:8000/readyz"
    assert hc.readiness_url({"BAYESGATE_HOST": "0.0.0.0", "BAYESGATE_PORT": "9001"}) == (
        "http://127.0.0.1:9001/readyz"
    )
    assert hc.readiness_url({"BAYESGATE_HOST": "::"}) == "http://[::1]:8000/readyz"
    assert hc.readiness_url({"BAYESGATE_HOST": "10.1.2.3"}, "/healthz") == (
        "http://10.1.2.3:8000/healthz"
    )
    for bad in ("http", "0", "70000"):
        with pytest.raises(ValueError, match="BAYESGATE_PORT"):
            hc.readiness_url({"BAYESGATE_PORT": bad})


_STUB_STATUSES = {"/readyz": 503, "/healthz": 200}


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(_STUB_STATUSES.get(self.path, 404))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_healthcheck_is_unhealthy_until_readyz_answers_200() -> None:
    """Against a stub on the loopback: 503 on /readyz (model still loading) is unhealthy even
    though /healthz answers 200; the exit codes are Docker's (0 healthy, 1 unhealthy)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    script = str(REPO_ROOT / "deploy" / "healthcheck.py")
    env = {**os.environ, "BAYESGATE_HOST": "0.0.0.0", "BAYESGATE_PORT": str(server.server_port)}
    try:
        ready = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True)
        live = subprocess.run(
            [sys.executable, script, "/healthz"], env=env, capture_output=True, text=True
        )
    finally:
        server.shutdown()
        server.server_close()
    assert ready.returncode == 1 and "HTTP 503" in ready.stdout
    assert live.returncode == 0 and "HTTP 200" in live.stdout
