"""Ray Serve settings (prefix ``BAYESGATE_RAY_``) and the deployment options built from them.

The service settings (:class:`bayesgate.service.settings.Settings`: model, K, batch size, queue,
timeouts)
are the same as for ``bayesgate serve``; these add only what Ray decides — how many replicas,
where they run, and how much traffic each may hold:

- ``num_replicas``: a number, or ``auto`` for Ray's autoscaler between ``min_replicas`` and
  ``max_replicas``, aiming at ``target_ongoing_requests`` per replica.
- ``num_gpus`` / ``num_cpus`` per replica (fractions allowed: ``0.5`` packs two replicas on one
  GPU). ``num_gpus`` unset means one whole GPU per replica if the cluster has GPUs (and the
  service device is not ``cpu``), else none.
- ``max_ongoing_requests``: requests Ray lets into one replica at a time. Cross-request batching
  happens *inside* a replica (:class:`bayesgate.service.worker.BatchWorker`), so this must exceed
  ``max_batch_size`` or a full batch can never form; default ``2 × max_batch_size`` capped at the
  worker's ``queue_capacity`` (more would only turn into 503s inside the replica).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bayesgate.errors import InvalidArgument
from bayesgate.service.settings import Settings

RAY_ENV_PREFIX = "BAYESGATE_RAY_"
DEPLOYMENT_NAME = "BayesGate"


class RaySettings(BaseSettings):
    """Replica count, placement, admission; each field is the env var ``BAYESGATE_RAY_<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix=RAY_ENV_PREFIX, case_sensitive=False, extra="ignore", frozen=True
    )

    app_name: str = Field("bayesgate", min_length=1, description="Serve application name")
    num_replicas: int | Literal["auto"] = Field(
        1, description="replicas, or `auto` (autoscaling between min and max)"
    )
    min_replicas: int = Field(1, ge=0, description="autoscaling: fewest replicas")
    max_replicas: int = Field(4, ge=1, description="autoscaling: most replicas")
    target_ongoing_requests: float | None = Field(
        None,
        gt=0,
        description="autoscaling: ongoing requests per replica to aim at "
        "(default: max_batch_size, i.e. one full batch in flight per replica)",
    )
    upscale_delay_s: float = Field(10.0, ge=0, description="autoscaling: wait before adding")
    downscale_delay_s: float = Field(120.0, ge=0, description="autoscaling: wait before removing")
    max_ongoing_requests: int | None = Field(
        None,
        ge=1,
        description="requests admitted per replica (default 2 × max_batch_size, "
        "at most queue_capacity); must exceed max_batch_size",
    )
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per replica")
    num_gpus: float | None = Field(
        None,
        ge=0,
        description="GPUs per replica (fractions allowed); unset: 1 if the cluster "
        "has GPUs and the device is not cpu, else 0",
    )
    health_check_period_s: float = Field(10.0, gt=0, description="Ray's replica health check")


def ray_logging_config(settings: Settings) -> dict[str, Any]:
    """Ray Serve's own logs (its files under ``/tmp/ray/session_*/logs/serve/``) at the service's
    level and format, without Ray's per-request access log: the app writes its own (with request
    ids), so Ray's only duplicated it (one more file write per request in the proxy and in each
    replica)."""
    level = {"critical": "CRITICAL", "error": "ERROR", "warning": "WARNING", "info": "INFO"}
    return {
        "log_level": level.get(settings.log_level, "DEBUG"),
        "encoding": "JSON" if settings.log_format == "json" else "TEXT",
        "enable_access_log": False,
    }


def max_ongoing_requests(settings: Settings, ray: RaySettings) -> int:
    """Requests per replica; raises ``ValueError`` when batches could not form or would 503."""
    if ray.max_ongoing_requests is None:
        value = min(2 * settings.max_batch_size, settings.queue_capacity)
    else:
        value = ray.max_ongoing_requests
    if settings.max_batch_size > 1 and value <= settings.max_batch_size:
        raise InvalidArgument(
            f"max_ongoing_requests ({value}) must exceed max_batch_size "
            f"({settings.max_batch_size}), or a replica never holds enough requests for a full "
            "batch (raise BAYESGATE_RAY_MAX_ONGOING_REQUESTS or BAYESGATE_QUEUE_CAPACITY)"
        )
    if value > settings.queue_capacity:
        raise InvalidArgument(
            f"max_ongoing_requests ({value}) exceeds queue_capacity ({settings.queue_capacity}): "
            "the replica would answer the excess with 503 instead of Ray queueing it"
        )
    return value


