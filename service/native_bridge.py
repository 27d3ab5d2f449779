"""The native front end in the service (``BAYESGATE_NATIVE_PORT``, ``bayesgate serve
--native-port``): an opt-in second HTTP port whose request path is not Python.

The front end (``service/native_front/``, Rust, loaded with :mod:`ctypes`) accepts the
connections of its port, parses HTTP, and answers ``POST /v2/models/{name}/infer`` requests with
the binary tensor extension itself — validation, queue, batching, encoding — when it can answer
them exactly as the service would (the rules are in its README). Every other request (other
routes, JSON bodies, anything it does not take, every error of those) is relayed byte for byte
to the service's own HTTP port, so the second port answers everything the first does.

Python is called once per **batch**, not per request: :class:`NativeBridge` is a thread that
waits in ``bgf_next_batch`` (the GIL released), hands each batch to the service's
:class:`~bayesgate.service.worker.BatchWorker` as one job — its queue, admission by
image-passes, deadline checks, stop checks between layers, metrics and stats apply, and the
batch may share an engine call with the Python routes' jobs — and gives the worker's answers back
as one buffer. The answers are the worker's own, as columns
(:class:`~bayesgate.service.prediction.ColumnAnswer`: the tensors every
:class:`~bayesgate.service.prediction.Prediction` is made from, no per-image object):
byte-identical to the service's ``/v2`` binary answers for the same seed
(tests/service/test_native_front.py).

Operations: the front end writes its own access-log lines (``"front": "native"``) for the requests
it answers; ``/metrics`` gains ``bayesgate_native_*`` series (:class:`NativeCollector`); on
SIGTERM it refuses new connections 0.5 s and stops accepting 0.25 s before uvicorn does (serving
its accept queue, whose requests may still be relayed), answers what it accepted, and stops within
the drain timeout; an admin reload or decision change reaches it at the next batch (a new
configuration generation; requests queued under the old one are answered from their own output
table, or 503 when the model changed under them).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import orjson
import torch
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import (
    DeadlineExceeded,
    QueueFull,
    ServiceError,
    error_body,
    status_of,
)
from bayesgate.service.http_server import REFUSE_LEAD_S
from bayesgate.service.inference_protocol import INPUT_NAME, output_table, response_head
from bayesgate.service.metrics import LATENCY_BUCKETS
from bayesgate.service.native import Batch, NativeFront, load_library
from bayesgate.service.native_build import library_path
from bayesgate.service.oip_binary import DTYPES
from bayesgate.service.prediction import ColumnAnswer
from bayesgate.service.served_model import ModelRef, ServedModel
from bayesgate.service.settings import Settings
from bayesgate.service.thread_names import NamedThread

log = logging.getLogger("bayesgate.native")

REPLACED = "the served model was replaced while this request waited (admin reload); retry"  # 503
BUSY = "too many connections to the native front end; retry later"


def upstream_of(host: str, port: int) -> str:
    """``host:port`` at which the front end reaches the service: the bind address, or loopback
    when the service listens on every interface."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def access_log_format(settings: Settings) -> str:
    """``json``, ``text`` or ``off``: the service's access log, as the front end writes it (off
    when the setting is off or ``bayesgate.access`` does not log INFO)."""
    if not settings.access_log or not logging.getLogger("bayesgate.access").isEnabledFor(
        logging.INFO
    ):
        return "off"
    return settings.log_format


