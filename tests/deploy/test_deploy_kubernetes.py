"""deploy/kubernetes: the manifests are valid Kubernetes (strict schemas, offline), agree with the
image, and the pod's command serves as the probes expect, writing only where the pod can.

Rendered as ``kubectl apply -k`` would (:mod:`kustomize`), for the CPU base and the GPU overlay,
and validated against the Kubernetes JSON schemas that ``kubernetes-validate`` ships (strict: an
unknown or misspelt field fails).
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_files import REPO_ROOT, Dockerfile
from kustomize import merge, of_kind, pod_template, render, split_image

from bayesgate.service.settings import Settings, settings_from_env

K8S = REPO_ROOT / "deploy" / "kubernetes"
VARIANTS = {"cpu": K8S / "cpu", "gpu": K8S / "gpu"}
# the oldest Kubernetes release still in wide use when this was written, and the newest schema
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
VENV_BIN = Path(sys.executable).parent


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = pod_template(docs)["spec"]["containers"]
    return c


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_manifests_are_valid_kubernetes(variant: str, version: str) -> None:
    docs = render(VARIANTS[variant])
    assert [d["kind"] for d in docs] == ["Service", "Deployment", "PodDisruptionBudget"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_can_fail() -> None:
    docs = render(VARIANTS["cpu"])
    bad = merge(of_kind(docs, "Deployment"), {"spec": {"template": {"spec": {"containers": [
        {"name": "bayesgate", "readinessProbe": {"httpGet": {"path": "/readyz", "prot": 8000}}}
    ]}}}})  # fmt: skip
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_reader_refuses_what_kustomize_refuses_or_it_does_not_know(tmp_path: Path) -> None:
    """An overlay inside its base (Kustomize: "cycle detected"; the first layout had gpu/ inside
    the base and `resources: [..]`, found in review), a file outside the directory, keys,
    directives and nulls it does not implement."""
    write(tmp_path / "kustomization.yaml", "resources: [service.yaml]\n")
    write(tmp_path / "service.yaml", "kind: Service\nmetadata: {name: s}\n")
    write(tmp_path / "gpu" / "kustomization.yaml", "resources: [..]\n")
    with pytest.raises(ValueError, match="cycle"):
        render(tmp_path / "gpu")
    write(tmp_path / "o" / "kustomization.yaml", "resources: [../service.yaml]\n")
    with pytest.raises(ValueError, match="outside"):
        render(tmp_path / "o")
    write(tmp_path / "p" / "kustomization.yaml", "resources: [..]\nnamePrefix: x-\n")
    with pytest.raises(ValueError, match="namePrefix"):
        render(tmp_path / "p")
    service = {"kind": "Service", "spec": {"ports": [{"name": "http", "port": 80}]}}
    with pytest.raises(ValueError, match="patch"):
        merge(service, {"spec": {"$patch": "replace"}})
    with pytest.raises(ValueError, match="null"):
        merge(service, {"spec": {"ports": None}})


def test_the_reader_merges_lists_by_their_kubernetes_keys() -> None:
    service = {"spec": {"ports": [{"name": "http", "port": 80}]}}
    both = merge(service, {"spec": {"ports": [{"name": "grpc", "port": 8001}]}})
    assert [p["port"] for p in both["spec"]["ports"]] == [80, 8001]  # by port, not replaced
    pod = {"containers": [{"name": "a", "ports": [{"containerPort": 1}], "args": ["x"]}]}
    out = merge(pod, {"containers": [{"name": "a", "ports": [{"containerPort": 2}], "args": []}]})
    assert out["containers"][0]["ports"] == [{"containerPort": 1}, {"containerPort": 2}]
    assert out["containers"][0]["args"] == []  # an ordinary list is replaced
    assert split_image("registry.example.com:5000/team/bayesgate:1.4") == (
        "registry.example.com:5000/team/bayesgate",
        "1.4",
    )
    assert split_image("registry.example.com:5000/team/bayesgate") == (
        "registry.example.com:5000/team/bayesgate",
        "",
    )


def test_every_manifest_file_is_a_resource_and_every_variant_is_tested() -> None:
    base = K8S / "base"
    listed = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == files
    overlays = {p.parent.name for p in K8S.glob("*/kustomization.yaml")} - {"base"}
    assert overlays == set(VARIANTS)


def test_the_pod_runs_the_image_as_built(dockerfile: Dockerfile) -> None:
    docs = render(VARIANTS["cpu"])
    pod = pod_template(docs)
    c = container(docs)
    assert c["image"] == "bayesgate:cpu"
    assert "command" not in c and "args" not in c  # the image's ENTRYPOINT + CMD
    assert dockerfile.final_command() == ["bayesgate", "serve"]
    image_env = dockerfile.env({"VARIANT": "cpu"})
    (port,) = c["ports"]
    assert port["containerPort"] == int(image_env["BAYESGATE_PORT"])
    # no Kubernetes service links (a Service named bayesgate sets BAYESGATE_PORT=tcp://…), and
    # the port set explicitly as well, which would win over them
    assert pod["spec"]["enableServiceLinks"] is False
    assert manifest_env(docs)["BAYESGATE_PORT"] == str(port["containerPort"])
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port["containerPort"])
    user = dockerfile.final.all("USER")[-1].args.split(":")
    context = pod["spec"]["securityContext"]
    assert [str(context["runAsUser"]), str(context["runAsGroup"])] == user
    # readiness and start-up ask what the image's own HEALTHCHECK asks; liveness /healthz
    spec = importlib.util.spec_from_file_location("hc", REPO_ROOT / "deploy" / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    healthcheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(healthcheck)
    readiness = healthcheck.DEFAULT_PATH
    assert c["readinessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"]
    assert c["readinessProbe"]["httpGet"]["path"] == readiness
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == port["name"], probe
    # the Service and the budget select these pods, by the port's name
    labels = pod["metadata"]["labels"]
    service = of_kind(docs, "Service")
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    assert of_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == labels
    assert of_kind(docs, "Deployment")["spec"]["selector"]["matchLabels"] == labels
    # everything the service writes goes under the one writable mount
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


def test_the_gpu_overlay_adds_a_gpu_and_keeps_the_rest() -> None:
    cpu, gpu = render(VARIANTS["cpu"]), render(VARIANTS["gpu"])
    c = container(gpu)
    assert c["image"] == "bayesgate:gpu"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container(cpu)["resources"]["limits"]
    assert pod_template(gpu)["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    for name in ("ports", "env", "startupProbe", "readinessProbe", "livenessProbe"):
        assert c[name] == container(cpu)[name], name
    for name in ("securityContext", "volumeMounts"):
        assert c[name] == container(cpu)[name], name
    cpu_pod, gpu_pod = pod_template(cpu)["spec"], pod_template(gpu)["spec"]
    assert {k: v for k, v in gpu_pod.items() if k not in ("containers", "tolerations")} == {
        k: v for k, v in cpu_pod.items() if k != "containers"
    }
    # one replica at a time: a surge pod would wait for a spare GPU
    rolling = of_kind(gpu, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxSurge": 0, "maxUnavailable": 1}
    for kind in ("Service", "PodDisruptionBudget"):
        assert of_kind(gpu, kind) == of_kind(cpu, kind)


def manifest_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment as the kubelet sets it: values, and ``resourceFieldRef``s
    to the container's own CPU request (whole cores, rounded up, as with ``divisor: "1"``)."""
    c = container(docs)
    env = {}
    for entry in c["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]["resourceFieldRef"]
        assert ref == {"containerName": c["name"], "resource": "requests.cpu", "divisor": "1"}
        cpu = str(c["resources"]["requests"]["cpu"])
        cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        env[entry["name"]] = str(math.ceil(cores))
    return env


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_settings_are_valid_and_the_grace_period_covers_the_drain(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(VARIANTS[variant])
    env = manifest_env(docs)
    known = {f"BAYESGATE_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= known, set(env) - known
    for name in [k for k in os.environ if k.startswith("BAYESGATE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = settings_from_env()
    grace = pod_template(docs)["spec"]["terminationGracePeriodSeconds"]
    assert grace >= settings.drain_delay_s + settings.drain_timeout_s + 5
    # a request may take its whole deadline: the drain waits that long for it
    assert settings.drain_timeout_s >= settings.request_timeout_s
    assert settings.num_threads == {"cpu": 2, "gpu": 1}[variant]  # the CPU request


def get(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_the_pod_serves_for_its_probes_and_writes_only_to_tmp(
    dockerfile: Dockerfile, served_model_dir: Path, tmp_path: Path
) -> None:
    """The container's command, with the image's ENV and the manifest's, run here: the startup,
    liveness and readiness probes' URLs answer 200, readiness turns 503 on SIGTERM while requests
    are still served, the process exits within the grace period, and nothing is written outside
    the ``/tmp`` mount (its home and working directory stay empty)."""
    docs = render(VARIANTS["cpu"])
    c = container(docs)
    home, cwd, tmp = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for d in (home, cwd, tmp):
        d.mkdir()
    with socket.socket() as sock:  # a free local port stands in for the container's
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAYESGATE_")}
    env.update({k: v for k, v in dockerfile.env({"VARIANT": "cpu"}).items() if k != "PATH"})
    env.update(manifest_env(docs))
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(home),
        TMPDIR=str(tmp),
        BAYESGATE_HOST="127.0.0.1",
        BAYESGATE_PORT=str(port),
        BAYESGATE_MODEL_DIR=str(served_model_dir),
        BAYESGATE_NUM_THREADS="1",
        BAYESGATE_EVENT_LOOP="asyncio",  # the image has no uvloop
        XDG_CACHE_HOME=str(home / ".cache"),
    )
    env.pop("BAYESGATE_NATIVE_LIBRARY", None)  # the image's path; no native port here
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "bayesgate"), *dockerfile.final_command()[1:]],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    probe = c["startupProbe"]
    try:
        deadline = time.monotonic() + probe["periodSeconds"] * probe["failureThreshold"]
        while get(base + probe["httpGet"]["path"]) != 200:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert get(base + c["livenessProbe"]["httpGet"]["path"]) == 200
        assert get(base + c["readinessProbe"]["httpGet"]["path"]) == 200
        assert get(base + "/metrics") == 200
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # within BAYESGATE_DRAIN_DELAY_S (5 s): draining, still serving
        assert get(base + c["readinessProbe"]["httpGet"]["path"]) == 503
        assert get(base + c["livenessProbe"]["httpGet"]["path"]) == 200
        grace = pod_template(docs)["spec"]["terminationGracePeriodSeconds"]
        assert proc.wait(timeout=grace) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []
    assert "Application shutdown complete" in log.read_text()
