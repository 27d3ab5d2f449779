"""The inference worker: one thread owns the model and serves a bounded queue in micro-batches.

Requests never run the model on the event loop. :meth:`BatchWorker.predict` (a coroutine) puts a
:class:`Job` on a bounded ``queue.Queue`` and awaits its ``concurrent.futures.Future`` through
``asyncio.wrap_future`` (results are handed back to the loop with ``call_soon_threadsafe``).

Dynamic batching (names as in Triton): the worker takes the first job, then keeps taking jobs
until the batch holds ``max_batch_size`` instances or ``max_queue_delay`` has passed since the
first job was *enqueued* (so a backlog is never delayed further). A job is never split; a job
larger than ``max_batch_size`` runs alone. Within a batch:

- unseeded jobs with the same K are concatenated into one engine call (``B = Σ B_j`` rows), and
  each job gets its own rows back;
- a job with a ``seed`` runs alone with its own ``torch.Generator`` seeded with it, so its answer
  depends only on (input, seed, K) and never on what else was queued.

An exception in an engine call fails only the jobs of that call (``InferenceFailed``); the
thread keeps serving. Expired or cancelled jobs are dropped before they reach the engine.

The worker is the one owner of the served model
(:class:`~bayesgate.service.served_model.ServedModel`): the routes read ``worker.model`` and an
admin change replaces it (``worker.model = new``). Each engine call reads ``model`` once, so a
batch runs entirely on the old or the new one, and every
:class:`~bayesgate.service.prediction.Prediction` names the model that computed it. With
``metrics`` set (after the warm-up), queue depth, queue time, compute time, batch sizes, outcomes
and flagged instances go to Prometheus (:class:`bayesgate.service.metrics.Metrics`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from bayesgate.service.engine import Engine, mc_engine
from bayesgate.service.errors import DeadlineExceeded, InferenceFailed, NotReady, QueueFull
from bayesgate.service.metrics import Metrics
from bayesgate.service.prediction import Prediction, predictions
from bayesgate.service.served_model import ServedModel

log = logging.getLogger("bayesgate.service")

_POLL_S = 0.1  # how often an idle worker checks whether it should stop


@dataclass(eq=False)
class Job:
    """One request: ``x`` is ``B×(input shape)`` on the CPU."""

    x: torch.Tensor
    k: int
    seed: int | None
    return_samples: bool
    deadline: float  # time.monotonic() after which the answer is useless
    enqueued: float = field(default_factory=time.monotonic)
    future: concurrent.futures.Future[list[Prediction]] = field(
        default_factory=concurrent.futures.Future
    )

    @property
    def size(self) -> int:
        return int(self.x.shape[0])


class WorkerStats:
    """Counters written by the worker thread, read (as a snapshot) by the event loop."""

    def __init__(self, window: int = 4096) -> None:
        self._lock = threading.Lock()
        self.requests_ok = 0
        self.requests_failed = 0
        self.requests_expired = 0
        self.requests_rejected = 0
        self.instances = 0
        self.engine_calls = 0
        self.queue_seconds = 0.0
        self.compute_seconds = 0.0
        self.batch_sizes: deque[int] = deque(maxlen=window)  # instances per engine call
        self.requests_per_batch: deque[int] = deque(maxlen=window)  # requests per engine call

    def record_call(self, instances: int, requests: int, seconds: float, ok: bool) -> None:
        with self._lock:
            self.engine_calls += 1
            self.compute_seconds += seconds
            self.batch_sizes.append(instances)
            self.requests_per_batch.append(requests)
            if ok:
                self.requests_ok += requests
                self.instances += instances
            else:
                self.requests_failed += requests

    def record(self, **increments: float) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            sizes = list(self.batch_sizes)
            per_batch = list(self.requests_per_batch)
            done = self.requests_ok + self.requests_failed
            return {
                "requests_succeeded": self.requests_ok,
                "requests_failed": self.requests_failed,
                "requests_expired": self.requests_expired,
                "requests_rejected": self.requests_rejected,
                "instances": self.instances,
                "engine_calls": self.engine_calls,
                "batch_size_mean": sum(sizes) / len(sizes) if sizes else 0.0,
                "batch_size_max": max(sizes, default=0),
                "batch_size_histogram": {str(k): v for k, v in sorted(Counter(sizes).items())},
                "requests_per_batch_mean": sum(per_batch) / len(per_batch) if per_batch else 0.0,
                "queue_seconds_mean": self.queue_seconds / done if done else 0.0,
                "compute_seconds_total": self.compute_seconds,
                "recent_batch_sizes": sizes[-64:],
            }


class BatchWorker:
    """Owns the model; runs :class:`Job` s from a bounded queue in dynamic micro-batches."""

    def __init__(
        self,
        model: ServedModel,
        *,
        max_batch_size: int = 64,
        max_queue_delay_s: float = 0.005,
        queue_capacity: int = 256,
        engine: Engine = mc_engine,
    ) -> None:
        if max_batch_size < 1 or queue_capacity < 1 or max_queue_delay_s < 0:
            raise ValueError("max_batch_size and queue_capacity must be ≥ 1, delay ≥ 0")
        # The served model, owned here: the routes read it, an admin change replaces it.
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.engine = engine  # replaceable (tests slow it down or make it fail)
        self.stats = WorkerStats()
        self.metrics: Metrics | None = None  # set once the warm-up batch has run
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=queue_capacity)
        self._carry: Job | None = None  # taken from the queue but did not fit the last batch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- event-loop side ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(
        self, x: torch.Tensor, k: int, *, seed: int | None, return_samples: bool, timeout_s: float
    ) -> Job:
        """Enqueue without blocking; :class:`QueueFull` when the queue is at capacity."""
        if not self.running:
            raise NotReady("the inference worker is not running (starting up or shutting down)")
        job = Job(
            x=x,
            k=k,
            seed=seed,
            return_samples=return_samples,
            deadline=time.monotonic() + timeout_s,
        )
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.stats.record(requests_rejected=1)
            if self.metrics is not None:
                self.metrics.count_requests("rejected")
            raise QueueFull(
                f"the inference queue is full ({self._queue.maxsize} requests waiting); retry later"
            ) from None
        self._report_depth()
        return job

    def _report_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self._queue.qsize())

    async def predict(
        self,
        x: torch.Tensor,
        k: int,
        *,
        seed: int | None = None,
        return_samples: bool = False,
        timeout_s: float = 30.0,
    ) -> list[Prediction]:
        """Answer one request (one :class:`Prediction` per instance, in order); raises the job's
        domain error."""
        job = self.submit(x, k, seed=seed, return_samples=return_samples, timeout_s=timeout_s)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job.future), timeout_s)
        except asyncio.TimeoutError:
            job.future.cancel()  # dropped by the worker if it has not started it yet
            raise DeadlineExceeded(
                f"no answer within the request timeout of {timeout_s:g} s (server busy)"
            ) from None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("worker already started")
        self._thread = threading.Thread(target=self._run, name="bayesgate-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; jobs still queued fail with :class:`NotReady`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        pending = [self._carry] if self._carry else []
        self._carry = None
        while True:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for job in pending:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(NotReady("server shutting down"))

    # --- worker thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._gather()
            except queue.Empty:
                continue
            try:
                self._process(batch)
            except Exception:  # a bug outside an engine call: never let the thread die
                log.exception("worker: unexpected error while processing a batch")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(InferenceFailed("internal error in the worker"))

    def _next(self, timeout: float | None) -> Job:
        if self._carry is not None:
            job, self._carry = self._carry, None
            return job
        if timeout is None:
            return self._queue.get(timeout=_POLL_S)
        if timeout <= 0:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def _gather(self) -> list[Job]:
        """First job (waiting up to the poll interval), then more until full or delay passed."""
        first = self._next(None)
        batch, size = [first], first.size
        until = first.enqueued + self.max_queue_delay_s
        while size < self.max_batch_size:
            try:
                job = self._next(until - time.monotonic())
            except queue.Empty:
                break
            if size + job.size > self.max_batch_size:
                self._carry = job
                break
            batch.append(job)
            size += job.size
        return batch

    def _process(self, batch: list[Job]) -> None:
        self._report_depth()
        metrics = self.metrics
        now = time.monotonic()
        live: list[Job] = []
        for job in batch:
            if not job.future.set_running_or_notify_cancel() or now > job.deadline:
                # cancelled by the waiting request (it timed out), or past its deadline
                self.stats.record(requests_expired=1)
                if metrics is not None:
                    metrics.count_requests("expired")
                if job.future.running():
                    job.future.set_exception(DeadlineExceeded("the request expired in the queue"))
                continue
            self.stats.record(queue_seconds=now - job.enqueued)
            if metrics is not None:
                metrics.queue_seconds.observe(now - job.enqueued)
            live.append(job)
        groups: dict[int, list[Job]] = {}
        for job in live:
            if job.seed is None:
                groups.setdefault(job.k, []).append(job)
            else:
                self._run_group([job])
        for jobs in groups.values():
            self._run_group(jobs)

    def _engine_call(
        self, model: ServedModel, x: torch.Tensor, k: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        """``(probs B×K×C, features)``; features (same K passes) only for a fused detector."""
        if model.detector is None:
            return self.engine(model.network, x, k, generator), None
        out = self.engine(model.network, x, k, generator, features=True)
        return out.probs, out.features

    def _run_group(self, jobs: list[Job]) -> None:
        """One engine call over the concatenated inputs of ``jobs`` (same K); split the rows."""
        model = self.model
        k, seed = jobs[0].k, jobs[0].seed
        size = sum(job.size for job in jobs)
        start = time.perf_counter()
        try:
            x = torch.cat([job.x for job in jobs]).to(model.device)
            generator = None
            if seed is not None:
                generator = torch.Generator(device=model.device).manual_seed(seed)
            probs, features = self._engine_call(model, x, k, generator)
            if probs.shape[:2] != (size, k):
                raise RuntimeError(f"engine returned shape {tuple(probs.shape)}, expected B×K×C")
            answers = predictions(probs, model, features)
        except Exception as exc:
            seconds = time.perf_counter() - start
            self.stats.record_call(size, len(jobs), seconds, ok=False)
            if self.metrics is not None:
                self.metrics.observe_engine_call(size, seconds)
                self.metrics.count_requests("failed", len(jobs))
            log.exception("worker: engine call failed for %d request(s)", len(jobs))
            message = f"inference failed: {type(exc).__name__}: {exc}"
            for job in jobs:
                job.future.set_exception(InferenceFailed(message))
            return
        seconds = time.perf_counter() - start
        self.stats.record_call(size, len(jobs), seconds, ok=True)
        if self.metrics is not None:
            self.metrics.observe_engine_call(size, seconds)
            self.metrics.count_requests("succeeded", len(jobs))
            self.metrics.count_instances(size, sum(p.adversarial for p in answers))
        offset = 0
        for job in jobs:
            rows = answers[offset : offset + job.size]
            if job.return_samples:
                samples = probs[offset : offset + job.size].float().cpu().tolist()
                rows = [replace(p, samples=s) for p, s in zip(rows, samples, strict=True)]
            offset += job.size
            job.future.set_result(rows)
