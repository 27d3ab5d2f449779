"""The inference worker's counters (:class:`WorkerStats`): written by its threads, read as a
snapshot by the event loop (``/v1/stats``, the load benchmark)."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any


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
        self.compute_cpu_seconds = 0.0
        self.batch_sizes: deque[int] = deque(maxlen=window)  # instances per engine call
        self.requests_per_batch: deque[int] = deque(maxlen=window)  # requests per engine call

    def record_call(
        self, instances: int, requests: int, seconds: float, ok: bool, cpu_seconds: float = 0.0
    ) -> None:
        """One engine call: ``seconds`` of wall time, ``cpu_seconds`` of the worker thread's CPU
        (``time.thread_time``)."""
        with self._lock:
            self.engine_calls += 1
            self.compute_seconds += seconds
            self.compute_cpu_seconds += cpu_seconds
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
                # the worker thread's CPU in engine calls: the model's own CPU in this server
                # when torch runs on that one thread (BAYESGATE_NUM_THREADS=1; with more, the
                # intra-op threads' share is not in it)
                "compute_cpu_seconds_total": self.compute_cpu_seconds,
                "recent_batch_sizes": sizes[-64:],
            }
