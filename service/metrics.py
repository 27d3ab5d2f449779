"""Prometheus metrics of the service (``GET /metrics``), correct with several worker processes.

One :class:`Metrics` per app. Names (Triton-like: named for what they count):

- ``bayesgate_http_requests_total{method,route,status}`` (counter): HTTP requests answered;
- ``bayesgate_http_request_duration_seconds{method,route}`` (histogram): request latency;
- ``bayesgate_inference_requests_total{outcome}`` (counter): inference jobs ``succeeded``,
  ``failed`` (engine error), ``expired`` (dropped: before computing, or stopped while computing),
  ``rejected`` (queue full);
- ``bayesgate_jobs_dropped_total{reason,stage}`` (counter): jobs dropped, ``deadline`` (the
  request's deadline passed) or ``client_gone`` (the client hung up); ``stage="queued"`` before
  their batch ran (never computed), ``"computing"`` stopped between two layers of their engine
  call (the rest never computed);
- ``bayesgate_inference_queue_seconds`` (histogram): enqueue → start of the job's engine call;
- ``bayesgate_inference_compute_seconds`` (histogram): one engine call (K passes + summary);
- ``bayesgate_inference_batch_size`` (histogram): instances per engine call;
- ``bayesgate_inference_queue_depth`` (gauge): jobs waiting (summed over live processes);
- ``bayesgate_instances_total`` / ``bayesgate_adversarial_instances_total`` (counters): instances
  answered / of those, flagged adversarial;
- ``bayesgate_model_info{model,weights_sha256,score}`` (gauge): 1 for the served model;
- ``bayesgate_adversarial_threshold`` (gauge): the active threshold of that score;
- ``bayesgate_ready`` (gauge): 1 ready, 0 loading or draining (minimum over live processes).

``route`` is the route template (``/v2/models/{name}/infer``), never the raw path, so the label set
stays bounded; requests that match no route are ``route="unmatched"``.

**Several processes.** With ``PROMETHEUS_MULTIPROC_DIR`` set *before* ``prometheus_client`` is
imported (``bayesgate serve --workers N`` does this), every process writes its values to files in
that directory and ``/metrics`` — whichever process answers — aggregates all of them with
``prometheus_client.multiprocess.MultiProcessCollector``: counters and histograms are summed, the
queue depth is summed over live processes, model info and threshold are the maximum over live
processes, readiness the minimum. A process that ends normally removes its live gauges; one that
is killed leaves its last queue depth in the sum until the directory is cleared (at the next
start). Without it, metrics are those of the one process.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
OUTCOMES = ("succeeded", "failed", "expired", "rejected")
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
"""The ``method`` label's values; any other method (h11 passes any token: ``X0000001``, …) is
``other`` — one series per made-up method would let a client grow ``/metrics`` without bound."""

DROP_REASONS = ("deadline", "client_gone")
DROP_STAGES = ("queued", "computing")


def multiprocess_dir() -> str | None:
    """The shared metrics directory when multiprocess mode is active, else None.

    Raises ``RuntimeError`` if ``PROMETHEUS_MULTIPROC_DIR`` was set after ``prometheus_client``
    chose single-process values (the variable must be in the environment before the import).
    """
    path = os.environ.get(MULTIPROC_ENV)
    active = values.ValueClass is not values.MutexValue
    if path and not active:
        raise RuntimeError(
            f"{MULTIPROC_ENV} was set after prometheus_client was imported; set it before the "
            "server starts"
        )
    if active and not (path and os.path.isdir(path)):
        raise RuntimeError(f"{MULTIPROC_ENV}={path!r}: not a directory")
    return path if active else None


class Metrics:
    """The service's metric objects and their exposition."""

    def __init__(self) -> None:
        self.directory = multiprocess_dir()
        # Single process: the metrics live in this app's own registry (tests build many apps in
        # one process). Multiprocess: values go to files; exposition reads all processes' files.
        self._registry = None if self.directory else CollectorRegistry(auto_describe=True)
        self._define_http_metrics(self._registry)
        self._define_inference_metrics(self._registry)
        self._define_model_metrics(self._registry)
        self._model_labels: tuple[str, str, str] | None = None
        self._collectors: list[Any] = []  # e.g. the native front end's (read at each scrape)
        for outcome in OUTCOMES:  # exported at 0 from the start
            self.inference_requests.labels(outcome)
        for reason in DROP_REASONS:
            for stage in DROP_STAGES:
                self.jobs_dropped.labels(reason, stage)

    def _define_http_metrics(self, reg: CollectorRegistry | None) -> None:
        self.http_requests = Counter(
            "bayesgate_http_requests",
            "HTTP requests answered, by route template and status",
            ["method", "route", "status"],
            registry=reg,
        )
        self.http_latency = Histogram(
            "bayesgate_http_request_duration_seconds",
            "HTTP request latency in seconds, by route template",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )

    def _define_inference_metrics(self, reg: CollectorRegistry | None) -> None:
        self.inference_requests = Counter(
            "bayesgate_inference_requests",
            "inference jobs by outcome: succeeded, failed (engine error), expired (dropped: "
            "client gone or deadline passed, queued or computing), rejected (queue full)",
            ["outcome"],
            registry=reg,
        )
        self.jobs_dropped = Counter(
            "bayesgate_jobs_dropped",
            "inference jobs dropped: deadline (passed) or client_gone (the client hung up); "
            "stage queued (never computed) or computing (stopped between two layers)",
            ["reason", "stage"],
            registry=reg,
        )
        self.queue_seconds = Histogram(
            "bayesgate_inference_queue_seconds",
            "seconds a job waited in the queue before its engine call started",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.compute_seconds = Histogram(
            "bayesgate_inference_compute_seconds",
            "seconds of one engine call (K MC passes over the batch and the summary)",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.batch_size = Histogram(
            "bayesgate_inference_batch_size",
            "instances per engine call",
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.queue_depth = Gauge(
            "bayesgate_inference_queue_depth",
            "jobs waiting in the inference queue",
            multiprocess_mode="livesum",
            registry=reg,
        )

    def _define_model_metrics(self, reg: CollectorRegistry | None) -> None:
        self.instances = Counter("bayesgate_instances", "instances (images) answered", registry=reg)
        self.adversarial = Counter(
            "bayesgate_adversarial_instances",
            "instances flagged adversarial (score > threshold)",
            registry=reg,
        )
        self.model_info = Gauge(
            "bayesgate_model_info",
            "the served model: 1 for its name, weights sha256 and active score",
            ["model", "weights_sha256", "score"],
            multiprocess_mode="livemax",
            registry=reg,
        )
        self.threshold = Gauge(
            "bayesgate_adversarial_threshold",
            "the active threshold: an instance is flagged when its score exceeds it",
            multiprocess_mode="livemax",
            registry=reg,
        )
        self.ready = Gauge(
            "bayesgate_ready",
            "1 when the server is ready for traffic, 0 while loading or draining",
            multiprocess_mode="livemin",
            registry=reg,
        )

    # --- recording (event loop and worker thread; prometheus_client locks internally) ------------

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "other"  # a label set clients cannot grow
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_latency.labels(method, route).observe(seconds)

    def count_requests(self, outcome: str, n: int = 1) -> None:
        self.inference_requests.labels(outcome).inc(n)

    def count_dropped(self, reason: str, n: int = 1, stage: str = "queued") -> None:
        self.jobs_dropped.labels(reason, stage).inc(n)

    def observe_engine_call(self, instances: int, seconds: float) -> None:
        self.batch_size.observe(instances)
        self.compute_seconds.observe(seconds)

    def count_instances(self, answered: int, flagged: int) -> None:
        self.instances.inc(answered)
        if flagged:
            self.adversarial.inc(flagged)

    def set_model(self, name: str, sha256: str, score: str, threshold: float) -> None:
        """Mark the served model; a replaced model's series drop to 0 (they cannot be removed
        from the multiprocess files)."""
        labels = (name, sha256, score)
        if self._model_labels not in (None, labels):
            self.model_info.labels(*self._model_labels).set(0)
        self.model_info.labels(*labels).set(1)
        self._model_labels = labels
        self.threshold.set(threshold)

    def set_ready(self, ready: bool) -> None:
        self.ready.set(1 if ready else 0)

    def process_exit(self) -> None:
        """Forget this process's live gauges (multiprocess mode), at the end of the lifespan."""
        if self.directory:
            multiprocess.mark_process_dead(os.getpid(), self.directory)

    def add_collector(self, collector: Any) -> None:
        """A collector of this process's own values (``collect()`` yields metric families),
        exported with the rest from now on."""
        self._collectors.append(collector)
        if self._registry is not None:
            self._registry.register(collector)

    def remove_collector(self, collector: Any) -> None:
        self._collectors.remove(collector)
        if self._registry is not None:
            self._registry.unregister(collector)

    # --- exposition -----------------------------------------------------------------------------

    def exposition(self) -> tuple[bytes, str]:
        """The text format of all metrics (all processes in multiprocess mode), content type."""
        if self.directory:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.directory)
            for collector in self._collectors:  # this process's own
                registry.register(collector)
        else:
            assert self._registry is not None
            registry = self._registry
        return generate_latest(registry), CONTENT_TYPE_LATEST


def clear_directory(path: str | os.PathLike[str]) -> None:
    """Delete the ``*.db`` files of a previous run from a metrics directory (must be empty at
    start: old files would be summed into the new server's counters)."""
    for entry in os.scandir(path):
        if entry.is_file() and entry.name.endswith(".db"):
            os.unlink(entry.path)


METRIC_NAMES = (
    "bayesgate_http_requests_total",
    "bayesgate_http_request_duration_seconds",
    "bayesgate_inference_requests_total",
    "bayesgate_inference_queue_seconds",
    "bayesgate_inference_compute_seconds",
    "bayesgate_inference_batch_size",
    "bayesgate_inference_queue_depth",
    "bayesgate_instances_total",
    "bayesgate_adversarial_instances_total",
    "bayesgate_model_info",
    "bayesgate_adversarial_threshold",
    "bayesgate_ready",
)