def front_config(served: ServedModel, settings: Settings, upstream: str) -> dict[str, Any]:
    """The front end's configuration (``bgf_start``/``bgf_configure`` JSON) for this model and
    these settings."""
    classes = len(served.card.classes)
    outputs = [
        {
            "name": name,
            "datatype": datatype,
            "elements": math.prod(classes if d == "C" else int(d) for d in dims),
        }
        for name, (datatype, dims) in output_table(served).items()
    ]
    lo, hi = served.input_range

    def body(message: str, code: str) -> str:
        return orjson.dumps(error_body(message, code, v2=True)).decode()

    return {
        "host": settings.host,
        "port": settings.native_port,
        "upstream": upstream,
        "model_name": served.name,
        "input_name": INPUT_NAME,
        "input_shape": list(served.input_shape),
        "input_range": [float(lo), float(hi)],
        "max_instances": settings.max_instances,
        "max_mc_samples": settings.max_mc_samples,
        "default_mc_samples": default_mc_samples(settings, served),
        "outputs": outputs,
        "max_batch": settings.max_batch_size,
        # images waiting in the front end (the worker's own queue bounds come after): one full
        # request always fits
        "queue_limit": max(settings.queue_capacity, settings.max_instances),
        "request_timeout_ms": int(settings.request_timeout_s * 1000),
        "queue_full_body": body("the inference queue is full; retry later", QueueFull.code),
        "timeout_body": body(
            "the request could not be answered before its deadline (server busy)",
            DeadlineExceeded.code,
        ),
        "busy_body": body(BUSY, QueueFull.code),
        "max_connections": settings.native_max_connections,
        # the main port's limits: a request past them is relayed, for the service's 431 / 413
        "max_header_bytes": settings.max_header_bytes,
        "max_header_count": settings.max_header_count,
        "max_body_bytes": settings.max_body_bytes,
        # as the main port: an idle keep-alive connection, a request whose bytes stop coming
        "idle_timeout_ms": settings.keep_alive_timeout_s * 1000,
        "read_timeout_ms": int(settings.body_read_timeout_s * 1000),
        # as the main port: a connection closed while the client still sends lingers
        "linger_ms": int(settings.linger_s * 1000),
        "linger_idle_ms": max(1, int(settings.linger_idle_s * 1000)),
        # the native drain runs REFUSE_LEAD_S before the main port closes: a connection without
        # a request may send one until then (its relay still reaches the main port)
        "first_request_grace_ms": int(REFUSE_LEAD_S * 1000),
        "access_log": access_log_format(settings),
        "pid": os.getpid(),
        "latency_buckets": list(LATENCY_BUCKETS),
    }


def answer_prefix(
    ref: ModelRef, score_name: str, threshold: float, k: int, seed: int | None
) -> bytes:
    """The response's JSON up to ``"outputs":[``: the service's own head
    (:func:`~bayesgate.service.inference_protocol.response_head`; no ``id``: requests with one are
    the service's)."""
    head = orjson.dumps({**response_head(ref, score_name, threshold, k, seed), "outputs": []})
    return head[:-2]  # without "]}"


def output_bytes(answer: ColumnAnswer, table: list[tuple[str, str]]) -> bytes:
    """The outputs of ``table`` (the front end's ``(name, datatype)`` s, in its order) for the
    batch, each ``n × elements`` little-endian values of its ``/v2`` datatype, concatenated: the
    values :func:`~bayesgate.service.inference_protocol.encode_outputs` gives the same rows'
    :class:`~bayesgate.service.prediction.Prediction` s (tested bit for bit), made per batch.
    :class:`KeyError` for a name the answer's model does not have."""
    c = answer.columns
    values = {
        "probabilities": c.mean,
        "label": c.labels,
        **c.scores,
        "aleatoric_variance": c.aleatoric_variance,
        "epistemic_variance": c.epistemic_variance,
        "adversarial": c.flagged(answer.score_name, answer.threshold),
        "score": c.scores[answer.score_name],
    }
    return b"".join(
        values[name].numpy().astype(DTYPES[datatype], copy=False).tobytes()
        for name, datatype in table
    )


class Slot:
    """One batch's hold on the bridge's in-flight semaphore, released exactly once."""

    def __init__(self, semaphore: threading.Semaphore) -> None:
        self._semaphore, self._lock, self._held = semaphore, threading.Lock(), True

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._semaphore.release()


