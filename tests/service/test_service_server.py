"""`bayesgate serve` as a real process, start-up failures, the default model and the settings."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from serve_process import bayesgate_command, free_port

from bayesgate import models
from bayesgate.cli import main
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.store.directory import load_model
from bayesgate.service.app import create_app
from bayesgate.service.cli import ENV_PREFIX as CLI_PREFIX
from bayesgate.service.errors import StartupError
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import ENV_PREFIX, Settings, bundled_model_names
from tests.service.lifespan import startup_failure_message

BUNDLED = Path(models.__file__).parent / "pretrained" / "bayesgate-robust"  # the default
PRETRAINED = BUNDLED.parent


def serve_env(model_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAYESGATE_")}
    env.update(
        BAYESGATE_MODEL_DIR=str(model_dir),
        BAYESGATE_DATA_DIR=os.environ.get("BAYESGATE_DATA_DIR", ""),
        BAYESGATE_NUM_THREADS="1",
        BAYESGATE_LOG_LEVEL="warning",
        OMP_NUM_THREADS="1",
    )
    return env


def test_serve_subprocess_predicts_a_real_mnist_digit(
    tiny_model_dir: Path, mnist_test: tuple[torch.Tensor, torch.Tensor]
) -> None:
    x, y = mnist_test
    net = load_model(tiny_model_dir).network
    k, seed = 10, 77
    # The first test digit the model gets right (seeded, as the server will compute it).
    index = next(
        i
        for i in range(len(y))
        if mc_predict(net, x[i : i + 1], k, generator=torch.Generator().manual_seed(seed))
        .probs.mean(1)
        .argmax()
        == y[i]
    )
    reference = mc_predict(
        net, x[index : index + 1], k, generator=torch.Generator().manual_seed(seed)
    )
    port = free_port()
    proc = subprocess.Popen(
        [*bayesgate_command(), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=serve_env(tiny_model_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "server did not become ready in 60 s"
            try:
                if httpx.get(f"{base}/readyz", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        r = httpx.post(
            f"{base}/v1/predict",
            json={"instances": [x[index].tolist()], "mc_samples": k, "seed": seed},
            timeout=10,
            trust_env=False,
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert out.splitlines()[0].startswith(f"bayesgate: page at {base}/")  # printed on start
    assert r.status_code == 200, r.text
    [pred] = r.json()["predictions"]
    assert pred["label"] == int(y[index])
    assert torch.allclose(
        torch.tensor(pred["probabilities"]), reference.probs.mean(1)[0], atol=1e-7
    )
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def _break(directory: Path, how: str) -> str:
    """Damage a copy of the model directory; return the file name the error must mention."""
    if how == "no calibration":
        (directory / "calibration.json").unlink()
        return "calibration.json"
    if how == "tampered weights":
        blob = bytearray((directory / "model.safetensors").read_bytes())
        blob[-1] ^= 0xFF
        (directory / "model.safetensors").write_bytes(bytes(blob))
        return "model.safetensors"
    if how == "calibration of other weights":
        data = json.loads((directory / "calibration.json").read_text())
        data["model_sha256"] = "0" * 64
        (directory / "calibration.json").write_text(json.dumps(data))
        return "calibration.json"
    if how == "card not JSON":
        (directory / "card.json").write_text("{not json")
        return "card.json"
    raise AssertionError(how)


def test_serve_refuses_a_broken_model_with_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    cases = ["no calibration", "tampered weights"]
    runs = []
    for i, how in enumerate(cases):  # both processes at once: start-up is import-bound
        broken = tmp_path / f"model-{i}"
        shutil.copytree(tiny_model_dir, broken)
        name = _break(broken, how)
        proc = subprocess.Popen(
            [*bayesgate_command(), "serve", "--port", str(free_port())],
            env=serve_env(broken),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        runs.append((how, broken / name, proc))
    for how, path, proc in runs:
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"bayesgate: error: {path}: ")
        assert ("not found" if how == "no calibration" else "does not match the card") in lines[0]


@pytest.mark.parametrize(
    "how", ["no calibration", "tampered weights", "calibration of other weights", "card not JSON"]
)
@pytest.mark.anyio
async def test_lifespan_failure_reports_one_line_to_the_server(
    make_settings: Callable[..., Settings], tmp_path: Path, tiny_model_dir: Path, how: str
) -> None:
    """Through the ASGI lifespan protocol (as uvicorn runs it): the failure message is the
    StartupError line, not a traceback."""
    broken = tmp_path / "model"
    shutil.copytree(tiny_model_dir, broken)
    name = _break(broken, how)
    app = create_app(make_settings(model_dir=broken))
    message = await startup_failure_message(app)
    assert message.startswith(f"cannot serve the model: {broken / name}: ")
    assert "\n" not in message and "Traceback" not in message


def test_invalid_setting_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BAYESGATE_MAX_BATCH_SIZE", "0")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bayesgate: error: setting BAYESGATE_MAX_BATCH_SIZE:")
    assert "greater than or equal to 1" in err and "\n" not in err


def test_an_address_in_use_or_unknown_host_is_one_line_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was a JSON log line from uvicorn after the start-up, exit code 3."""
    import socket

    from bayesgate.service import cli as service_cli

    def no_model(*_: object, **__: object) -> None:
        raise AssertionError("the model was loaded before the address was checked")

    monkeypatch.setattr("bayesgate.service.served_model.load_served_model", no_model)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"bayesgate: error: --host/--port: cannot listen on 127.0.0.1:{port} "
            "(Address already in use)\n"
        )
        assert main(["serve", "--port", str(free_port()), "--grpc-port", str(port)]) == 2
        assert "--grpc-port: cannot listen on" in capsys.readouterr().err
    assert main(["serve", "--host", "no-such-host.invalid", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayesgate: error: --host/--port: cannot resolve host")
    assert err.count("\n") == 1
    service_cli.check_listen("127.0.0.1", free_port(), "--port")  # a free port passes


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("BAYESGATE_"):
            monkeypatch.delenv(name)
    defaults = Settings()
    assert defaults.model_dir == BUNDLED
    assert (defaults.host, defaults.port, defaults.workers, defaults.device) == (
        "127.0.0.1",
        8000,
        1,
        "auto",
    )
    monkeypatch.setenv("BAYESGATE_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("BAYESGATE_MAX_QUEUE_DELAY_MS", "12.5")
    monkeypatch.setenv("BAYESGATE_DOCS", "false")
    monkeypatch.setenv("BAYESGATE_DEVICE", "cpu")
    s = Settings()
    assert (s.max_batch_size, s.max_queue_delay_s, s.docs, s.device) == (7, 0.0125, False, "cpu")
    assert CLI_PREFIX == ENV_PREFIX
    monkeypatch.setenv("BAYESGATE_DEFAULT_MC_SAMPLES", "200")
    expected = r"BAYESGATE_DEFAULT_MC_SAMPLES \(200\) exceeds BAYESGATE_MAX_MC_SAMPLES \(100\)"
    with pytest.raises(ValueError, match=expected):
        Settings()


def test_bundled_default_model_loads_when_present() -> None:
    """The bundled model is optional in a checkout; when it is there it must load and match its
    calibration. Its quality is not tested here."""
    if BUNDLED.is_dir():
        serving = load_served_model(BUNDLED, "cpu")
        assert serving.calibration.model_sha256 == serving.card.weights_sha256
        x = torch.zeros(2, *serving.input_shape)
        assert mc_predict(serving.network, x, 3).probs.shape == (2, 3, len(serving.card.classes))
    else:
        with pytest.raises(StartupError, match="model directory not found"):
            load_served_model(BUNDLED, "cpu")


def test_every_bundled_model_loads_with_its_calibration_and_detector() -> None:
    """Each shipped model directory loads, its calibration and its fused detector belong to its
    weights (the loader checks the sha256s), and it answers a batch."""
    names = bundled_model_names()
    assert names == ["bayesgate-cnn", "bayesgate-robust"]
    for name in names:
        serving = load_served_model(PRETRAINED / name, "cpu")
        assert serving.calibration.model_sha256 == serving.card.weights_sha256
        assert serving.detector is not None, f"{name} ships without its fitted detector"
        x = torch.zeros(2, *serving.input_shape)
        assert mc_predict(serving.network, x, 3).probs.shape == (2, 3, len(serving.card.classes))


def test_a_bundled_model_is_chosen_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BAYESGATE_MODEL_DIR", raising=False)
    assert Settings().model_dir == BUNDLED  # the default is the robust model
    assert Settings(model_dir=Path("bayesgate-cnn")).model_dir == PRETRAINED / "bayesgate-cnn"
    assert Settings(model_dir=Path("bayesgate-default")).model_dir == BUNDLED  # an alias
    monkeypatch.setenv("BAYESGATE_MODEL_DIR", "bayesgate-cnn")
    assert Settings().model_dir == PRETRAINED / "bayesgate-cnn"
    (tmp_path / "bayesgate-cnn").mkdir()  # a directory of that name here wins
    assert Settings().model_dir == Path("bayesgate-cnn")
    with pytest.raises(StartupError, match="bayesgate-cnn, bayesgate-robust, or bayesgate-default"):
        load_served_model(Path("no-such-model"), "cpu")


@pytest.mark.anyio
async def test_failing_warm_up_stops_start_up(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("kernel missing")

    monkeypatch.setattr("bayesgate.service.engine.mc_predict", broken)
    app = create_app(make_settings())
    with pytest.raises(StartupError, match="cannot answer a blank image \\(kernel missing\\)"):
        async with app.router.lifespan_context(app):  # the load check sees it first…
            pass
    # …and what passes two blank images but fails the warm-up batch (its size, memory) stops
    # the start-up there
    monkeypatch.setattr("bayesgate.service.served_model.check_answers", lambda _: None)
    app = create_app(make_settings())
    with pytest.raises(StartupError, match="warm-up batch failed: inference failed: RuntimeError"):
        async with app.router.lifespan_context(app):
            pass
    assert app.state.ready is False
    assert not app.state.worker.running
