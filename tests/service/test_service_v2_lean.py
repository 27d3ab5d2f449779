"""``POST /v2/models/{name}/infer`` on its lean path (:mod:`bayesgate.service.routes.v2_infer`):
binary bodies sent as ``application/octet-stream``; large bodies decoded off the event loop;
the deadline counted from the request's arrival; jobs of clients that hung up dropped, never
computed, and counted; binary outputs packed as numpy packs them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from test_service_admission import WAIT_S, dropped, held_worker, until

from bayesgate.service import inference_protocol
from bayesgate.service.oip_binary import DTYPES, raw_bytes
from bayesgate.service.routes.lean import INLINE_DECODE_BYTES
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

INFER = "/v2/models/tiny-mlp/infer"
HEADER = "inference-header-content-length"


def _json_body(n: int) -> dict[str, Any]:
    x = torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    return {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": [n, 1, 28, 28],
                "data": x.flatten().tolist(),
            }
        ],
        "parameters": {"mc_samples": 3, "seed": 1},
    }


def _binary_body(n: int) -> tuple[bytes, int]:
    x = torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(3)).numpy()
    raw = x.astype("<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [n, 1, 28, 28],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"mc_samples": 3, "seed": 1, "binary_data_output": True},
            "outputs": [{"name": "label"}],
        }
    ).encode()
    return head + raw, len(head)


def record_threads(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Replace ``module.name`` by a wrapper noting the thread of every call (returned list)."""
    threads: list[int] = []
    real = getattr(module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return threads


async def test_binary_body_as_octet_stream_equals_json(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """The docs allow ``application/octet-stream`` for binary bodies (it was a 400)."""
    body, length = _binary_body(2)
    json_body = {**_json_body(2), "outputs": [{"name": "label"}]}
    async with serving(make_settings()) as (_, client):
        typed = await client.post(
            INFER,
            content=body,
            headers={HEADER: str(length), "content-type": "application/octet-stream"},
        )
        plain = await client.post(INFER, json=json_body)
        wrong = await client.post(INFER, content=body, headers={"content-type": "text/plain"})
    assert typed.status_code == 200, typed.text
    assert typed.headers["content-type"] == "application/octet-stream"
    head_length = int(typed.headers[HEADER])
    labels = np.frombuffer(typed.content[head_length:], dtype="<i8")
    assert labels.tolist() == plain.json()["outputs"][0]["data"]
    assert wrong.status_code == 400 and "Content-Type must be" in wrong.json()["error"]
    assert set(wrong.json()) == {"error"}


async def test_large_bodies_are_decoded_off_the_event_loop(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = record_threads(monkeypatch, inference_protocol, "parse_infer_request")
    small, large = _json_body(1), _json_body(8)
    assert len(json.dumps(small)) < INLINE_DECODE_BYTES < len(json.dumps(large))
    async with serving(make_settings(max_instances=8)) as (_, client):
        loop_thread = threading.get_ident()
        r_small = await client.post(INFER, json=small)
        r_large = await client.post(INFER, json=large)
        binary, length = _binary_body(8)  # the same 8 images, 25 KiB: decoded on the loop
        r_binary = await client.post(INFER, content=binary, headers={HEADER: str(length)})
    assert r_small.status_code == r_large.status_code == 200, (r_small.text, r_large.text)
    assert threads[0] == loop_thread  # one image: cheaper on the loop than a thread hand-off
    assert threads[1] != loop_thread  # eight images: in a thread, the loop stays free
    assert threads[2] == loop_thread
    labels = np.frombuffer(r_binary.content[int(r_binary.headers[HEADER]) :], dtype="<i8")
    json_labels = next(o for o in r_large.json()["outputs"] if o["name"] == "label")["data"]
    assert labels.tolist() == json_labels  # same images, seed and K: the same answer


async def test_v2_deadline_counts_from_arrival_not_enqueue(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decoding outlasts the whole request timeout: 503 (OIP's status for a missed deadline)
    without computing anything; counted from enqueueing it would be answered 200."""
    real = inference_protocol.parse_infer_request

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(inference_protocol, "parse_infer_request", slow)
    async with serving(make_settings(request_timeout_s=0.5)) as (app, client):
        calls_before = app.state.worker.stats.snapshot()["engine_calls"]
        r = await client.post(INFER, json=_json_body(1))
        assert r.status_code == 503, r.text
        assert "request timeout" in r.json()["error"]
        assert app.state.worker.stats.snapshot()["engine_calls"] == calls_before
        assert dropped(app, "deadline") == 1


async def test_v2_job_of_a_client_that_hung_up_is_dropped_never_computed(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    """The ASGI app called directly: the client sends its body, then disconnects while its job
    waits behind a held engine call."""
    body = json.dumps(_json_body(2)).encode()
    hang_up = asyncio.Event()
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": INFER,
        "raw_path": INFER.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 5000),
        "server": ("test", 80),
    }
    async with serving(make_settings(max_batch_size=64)) as (app, _):
        worker, engine, first = await held_worker(app)
        request = asyncio.create_task(app(scope, receive, send))
        await until(lambda: worker.queue_depth() == 1)
        hang_up.set()
        await asyncio.wait_for(request, WAIT_S)
        engine.release()
        await first
        await until(lambda: worker.queue_depth() == 0)
        assert engine.calls == [1]  # the 2-image job never reached the engine
        assert dropped(app, "client_gone") == 1
    assert not [m for m in sent if m["type"] == "http.response.start"]  # nobody to answer


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "BOOL", "FP64", "INT32"])
def test_raw_bytes_equal_numpy(datatype: str) -> None:
    values = {
        "FP32": [0.1, 1e-30, 3.4e38, -2.5, float("nan")],
        "FP64": [0.1, 1e-300, -2.5],
        "INT64": [0, 9, -1, 2**62],
        "INT32": [0, 9, -1, 2**30],
        "BOOL": [True, False, True],
    }[datatype]
    expected = np.asarray(values, dtype=DTYPES[datatype]).tobytes()
    assert raw_bytes(values, datatype) == expected


async def test_v1_small_bodies_decode_on_the_loop_large_in_a_thread(
    serving: Callable[[Settings], Any],
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bayesgate.service.routes import predict as v1

    threads = record_threads(monkeypatch, v1, "decode_instances")
    x = torch.rand(8, 784, generator=torch.Generator().manual_seed(3)).tolist()
    async with serving(make_settings(max_instances=8)) as (_, client):
        loop_thread = threading.get_ident()
        small = await client.post("/v1/predict", json={"instances": x[:1], "seed": 2})
        large = await client.post("/v1/predict", json={"instances": x, "seed": 2})
    assert small.status_code == large.status_code == 200, (small.text, large.text)
    assert threads == [loop_thread, threads[1]] and threads[1] != loop_thread


async def test_fastapi_routes_answer_as_the_lean_path(
    make_settings: Callable[..., Settings],
) -> None:
    """Without :class:`LeanRoutes` the FastAPI routes serve (they document the bodies): the same
    answers and the same errors."""
    import httpx

    from bayesgate.service.app import create_app
    from bayesgate.service.routes.lean import LeanRoutes

    body, length = _binary_body(2)
    requests = [
        ("/v1/predict", {"json": {"instances": [[0.5] * 784], "seed": 4, "mc_samples": 3}}),
        ("/v1/predict", {"json": {"instances": [[0.5] * 784], "mc_samples": "3"}}),
        ("/v1/predict", {"content": b"{}", "headers": {"content-type": "text/plain"}}),
        (INFER, {"json": _json_body(1)}),
        (INFER, {"content": body, "headers": {HEADER: str(length)}}),
        (INFER, {"json": {**_json_body(1), "parameters": {"mc_sample": 3}}}),
        ("/v2/models/other/infer", {"json": _json_body(1)}),
    ]
    answers = []
    for lean in (True, False):
        app = create_app(make_settings())
        if not lean:
            app.user_middleware = [m for m in app.user_middleware if m.cls is not LeanRoutes]
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                answers.append(
                    [await client.post(path, **kwargs) for path, kwargs in requests]  # type: ignore[arg-type]
                )
    for (path, _), fast, plain in zip(requests, *answers, strict=True):
        assert fast.status_code == plain.status_code, (path, fast.text, plain.text)
        assert fast.content == plain.content, path
    assert [r.status_code for r in answers[0]] == [200, 422, 415, 200, 200, 400, 404]
