"""BayesGate prediction service: MNIST predictions with MC-dropout uncertainty over HTTP.

Layout (data flows one way, top to bottom):

- :mod:`~bayesgate.service.settings` — one pydantic-settings object (prefix ``BAYESGATE_``);
- :mod:`~bayesgate.service.errors` — domain exceptions and their single mapping to HTTP statuses;
- :mod:`~bayesgate.service.served_model` — the served model (network, card, calibration) loaded
  from the store, and its summary;
- :mod:`~bayesgate.service.inputs` — request payload → validated ``B×C×H×W`` tensor (never reaches
  the model unvalidated);
- :mod:`~bayesgate.service.engine` — the engine call (``B×K×C`` MC probabilities);
- :mod:`~bayesgate.service.prediction` — :class:`Prediction`, one instance's answer: label,
  probabilities, uncertainty scores, the ``score > threshold`` decision, the model that computed it;
- :mod:`~bayesgate.service.worker` — the inference thread: owns the served model, bounded queue,
  dynamic micro-batching;
- :mod:`~bayesgate.service.schemas` (``/v1``) and :mod:`~bayesgate.service.inference_protocol`
  (Open Inference Protocol, ``/v2``) — request models and the encodings of a prediction;
- :mod:`~bayesgate.service.control` — admin changes (reload, threshold/score override), shared by
  all worker processes; :mod:`~bayesgate.service.auth` — the API key of the admin routes;
- :mod:`~bayesgate.service.metrics` — Prometheus metrics (multiprocess-aware);
  :mod:`~bayesgate.service.logs` — JSON logs with request ids;
  :mod:`~bayesgate.service.middleware` — request context, body limit;
- :mod:`~bayesgate.service.routes` — ``/v1`` predict and model routes, ``/v2``, health,
  readiness, ``/metrics`` and ``/admin``;
- :mod:`~bayesgate.service.shutdown` — SIGTERM: readiness off, drain, exit 0;
- :mod:`~bayesgate.service.app` — the app factory and its lifespan;
  :mod:`~bayesgate.service.cli` — ``bayesgate serve``;
- :mod:`~bayesgate.service.ray_app`, :mod:`~bayesgate.service.ray_settings`,
  :mod:`~bayesgate.service.ray_run` — the same app as a Ray Serve application
  (``bayesgate serve --ray``; needs the ``ray`` extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `import bayesgate.service.cli` (done by every `bayesgate` command) stays cheap.
    if name == "create_app":
        from bayesgate.service.app import create_app

        return create_app
    if name == "Settings":
        from bayesgate.service.settings import Settings

        return Settings
    raise AttributeError(f"module 'service' has no attribute {name!r}")