class NativeBridge:
    """The running front end and the thread that feeds its batches to the worker."""

    # Batches handed to the worker and not yet computing. One: the next batch is taken from the
    # front end when the worker starts computing this one (Job.on_start), so it waits in the
    # worker's queue and the engine never waits for it; the worker's answer thread answers the
    # previous batch meanwhile. (Taking it when the call ends instead gave batches of 16 rather
    # than 10 under 32 clients, but 817 rather than 936 images/s and more CPU per image:
    # docs/performance.md, the native front end's benchmark.)
    in_flight = 1
    timeout_ms = 100  # longest wait in bgf_next_batch (how soon a stop or a reload is seen)

    def __init__(self, front: NativeFront, worker: Any, settings: Settings, upstream: str) -> None:
        self.front = front
        self.worker = worker
        self.settings = settings
        self.upstream = upstream
        self.generation = 0
        self._model = worker.model
        self._config = front_config(self._model, settings, upstream)
        self._tables = {0: self._table(self._config)}
        self._drain_started: float | None = None
        self._stopping = threading.Event()
        self._slots = threading.Semaphore(self.in_flight)
        self._outstanding = 0  # batches submitted to the worker and not yet answered
        self._settled_cond = threading.Condition()
        self._thread = NamedThread(self._run, "native-bridge", os_name="bg-native")

    @staticmethod
    def _table(config: dict[str, Any]) -> tuple[list[tuple[str, str]], tuple[int, ...]]:
        """The configuration's outputs ``(name, datatype)`` and input shape."""
        outputs = [(o["name"], o["datatype"]) for o in config["outputs"]]
        return outputs, tuple(config["input_shape"])

    @property
    def port(self) -> int:
        return self.front.port

    def start(self) -> None:
        self._thread.start()

    # --- the batch loop --------------------------------------------------------------------------

    def _run(self) -> None:
        capacity = max(self.settings.max_batch_size, self.settings.max_instances)
        shape = self._tables[self.generation][1]
        images = np.empty((capacity, *shape), dtype=np.float32)
        while not self._stopping.is_set():
            try:
                if self._follow_model():
                    shape = self._tables[self.generation][1]
                    images = np.empty((capacity, *shape), dtype=np.float32)
                if not self._slots.acquire(timeout=self.timeout_ms / 1000):
                    continue
                batch = self.front.next_batch(images, self.timeout_ms)
                if batch is None:
                    self._slots.release()
                    continue
                self._submit(batch, images)
            except Exception:  # never let the thread die: the port would hang
                log.exception("native bridge: unexpected error")
                time.sleep(0.1)

    def _follow_model(self) -> bool:
        """A new configuration generation when the served model's configuration changed (admin
        reload, a new default K); True when the input shape changed."""
        served = self.worker.model
        if served is self._model:
            return False
        config = front_config(served, self.settings, self.upstream)
        if config != self._config:  # else e.g. only the threshold changed: the answers carry it
            self.front.configure(config)  # raises: tried again at the next turn of the loop
        self._model = served
        if config == self._config:
            return False
        old_shape = self._config["input_shape"]
        self._config = config
        self.generation += 1
        self._tables[self.generation] = self._table(config)
        for old in [g for g in self._tables if g < self.generation - 8]:
            del self._tables[old]  # older batches than these are long answered
        log.info("native front end: configuration %d (model %s)", self.generation, served.name)
        return config["input_shape"] != old_shape

    def _submit(self, batch: Batch, images: np.ndarray) -> None:
        """The batch as one job of the worker (its slot is freed when its engine call starts, or
        when it ends without one); answered from the worker's answer thread."""
        table = self._tables.get(batch.generation)
        if table is None or table[1] != self._tables[self.generation][1]:
            self._fail(batch.batch_id, QueueFull(REPLACED))
            self._slots.release()
            return
        x = torch.from_numpy(images[: batch.n]).clone()  # the buffer is the next batch's
        slot = Slot(self._slots)
        with self._settled_cond:
            self._outstanding += 1
        try:
            job = self.worker.submit(
                x,
                batch.k,
                seed=batch.seed,
                return_samples=False,
                deadline=time.monotonic() + self.settings.request_timeout_s,
                requests=batch.requests,
                gathered=True,
                on_start=slot.release,
                columnar=True,
            )
        except ServiceError as exc:
            self._fail(batch.batch_id, exc)
            slot.release()
            self._settled()
            return
        job.future.add_done_callback(lambda future: self._finish(future, batch, table[0], slot))

    def _finish(
        self, future: Future[Any], batch: Batch, table: list[tuple[str, str]], slot: Slot
    ) -> None:
        try:
            exc = future.exception()
            if exc is not None:
                self._fail(batch.batch_id, exc)
                return
            answer: ColumnAnswer = future.result()
            try:
                data = output_bytes(answer, table)
            except KeyError:  # a score of the old table the new model does not have
                self._fail(batch.batch_id, QueueFull(REPLACED))
                return
            prefix = answer_prefix(answer.model, answer.score_name, answer.threshold, batch.k,
                                   batch.seed)  # fmt: skip
            self.front.complete(batch.batch_id, 200, prefix, data)
        except Exception as exc:  # never leave the front end's requests waiting
            log.exception("native bridge: answering batch %d failed", batch.batch_id)
            self._fail(batch.batch_id, exc)
        finally:
            slot.release()  # a job dropped before its engine call never started
            self._settled()

    def _settled(self) -> None:
        with self._settled_cond:
            self._outstanding -= 1
            self._settled_cond.notify_all()

    def _fail(self, batch_id: int, exc: BaseException) -> None:
        if isinstance(exc, ServiceError):
            status, message, code = status_of(exc, v2=True), exc.message, exc.code
        else:
            status, message, code = 500, f"internal error: {type(exc).__name__}", ""
        self.front.complete(batch_id, status, orjson.dumps(error_body(message, code, v2=True)))

    # --- shutdown --------------------------------------------------------------------------------

    def refuse_new(self) -> None:
        """Refuse new connections a moment before :meth:`drain` (see ``bgf_refuse_new``), so that
        a handshake under way completes before the last ``accept()``."""
        if self._drain_started is not None or not self.front.handle:
            return
        if self.front.refuse_new():
            log.info("native port: new connections refused from now on")
        else:
            log.warning("native port: cannot refuse new connections before closing (no socket "
                        "filter here): one arriving as it closes may be reset")  # fmt: skip

    def drain(self) -> None:
        """Stop accepting connections (its accept queue is served; requests already accepted
        are still answered)."""
        if self._drain_started is None:
            self._drain_started = time.monotonic()
        taken = self.front.drain()
        if taken:
            log.info("native port: stopped listening; %d connection(s) waiting to be accepted "
                     "taken", taken)  # fmt: skip

    def shut_down(self, grace_s: float) -> int:
        """Drain (if not yet), wait until ``grace_s`` after the drain began for the accepted
        requests to be answered, then stop (what is left is answered 503). Returns how many were
        left."""
        self.drain()
        assert self._drain_started is not None
        deadline = self._drain_started + grace_s
        while self.front.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        left = self.front.pending()
        self._stopping.set()
        self.front.stop()
        self._thread.join(timeout=5)
        # the batches with the worker finish on it (it is still running): wait for their answers
        # before the handle is freed, which the answers use
        with self._settled_cond:
            settled = self._settled_cond.wait_for(
                lambda: self._outstanding == 0, timeout=max(0.0, deadline - time.monotonic()) + 1.0
            )
        if settled:
            self.front.free()
        else:  # an answer may still come: keep the handle (the process is ending anyway)
            log.warning("native front end: a batch was still computing at shutdown")
        return left


