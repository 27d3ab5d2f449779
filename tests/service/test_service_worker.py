"""The batching worker: concurrent requests share engine calls and get their own rows back; a
failing engine call fails only its requests; a full queue is 503, a missed deadline 504."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from prometheus_text import metric_value
from torch import nn

from bayesgate.models.store.directory import load_model
from bayesgate.service.engine import Engine, mc_engine
from bayesgate.service.errors import InferenceFailed, NotReady
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import Settings
from bayesgate.service.worker import BatchWorker

pytestmark = pytest.mark.anyio


def encoding_engine(calls: list[int]) -> Engine:
    """Fake engine: instance b answers class ``round(9·x_b[0])`` with certainty in all K passes;
    records the batch size of every call."""

    def run(_: nn.Module, x: torch.Tensor, k: int, __: torch.Generator | None) -> torch.Tensor:
        calls.append(x.shape[0])
        label = (x.flatten(1)[:, 0] * 9).round().long()
        probs = torch.nn.functional.one_hot(label, 10).float()
        return probs.unsqueeze(1).expand(-1, k, -1).contiguous()

    return run


def image_with_code(code: int) -> list[float]:
    return [code / 9] + [0.0] * 783


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_concurrent_requests_share_an_engine_call_and_get_their_own_rows(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    slowed: Callable[..., Engine],
) -> None:
    calls: list[int] = []
    async with serving(make_settings(max_batch_size=32, max_queue_delay_ms=5.0)) as (app, c):
        app.state.worker.engine = slowed(encoding_engine(calls), 0.3)
        first = asyncio.create_task(c.post("/v1/predict", json={"instances": [image_with_code(9)]}))
        await wait_for(lambda: app.state.worker.queue_depth() == 0 and calls == [1])
        # While the worker is busy, 8 requests of 1–3 images each pile up in the queue.
        sizes = [1, 2, 3, 1, 2, 3, 1, 2]
        bodies = [
            {"instances": [image_with_code((i + j) % 10) for j in range(n)], "mc_samples": 4}
            for i, n in enumerate(sizes)
        ]
        answers = await asyncio.gather(*(c.post("/v1/predict", json=b) for b in bodies))
        await first
        stats = (await c.get("/v1/stats")).json()
    for i, (n, answer) in enumerate(zip(sizes, answers, strict=True)):
        assert answer.status_code == 200
        labels = [p["label"] for p in answer.json()["predictions"]]
        assert labels == [(i + j) % 10 for j in range(n)]
        assert all(p["mutual_information"] == 0 for p in answer.json()["predictions"])
    # Everything queued behind the slow call ran as one engine call of 15 instances.
    assert calls == [1, sum(sizes)]
    assert stats["batch_size_max"] == 15 and stats["recent_batch_sizes"] == [1, 15]
    assert stats["requests_per_batch_mean"] == pytest.approx((1 + 8) / 2)
    assert stats["requests_succeeded"] == 9 and stats["instances"] == 16


async def test_batches_respect_max_batch_size_and_never_split_a_request(
    tiny_model_dir: Any, slowed: Callable[..., Engine]
) -> None:
    calls: list[int] = []
    worker = BatchWorker(
        load_served_model(tiny_model_dir, "cpu"), max_batch_size=5, max_queue_delay_s=0.05
    )
    worker.engine = slowed(encoding_engine(calls), 0.2)
    worker.start()
    try:
        blocker = asyncio.create_task(worker.predict(torch.zeros(1, 1, 28, 28), 2))
        await wait_for(lambda: calls == [1])
        sizes = [2, 2, 2, 7, 1]
        jobs = [worker.predict(torch.zeros(n, 1, 28, 28), 2) for n in sizes]
        results = await asyncio.gather(blocker, *jobs)
    finally:
        worker.stop()
    assert [len(r) for r in results] == [1, *sizes]
    # FIFO gathering: [2,2] (next 2 would exceed 5), [2] (the 7 does not fit), [7] alone, [1].
    assert calls == [1, 4, 2, 7, 1]


async def test_failing_engine_call_fails_only_its_requests_and_the_worker_survives(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    body = {"instances": [[0.3] * 784]}
    async with serving(make_settings(max_queue_delay_ms=50.0)) as (app, client):
        failures = {"left": 1}

        def flaky(net: nn.Module, x: torch.Tensor, k: int, g: torch.Generator | None):
            if k == 3 and failures["left"]:
                failures["left"] -= 1
                raise RuntimeError("injected engine failure")
            return mc_engine(net, x, k, g)

        app.state.worker.engine = flaky
        # Same batch (50 ms gathering window), two engine calls: K=3 fails, K=5 succeeds.
        bad, good = await asyncio.gather(
            client.post("/v1/predict", json={**body, "mc_samples": 3}),
            client.post("/v1/predict", json={**body, "mc_samples": 5}),
        )
        after = await client.post("/v1/predict", json={**body, "mc_samples": 3})
        stats = (await client.get("/v1/stats")).json()
    assert bad.status_code == 500
    assert bad.json()["error"] == "inference failed: RuntimeError: injected engine failure"
    assert bad.json()["code"] == "inference_failed"
    assert good.status_code == 200 and after.status_code == 200
    assert after.json()["mc_samples"] == 3
    assert stats["requests_failed"] == 1 and stats["requests_succeeded"] == 2


async def test_full_queue_is_503_with_retry_after(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    slowed: Callable[..., Engine],
) -> None:
    settings = make_settings(queue_capacity=1, max_batch_size=1, max_queue_delay_ms=0.0)
    async with serving(settings) as (app, client):
        slow = slowed(mc_engine, 0.3)
        entered = threading.Event()

        def engine(*args: Any) -> torch.Tensor:
            entered.set()
            return slow(*args)

        app.state.worker.engine = engine
        body = {"instances": [[0.3] * 784]}
        first = asyncio.create_task(client.post("/v1/predict", json=body))
        await wait_for(entered.is_set)  # the worker is inside the slow call
        queued = asyncio.create_task(client.post("/v1/predict", json=body))
        await wait_for(lambda: app.state.worker.queue_depth() == 1)
        rejected = await asyncio.gather(*(client.post("/v1/predict", json=body) for _ in range(3)))
        served = await asyncio.gather(first, queued)
        stats = (await client.get("/v1/stats")).json()
    for r in rejected:
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert "queue is full (1 requests waiting)" in r.json()["error"]
    assert [r.status_code for r in served] == [200, 200]
    assert stats["requests_rejected"] == 3


async def test_missed_deadline_is_504_and_expired_jobs_never_reach_the_engine(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    slowed: Callable[..., Engine],
) -> None:
    settings = make_settings(request_timeout_s=0.2, max_batch_size=1, max_queue_delay_ms=0.0)
    async with serving(settings) as (app, client):
        calls: list[int] = []
        encode = encoding_engine(calls)

        def slow_then_network(net: nn.Module, x: torch.Tensor, k: int, g: Any) -> torch.Tensor:
            """0.6 s before the first layer of the network runs (where the worker checks)."""
            probs = encode(net, x, k, g)
            if len(calls) == 1:
                time.sleep(0.6)
            net(x)
            return probs

        app.state.worker.engine = slow_then_network
        body = {"instances": [image_with_code(4)]}
        late, expired = await asyncio.gather(
            client.post("/v1/predict", json=body), client.post("/v1/predict", json=body)
        )
        # the late job stopped before its first layer, the expired one never started
        await wait_for(lambda: app.state.worker.stats.snapshot()["requests_expired"] == 2)
        after = await client.post("/v1/predict", json=body)
        text = app.state.metrics.exposition()[0].decode()
    for r in (late, expired):
        assert r.status_code == 504
        assert "within the request timeout of 0.2 s" in r.json()["error"]
    assert after.status_code == 200 and after.json()["predictions"][0]["label"] == 4
    assert calls == [1, 1]  # the slow call and `after`; the expired job was dropped
    dropped = "bayesgate_jobs_dropped_total"
    assert metric_value(text, dropped, reason="deadline", stage="computing") == 1
    assert metric_value(text, dropped, reason="deadline", stage="queued") == 1


async def test_worker_refuses_work_when_not_running(tiny_model_dir: Any) -> None:
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"))
    with pytest.raises(NotReady, match="not running"):
        await worker.predict(torch.zeros(1, 1, 28, 28), 2)
    worker.start()
    assert len(await worker.predict(torch.zeros(2, 1, 28, 28), 2)) == 2
    worker.stop()
    with pytest.raises(NotReady):
        await worker.predict(torch.zeros(1, 1, 28, 28), 2)


async def test_worker_answers_match_the_engine_on_the_loaded_network(tiny_model_dir: Any) -> None:
    """Seeded worker output equals ``mc_predict`` on an independently loaded copy.

    At one torch thread, set here before the worker starts: the worker's thread must compute
    with it from its first call (``use_process_thread_count``). Without that, its matrix products
    ran on every core (OpenMP's default in a new thread), and the answer's last bits differed from
    this thread's one-thread ones — every time on a 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"))
    worker.start()
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    try:
        rows = await worker.predict(x, 6, seed=5, return_samples=True)
        net = load_model(tiny_model_dir).network
        expected = mc_engine(net, x, 6, torch.Generator().manual_seed(5))
    finally:
        worker.stop()
        torch.set_num_threads(threads)
    assert torch.equal(torch.tensor([r.samples for r in rows]), expected)


class _HeldAnswers:
    """``answer_columns`` (the first step of every batch's answers) that waits, in the answer
    thread, until ``release`` is set (the real one afterwards); records the thread that built
    each batch's answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import bayesgate.service.worker as worker_module

        self.real = worker_module.answer_columns
        self.holding = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []
        monkeypatch.setattr(worker_module, "answer_columns", self)

    def __call__(self, probs: torch.Tensor, model: Any, features: Any = None) -> Any:
        self.threads.append(threading.current_thread().name)
        self.holding.set()
        assert self.release.wait(10), "answers never released"
        return self.real(probs, model, features)


async def test_the_next_batch_computes_while_the_last_one_is_answered(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs batch 2 while batch 1's answers are still being built (held here): the
    answers are built by another thread than the engine's, and each request gets its own."""
    held = _HeldAnswers(monkeypatch)
    engine_threads: list[str] = []

    def engine(network: nn.Module, x: torch.Tensor, k: int, g: Any, **kw: Any) -> Any:
        engine_threads.append(threading.current_thread().name)
        return mc_engine(network, x, k, g, **kw)

    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"), max_queue_delay_s=0.0)
    worker.engine = engine
    worker.start()
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    try:
        first = asyncio.ensure_future(worker.predict(x[:1], 4, seed=1, return_samples=True))
        await wait_for(held.holding.is_set)
        second = asyncio.ensure_future(worker.predict(x[1:], 4, seed=2, return_samples=True))
        await wait_for(lambda: len(engine_threads) == 2)  # computed while batch 1 is held
        assert not first.done() and not second.done()
        held.release.set()
        rows = await first, await second
    finally:
        held.release.set()
        worker.stop()
    assert engine_threads == ["bayesgate-worker"] * 2
    assert held.threads == ["bayesgate-answers"] * 2
    net = load_model(tiny_model_dir).network
    for row, b, seed in ((rows[0], 0, 1), (rows[1], 1, 2)):
        expected = mc_engine(net, x[b : b + 1], 4, torch.Generator().manual_seed(seed))
        assert torch.equal(torch.tensor([r.samples for r in row]), expected)


async def test_abandon_and_stop_answer_a_batch_waiting_for_its_answers(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _HeldAnswers(monkeypatch)
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"), max_queue_delay_s=0.0)
    worker.start()
    try:
        waiting = asyncio.ensure_future(worker.predict(torch.zeros(1, 1, 28, 28), 2))
        await wait_for(held.holding.is_set)
        assert worker.abandon("draining") == 1  # computed, its answers not built yet
        with pytest.raises(NotReady, match="draining"):
            await waiting
    finally:
        held.release.set()
        worker.stop(timeout_s=5.0)
    assert worker._answer_thread is not None and not worker._answer_thread.is_alive()
    assert worker._answering == []


async def test_an_error_while_answering_fails_only_that_batch(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bayesgate.service.worker as worker_module

    real = worker_module.answer_columns
    failures = iter([True, False])

    def flaky(probs: torch.Tensor, model: Any, features: Any = None) -> Any:
        if next(failures):
            raise ValueError("scores broke")
        return real(probs, model, features)

    monkeypatch.setattr(worker_module, "answer_columns", flaky)
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"), max_queue_delay_s=0.0)
    worker.start()
    try:
        with pytest.raises(InferenceFailed, match="ValueError: scores broke"):
            await worker.predict(torch.zeros(1, 1, 28, 28), 2)
        assert len(await worker.predict(torch.zeros(3, 1, 28, 28), 2)) == 3
    finally:
        worker.stop()
    snapshot = worker.stats.snapshot()
    assert (snapshot["requests_failed"], snapshot["requests_succeeded"]) == (1, 1)


def timed_engine(seconds: float, spin: bool) -> Engine:
    """:func:`encoding_engine` that first spends ``seconds`` sleeping (no CPU) or spinning on
    the worker thread (CPU)."""
    inner = encoding_engine([])

    def run(network: nn.Module, x: torch.Tensor, k: int, g: torch.Generator | None) -> Any:
        end = time.perf_counter() + seconds
        if spin:
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(seconds)
        return inner(network, x, k, g)

    return run


def spinning_thread_cpu_share(seconds: float = 0.3) -> float:
    """CPU ÷ wall time of a thread spinning for ``seconds`` now: what this machine gives one
    busy thread at the moment (1 when idle, less under load)."""
    share: list[float] = []

    def spin() -> None:
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        while time.perf_counter() < wall0 + seconds:
            pass
        share.append((time.thread_time() - cpu0) / (time.perf_counter() - wall0))

    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()
    return share[0]


async def test_stats_split_engine_time_into_wall_and_worker_thread_cpu(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """``compute_cpu_seconds_total`` is the worker thread's CPU in engine calls: ≈ the call's wall
    time when it computes, ≈ 0 when it waits (bench/load.py's same-run model reference). The
    spinning case is compared with the share a spinning thread gets just before and after, so a
    busy machine (a CI run beside other jobs gave the engine thread 47 % of its wall time once)
    does not fail it."""
    body = {"instances": [image_with_code(3)], "mc_samples": 2}
    totals = {}
    shares = [spinning_thread_cpu_share()]
    for spin in (False, True):
        async with serving(make_settings(max_batch_size=1)) as (app, c):
            app.state.worker.engine = timed_engine(0.1, spin)
            for _ in range(3):
                assert (await c.post("/v1/predict", json=body)).status_code == 200
            stats = (await c.get("/v1/stats")).json()
        assert stats["compute_seconds_total"] >= 0.3
        totals[spin] = (stats["compute_seconds_total"], stats["compute_cpu_seconds_total"])
    shares.append(spinning_thread_cpu_share())
    wall, cpu = totals[False]
    assert cpu < 0.1 * wall  # sleeping: the thread used (almost) no CPU
    wall, cpu = totals[True]
    # spinning: CPU ≈ wall × the share a busy thread gets here now (1 on an idle machine)
    assert 0.5 * min(shares) * wall < cpu <= wall + 0.01, (cpu, wall, shares)


def test_a_gathered_job_runs_without_the_gather_wait_and_counts_its_requests(
    tiny_model_dir: Any,
) -> None:
    """A native front end's batch (``gathered``) does not wait ``max_queue_delay`` for company;
    ``on_start`` is called once, before its answer; its ``requests`` are what the stats count.
    A plain job under the same worker does wait (the control)."""
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"), max_queue_delay_s=1.5)
    worker.start()
    try:
        x = torch.rand(3, 1, 28, 28)
        events: list[str] = []
        start = time.monotonic()
        job = worker.submit(
            x,
            4,
            seed=None,
            return_samples=False,
            deadline=start + 30,
            requests=3,
            gathered=True,
            on_start=lambda: events.append("start"),
        )
        job.future.add_done_callback(lambda _: events.append("answered"))
        rows = job.future.result(timeout=10)
        gathered_s = time.monotonic() - start
        assert len(rows) == 3 and gathered_s < 1.0 and events == ["start", "answered"]
        assert worker.stats.snapshot()["requests_succeeded"] == 3
        start = time.monotonic()
        plain = worker.submit(x, 4, seed=None, return_samples=False, deadline=start + 30)
        plain.future.result(timeout=10)
        assert time.monotonic() - start >= 1.4  # waited for more jobs
        assert worker.stats.snapshot()["requests_succeeded"] == 4
    finally:
        worker.stop()


async def test_a_mixed_call_builds_predictions_only_for_the_jobs_answered_per_image(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A native front end's batch (``columnar``) sharing an engine call with per-image jobs gets
    its columns; the :class:`Prediction` s are built for the other jobs' rows only, and each
    equals the one built from all the call's rows."""
    import bayesgate.service.worker as worker_module
    from bayesgate.service.jobs import Job
    from bayesgate.service.prediction import ColumnAnswer

    seen: dict[str, Any] = {"built": []}
    real_columns, real_rows = worker_module.answer_columns, worker_module.rows_of

    def columns_spy(probs: torch.Tensor, model: Any, features: Any = None) -> Any:
        seen["columns"] = real_columns(probs, model, features)
        return seen["columns"]

    def rows_spy(columns: Any, model: Any) -> Any:
        seen["built"].append(int(columns.labels.shape[0]))
        return real_rows(columns, model)

    monkeypatch.setattr(worker_module, "answer_columns", columns_spy)
    monkeypatch.setattr(worker_module, "rows_of", rows_spy)
    worker = BatchWorker(load_served_model(tiny_model_dir, "cpu"), max_queue_delay_s=0.0)
    worker.start()
    x = torch.rand(7, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    spans = [(0, 3, True), (3, 5, False), (5, 6, True), (6, 7, False)]  # (start, stop, columnar)
    jobs = [
        Job(x=x[a:b], k=4, seed=3, return_samples=False, deadline=time.monotonic() + 60,
            columnar=columnar)
        for a, b, columnar in spans
    ]  # fmt: skip
    try:
        worker._run_group(jobs)
        answers = [job.future.result(timeout=30) for job in jobs]
    finally:
        worker.stop()
    assert seen["built"] == [3]  # the two per-image jobs' rows, not the 7 of the call
    everything = real_rows(seen["columns"], worker.model)
    for (a, b, columnar), answer in zip(spans, answers, strict=True):
        if columnar:
            assert isinstance(answer, ColumnAnswer)
            assert torch.equal(answer.columns.labels, seen["columns"].labels[a:b])
        else:
            assert answer == everything[a:b]
