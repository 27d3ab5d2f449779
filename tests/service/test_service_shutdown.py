"""Graceful shutdown of a real ``bayesgate serve``: SIGTERM in the middle of a burst of requests.

The server batches up to 16 images and waits up to 2 s for a batch to fill, so of a burst of
40 one-image requests, two batches of 16 are answered at once and the last 8 wait in the queue:
they are in flight when SIGTERM arrives. Expected: readiness turns 503 at once, the server keeps
answering during the drain delay, every request it accepted gets its 200, and it exits with 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn
from serve_process import start_server

from bayesgate.service.shutdown import install_drain_handler

BURST = 40
BATCH = 16
QUEUE_DELAY_S = 2.0
DRAIN_DELAY_S = 1.5


def test_sigterm_mid_burst_loses_no_accepted_request(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(
        tiny_model_dir,
        tmp_path,
        max_batch_size=BATCH,
        max_queue_delay_ms=QUEUE_DELAY_S * 1000,
        drain_delay_s=DRAIN_DELAY_S,
        drain_timeout_s=20,
    )
    body = {"instances": [[0.25] * 784], "mc_samples": 4}

    async def scenario() -> dict:
        limits = httpx.Limits(max_connections=BURST + 8, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=server.base, limits=limits, timeout=30, trust_env=False
        ) as client:
            finished: list[float] = []

            async def one() -> int:
                r = await client.post("/v1/predict", json=body)
                finished.append(time.monotonic())
                return r.status_code

            burst = [asyncio.ensure_future(one()) for _ in range(BURST)]
            while not finished:  # mid-burst: the first batches are answered ...
                await asyncio.sleep(0.01)
            sigterm_at = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            pending_at_sigterm = sum(not t.done() for t in burst)
            # ... readiness turns 503 while the server still answers (drain delay) ...
            ready_status = 200
            while ready_status == 200 and time.monotonic() - sigterm_at < DRAIN_DELAY_S * 0.6:
                ready_status = (await client.get("/readyz")).status_code
            v2_ready = await client.get("/v2/health/ready")
            late = await client.post("/v1/predict", json=body)  # accepted during the delay
            statuses = await asyncio.gather(*burst)
            return {
                "pending_at_sigterm": pending_at_sigterm,
                "ready_status": ready_status,
                "v2_ready": v2_ready.status_code,
                "late": late.status_code,
                "statuses": statuses,
                "after_sigterm": sum(t > sigterm_at for t in finished),
            }

    try:
        result = asyncio.run(scenario())
        code = server.proc.wait(timeout=60)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    log = server.log_path.read_text()
    assert result["pending_at_sigterm"] > 0, result  # requests were in flight at SIGTERM
    assert result["ready_status"] == 503 and result["v2_ready"] == 503, result
    assert result["late"] == 200, result
    assert result["statuses"] == [200] * BURST, result
    assert result["after_sigterm"] >= BURST - 2 * BATCH, result  # the queued ones, drained
    assert code == 0, log[-3000:]
    records = server.log_records()
    messages = [r["message"] for r in records]
    assert any(m.startswith("SIGTERM: readiness off") for m in messages)
    assert "Application shutdown complete." in messages
    assert (
        sum(r.get("route") == "/v1/predict" and r.get("status") == 200 for r in records)
        == BURST + 1
    )
    assert "Traceback" not in log


def test_drain_handler_delays_sigterm_but_not_sigint() -> None:
    """The wrapper around uvicorn's handler, in-process: SIGTERM reaches uvicorn only after the
    delay (readiness off at once), and the ``before_end`` callbacks run their lead before it;
    SIGINT and a second SIGTERM reach it at once, and skip them."""

    async def scenario(sig: int, delay: float) -> list[tuple[str, float]]:
        server = uvicorn.Server(uvicorn.Config(app=None))
        events: list[tuple[str, float]] = []
        start = time.monotonic()

        def lead(name: str) -> Callable[[], None]:
            return lambda: events.append((name, time.monotonic() - start))

        saved = {s: signal.signal(s, server.handle_exit) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            uninstall = install_drain_handler(
                asyncio.get_running_loop(),
                delay,
                lambda: events.append(("drain", 0.0)),
                before_end=((0.25, lead("lead 0.25")), (0.5, lead("lead 0.5"))),
            )
            assert uninstall is not None
            os.kill(os.getpid(), sig)
            await asyncio.sleep(0.05)
            events.append(("exit" if server.should_exit else "serving", time.monotonic() - start))
            while not server.should_exit:
                await asyncio.sleep(0.01)
            events.append(("exit", time.monotonic() - start))
            uninstall()
            assert signal.getsignal(signal.SIGTERM) == server.handle_exit
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)
        return events

    term = asyncio.run(scenario(signal.SIGTERM, 0.8))
    assert [e[0] for e in term] == ["drain", "serving", "lead 0.5", "lead 0.25", "exit"], term
    times = dict(term)
    assert times["lead 0.5"] >= 0.3 and times["lead 0.25"] >= 0.55 and times["exit"] >= 0.8, term
    short = asyncio.run(scenario(signal.SIGTERM, 0.4))  # a lead longer than the delay: at once
    order = [e[0] for e in short if e[0] != "serving"]  # (its place depends on the loop's pace)
    assert order == ["drain", "lead 0.5", "lead 0.25", "exit"], short
    times = dict(short)
    assert times["lead 0.25"] >= 0.15 and times["lead 0.5"] < times["lead 0.25"], short
    interrupt = asyncio.run(scenario(signal.SIGINT, 30))
    assert [e[0] for e in interrupt] == ["drain", "exit", "exit"] and interrupt[-1][1] < 5


def test_no_handler_is_installed_outside_uvicorn() -> None:
    async def scenario() -> object:
        return install_drain_handler(asyncio.get_running_loop(), 1.0, lambda: None)

    before = signal.getsignal(signal.SIGTERM)
    assert asyncio.run(scenario()) is None
    assert signal.getsignal(signal.SIGTERM) is before
