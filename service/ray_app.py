"""The BayesGate service as a Ray Serve application: same app factory, same routes, same batching.

Each replica is a Ray actor that builds the FastAPI app with
:func:`bayesgate.service.app.create_app`
(``@serve.ingress`` with a late-bound app), so every ``/v1``, ``/v2``, health and admin route is
served unchanged behind Ray's HTTP proxy, and Ray runs the app's lifespan: load the model
(sha256-checked), start the inference thread, warm up, ready.

One batching mechanism: the replica's :class:`bayesgate.service.worker.BatchWorker` merges the
requests Ray
lets into the replica (up to ``max_ongoing_requests``) into micro-batches of up to
``max_batch_size`` instances, waiting at most ``max_queue_delay_ms`` — the same code and the
same seeded-job semantics as ``bayesgate serve``, so a seeded request gets the same answer from
either. ``@serve.batch`` is not used: it would be a second queue in front of the first.

Settings come from the replica's environment (``BAYESGATE_*``, shipped as the application's
``runtime_env`` env vars) plus explicit overrides; replica count, placement and admission from
:class:`bayesgate.service.ray_settings.RaySettings`. Two ways in:

- ``bayesgate serve --ray [--address ADDR]`` (:mod:`bayesgate.service.ray_run`);
- ``serve deploy deploy/ray-serve.yaml``, whose ``import_path`` is :func:`app_builder`.

Every response carries ``X-BayesGate-Replica`` (the Ray replica id) so clients, load tests and
the tests can see which replica answered. Metrics (``/metrics``) and ``/v1/stats`` are those of the
replica that answers; Ray's own metrics cover the deployment as a whole.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bayesgate.service.ray_settings import DEPLOYMENT_NAME, RaySettings, cluster_options
from bayesgate.service.settings import Settings, settings_from_env

REPLICA_HEADER = "x-bayesgate-replica"
REQUEST_ID = b"x-request-id"


class ReplicaHeaderMiddleware:
    """Adds ``X-BayesGate-Replica: <replica id>`` to every HTTP response, and leaves the
    ``X-Request-ID`` to Ray's proxy, which always appends its own (the client's id, or a new one):
    echoing ours too would send the header twice."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode("latin-1"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", ()) if h[0].lower() != REQUEST_ID]
                message = {**message, "headers": [*kept, self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


@serve.ingress()
class BayesGateReplica:
    """One replica: the app of :func:`bayesgate.service.app.create_app`, built at replica start."""

    def __init__(self, overrides: dict[str, Any] | None = None) -> None:
        self.settings: Settings = settings_from_env(**(overrides or {}))
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._app: FastAPI | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = create_replica_app(self.settings, self.replica_id)
        self._app = app
        return app

    def check_health(self) -> None:
        """Ray's periodic health check: a ready replica whose inference thread died is unhealthy
        (Ray replaces it)."""
        state = self._app.state if self._app is not None else None
        if state is not None and state.ready and not state.worker.running:
            raise RuntimeError("the inference worker thread is not running")


def create_replica_app(settings: Settings, replica_id: str) -> FastAPI:
    """:func:`bayesgate.service.app.create_app` plus the replica header (importable without a
    replica)."""
    from bayesgate.service.app import create_app

    app = create_app(settings)
    app.add_middleware(ReplicaHeaderMiddleware, replica=replica_id)
    return app


BayesGateDeployment = serve.deployment(name=DEPLOYMENT_NAME)(BayesGateReplica)


def build_application(
    options: dict[str, Any], overrides: dict[str, Any] | None = None
) -> Application:
    """The bound Serve application: the deployment with ``options``
    (:func:`bayesgate.service.ray_settings.cluster_options`), its replicas built with ``overrides``
    on top
    of their ``BAYESGATE_*`` environment."""
    return BayesGateDeployment.options(**options).bind(overrides or {})


def app_builder(args: dict[str, Any]) -> Application:
    """Application builder for ``serve deploy`` / ``serve run`` (``import_path`` in the YAML).

    ``args`` keys are service setting names (``model_dir``, ``max_batch_size``, …) or Ray
    setting names with a ``ray_`` prefix (``ray_num_replicas``, ``ray_num_gpus``, …); both
    override the ``BAYESGATE_*`` / ``BAYESGATE_RAY_*`` environment of the application's
    ``runtime_env``. An unknown key is an error, not silently ignored.
    """
    import ray

    service_args = {k: v for k, v in args.items() if not k.startswith("ray_")}
    ray_args = {k.removeprefix("ray_"): v for k, v in args.items() if k.startswith("ray_")}
    unknown = sorted(
        [k for k in service_args if k not in Settings.model_fields]
        + [f"ray_{k}" for k in ray_args if k not in RaySettings.model_fields]
    )
    if unknown:
        raise ValueError(f"unknown BayesGate application args: {', '.join(unknown)}")
    try:
        settings = settings_from_env(**service_args)
        ray_settings = RaySettings(**ray_args)
    except ValidationError as exc:
        raise ValueError(f"invalid BayesGate application args: {exc}") from None
    cluster_gpus = ray.cluster_resources().get("GPU", 0.0) if ray.is_initialized() else 0.0
    return build_application(
        cluster_options(settings, ray_settings, cluster_gpus), overrides=service_args
    )
