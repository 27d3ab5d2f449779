"""docker-compose.yml checked without a Docker engine: the Compose specification schema
(check-jsonschema), the GPU reservation and CPU profile, environment, volumes, health check."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import COMPOSE_FILE, REPO_ROOT, Dockerfile, compose_environment, interpolate

from bayesgate.service.settings import Settings

SCHEMA_ARGS = ["--builtin-schema", "vendor.compose-spec"]


def _validate(check_jsonschema: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [check_jsonschema, *SCHEMA_ARGS, str(path)], capture_output=True, text=True, timeout=120
    )


def _container_env(dockerfile: Dockerfile, name: str, service: Any, shell: dict[str, str]) -> Any:
    """The container's environment: the image's ENV overlaid with the service's."""
    variant = "gpu" if name == "bayesgate" else "cpu"
    return {**dockerfile.env({"VARIANT": variant}), **compose_environment(service, shell)}


def test_compose_file_follows_the_compose_specification(check_jsonschema: str) -> None:
    result = _validate(check_jsonschema, COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("edit", "reported"),
    [
        ({"restart_policy": "always"}, "restart_policy"),  # a misspelt key
        ({"ports": {"8000": 8000}}, "ports"),  # a map where the spec wants a list
    ],
)
def test_schema_check_rejects_an_invalid_compose_file(
    check_jsonschema: str,
    compose: dict[str, Any],
    tmp_path: Path,
    edit: dict[str, Any],
    reported: str,
) -> None:
    """The check really validates; the unbroken data passes after the same YAML round trip."""
    good = tmp_path / "good.yml"
    good.write_text(yaml.safe_dump(compose))
    assert _validate(check_jsonschema, good).returncode == 0
    broken = copy.deepcopy(compose)
    broken["services"]["bayesgate"].update(edit)
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(broken))
    result = _validate(check_jsonschema, bad)
    assert result.returncode == 1, result.stdout
    assert reported in result.stdout, result.stdout


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET}-$SET-${UNSET}", env) == "x-x-"
    assert interpolate("${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${SET:-d}", env) == "d d  x"
    assert interpolate("${SET:+alt}|${EMPTY:+alt}|${EMPTY+alt}", env) == "alt||alt"
    assert interpolate("$${SET} costs $$5", env) == "${SET} costs $5"
    with pytest.raises(ValueError, match="UNSET"):
        interpolate("${UNSET:?set it}", env)
    with pytest.raises(ValueError, match="invalid interpolation"):
        interpolate("${1BAD}", env)


def test_environment_value_without_a_value_passes_through_or_is_unset() -> None:
    service = {"environment": {"A": "${B:-1}", "PASS": None, "FLAG": True}}
    assert compose_environment(service, {}) == {"A": "1", "FLAG": "true"}
    assert compose_environment(service, {"PASS": "7", "B": "2"}) == {
        "A": "2",
        "PASS": "7",
        "FLAG": "true",
    }
    assert compose_environment({"environment": ["X=1", "PASS"]}, {}) == {"X": "1"}


def test_gpu_service_reserves_one_nvidia_gpu(
    compose: dict[str, Any], dockerfile: Dockerfile
) -> None:
    gpu = compose["services"]["bayesgate"]
    assert "profiles" not in gpu, "the GPU service is the default one"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert gpu["build"]["args"]["VARIANT"] == "gpu"
    assert _container_env(dockerfile, "bayesgate", gpu, {})["BAYESGATE_DEVICE"] == "cuda"


def test_cpu_service_is_profile_gated_and_reserves_no_gpu(
    compose: dict[str, Any], dockerfile: Dockerfile
) -> None:
    cpu = compose["services"]["bayesgate-cpu"]
    assert cpu["profiles"] == ["cpu"]
    assert "deploy" not in cpu
    assert cpu["build"]["args"]["VARIANT"] == "cpu"
    assert _container_env(dockerfile, "bayesgate-cpu", cpu, {})["BAYESGATE_DEVICE"] == "cpu"
    # Apart from the device (the image's; only the GPU one may be changed) and the CPU thread
    # count, both services serve the same way.
    gpu = compose["services"]["bayesgate"]
    assert set(gpu["environment"]) - set(cpu["environment"]) == {"BAYESGATE_DEVICE"}
    assert set(cpu["environment"]) - set(gpu["environment"]) == {"BAYESGATE_NUM_THREADS"}
    gpu_env = _container_env(dockerfile, "bayesgate", gpu, {})
    cpu_env = _container_env(dockerfile, "bayesgate-cpu", cpu, {})
    differing = {k for k in gpu_env.keys() | cpu_env.keys() if gpu_env.get(k) != cpu_env.get(k)}
    assert differing == {"BAYESGATE_DEVICE"}


def test_optional_services_are_profile_gated(compose: dict[str, Any]) -> None:
    """Only the GPU service starts on a plain `docker compose up`."""
    unprofiled = [name for name, s in compose["services"].items() if not s.get("profiles")]
    assert unprofiled == ["bayesgate"]
    assert compose["services"]["prometheus"]["profiles"] == ["monitoring"]
    assert compose["services"]["nginx"]["profiles"] == ["lb"]


