"""When the HTTP request counter moves, relative to the answer: before its last byte is sent.

A client that has read its answer and then scrapes ``/metrics`` (or a test that reads the
multiprocess files) must find the request counted. Each case drives
:class:`RequestContextMiddleware` with a hand-written ASGI app and reads the counter from inside
the server's ``send`` — the moment the bytes would go to the socket.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_text import metric_value
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from bayesgate.service.metrics import Metrics
from bayesgate.service.middleware import RequestContextMiddleware

pytestmark = pytest.mark.anyio


def counted(metrics: Metrics, status: str, name: str = "bayesgate_http_requests_total") -> float:
    """One sample of the service's own exposition (what a ``/metrics`` scrape would read)."""
    text = metrics.exposition()[0].decode()
    labels = {"status": status} if name == "bayesgate_http_requests_total" else {}
    return metric_value(text, name, method="POST", route="/v1/predict", **labels)


def scope() -> Scope:
    return {"type": "http", "method": "POST", "path": "/v1/predict", "headers": []}


async def no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def answering(*chunks: bytes, status: int = 200):
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        for i, chunk in enumerate(chunks):
            more = i < len(chunks) - 1
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

    return app


async def run(app, metrics: Metrics) -> list[tuple[str, bool, float]]:
    """Drive one request; for each message sent: (type, more_body, counter value then)."""
    seen: list[tuple[str, bool, float]] = []

    async def send(message: Message) -> None:
        seen.append((message["type"], message.get("more_body", False), counted(metrics, "200")))

    middleware = RequestContextMiddleware(app, ["/v1/predict"], metrics, access_log=False)
    await middleware(scope(), no_body, send)
    return seen


async def test_a_request_is_counted_before_its_last_byte_goes_out() -> None:
    metrics = Metrics()
    seen = await run(answering(b'{"ok": true}'), metrics)
    assert seen == [("http.response.start", False, 0.0), ("http.response.body", False, 1.0)]
    assert counted(metrics, "200") == 1  # once, not again after the app returned
    latency = "bayesgate_http_request_duration_seconds_count"
    assert counted(metrics, "", name=latency) == 1  # the histogram is observed with it


async def test_a_streamed_answer_is_counted_once_at_its_last_chunk() -> None:
    metrics = Metrics()
    seen = await run(answering(b"a", b"b", b"c"), metrics)
    bodies = [(more, value) for kind, more, value in seen if kind == "http.response.body"]
    assert bodies == [(True, 0.0), (True, 0.0), (False, 1.0)]
    assert counted(metrics, "200") == 1


async def test_requests_without_a_complete_answer_are_counted_once_afterwards() -> None:
    metrics = Metrics()

    async def fails(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async def hangs_up(scope: Scope, receive: Receive, send: Send) -> None:
        raise ClientDisconnect()

    async def cut_off(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        raise asyncio.CancelledError()

    async def sink(message: Message) -> None:
        pass

    middleware = RequestContextMiddleware(fails, ["/v1/predict"], metrics, access_log=False)
    with pytest.raises(RuntimeError):
        await middleware(scope(), no_body, sink)
    assert counted(metrics, "500") == 1
    await RequestContextMiddleware(hangs_up, ["/v1/predict"], metrics, access_log=False)(
        scope(), no_body, sink
    )
    assert counted(metrics, "499") == 1
    with pytest.raises(asyncio.CancelledError):
        await RequestContextMiddleware(cut_off, ["/v1/predict"], metrics, access_log=False)(
            scope(), no_body, sink
        )
    assert counted(metrics, "499") == 2
    assert counted(metrics, "200") == 0  # a cut-off answer is not a 200
