"""``bayesgate serve``'s pre-flight names what to change: the flag when the value came from a
flag, the variable when it came from the environment; a missing gRPC extra is one line before
anything starts, and a StartupError in the app's lifespan is one line without its traceback."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from serve_process import free_port

from bayesgate import extras
from bayesgate.cli import main
from bayesgate.service import cli as service_cli
from bayesgate.service.app import create_app
from bayesgate.service.event_loop import loop_label
from bayesgate.service.settings import Settings
from tests.service.lifespan import startup_failure_message


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


@pytest.fixture
def never_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_uvicorn(config: Any, **_: Any) -> None:
        raise AssertionError("the server started although the pre-flight should have refused")

    monkeypatch.setattr(service_cli, "run_uvicorn", run_uvicorn)


@pytest.fixture
def no_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name.split(".")[0] == "grpc" else real(name, *args)

    monkeypatch.setattr(extras, "find_spec", find_spec)


@pytest.mark.parametrize("source", ["flag", "env"])
def test_grpc_port_without_the_grpc_extra_is_one_line(
    source: str,
    tiny_model_dir: Path,
    no_grpc: None,
    never_serves: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["serve", "--model-dir", str(tiny_model_dir), "--port", str(free_port())]
    if source == "flag":
        argv += ["--grpc-port", str(free_port())]
    else:
        monkeypatch.setenv("BAYESGATE_GRPC_PORT", str(free_port()))
    assert main(argv) == 2
    named = "--grpc-port" if source == "flag" else "BAYESGATE_GRPC_PORT"
    assert _one_line(capsys) == (
        f"bayesgate: error: {named}: gRPC needs the grpc extra (grpc is not installed): "
        "pip install 'bayesgate[grpc]'"
    )


@pytest.mark.anyio
async def test_a_startup_error_after_the_model_loads_is_one_line_not_a_traceback(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gRPC server fails to start (its extra missing) inside the lifespan, after the model
    loaded: the lifespan.startup.failed message is the StartupError's line."""
    monkeypatch.setitem(sys.modules, "bayesgate.service.grpc_server", None)  # import fails
    app = create_app(make_settings(grpc_port=free_port()))
    text = await startup_failure_message(app)
    assert text.startswith("cannot serve the model: BAYESGATE_GRPC_PORT is set but gRPC is not")
    assert "\n" not in text and "Traceback" not in text


def test_a_check_of_two_settings_names_both_variables_without_the_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BAYESGATE_DEFAULT_MC_SAMPLES", "500")
    assert main(["serve", "--port", "8019"]) == 2
    assert _one_line(capsys) == (
        "bayesgate: error: BAYESGATE_DEFAULT_MC_SAMPLES (500) exceeds "
        "BAYESGATE_MAX_MC_SAMPLES (100)"
    )


def test_one_port_for_http_and_grpc_is_refused_before_anything_binds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: the page URL was printed, gRPC bound the port, and uvicorn died on it (exit 3)."""
    assert main(["serve", "--port", "8019", "--grpc-port", "8019"]) == 2
    assert _one_line(capsys) == (
        "bayesgate: error: BAYESGATE_GRPC_PORT (8019) must differ from BAYESGATE_PORT "
        "(gRPC is served on a port of its own)"
    )


def test_a_bad_value_is_named_by_the_flag_that_gave_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    err = _one_line(capsys)
    assert err.startswith("bayesgate: error: --port: ") and "(got 70000)" in err
    assert "BAYESGATE_PORT" not in err
    monkeypatch.setenv("BAYESGATE_PORT", "70000")
    assert main(["serve"]) == 2
    err = _one_line(capsys)
    assert err.startswith("bayesgate: error: setting BAYESGATE_PORT: ")
    assert "service link" not in err


def test_a_kubernetes_service_link_in_the_port_setting_is_explained(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Service named bayesgate gives its namespace's pods BAYESGATE_PORT=tcp://IP:80 (found in
    review of deploy/kubernetes, whose pods did not start): the error says where it comes from."""
    monkeypatch.setenv("BAYESGATE_PORT", "tcp://10.96.12.34:80")
    monkeypatch.setenv("BAYESGATE_SERVICE_HOST", "10.96.12.34")
    assert main(["serve"]) == 2
    err = _one_line(capsys)
    assert err.startswith("bayesgate: error: setting BAYESGATE_PORT: ")
    assert "'tcp://10.96.12.34:80'" in err and "enableServiceLinks: false" in err


def test_a_missing_model_dir_flag_is_named_as_the_flag(
    tmp_path: Path, never_serves: None, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nosuch"
    assert main(["serve", "--model-dir", str(missing), "--port", str(free_port())]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"bayesgate: error: --model-dir {missing}: model directory not found")
    assert "bayesgate-robust" in err and "BAYESGATE_MODEL_DIR" not in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # uvloop asked for, not installed (blocked below)
        (
            "uvloop",
            "BAYESGATE_EVENT_LOOP=uvloop: uvloop is not installed (pip install uvloop), "
            "or choose auto or asyncio",
        ),
        (
            "trio",
            "setting BAYESGATE_EVENT_LOOP: Input should be 'auto', 'uvloop' or 'asyncio' "
            "(got 'trio')",
        ),
    ],
)
def test_an_event_loop_that_cannot_run_is_one_line(
    value: str,
    message: str,
    tiny_model_dir: Path,
    never_serves: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    monkeypatch.setenv("BAYESGATE_EVENT_LOOP", value)
    assert main(["serve", "--model-dir", str(tiny_model_dir), "--port", str(free_port())]) == 2
    assert _one_line(capsys) == f"bayesgate: error: {message}"


def test_the_event_loop_setting_reaches_uvicorn(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(service_cli, "run_uvicorn", lambda config, **_: seen.append(config))
    monkeypatch.setenv("BAYESGATE_EVENT_LOOP", "asyncio")
    assert main(["serve", "--model-dir", str(tiny_model_dir), "--port", str(free_port())]) == 0
    factory = seen[0].get_loop_factory()  # uvicorn imports the string as it does at start-up
    loop = factory()
    try:
        assert loop_label(loop) == "bayesgate.ServingSelectorEventLoop"
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("env", "healthcheck_s", "delay_s"),
    [({}, 60, 2.0), ({"WORKER_HEALTHCHECK_TIMEOUT_S": "7", "DRAIN_DELAY_S": "0.75"}, 7, 0.75)],
)
def test_worker_settings_reach_uvicorn_and_the_supervisor(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    healthcheck_s: int,
    delay_s: float,
) -> None:
    """uvicorn's own 5 s would abandon a SIGHUP restart whose new worker is still loading; the
    supervisor needs the drain delay to refuse new connections just before it ends."""
    seen: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(service_cli, "run_uvicorn", lambda config, **kw: seen.append((config, kw)))
    for name in ("WORKER_HEALTHCHECK_TIMEOUT_S", "DRAIN_DELAY_S"):
        monkeypatch.delenv(f"BAYESGATE_{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"BAYESGATE_{name}", value)
    assert main(["serve", "--model-dir", str(tiny_model_dir), "--port", str(free_port())]) == 0
    config, kwargs = seen[0]
    assert config.timeout_worker_healthcheck == healthcheck_s
    assert kwargs == {"drain_delay_s": delay_s}