@pytest.mark.parametrize("name", ["bayesgate", "bayesgate-cpu"])
def test_service_environment_restates_no_default(
    compose: dict[str, Any], dockerfile: Dockerfile, name: str
) -> None:
    """Every BAYESGATE_* variable is a setting (a typo would be silently ignored by the service)
    and none carries a value: defaults live in the service's Settings and the image's ENV only,
    and the compose file passes through what the shell sets."""
    service = compose["services"][name]
    fields = Settings.model_fields
    for key, value in service["environment"].items():
        assert key.startswith("BAYESGATE_"), key
        assert key.removeprefix("BAYESGATE_").lower() in fields, f"{key} is not a setting"
        assert value is None, f"{key}: {value!r} restates a default; list it without a value"
    container = _container_env(dockerfile, name, service, {})
    settings = Settings(
        **{
            k.removeprefix("BAYESGATE_").lower(): v
            for k, v in container.items()
            if k.startswith("BAYESGATE_")
        }
    )
    assert settings.host == "0.0.0.0" and settings.port == 8000
    assert str(settings.model_dir) == "/opt/bayesgate/default-model"
    assert settings.device == ("cuda" if name == "bayesgate" else "cpu")
    shell = {"BAYESGATE_MAX_BATCH_SIZE": "32", "BAYESGATE_MODEL_DIR": "/models/cnn"}
    passed = _container_env(dockerfile, name, service, shell)
    assert passed["BAYESGATE_MAX_BATCH_SIZE"] == "32"
    assert passed["BAYESGATE_MODEL_DIR"] == "/models/cnn"
    grace = service["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace)
    defaults = Settings()
    assert int(grace[:-1]) >= defaults.drain_delay_s + defaults.drain_timeout_s + 5


@pytest.mark.parametrize("name", ["bayesgate", "bayesgate-cpu"])
def test_service_ports_volume_healthcheck_and_restart(
    compose: dict[str, Any], dockerfile: Dockerfile, name: str
) -> None:
    service = compose["services"][name]
    env = _container_env(dockerfile, name, service, {})
    (port,) = service["ports"]
    host_port, container_port = interpolate(port, {}).rsplit(":", 1)
    assert container_port == env["BAYESGATE_PORT"]
    assert re.fullmatch(r"\d+(-\d+)?", host_port)
    assert interpolate(port, {"BAYESGATE_HOST_PORT": "8000-8003"}) == "8000-8003:8000"

    (volume,) = service["volumes"]
    assert volume["type"] == "bind" and volume["read_only"] is True
    assert volume["target"] == "/models"
    assert (REPO_ROOT / interpolate(volume["source"], {})).is_dir()

    health = service["healthcheck"]
    _, command = dockerfile.healthcheck()
    assert health["test"] == ["CMD", *command]
    assert re.fullmatch(r"\d+s", health["start_period"])
    assert int(health["start_period"][:-1]) >= 30
    assert service["restart"] in {"always", "unless-stopped", "on-failure"}
    assert service["networks"]["default"]["aliases"] == ["bayesgate-backend"]
    # hardened as the Kubernetes pod: read-only root (only /tmp written), no capabilities
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    assert service["cap_drop"] == ["ALL"]
    assert service["security_opt"] == ["no-new-privileges:true"]


def test_admin_and_metrics_are_not_served_through_the_balancer_nor_prometheus_publicly(
    compose: dict[str, Any],
) -> None:
    """An admin change through nginx would reach one replica of several, and the metrics are
    scraped per replica: nginx answers 404 for both (and nothing else), longest match first.
    Prometheus (no auth) is published on the host's loopback unless told otherwise."""
    nginx_conf = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    (pattern,) = re.findall(r"location ~ (\S+) \{\s*return 404;", nginx_conf)
    for path in ("/admin/threshold", "/admin", "/metrics", "/metrics/"):
        assert re.search(pattern, path), path
    for path in ("/v1/predict", "/v2/models/m/infer", "/administer", "/metricsx", "/healthz"):
        assert not re.search(pattern, path), path
    (port,) = compose["services"]["prometheus"]["ports"]
    assert interpolate(port, {}) == "127.0.0.1:9090:9090"
    assert interpolate(port, {"BAYESGATE_PROMETHEUS_BIND": "0.0.0.0"}) == "0.0.0.0:9090:9090"


def test_load_balancer_and_prometheus_reach_every_replica(compose: dict[str, Any]) -> None:
    """nginx and Prometheus address the replicas by the network alias on the container port."""
    nginx_conf = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    assert "resolver 127.0.0.11" in nginx_conf
    assert re.search(r"set \$bayesgate http://bayesgate-backend:8000;", nginx_conf)
    assert "proxy_pass $bayesgate;" in nginx_conf

    prometheus = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd == {**sd, "names": ["bayesgate-backend"], "type": "A", "port": 8000}
    for service in ("nginx", "prometheus"):
        for volume in compose["services"][service]["volumes"]:
            if isinstance(volume, dict):
                assert (REPO_ROOT / volume["source"]).is_file()
                assert volume["read_only"] is True