def resolve_num_gpus(settings: Settings, ray: RaySettings, cluster_gpus: float) -> float:
    """GPUs per replica: the setting, else 1 when the cluster has GPUs and the device allows."""
    if ray.num_gpus is not None:
        if ray.num_gpus > 0 and settings.device == "cpu":
            raise InvalidArgument(
                f"num_gpus ({ray.num_gpus:g}) > 0 with device cpu: the GPU would sit idle"
            )
        return ray.num_gpus
    return 1.0 if cluster_gpus > 0 and settings.device != "cpu" else 0.0


def deployment_options(settings: Settings, ray: RaySettings, num_gpus: float) -> dict[str, Any]:
    """Keyword arguments of ``serve.deployment`` / ``Deployment.options`` for these settings."""
    if settings.device.startswith("cuda") and num_gpus == 0:
        raise InvalidArgument(
            f"device {settings.device} needs a GPU per replica: set BAYESGATE_RAY_NUM_GPUS "
            "(e.g. 1, or 0.5 to share one GPU between two replicas)"
        )
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": max_ongoing_requests(settings, ray),
        "ray_actor_options": {"num_cpus": ray.num_cpus, "num_gpus": num_gpus},
        "health_check_period_s": ray.health_check_period_s,
        # Ray stops a replica after its in-flight requests finish, at most this long.
        "graceful_shutdown_timeout_s": settings.drain_timeout_s,
        "logging_config": ray_logging_config(settings),
    }
    if ray.num_replicas == "auto":
        if ray.min_replicas > ray.max_replicas:
            raise InvalidArgument(
                f"min_replicas ({ray.min_replicas}) exceeds max_replicas ({ray.max_replicas})"
            )
        target = ray.target_ongoing_requests or float(settings.max_batch_size)
        options["autoscaling_config"] = {
            "min_replicas": ray.min_replicas,
            "max_replicas": ray.max_replicas,
            "target_ongoing_requests": target,
            "upscale_delay_s": ray.upscale_delay_s,
            "downscale_delay_s": ray.downscale_delay_s,
        }
    else:
        if ray.num_replicas < 1:
            raise InvalidArgument(f"num_replicas must be ≥ 1 or auto, got {ray.num_replicas}")
        options["num_replicas"] = ray.num_replicas
    return options


def cluster_options(settings: Settings, ray: RaySettings, cluster_gpus: float) -> dict[str, Any]:
    """:func:`deployment_options` with the GPUs per replica resolved for a cluster that has
    ``cluster_gpus`` GPUs (raises ``ValueError`` when the settings clash)."""
    return deployment_options(settings, ray, resolve_num_gpus(settings, ray, cluster_gpus))


def check_settings(settings: Settings, ray: RaySettings) -> None:
    """Raise the ``ValueError`` that :func:`deployment_options` would, for every clash that does
    not depend on the cluster (so the CLI refuses them before starting or joining Ray)."""
    gpus = ray.num_gpus if ray.num_gpus is not None else float(settings.device.startswith("cuda"))
    resolve_num_gpus(settings, ray, cluster_gpus=0.0)
    deployment_options(settings, ray, gpus)


def describe_options(options: dict[str, Any]) -> str:
    """One line for the log: replica count or autoscaling range, GPUs, admission."""
    scaling = options.get("autoscaling_config")
    if scaling is not None:
        count = f"autoscaling {scaling['min_replicas']}–{scaling['max_replicas']} replicas"
    else:
        count = f"{options['num_replicas']} replica(s)"
    gpus = options["ray_actor_options"]["num_gpus"]
    admitted = options["max_ongoing_requests"]
    return f"{count}, {gpus:g} GPU each, at most {admitted} ongoing requests each"
