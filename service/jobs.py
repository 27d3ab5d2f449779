"""What the inference worker (:mod:`bayesgate.service.worker`) queues and hands between its threads:
a request's :class:`Job`, an engine call's :class:`Computed` outputs waiting for their answers, and
the :class:`Reservation` of work a request holds before it is queued."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from bayesgate.service.prediction import ColumnAnswer, Prediction
from bayesgate.service.served_model import ServedModel


@dataclass(eq=False)
class Job:
    """One request: ``x`` is ``B×(input shape)`` on the CPU."""

    x: torch.Tensor
    k: int
    seed: int | None
    return_samples: bool
    deadline: float  # time.monotonic() after which the answer is useless
    enqueued: float = field(default_factory=time.monotonic)
    dropped: str | None = None  # why the waiting request cancelled it (``client_gone``, …)
    requests: int = 1  # HTTP requests it answers (a native front end's batch is several)
    gathered: bool = False  # already a batch (the native front end's): run without waiting
    columnar: bool = False  # answered with a ColumnAnswer (no per-image Prediction)
    on_start: Callable[[], None] | None = None  # called (worker thread) as its batch is taken
    future: concurrent.futures.Future[list[Prediction] | ColumnAnswer] = field(
        default_factory=concurrent.futures.Future
    )

    @property
    def size(self) -> int:
        return int(self.x.shape[0])

    @property
    def work(self) -> int:
        """The job's cost in image-passes: ``B × K``."""
        return self.size * self.k


@dataclass(eq=False)
class Computed:
    """An engine call's outputs waiting for their answers: the jobs (in row order), the model
    that computed them, ``probs`` ``B×K×C`` and the detector's features, the call's seconds (wall
    time) and the worker thread's CPU seconds in it."""

    jobs: list[Job]
    model: ServedModel
    probs: torch.Tensor
    features: dict[str, torch.Tensor] | None
    size: int
    engine_seconds: float
    engine_cpu_seconds: float = 0.0


@dataclass(eq=False)
class Reservation:
    """Image-passes held for one request between its arrival and its enqueueing (0 once queued
    or released)."""

    work: int


def settle(
    future: concurrent.futures.Future[Any], result: Any = None, exc: Exception | None = None
):
    """Set a future's result or exception unless it is already done (abandoned at shutdown)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def claim(job: Job) -> bool:
    """Mark the job running; False when its request cancelled it (or abandon() answered it)."""
    try:
        return job.future.set_running_or_notify_cancel()
    except RuntimeError:  # finished meanwhile by abandon()
        return False
