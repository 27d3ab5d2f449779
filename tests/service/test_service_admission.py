"""Admission by work and dropped jobs, deterministic: the worker is held inside an engine call (an
``Event``) while jobs queue behind it, so what is queued, refused, dropped or computed is known.

- the queue holds at most ``max_queued_work`` image-passes (B × K): a request that does not fit is
  503 + ``Retry-After`` at once — from its head and first body piece (an estimate) before the body
  is read, and exactly (images × K) before decoding; what a request held is given back however it
  ends;
- the deadline counts from the request's arrival (the middleware's stamp), not from enqueueing;
- jobs whose client hung up or whose deadline passed before their batch ran are never computed
  and are counted in ``bayesgate_jobs_dropped_total{reason}``;
- ``abandon()`` (the drain deadline) answers queued and running jobs with 503 and the worker keeps
  serving.
"""

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

from bayesgate.service.errors import ClientGone, DeadlineExceeded, NotReady, QueueFull
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

GOOD = [0.5] * 784
WAIT_S = 20.0  # generous: the machine running the tests may be heavily loaded


class HeldEngine:
    """Records the batch size of each call; the first call blocks until ``release()``."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.entered = threading.Event()
        self._gate = threading.Event()

    def __call__(self, _: nn.Module, x: torch.Tensor, k: int, __: Any = None) -> torch.Tensor:
        self.calls.append(int(x.shape[0]))
        self.entered.set()
        assert self._gate.wait(WAIT_S), "engine never released"
        return torch.full((x.shape[0], k, 10), 0.1)

    def release(self) -> None:
        self._gate.set()


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def held_worker(app: Any) -> tuple[Any, HeldEngine, asyncio.Task]:
    """The app's worker with a held engine, busy with one 1-image job (K = 1)."""
    worker = app.state.worker
    engine = HeldEngine()
    worker.engine = engine
    first = asyncio.create_task(worker.predict(torch.zeros(1, 1, 28, 28), 1, timeout_s=WAIT_S))
    await until(engine.entered.is_set)
    return worker, engine, first


def dropped(app: Any, reason: str) -> float:
    text = app.state.metrics.exposition()[0].decode()
    return metric_value(text, "bayesgate_jobs_dropped_total", reason=reason)