class NativeCollector:
    """``bayesgate_native_*`` metrics, read from the front end's counters at each scrape."""

    def __init__(self, front: NativeFront) -> None:
        self.front = front

    def describe(self) -> list[Metric]:
        return []  # the families are described by collect()

    def collect(self) -> Iterator[Metric]:
        if not self.front.handle:
            return
        s = self.front.stats()
        requests = CounterMetricFamily(
            "bayesgate_native_requests",
            "requests on the native front end's port by outcome: answered (200), relayed (to the "
            "service's port, which counts them again), rejected (503 queue full or stopping), "
            "timed_out (504), client_gone (dropped before computing), bad_request (400/431), "
            "error (500), upstream_unreachable (502)",
            labels=["outcome"],
        )
        for outcome, key in (
            ("answered", "answered_200"),
            ("relayed", "relayed_requests"),
            ("rejected", "rejected_503"),
            ("timed_out", "timed_out_504"),
            ("client_gone", "client_gone"),
            ("bad_request", "bad_requests_400_native"),
            ("error", "errors_500"),
            ("upstream_unreachable", "upstream_502"),
        ):
            requests.add_metric([outcome], s[key])
        yield requests
        connections = CounterMetricFamily(
            "bayesgate_native_connections",
            "connections to the native front end: accepted, or rejected (503) at the limit",
            labels=["result"],
        )
        connections.add_metric(["accepted"], s["connections_accepted"])
        connections.add_metric(["rejected"], s["rejected_connections"])
        yield connections
        yield GaugeMetricFamily(
            "bayesgate_native_open_connections",
            "connections open on the native front end",
            value=s["open_connections"],
        )
        yield CounterMetricFamily(
            "bayesgate_native_batches", "batches the native front end handed to the worker",
            value=s["batches"],
        )  # fmt: skip
        yield CounterMetricFamily(
            "bayesgate_native_images", "images in requests queued by the native front end",
            value=s["fast_images"],
        )  # fmt: skip
        counts = self.front.latency_buckets(len(LATENCY_BUCKETS) + 1)
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(
            "bayesgate_native_request_duration_seconds",
            "latency of the requests the native front end answered itself (head read → "
            "response written)",
            buckets=buckets,
            sum_value=s["latency_sum_us"] / 1e6,
        )


def start_native_front(worker: Any, settings: Settings) -> NativeBridge:
    """Load (building if needed) the library, start the front end on ``native_port`` and its
    bridge thread."""
    assert settings.native_port is not None
    library = library_path(settings.native_library, build=True)
    lib = load_library(library)
    upstream = upstream_of(settings.host, settings.port)
    config = front_config(worker.model, settings, upstream)
    try:
        front = NativeFront(lib, config)
    except OSError as exc:
        raise OSError(f"the native front end did not start: {exc}") from None
    bridge = NativeBridge(front, worker, settings, upstream)
    bridge.start()
    log.info(
        "native front end on %s:%d (library %s), relaying to %s",
        settings.host,
        bridge.port,
        library,
        upstream,
    )
    return bridge
