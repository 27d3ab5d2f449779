"""The inference worker: one thread owns the model and serves a bounded queue in micro-batches.

Requests never run the model on the event loop. :meth:`BatchWorker.predict` (a coroutine) puts a
:class:`~bayesgate.service.jobs.Job` on a bounded ``queue.Queue`` and awaits its
``concurrent.futures.Future`` through ``asyncio.wrap_future`` (results are handed back to the
loop with ``call_soon_threadsafe``).

Dynamic batching (names as in Triton): the worker takes the first job, then keeps taking jobs
until the batch holds ``max_batch_size`` instances or ``max_queue_delay`` has passed since the
first job was *enqueued* (so a backlog is never delayed further). A job is never split; a job
larger than ``max_batch_size`` runs alone. Within a batch:

- unseeded jobs with the same K are concatenated into one engine call (``B = Σ B_j`` rows), and
  each job gets its own rows back;
- a job with a ``seed`` runs alone with its own ``torch.Generator`` seeded with it, so its answer
  depends only on (input, seed, K) and never on what else was queued.

An exception in an engine call fails only the jobs of that call (``InferenceFailed``); the
thread keeps serving.

The answers are built by a second thread: after an engine call the worker hands its outputs over
(a queue of one batch) and goes on to gather and compute the next batch while the answer thread
turns the last one into :class:`~bayesgate.service.prediction.Prediction` s (uncertainty, detector
scores, flags) and answers its requests. The two overlap — the engine's kernels run without the
GIL — which is worth ~20–25 % of throughput at one-image requests (docs/performance.md). The answers
are those of the engine call's own model and outputs, so nothing about them changes.

Admission is by work, not by requests: a job costs ``B × K`` image-passes, and the queue holds at
most ``max_queued_work`` of them (and at most ``queue_capacity`` jobs); a request that does not fit
is refused at once (:class:`QueueFull`, 503 + ``Retry-After``). Work is *held* from the request's
arrival: :meth:`BatchWorker.reserve` holds an estimate before the body is read (a
:class:`~bayesgate.service.jobs.Reservation`), :meth:`BatchWorker.resize` replaces it by the exact
``B × K`` once the body is parsed, and :meth:`BatchWorker.submit` turns it into queued work. A
request is refused when ``held + its work > max_queued_work`` with ``held`` = queued + reserved work
of the other requests (a request alone may exceed the limit: it runs when nothing else is held). A
job's deadline is fixed by the caller from the moment its request *arrived* (not when it was
enqueued). A job whose deadline has passed — or would pass before it finished even at the fastest
per-pass rate of the last 64 engine calls, once there are 8 (:meth:`BatchWorker.fastest_seconds`) —,
or whose client hung up (the route cancels it), before its batch runs is dropped — never computed —
and counted in ``bayesgate_jobs_dropped_total{reason}`` (``deadline``, ``client_gone``). A job
already computing is checked before every layer of its engine call
(:func:`~bayesgate.service.engine.checkpoints`): once its client is gone or its deadline passed, the
call stops there, the job is answered (504, or 499 for a client gone) and counted with
``stage="computing"``, and the other jobs of the call run again without it. The request waits for
that (one layer, :meth:`BatchWorker._stopped`), so no client is answered while its job is still
computed, and no job finishes for a client already answered. At the drain deadline
:meth:`BatchWorker.abandon` answers every queued and running job with :class:`NotReady` (503) so no
client is left to uvicorn's cancellation.

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
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import torch

from bayesgate.models.device import use_process_thread_count
from bayesgate.service.engine import CallStopped, Engine, checkpoints, mc_engine
from bayesgate.service.errors import (
    ClientGone,
    DeadlineExceeded,
    InferenceFailed,
    NotReady,
    QueueFull,
)
from bayesgate.service.jobs import Computed, Job, Reservation, claim, settle
from bayesgate.service.metrics import Metrics
from bayesgate.service.prediction import (
    AnswerColumns,
    ColumnAnswer,
    Prediction,
    answer_columns,
    engine_outputs,
    rows_of,
)
from bayesgate.service.served_model import ServedModel
from bayesgate.service.thread_names import NamedThread
from bayesgate.service.worker_stats import WorkerStats

log = logging.getLogger("bayesgate.service")

_POLL_S = 0.1  # how often an idle worker checks whether it should stop
MIN_RATE_CALLS = 8  # engine calls timed before a job's compute time is predicted from them
ABANDON_SLACK_S = 0.05  # a caller cancelled this close to its job's deadline ran out of time
STOP_WAIT_S = 2.0  # how long a request past its deadline waits for the worker to stop its job
STOPPED_LATE = "the request's deadline passed while it was computed (server busy); it was stopped"


def per_image_rows(jobs: list[Job], columns: AnswerColumns, model: ServedModel) -> list[Prediction]:
    """The :class:`~bayesgate.service.prediction.Prediction` of each row of the jobs answered per
    image, in order; none for a ``columnar`` job's rows (a native front end's batch sharing the
    engine call), which are answered from the columns."""
    if not any(job.columnar for job in jobs):
        return rows_of(columns, model)
    wanted, offset = [], 0
    for job in jobs:
        if not job.columnar:
            wanted.append(torch.arange(offset, offset + job.size))
        offset += job.size
    return rows_of(columns.take(torch.cat(wanted)), model) if wanted else []


class BatchWorker:
    """Owns the model; runs :class:`Job` s from a bounded queue in dynamic micro-batches."""

    def __init__(
        self,
        model: ServedModel,
        *,
        max_batch_size: int = 64,
        max_queue_delay_s: float = 0.005,
        queue_capacity: int = 256,
        max_queued_work: int | None = None,
        engine: Engine = mc_engine,
        stop_wait_s: float = STOP_WAIT_S,
    ) -> None:
        if max_batch_size < 1 or queue_capacity < 1 or max_queue_delay_s < 0:
            raise ValueError("max_batch_size and queue_capacity must be ≥ 1, delay ≥ 0")
        if max_queued_work is not None and max_queued_work < 1:
            raise ValueError("max_queued_work must be ≥ 1")
        self.max_queued_work = max_queued_work  # image-passes (B × K) waiting; None = unbounded
        self._work_lock = threading.Lock()
        self._queued_work = 0
        self._reserved_work = 0  # held for requests not queued yet (Reservation)
        # The batch being gathered or computed (answered by abandon() at the drain deadline).
        self._running: list[Job] = []
        # The served model, owned here: the routes read it, an admin change replaces it.
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self._engine = engine
        self.stop_wait_s = stop_wait_s
        self.stats = WorkerStats()
        self.metrics: Metrics | None = None  # set once the warm-up batch has run
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=queue_capacity)
        self._carry: Job | None = None  # taken from the queue but did not fit the last batch
        # Seconds per image-pass of recent engine calls (a job is not started when even the
        # fastest of them could not answer it before its deadline).
        self._pass_seconds: deque[float] = deque(maxlen=64)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Engine outputs handed to the answer thread (at most one waiting, one being answered).
        self._computed: queue.Queue[Computed | None] = queue.Queue(maxsize=1)
        self._answering: list[Computed] = []  # handed over, not yet answered (abandon() sees them)
        self._answering_lock = threading.Lock()
        self._answer_thread: threading.Thread | None = None

    @property
    def engine(self) -> Engine:
        """The MC engine; replaceable (tests slow it down or make it fail), which forgets the
        per-pass times of the old one."""
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._engine = engine
        self._pass_seconds.clear()

    # --- event-loop side ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def queued_work(self) -> int:
        """Image-passes (``Σ B × K``) waiting in the queue."""
        with self._work_lock:
            return self._queued_work

    def held_work(self) -> int:
        """Image-passes held: queued plus reserved for requests still being read or decoded."""
        with self._work_lock:
            return self._queued_work + self._reserved_work

    def _refuse_unless_fits(self, work: int, what: str, requests: int = 1) -> None:
        """:class:`QueueFull` unless ``work`` more image-passes fit (call with the lock held).

        ``what`` describes the request's work in the message (``needs 40``, ``needs about …``)."""
        held = self._queued_work + self._reserved_work
        if self._queue.full():
            self._reject(requests)
            raise QueueFull(
                f"the inference queue is full ({self._queue.maxsize} requests waiting); retry later"
            )
        if self.max_queued_work is not None and held > 0 and held + work > self.max_queued_work:
            self._reject(requests)
            raise QueueFull(
                f"the inference queue is full: it holds {held} image-passes (images × K) of "
                f"work, this request {what} and the limit is {self.max_queued_work} "
                "(BAYESGATE_MAX_QUEUED_WORK); retry later"
            )

    def check_room(self) -> None:
        """:class:`QueueFull` at once when the queue is already full (in jobs, or in work held),
        for a request whose work is not known before it is decoded (``/v2``)."""
        with self._work_lock:
            held = self._queued_work + self._reserved_work
            if self.max_queued_work is not None and held >= self.max_queued_work:
                self._reject()
                raise QueueFull(
                    f"the inference queue is full: it holds {held} image-passes (images × K) of "
                    f"work, the limit is {self.max_queued_work} (BAYESGATE_MAX_QUEUED_WORK); "
                    "retry later"
                )
            self._refuse_unless_fits(0, "needs nothing yet")  # full in jobs

    def check_fits(self, work: int, what: str | None = None) -> None:
        """:class:`QueueFull` at once when ``work`` more image-passes would not fit (nothing is
        held)."""
        with self._work_lock:
            self._refuse_unless_fits(work, what or f"needs {work}")

    def reserve(self, work: int, what: str | None = None) -> Reservation:
        """Hold ``work`` image-passes for a request whose body is not read yet (an estimate);
        :class:`QueueFull` at once when it does not fit."""
        if not self.running:
            raise NotReady("the inference worker is not running (starting up or shutting down)")
        with self._work_lock:
            self._refuse_unless_fits(work, what or f"needs {work}")
            self._reserved_work += work
        return Reservation(work)

    def resize(self, reservation: Reservation, work: int) -> None:
        """Replace the reservation's estimate by the request's exact work (``B × K``);
        :class:`QueueFull` (and nothing held) when that does not fit."""
        with self._work_lock:
            self._reserved_work -= reservation.work
            reservation.work = 0
            self._refuse_unless_fits(work, f"needs {work}")
            self._reserved_work += work
            reservation.work = work

    def release(self, reservation: Reservation) -> None:
        """Give the reservation's work back (idempotent; a no-op once the job is queued)."""
        with self._work_lock:
            self._reserved_work -= reservation.work
            reservation.work = 0

    def submit(
        self,
        x: torch.Tensor,
        k: int,
        *,
        seed: int | None,
        return_samples: bool,
        deadline: float,
        reservation: Reservation | None = None,
        requests: int = 1,
        gathered: bool = False,
        on_start: Callable[[], None] | None = None,
        columnar: bool = False,
    ) -> Job:
        """Enqueue without blocking; :class:`QueueFull` when the job's work or the job itself does
        not fit. The request's ``reservation`` (if any) becomes the job's queued work.

        For jobs that are batches already (the native front end's): ``requests`` is how many
        requests the job answers (counted in the stats and metrics); ``gathered`` runs it without
        waiting up to ``max_queue_delay`` for more jobs (those already queued still join it);
        ``on_start`` is called in the worker thread when its batch is taken for computing (before
        the batch's engine calls) — the moment to form the next batch, so that it waits in the
        queue, ready when the engine is free;
        ``columnar`` answers it with one :class:`~bayesgate.service.prediction.ColumnAnswer`
        instead of a :class:`~bayesgate.service.prediction.Prediction` per image."""
        if not self.running:
            raise NotReady("the inference worker is not running (starting up or shutting down)")
        job = Job(
            x=x,
            k=k,
            seed=seed,
            return_samples=return_samples,
            deadline=deadline,
            requests=requests,
            gathered=gathered,
            on_start=on_start,
            columnar=columnar,
        )
        with self._work_lock:
            if reservation is not None:
                self._reserved_work -= reservation.work
                reservation.work = 0
            self._refuse_unless_fits(job.work, f"needs {job.work}", requests)
            try:
                self._queue.put_nowait(job)  # puts happen under this lock: not full
            except queue.Full:  # pragma: no cover - defensive
                self._reject(requests)
                raise QueueFull("the inference queue is full; retry later") from None
            self._queued_work += job.work
        self._report_depth()
        return job

    def _reject(self, requests: int = 1) -> None:
        self.stats.record(requests_rejected=requests)
        if self.metrics is not None:
            self.metrics.count_requests("rejected", requests)

    def _dequeued(self, job: Job) -> Job:
        with self._work_lock:
            self._queued_work -= job.work
        return job

    def drop(self, reason: str, n: int = 1, stage: str = "queued") -> None:
        """Count jobs dropped (``bayesgate_jobs_dropped_total{reason,stage}``): before they were
        computed (``queued``) or stopped between two layers of their engine call
        (``computing``)."""
        self.stats.record(requests_expired=n)
        if self.metrics is not None:
            self.metrics.count_requests("expired", n)
            self.metrics.count_dropped(reason, n, stage)

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
        arrived: float | None = None,
        client_gone: Callable[[], Awaitable[Any]] | None = None,
        reservation: Reservation | None = None,
    ) -> list[Prediction]:
        """Answer one request (one :class:`Prediction` per instance, in order); raises the job's
        domain error.

        The deadline is ``arrived + timeout_s`` (``arrived``: ``time.monotonic()`` when the request
        reached the server; default now). ``client_gone()`` completes when the client hangs up: the
        job is then cancelled (dropped if not yet running) and :class:`ClientGone` raised; so is
        it when this coroutine itself is cancelled. The request's ``reservation``
        (:meth:`reserve`) becomes the job's queued work.
        """
        deadline = (time.monotonic() if arrived is None else arrived) + timeout_s
        late = DeadlineExceeded(
            f"no answer within the request timeout of {timeout_s:g} s (server busy)"
        )
        if time.monotonic() >= deadline:
            self.drop("deadline")  # spent its whole time reading and decoding: never enqueued
            raise late
        job = self.submit(
            x,
            k,
            seed=seed,
            return_samples=return_samples,
            deadline=deadline,
            reservation=reservation,
        )
        answer = asyncio.wrap_future(job.future)
        watcher = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        waiting = {answer} if watcher is None else {answer, watcher}
        try:
            done, _ = await asyncio.wait(
                waiting, timeout=deadline - time.monotonic(), return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            self._abandon(job, answer)
            raise
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
        if answer in done:
            return answer.result()
        job.dropped = "client_gone" if watcher is not None and watcher in done else "deadline"
        if not job.future.cancel():  # running: never answer while it is being computed
            try:
                result = await self._stopped(job, answer)
            except asyncio.CancelledError:
                self._abandon(job, answer)
                raise
            if result is not None and job.dropped == "deadline":
                return result  # its last layer ran before the worker's next check
        if job.dropped == "client_gone":
            raise ClientGone("the client closed the connection before the answer")
        raise late

    def _abandon(self, job: Job, answer: asyncio.Future[list[Prediction]]) -> None:
        """The waiting request was cancelled (a gRPC client cancelled its call or its deadline
        passed: grpc.aio cancels the handler): nobody will read the answer, so the job is dropped
        like one whose client hung up — never computed if still queued, stopped before its next
        layer if running (:meth:`_check`) — and its answer, if one comes, is read and dropped."""
        if job.dropped is None:  # at its deadline (a gRPC client's), or the client left
            # grpc.aio's own deadline timer may fire a hair before the job's (same instant, read
            # apart): a cancellation within ABANDON_SLACK_S of the deadline is the deadline
            at_deadline = time.monotonic() >= job.deadline - ABANDON_SLACK_S
            job.dropped = "deadline" if at_deadline else "client_gone"
        job.future.cancel()
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _stopped(
        self, job: Job, answer: asyncio.Future[list[Prediction]]
    ) -> list[Prediction] | None:
        """Wait for the worker to stop a running job the request gave up on (it checks before
        every layer, :meth:`_check`) and answer it (its exception is raised), or to finish it
        first (the answer is returned). An engine that runs no layers cannot be stopped: after
        ``stop_wait_s`` the request is answered anyway (logged)."""
        try:
            return await asyncio.wait_for(asyncio.shield(answer), self.stop_wait_s)
        except (DeadlineExceeded, ClientGone):
            return None  # stopped: the request answers with its own message
        except TimeoutError:
            log.warning(
                "worker: a job given up (%s) was not stopped within %.1f s",
                job.dropped,
                self.stop_wait_s,
            )
            return None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("worker already started")
        self._answer_thread = NamedThread(
            self._answer_loop, "bayesgate-answers", os_name="bg-answers"
        )
        self._answer_thread.start()
        self._thread = NamedThread(self._run, "bayesgate-worker", os_name="bg-worker")
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the threads; a computed batch is still answered, jobs still queued fail with
        :class:`NotReady`."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._answer_thread is not None:
            # queue.Full: the answer thread is stuck in an answer; abandon() answers its jobs
            with contextlib.suppress(queue.Full):
                self._computed.put(None, timeout=max(0.0, deadline - time.monotonic()))
            self._answer_thread.join(max(0.0, deadline - time.monotonic()))
        self.abandon("server shutting down")

    def abandon(self, message: str) -> int:
        """Answer every queued and running job with :class:`NotReady` (``message``) now; return
        how many. A running engine call finishes in the thread, its answer is discarded."""
        pending = list(self._running)
        with self._answering_lock:
            pending += [job for computed in self._answering for job in computed.jobs]
        carry, self._carry = self._carry, None
        if carry is not None:
            pending.append(carry)
        while True:
            try:
                pending.append(self._dequeued(self._queue.get_nowait()))
            except queue.Empty:
                break
        answered = 0
        for job in pending:
            if not job.future.done():
                settle(job.future, exc=NotReady(message))
                answered += 1
        self._report_depth()
        return answered

    # --- worker thread ------------------------------------------------------------------------

    def fastest_seconds(self, work: int) -> float:
        """``work`` image-passes at the fastest per-pass rate of the last 64 engine calls (0 until
        there are :data:`MIN_RATE_CALLS` of them): a lower bound on how long the job will
        compute."""
        if len(self._pass_seconds) < MIN_RATE_CALLS:
            return 0.0
        return work * min(self._pass_seconds)

    def _run(self) -> None:
        use_process_thread_count()
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
                    settle(job.future, exc=InferenceFailed("internal error in the worker"))

    def _next(self, timeout: float | None) -> Job:
        if self._carry is not None:
            job, self._carry = self._carry, None
            return job
        if timeout is None:
            return self._dequeued(self._queue.get(timeout=_POLL_S))
        if timeout <= 0:
            return self._dequeued(self._queue.get_nowait())
        return self._dequeued(self._queue.get(timeout=timeout))

    def _gather(self) -> list[Job]:
        """First job (waiting up to the poll interval), then more until full or delay passed."""
        first = self._next(None)
        batch, size = [first], first.size
        self._running = batch  # visible to abandon() while the batch waits to fill
        # a batch already (gathered): take what is queued now, wait for nothing more
        until = time.monotonic() if first.gathered else first.enqueued + self.max_queue_delay_s
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
            if job.future.done() and not job.future.cancelled():
                continue  # answered by abandon() while the batch was gathered
            if not claim(job) or now + self.fastest_seconds(job.work) > job.deadline:
                # cancelled by the waiting request (client gone or timed out), or it cannot be
                # answered before its deadline even at the fastest rate seen lately
                self.drop(job.dropped or "deadline", job.requests)
                if job.future.running():
                    settle(
                        job.future,
                        exc=DeadlineExceeded(
                            "the request could not be answered before its deadline (server busy)"
                        ),
                    )
                continue
            self.stats.record(queue_seconds=now - job.enqueued)
            if metrics is not None:
                metrics.queue_seconds.observe(now - job.enqueued)
            live.append(job)
            if job.on_start is not None:
                job.on_start()
        self._running = live
        groups: dict[int, list[Job]] = {}
        for job in live:
            if job.seed is None:
                groups.setdefault(job.k, []).append(job)
            else:
                self._run_group([job])
        for jobs in groups.values():
            self._run_group(jobs)
        self._running = []

    def engine_call(
        self, model: ServedModel, x: torch.Tensor, k: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        """``(probs B×K×C, features)`` of this worker's engine (:func:`engine_outputs`)."""
        return engine_outputs(self.engine, model, x, k, generator)

    def _run_group(self, jobs: list[Job]) -> None:
        """One engine call over the concatenated inputs of ``jobs`` (same K); split the rows.

        The call is checked before every layer (:func:`~bayesgate.service.engine.checkpoints`):
        when a job's client is gone or its deadline has passed, the call stops, that job is
        answered (:meth:`_stop_dropped`) and the others run again without it."""
        while jobs:
            try:
                self._compute_and_answer(jobs)
                return
            except CallStopped:
                jobs = self._stop_dropped(jobs)

    def _check(self, jobs: list[Job]) -> None:
        """:class:`CallStopped` when a job of the running call is to be dropped: its request gave
        up (``dropped``), its deadline passed, or it was answered (``abandon()``)."""
        now = time.monotonic()
        for job in jobs:
            if job.dropped is not None or now > job.deadline or job.future.done():
                raise CallStopped

    def _stop_dropped(self, jobs: list[Job]) -> list[Job]:
        """Answer and count the jobs of a stopped call that are dropped (``stage="computing"``);
        return the others, which run again."""
        now = time.monotonic()
        rest: list[Job] = []
        for job in jobs:
            if job.future.done():  # answered by abandon()
                continue
            reason = job.dropped or ("deadline" if now > job.deadline else None)
            if reason is None:
                rest.append(job)
                continue
            self.drop(reason, job.requests, stage="computing")
            if reason == "client_gone":
                settle(job.future, exc=ClientGone("the client closed the connection"))
            else:
                settle(job.future, exc=DeadlineExceeded(STOPPED_LATE))
        self._running = rest
        return rest

    def _compute_and_answer(self, jobs: list[Job]) -> None:
        """Run the engine over ``jobs`` (checked between layers) and hand the outputs to the
        answer thread (:meth:`_answer`); an engine error fails them all (:class:`InferenceFailed`).
        """
        model = self.model
        k, seed = jobs[0].k, jobs[0].seed
        size = sum(job.size for job in jobs)
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            x = torch.cat([job.x for job in jobs]).to(model.device)
            generator = None
            if seed is not None:
                generator = torch.Generator(device=model.device).manual_seed(seed)
            with checkpoints(model.network, lambda: self._check(jobs)):
                probs, features = self.engine_call(model, x, k, generator)
            if probs.shape[:2] != (size, k):
                raise RuntimeError(f"engine returned shape {tuple(probs.shape)}, expected B×K×C")
        except CallStopped:
            raise
        except Exception as exc:
            self._fail(jobs, exc, size, time.perf_counter() - start)
            return
        seconds = time.perf_counter() - start
        self._pass_seconds.append(seconds / (size * k))
        cpu = time.thread_time() - cpu_start
        computed = Computed(list(jobs), model, probs, features, size, seconds, cpu)
        with self._answering_lock:
            self._answering.append(computed)
        self._computed.put(computed)  # waits while the answer thread has one batch waiting

    def _answer_loop(self) -> None:
        """The answer thread: answer each computed batch in turn until ``None``."""
        use_process_thread_count()
        while True:
            computed = self._computed.get()
            if computed is None:
                return
            try:
                self._answer(computed)
            except Exception:  # a bug while answering: never let the thread die
                log.exception("worker: unexpected error while answering a batch")
                for job in computed.jobs:
                    settle(job.future, exc=InferenceFailed("internal error in the worker"))
            finally:
                with self._answering_lock:
                    self._answering.remove(computed)

    def _answer(self, computed: Computed) -> None:
        """Build the answers of one engine call (its own model) and answer each job with its rows
        — :class:`Prediction` s, or one :class:`ColumnAnswer` for a ``columnar`` job; an error
        fails them all (:class:`InferenceFailed`)."""
        jobs, probs, size, model = computed.jobs, computed.probs, computed.size, computed.model
        decision = model.decision
        try:
            columns = answer_columns(probs, model, computed.features)
            answers = per_image_rows(jobs, columns, model)
            flagged = int(columns.flagged(decision.score, decision.threshold).sum())
        except Exception as exc:
            self._fail(jobs, exc, size, computed.engine_seconds)
            return
        requests = sum(job.requests for job in jobs)
        self.stats.record_call(
            size,
            requests,
            computed.engine_seconds,
            ok=True,
            cpu_seconds=computed.engine_cpu_seconds,
        )
        if self.metrics is not None:
            self.metrics.observe_engine_call(size, computed.engine_seconds)
            self.metrics.count_requests("succeeded", requests)
            self.metrics.count_instances(size, flagged)
        offset = taken = 0  # rows of the call; rows of ``answers``
        for job in jobs:
            end = offset + job.size
            if job.columnar:
                part = columns.rows(offset, end)
                answer = ColumnAnswer(part, model.ref, decision.score, decision.threshold)
                settle(job.future, answer)
                offset = end
                continue
            rows = answers[taken : taken + job.size]
            taken += job.size
            if job.return_samples:
                samples = probs[offset:end].float().cpu().tolist()
                rows = [replace(p, samples=s) for p, s in zip(rows, samples, strict=True)]
            offset = end
            settle(job.future, rows)

    def _fail(self, jobs: list[Job], exc: Exception, size: int, seconds: float) -> None:
        requests = sum(job.requests for job in jobs)
        self.stats.record_call(size, requests, seconds, ok=False)
        if self.metrics is not None:
            self.metrics.observe_engine_call(size, seconds)
            self.metrics.count_requests("failed", requests)
        log.exception("worker: engine call failed for %d request(s)", requests)
        message = f"inference failed: {type(exc).__name__}: {exc}"
        for job in jobs:
            settle(job.future, exc=InferenceFailed(message))
