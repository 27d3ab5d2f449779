"""A real ``bayesgate serve`` against hostile clients on raw sockets (127.0.0.1, bounded loops).

- aborted uploads (headers and half a body, then a hang-up) are 499 in the log and metrics: no
  500, no traceback, and the server stays responsive.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from raw_http import aborted_upload, metric_value, multipart_body
from serve_process import Server, start_server

ABORTED = 40


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("hostile"), drain_delay_s=0)
    try:
        yield server
    finally:
        server.stop()


def png_upload() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="PNG")
    return multipart_body(buffer.getvalue() + b"\0" * 4096)  # large enough to be cut in half


def test_aborted_uploads_are_499_without_traceback(server: Server) -> None:
    body = png_upload()
    for _ in range(ABORTED):
        aborted_upload(server.port, body)
    metrics = ""
    for _ in range(100):  # the server notices each hang-up asynchronously: poll (bounded, 20 s)
        metrics = httpx.get(f"{server.base}/metrics", timeout=10, trust_env=False).text
        if (
            metric_value(metrics, "bayesgate_http_requests_total", route="/v1/predict/file")
            >= ABORTED
        ):
            break
        time.sleep(0.2)
    route = "/v1/predict/file"
    assert (
        metric_value(metrics, "bayesgate_http_requests_total", route=route, status="499") == ABORTED
    )
    assert metric_value(metrics, "bayesgate_http_requests_total", status="500") == 0
    log = server.log_path.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log
    records = [r for r in server.log_records() if r.get("route") == route]
    assert [r["status"] for r in records] == [499] * ABORTED
    assert httpx.get(f"{server.base}/healthz", timeout=10, trust_env=False).status_code == 200
