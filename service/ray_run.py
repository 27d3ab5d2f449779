"""``bayesgate serve --ray``: deploy the service onto a Ray cluster and run it in the foreground.

Without ``--address`` a single-node Ray instance is started on this machine (and stopped at
exit); with ``--address`` (``auto``, ``HOST:6379`` or ``ray://HOST:10001``) the application is
deployed onto that running cluster. Either way the command waits until every replica has loaded
the model and run its warm-up batch, logs the URL, and serves until SIGINT/SIGTERM, then deletes
the application (Ray drains each replica's in-flight requests). ``--detach`` leaves the
application running on the cluster and returns at once (remove it with
``serve delete bayesgate`` or ``serve shutdown``).

The replicas get this process's ``BAYESGATE_*`` variables (after the CLI flags are applied) as
their ``runtime_env`` env vars, so they see exactly the settings checked here. On a local
instance with several replicas a shared runtime directory is created, as for
``bayesgate serve --workers N``, so an admin change made through one replica reaches all.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from bayesgate.errors import InvalidArgument
from bayesgate.service.control import forget_admin_changes
from bayesgate.service.logs import configure_logging
from bayesgate.service.ray_settings import (
    RaySettings,
    check_settings,
    cluster_options,
    describe_options,
    ray_logging_config,
)
from bayesgate.service.settings import ENV_PREFIX, Settings

log = logging.getLogger("bayesgate.ray")

PROXY_TIMEOUT_MARGIN_S = 5.0
CONNECT_TIMEOUT_S = 5.0  # the proxy's timeout sits above the app's own 504 deadline


class DeployFailed(RuntimeError):
    """The application did not reach RUNNING (a replica failed to start)."""


def replica_env(
    local: bool, settings: Settings, ray_settings: RaySettings
) -> tuple[dict[str, str], Path | None]:
    """The ``BAYESGATE_*`` env vars for the replicas, and a runtime dir this call created."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    created = None
    several = ray_settings.num_replicas == "auto" or ray_settings.num_replicas > 1
    if local and several and settings.runtime_dir is None:
        created = Path(tempfile.mkdtemp(prefix="bayesgate-ray-"))
        env[ENV_PREFIX + "RUNTIME_DIR"] = str(created)
    elif local and settings.runtime_dir is not None:
        forget_admin_changes(settings.runtime_dir)  # as `bayesgate serve --workers N` does
    return env, created


def _connect(ray: ModuleType, address: str | None, env: dict[str, str]) -> None:
    """``ray.init``: a new local instance, or the cluster at ``address`` (``ValueError`` with
    Ray's reason when it cannot be reached or refuses this client)."""
    from ray.exceptions import AuthenticationError

    if address is not None:
        _check_reachable(address)
    try:
        ray.init(
            address="local" if address is None else address,
            runtime_env={"env_vars": env},
            include_dashboard=False if address is None else None,
            configure_logging=True,
        )
    except (ConnectionError, AuthenticationError) as exc:
        chain = f"{exc} {exc.__cause__ or ''}"
        reason = str(exc).strip().splitlines()[0]
        if "authentication" in chain.lower() or "token" in chain.lower():
            reason += (
                " — the cluster refused this client's authentication token. Clusters started by "
                "`ray start` use token authentication: set RAY_AUTH_MODE=token and provide the "
                "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (docs/ray.md)"
            )
        raise InvalidArgument(f"cannot connect to the Ray cluster at {address}: {reason}") from None


def _check_reachable(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` nobody listens on (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://…": Ray resolves these itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise InvalidArgument(f"cannot reach the Ray cluster at {address}: {exc}") from None


def _deploy(settings: Settings, ray_settings: RaySettings) -> dict[str, Any]:
    """Start Serve's proxy and deploy the application on the connected cluster; returns the
    deployment options (:class:`DeployFailed` when a replica cannot start)."""
    import ray
    from ray import serve

    from bayesgate.service.ray_app import build_application

    cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
    options = cluster_options(settings, ray_settings, cluster_gpus)
    app = build_application(options)
    serve.start(
        http_options={
            "host": settings.host,
            "port": settings.port,
            "request_timeout_s": settings.request_timeout_s + PROXY_TIMEOUT_MARGIN_S,
        },
        logging_config=ray_logging_config(settings),  # the proxy's and controller's logs
    )
    try:
        serve.run(app, name=ray_settings.app_name, route_prefix="/")
    except RuntimeError as exc:
        raise DeployFailed(f"deployment failed: {exc}") from exc
    return options


def run_on_ray(settings: Settings, address: str | None, detach: bool) -> int:
    """Deploy and (unless ``detach``) serve until a signal; returns the exit code."""
    import ray
    from ray import serve

    configure_logging(settings.log_level, settings.log_format)
    ray_settings = RaySettings()
    local = address is None
    if detach and local:
        raise InvalidArgument(
            "--detach needs --address: a local Ray instance ends with this command"
        )
    check_settings(settings, ray_settings)
    env, runtime_dir = replica_env(local, settings, ray_settings)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # SIGTERM during start-up is remembered (the deploy finishes, then everything is cleaned up);
    # SIGINT raises KeyboardInterrupt until the application is up, which cleans up the same way.
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, on_signal)
    try:
        _connect(ray, address, env)
        signal.signal(signal.SIGTERM, on_signal)  # again: ray.init installs its own (it aborts)
        options = _deploy(settings, ray_settings)
        log.info(
            "ready on Ray: http://%s:%d/ (application %s, %s); %s",
            settings.host,
            settings.port,
            ray_settings.app_name,
            describe_options(options),
            "detached" if detach else "SIGINT/SIGTERM stops",
        )
        if detach:
            return 0
        signal.signal(signal.SIGINT, on_signal)
        while not stop.wait(1.0):
            pass
        log.info("stopping: deleting application %s (draining replicas)", ray_settings.app_name)
        serve.delete(ray_settings.app_name)
        return 0
    finally:
        if local and ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        elif ray.is_initialized():
            ray.shutdown()  # disconnects this driver; a detached application keeps running
        if runtime_dir is not None:
            shutil.rmtree(runtime_dir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