async def test_queue_is_bounded_in_images_times_k(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(max_queued_work=100, max_instances=8, max_batch_size=64)
    async with serving(settings) as (app, client):
        worker, engine, first = await held_worker(app)
        body = {"instances": [GOOD] * 4, "mc_samples": 10}  # 40 image-passes each
        queued = [asyncio.create_task(client.post("/v1/predict", json=body)) for _ in range(2)]
        await until(lambda: worker.queued_work() == 80)
        start = time.monotonic()
        refused = await client.post("/v1/predict", json=body)  # 80 + 40 > 100
        refused_after = time.monotonic() - start
        small = asyncio.create_task(
            client.post("/v1/predict", json={"instances": [GOOD] * 2, "mc_samples": 10})
        )  # 80 + 20 ≤ 100: fits
        await until(lambda: worker.queued_work() == 100)
        engine.release()
        answers = await asyncio.gather(*queued, small)
        await first
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["code"] == "queue_full"
    assert "holds 80 image-passes" in refused.json()["error"]
    assert "needs about 40 (4 image(s) estimated" in refused.json()["error"]
    assert "limit is 100" in refused.json()["error"]
    assert refused_after < 5.0  # answered at once, not after waiting (generous on a loaded host)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert sorted(engine.calls) == [1, 10]  # the first job, then 4 + 4 + 2 images in one call


async def holding_80(app: Any) -> tuple[Any, HeldEngine, asyncio.Task, asyncio.Task]:
    """:func:`held_worker`, and an 8-image job with K = 10 queued behind it (80 image-passes)."""
    worker, engine, first = await held_worker(app)
    queued = asyncio.create_task(worker.predict(torch.zeros(8, 1, 28, 28), 10, timeout_s=WAIT_S))
    await until(lambda: worker.queued_work() == 80)
    return worker, engine, first, queued


def compact_instances(n: int) -> bytes:
    """``n`` blank images as compact JSON: 2 bytes per pixel, so the estimate (3,072 bytes per
    instance) counts about half of them."""
    row = b"[" + b",".join([b"0"] * 28) + b"]"
    image = b"[" + b",".join([row] * 28) + b"]"
    return b'{"mc_samples":10,"instances":[' + b",".join([image] * n) + b"]}"


async def test_a_full_queue_refuses_before_the_body_is_read(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """The body's first piece arrives, the rest never does: the 503 comes anyway (a server that
    reads the body before deciding never answers), and nothing stays held."""
    settings = make_settings(max_queued_work=100, max_instances=64, default_mc_samples=10)
    async with serving(settings) as (app, client):
        worker, engine, first, queued = await holding_80(app)
        head = b'{"images": [' + b",".join([b'"' + b"A" * 1020 + b'"'] * 4)
        never = asyncio.Event()

        async def post_unfinished(length: int) -> Any:
            async def body() -> Any:
                yield head
                await never.wait()  # the rest of the body never comes
                yield b"]}"

            headers = {"content-type": "application/json", "content-length": str(length)}
            return await asyncio.wait_for(
                client.post("/v1/predict", content=body(), headers=headers), 10.0
            )

        # 8 kB: as "instances" 2 images (20 fit), as base64 images 8 (80 do not): first piece read
        after_first_piece = await post_unfinished(8 * 1024)
        # 32 kB: even as "instances" 10 images, 100 image-passes: refused from the head alone
        from_head = await post_unfinished(32 * 1024)
        held_after_refusal = worker.held_work()
        bad = await client.post("/v1/predict", json={"images": ["not base64!"] * 2})
        held_after_bad = worker.held_work()
        engine.release()
        assert len(await queued) == 8
        await first
    for refused, needs in (
        (after_first_piece, "needs about 80 (8 image(s) estimated from a body of 8192 bytes"),
        (from_head, "needs about 100 (10 image(s) estimated from a body of 32768 bytes"),
    ):
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert needs in refused.json()["error"]
    assert bad.status_code == 422, bad.text  # 20 image-passes fit; the decoder refuses them
    assert held_after_refusal == held_after_bad == 80  # only the queued job: nothing leaked


async def test_the_exact_work_is_checked_before_decoding(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The estimate lets a compact body in (2 images estimated, 20 image-passes); its exact work
    (4 × 10) does not fit beside 80 queued: 503 naming it, and no image is decoded."""
    from bayesgate.service.routes import predict as predict_route

    decoded: list[int] = []
    real = predict_route.decode_instances

    def counting_decode(instances: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        decoded.append(len(instances))
        return real(instances, *args, **kwargs)

    monkeypatch.setattr(predict_route, "decode_instances", counting_decode)
    settings = make_settings(max_queued_work=100, max_instances=64, default_mc_samples=10)
    async with serving(settings) as (app, client):
        worker, engine, first, queued = await holding_80(app)
        headers = {"content-type": "application/json"}
        refused = await client.post("/v1/predict", content=compact_instances(4), headers=headers)
        fits = asyncio.create_task(
            client.post("/v1/predict", content=compact_instances(2), headers=headers)
        )
        await until(lambda: worker.queued_work() == 100)
        engine.release()
        assert (await fits).status_code == 200
        await queued, await first
        assert worker.held_work() == 0
    assert refused.status_code == 503, refused.text
    assert "holds 80 image-passes" in refused.json()["error"]
    assert "needs 40 and the limit is 100" in refused.json()["error"]
    assert decoded == [2]  # the refused body was never decoded


async def test_deadline_counts_from_arrival_not_enqueue(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decoding takes longer than the whole request timeout: 504 without computing anything (on
    a deadline counted from enqueueing the request would be answered 200)."""
    from bayesgate.service.routes import predict as predict_route

    real = predict_route.decode_instances

    def slow_decode(*args: Any, **kwargs: Any) -> torch.Tensor:
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(predict_route, "decode_instances", slow_decode)
    async with serving(make_settings(request_timeout_s=0.5)) as (app, client):
        calls_before = app.state.worker.stats.snapshot()["engine_calls"]
        r = await client.post("/v1/predict", json={"instances": [GOOD]})
        assert r.status_code == 504, r.text
        assert r.json()["code"] == "deadline_exceeded"
        assert app.state.worker.stats.snapshot()["engine_calls"] == calls_before
        assert dropped(app, "deadline") == 1


async def test_jobs_of_gone_or_late_clients_are_dropped_never_computed(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(max_batch_size=64)) as (app, _):
        worker, engine, first = await held_worker(app)
        hang_up = asyncio.Event()
        gone = asyncio.create_task(
            worker.predict(torch.zeros(3, 1, 28, 28), 1, timeout_s=WAIT_S, client_gone=hang_up.wait)
        )
        late = asyncio.create_task(worker.predict(torch.zeros(5, 1, 28, 28), 1, timeout_s=0.2))
        kept = asyncio.create_task(worker.predict(torch.zeros(7, 1, 28, 28), 1, timeout_s=WAIT_S))
        await until(lambda: worker.queue_depth() == 3)
        hang_up.set()
        with pytest.raises(ClientGone):
            await gone
        with pytest.raises(DeadlineExceeded):
            await late
        engine.release()
        assert len(await kept) == 7
        await first
        assert engine.calls == [1, 7]  # the 3- and 5-image jobs never reached the engine
        assert dropped(app, "client_gone") == 1 and dropped(app, "deadline") == 1


async def test_a_cancelled_request_drops_its_job(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """A request whose own coroutine is cancelled (grpc.aio cancels a call's handler when the
    client cancels it or its deadline passes) drops its job as a gone client's, and leaves no
    unread exception behind; the job queued beside it is answered."""
    async with serving(make_settings(max_batch_size=64)) as (app, _):
        worker, engine, first = await held_worker(app)
        cancelled = asyncio.create_task(
            worker.predict(torch.zeros(3, 1, 28, 28), 1, timeout_s=WAIT_S)
        )
        kept = asyncio.create_task(worker.predict(torch.zeros(7, 1, 28, 28), 1, timeout_s=WAIT_S))
        await until(lambda: worker.queue_depth() == 2)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        engine.release()
        assert len(await kept) == 7
        await first
        assert engine.calls == [1, 7]  # the cancelled 3-image job never reached the engine
        assert dropped(app, "client_gone") == 1


async def test_a_job_that_cannot_finish_before_its_deadline_is_not_started(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """An engine taking 50 ms per image-pass: a 40-pass job (≥ 2 s) with 1 s left is answered
    504 at once and never computed; one that fits its deadline runs."""
    calls: list[tuple[int, int]] = []

    def timed_engine(_: nn.Module, x: torch.Tensor, k: int, __: Any = None) -> torch.Tensor:
        calls.append((int(x.shape[0]), k))
        time.sleep(0.05 * x.shape[0] * k)
        return torch.full((x.shape[0], k, 10), 0.1)

    async with serving(make_settings(max_batch_size=64)) as (app, _):
        worker = app.state.worker
        worker.engine = timed_engine
        for _ in range(8):  # the rate: 50 ms per image-pass, from 8 engine calls
            await worker.predict(torch.zeros(1, 1, 28, 28), 1, timeout_s=WAIT_S)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="could not be answered before its deadline"):
            await worker.predict(torch.zeros(4, 1, 28, 28), 10, timeout_s=1.0)
        refused_after = time.monotonic() - start
        assert len(await worker.predict(torch.zeros(2, 1, 28, 28), 2, timeout_s=WAIT_S)) == 2
    assert calls == [(1, 1)] * 8 + [(2, 2)]  # the 4 × 10 job never reached the engine
    assert refused_after < 0.9  # answered before its deadline, not at it
    assert dropped(app, "deadline") == 1


async def test_abandon_answers_queued_and_running_jobs_503_and_the_worker_goes_on(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(max_batch_size=64)) as (app, _):
        worker, engine, first = await held_worker(app)
        queued = asyncio.create_task(worker.predict(torch.zeros(2, 1, 28, 28), 1, timeout_s=WAIT_S))
        await until(lambda: worker.queue_depth() == 1)
        assert worker.abandon("drain timeout expired") == 2
        for task in (first, queued):
            with pytest.raises(NotReady, match="drain timeout expired"):
                await task
        assert worker.queued_work() == 0
        engine.release()  # the running call finishes; its answer is discarded without error
        assert len(await worker.predict(torch.zeros(1, 1, 28, 28), 1, timeout_s=WAIT_S)) == 1


async def test_refused_submit_raises_queue_full_with_the_work(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings(max_queued_work=10, max_batch_size=64)) as (app, _):
        worker, engine, first = await held_worker(app)
        ok = asyncio.create_task(worker.predict(torch.zeros(2, 1, 28, 28), 4, timeout_s=WAIT_S))
        await until(lambda: worker.queued_work() == 8)
        with pytest.raises(QueueFull, match="needs 4"):
            await worker.predict(torch.zeros(1, 1, 28, 28), 4, timeout_s=WAIT_S)
        engine.release()
        assert len(await ok) == 2
        await first


async def test_the_request_s_own_timeout_parameter_bounds_its_deadline(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """Triton's per-request ``timeout`` parameter (µs; tritonclient's ``infer(timeout=…)``,
    which used to be a 400 "unknown field"): behind a held engine call, a ``/v2`` request with
    ``timeout`` 0.2 s is answered 503 and dropped long before the server's own timeout; one
    without it waits and is answered. A timeout that is not a positive integer is a 400."""
    tensor = {"name": "input", "datatype": "FP32", "shape": [2, 1, 28, 28], "data": [0.5] * 1568}
    infer = "/v2/models/tiny-mlp/infer"
    async with serving(make_settings(max_batch_size=64, request_timeout_s=WAIT_S)) as (app, c):
        for bad in (0, -5, "1000", 1.5):
            r = await c.post(infer, json={"inputs": [tensor], "parameters": {"timeout": bad}})
            assert r.status_code == 400 and "timeout" in r.json()["error"], r.text
        worker, engine, first = await held_worker(app)
        started = time.monotonic()
        r = await c.post(infer, json={"inputs": [tensor], "parameters": {"timeout": 200_000}})
        assert r.status_code == 503 and "request timeout of 0.2 s" in r.text, r.text
        assert time.monotonic() - started < WAIT_S / 2
        patient = asyncio.create_task(
            c.post(infer, json={"inputs": [tensor], "parameters": {"timeout": 10**9}})
        )
        await until(lambda: worker.queue_depth() == 1)
        engine.release()
        assert (await patient).status_code == 200
        await first
        assert dropped(app, "deadline") == 1
        assert engine.calls == [1, 2]  # the timed-out request never reached the engine
