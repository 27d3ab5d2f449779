"""Ray Serve deployment: options from the settings, the application builder and its YAML config,
the replica header, and the CLI's refusals — all without starting Ray (the live cluster test is
``test_service_ray_live.py``)."""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import ValidationError
from ray.serve import Application
from ray.serve.schema import ServeDeploySchema

import bayesgate.service.ray_app as ray_app
from bayesgate.cli import main
from bayesgate.service.ray_app import (
    REPLICA_HEADER,
    app_builder,
    build_application,
    create_replica_app,
)
from bayesgate.service.ray_settings import (
    DEPLOYMENT_NAME,
    RaySettings,
    cluster_options,
    deployment_options,
    describe_options,
    resolve_num_gpus,
)
from bayesgate.service.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO_ROOT / "deploy" / "ray-serve.yaml"


@pytest.fixture(autouse=True)
def _clean_env() -> Iterator[None]:
    """No BAYESGATE_* settings from outside; and the environment restored afterwards, since
    ``bayesgate serve`` writes its flags into ``os.environ`` (for the processes it starts)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("BAYESGATE_") and name != "BAYESGATE_DATA_DIR":
            del os.environ[name]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def options(settings: dict[str, Any] | None = None, **ray: Any) -> dict[str, Any]:
    s = Settings(**(settings or {}))
    r = RaySettings(**ray)
    return deployment_options(s, r, resolve_num_gpus(s, r, cluster_gpus=0))


def test_default_options_admit_two_batches_per_replica() -> None:
    got = options({"max_batch_size": 16, "drain_timeout_s": 7})
    assert got == {
        "name": DEPLOYMENT_NAME,
        "num_replicas": 1,
        "max_ongoing_requests": 32,
        "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0.0},
        "health_check_period_s": 10.0,
        "graceful_shutdown_timeout_s": 7.0,
        # Ray's own logs at the service's level and format; the app writes the access log
        "logging_config": {"log_level": "INFO", "encoding": "JSON", "enable_access_log": False},
    }
    assert describe_options(got) == ("1 replica(s), 0 GPU each, at most 32 ongoing requests each")


def test_ray_logs_follow_the_service_log_settings() -> None:
    got = options({"log_level": "warning", "log_format": "text"})["logging_config"]
    assert got == {"log_level": "WARNING", "encoding": "TEXT", "enable_access_log": False}
    assert options({"log_level": "trace"})["logging_config"]["log_level"] == "DEBUG"


def test_admission_is_capped_by_the_worker_queue() -> None:
    assert options({"max_batch_size": 64, "queue_capacity": 100})["max_ongoing_requests"] == 100


@pytest.mark.parametrize(
    ("settings", "ray", "message"),
    [
        ({"max_batch_size": 32}, {"max_ongoing_requests": 32}, "must exceed max_batch_size"),
        ({"max_batch_size": 32, "queue_capacity": 32}, {}, "must exceed max_batch_size"),
        ({"max_batch_size": 16, "queue_capacity": 50}, {"max_ongoing_requests": 51}, "exceeds"),
        ({}, {"num_replicas": "auto", "min_replicas": 3, "max_replicas": 2}, "min_replicas"),
        ({}, {"num_replicas": 0}, "num_replicas must be ≥ 1"),
        ({"device": "cpu"}, {"num_gpus": 1}, "GPU would sit idle"),
        ({"device": "cuda"}, {}, "needs a GPU per replica"),
    ],
)
def test_clashing_settings_are_refused_by_name(
    settings: dict[str, Any], ray: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        options(settings, **ray)


def test_without_batching_one_request_per_replica_is_allowed() -> None:
    got = options({"max_batch_size": 1}, max_ongoing_requests=1)
    assert got["max_ongoing_requests"] == 1


def test_auto_replicas_autoscale_around_one_full_batch_per_replica() -> None:
    got = options({"max_batch_size": 24}, num_replicas="auto", min_replicas=2, max_replicas=6)
    assert "num_replicas" not in got
    assert got["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 24.0,
        "upscale_delay_s": 10.0,
        "downscale_delay_s": 120.0,
    }
    assert got["max_ongoing_requests"] == 48 > got["autoscaling_config"]["target_ongoing_requests"]
    assert describe_options(got).startswith("autoscaling 2–6 replicas")


@pytest.mark.parametrize(
    ("device", "num_gpus", "cluster_gpus", "expected"),
    [
        ("auto", None, 0, 0.0),  # CPU-only cluster
        ("auto", None, 4, 1.0),  # a GPU each when there are GPUs
        ("cpu", None, 4, 0.0),  # the device setting wins
        ("auto", 0.5, 4, 0.5),  # fractions: two replicas per GPU
        ("cuda", 0.25, 0, 0.25),  # explicit, even if this driver sees no GPU yet
    ],
)
def test_gpus_per_replica(
    device: str, num_gpus: float | None, cluster_gpus: float, expected: float
) -> None:
    s, r = Settings(device=device), RaySettings(num_gpus=num_gpus)
    assert resolve_num_gpus(s, r, cluster_gpus) == expected


def test_ray_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAYESGATE_RAY_NUM_REPLICAS", "auto")
    monkeypatch.setenv("BAYESGATE_RAY_NUM_GPUS", "0.5")
    r = RaySettings()
    assert (r.num_replicas, r.num_gpus) == ("auto", 0.5)
    monkeypatch.setenv("BAYESGATE_RAY_NUM_REPLICAS", "3")
    assert RaySettings().num_replicas == 3
    monkeypatch.setenv("BAYESGATE_RAY_NUM_REPLICAS", "many")
    with pytest.raises(ValidationError):
        RaySettings()


def test_build_application_returns_a_serve_application() -> None:
    options = cluster_options(Settings(), RaySettings(num_replicas=2), cluster_gpus=0)
    assert isinstance(build_application(options), Application)


def test_serve_config_is_valid_and_its_args_reach_the_builder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """deploy/ray-serve.yaml passes Ray's own schema, its import path is the builder, and the
    builder turns its args into the deployment options they say."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    ServeDeploySchema.model_validate(config)
    [application] = config["applications"]
    module, _, name = application["import_path"].partition(":")
    assert getattr(importlib.import_module(module), name) is app_builder
    assert application["route_prefix"] == "/"  # every route at the same path as bayesgate serve

    seen: dict[str, Any] = {}

    def capture(options: dict[str, Any], overrides: dict[str, Any]) -> str:
        seen.update(options=options, overrides=overrides)
        return "application"

    monkeypatch.setattr(ray_app, "build_application", capture)
    monkeypatch.setattr("ray.is_initialized", lambda: True)  # as inside `serve deploy`
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 16.0, "GPU": 8.0})
    assert app_builder(application["args"]) == "application"
    # the replicas rebuild their settings from the same overrides
    settings = Settings(**seen["overrides"])
    assert settings.max_batch_size == 64 and settings.max_queue_delay_ms == 5
    got = seen["options"]
    assert got["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert got["max_ongoing_requests"] == 128
    assert got["autoscaling_config"]["max_replicas"] == 8
    assert got["autoscaling_config"]["target_ongoing_requests"] == 64
    # the proxy's timeout sits above the app's own deadline, so clients get the app's 504
    assert config["http_options"]["request_timeout_s"] > settings.request_timeout_s


def test_serve_config_restates_no_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each arg of deploy/ray-serve.yaml changes the deployment it builds (an arg equal to a
    default, or to what the code derives from the other settings, would not), and no
    environment variable of its runtime_env restates a setting's default."""
    [application] = yaml.safe_load(SERVE_CONFIG.read_text())["applications"]
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(
        ray_app, "build_application", lambda options, overrides: seen.append(options)
    )
    monkeypatch.setattr("ray.is_initialized", lambda: True)
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 16.0, "GPU": 8.0})
    args = application["args"]
    app_builder(args)
    for key in args:
        app_builder({k: v for k, v in args.items() if k != key})
        assert seen[-1] != seen[0], f"{key}: {args[key]!r} is already what the code does"
    for key, value in (application.get("runtime_env", {}).get("env_vars") or {}).items():
        field = key.removeprefix("BAYESGATE_").lower()
        assert getattr(Settings(**{field: value}), field) != Settings.model_fields[field].default


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_batch": 8}, "unknown BayesGate application args: max_batch"),
        ({"ray_replicas": 2}, "unknown BayesGate application args: ray_replicas"),
        ({"max_batch_size": 0}, "invalid BayesGate application args"),
        ({"ray_num_replicas": "lots"}, "invalid BayesGate application args"),
        ({"max_batch_size": 64, "ray_max_ongoing_requests": 64}, "must exceed max_batch_size"),
    ],
)
def test_app_builder_refuses_bad_args(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        app_builder(args)


@pytest.mark.anyio
async def test_replica_app_names_the_replica_and_leaves_request_ids_to_the_proxy(
    make_settings: Any,
) -> None:
    app = create_replica_app(make_settings(), "replica-7")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            ready = await client.get("/readyz", headers={"X-Request-ID": "abc"})
            missing = await client.get("/v1/models/nope")
    assert ready.status_code == 200
    assert ready.headers[REPLICA_HEADER] == "replica-7"
    assert "x-request-id" not in ready.headers  # Ray's proxy adds exactly one
    assert missing.status_code == 404 and missing.headers[REPLICA_HEADER] == "replica-7"


@pytest.mark.anyio
async def test_replica_health_check_fails_once_the_inference_thread_is_gone(
    make_settings: Any,
) -> None:
    from types import SimpleNamespace

    from bayesgate.service.ray_app import BayesGateReplica

    app = create_replica_app(make_settings(), "replica-1")
    replica = SimpleNamespace(_app=app)  # the attributes check_health reads
    BayesGateReplica.check_health(replica)  # not started yet: healthy (Ray waits for start-up)
    async with app.router.lifespan_context(app):
        BayesGateReplica.check_health(replica)
        app.state.worker.stop()
        with pytest.raises(RuntimeError, match="inference worker thread is not running"):
            BayesGateReplica.check_health(replica)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["serve", "--address", "auto"], {}, "--address and --detach only apply with --ray"),
        (["serve", "--ray", "--workers", "2"], {}, "set BAYESGATE_RAY_NUM_REPLICAS instead"),
        (["serve", "--ray", "--detach"], {}, "--detach needs --address"),
        (["serve", "--ray", "--address", "127.0.0.1:1"], {}, "cannot reach the Ray cluster at"),
        (["serve", "--ray"], {"BAYESGATE_RAY_NUM_REPLICAS": "lots"}, "BAYESGATE_RAY_NUM_REPLICAS"),
        (
            ["serve", "--ray"],
            {"BAYESGATE_MAX_BATCH_SIZE": "64", "BAYESGATE_RAY_MAX_ONGOING_REQUESTS": "10"},
            "must exceed max_batch_size",
        ),
    ],
)
def test_serve_ray_refuses_bad_combinations_before_starting_ray(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import ray

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayesgate: error: ") and message in err
    assert not ray.is_initialized()


def test_serve_ray_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if `ray` were not installed
    assert main(["serve", "--ray"]) == 2
    err = capsys.readouterr().err
    assert "--ray needs Ray Serve (ray is not installed): pip install 'bayesgate[ray]'" in err


class FakeRay:
    """Stands in for ``ray`` and ``ray.serve`` in :mod:`bayesgate.service.ray_run`: records the
    calls."""

    def __init__(self, run_error: Exception | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.initialized = False
        self.run_error = run_error

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import ray
        from ray import serve

        monkeypatch.setattr(ray, "init", self.init)
        monkeypatch.setattr(ray, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
        monkeypatch.setattr(ray, "shutdown", lambda: self.calls.append(("ray.shutdown", None)))
        monkeypatch.setattr(serve, "start", lambda **kw: self.calls.append(("serve.start", kw)))
        monkeypatch.setattr(serve, "run", self.run)
        monkeypatch.setattr(serve, "shutdown", lambda: self.calls.append(("serve.shutdown", None)))

    def init(self, **kwargs: Any) -> None:
        self.initialized = True
        self.calls.append(("ray.init", kwargs))

    def run(self, app: Any, **kwargs: Any) -> None:
        self.calls.append(("serve.run", kwargs))
        if self.run_error is not None:
            raise self.run_error

    def kwargs(self, name: str) -> dict[str, Any]:
        return next(kw for call, kw in self.calls if call == name)


def test_detached_deploy_ships_the_settings_to_the_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRay()
    fake.install(monkeypatch)
    monkeypatch.setenv("BAYESGATE_MAX_BATCH_SIZE", "12")
    monkeypatch.setenv("BAYESGATE_RAY_APP_NAME", "digits")
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert main(["serve", "--ray", "--address", "auto", "--detach", "--port", "8123"]) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    init = fake.kwargs("ray.init")
    assert init["address"] == "auto"
    env = init["runtime_env"]["env_vars"]
    # the flags are applied first, so the replicas see the checked settings
    assert env["BAYESGATE_MAX_BATCH_SIZE"] == "12" and env["BAYESGATE_PORT"] == "8123"
    assert "BAYESGATE_RUNTIME_DIR" not in env  # remote cluster: no local shared directory
    assert fake.kwargs("serve.start")["http_options"]["port"] == 8123
    assert fake.kwargs("serve.run") == {"name": "digits", "route_prefix": "/"}
    # detached: the driver disconnects, the application stays
    assert ("serve.shutdown", None) not in fake.calls and ("ray.shutdown", None) in fake.calls


def test_a_local_run_forgets_the_previous_runs_admin_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeRay()
    fake.install(monkeypatch)
    # the deploy "succeeds" and a SIGTERM arrives at once
    monkeypatch.setattr("ray.serve.run", lambda app, **kw: signal.raise_signal(signal.SIGTERM))
    (tmp_path / "admin.json").write_text('{"generation": 3, "threshold": 0.1}')
    monkeypatch.setenv("BAYESGATE_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr("ray.serve.delete", lambda name: None)
    assert main(["serve", "--ray"]) == 0  # deploys, gets SIGTERM, deletes the app, exits 0
    assert not (tmp_path / "admin.json").exists()
    env = fake.kwargs("ray.init")["runtime_env"]["env_vars"]
    assert env["BAYESGATE_RUNTIME_DIR"] == str(tmp_path)


def test_a_replica_that_fails_to_start_is_exit_3_and_ray_is_stopped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeRay(RuntimeError("Deploying application bayesgate failed: replica died"))
    fake.install(monkeypatch)
    monkeypatch.setenv("BAYESGATE_RAY_NUM_REPLICAS", "2")
    assert main(["serve", "--ray"]) == 3
    err = capsys.readouterr().err
    assert "bayesgate: error: deployment failed: Deploying application bayesgate failed" in err
    assert fake.kwargs("ray.init")["address"] == "local"
    # a local instance with several replicas gets a shared runtime dir, removed at exit
    runtime_dir = Path(fake.kwargs("ray.init")["runtime_env"]["env_vars"]["BAYESGATE_RUNTIME_DIR"])
    assert not runtime_dir.exists()
    assert ("serve.shutdown", None) in fake.calls and ("ray.shutdown", None) in fake.calls
