"""A real ``bayesgate serve`` against hostile clients on raw sockets (127.0.0.1, bounded loops).

- aborted uploads (headers and half a body, then a hang-up) are 499 in the log and metrics: no
  500, no traceback, and the server stays responsive;
- request heads over BAYESGATE_MAX_HEADER_BYTES are refused (431 JSON, closed, with either
  parser), more than BAYESGATE_MAX_HEADER_COUNT headers are 431 JSON, and a body shorter than its
  Content-Length is 408 JSON after BAYESGATE_BODY_READ_TIMEOUT_S;
- a head the parser rejects is a JSON 400 naming the parser's reason, closed.

Every test runs against both HTTP parsers (``BAYESGATE_HTTP_PARSER``).
"""

from __future__ import annotations

import io
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from prometheus_text import metric_value
from raw_http import aborted_upload, json_body, multipart_body, read_response
from serve_process import Server, start_server

ABORTED = 40


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The server with each HTTP parser (``BAYESGATE_HTTP_PARSER``): both bound the head."""
    server = start_server(
        tiny_model_dir,
        tmp_path_factory.mktemp("hostile"),
        drain_delay_s=0,
        body_read_timeout_s=1,
        http_parser=request.param,
    )
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


def exchange(port: int, request: bytes, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` on a fresh connection and read one response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        return read_response(sock)


def test_oversized_request_head_is_refused_and_rss_bounded(server: Server) -> None:
    """A 1 MiB header and 5,000 headers exceed BAYESGATE_MAX_HEADER_BYTES (32 KiB): the server
    refuses a head still incomplete beyond it (431, closed), the app one that arrived at once
    (431)."""
    rss_before = rss_kib(server.proc.pid)
    huge = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    many = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(5000))
        + b"\r\n"
    )
    for request in (huge, many):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            # the server answers before the client has sent it all, and lingers: no reset
            sock.sendall(request)
            status, _, _ = read_response(sock)
        assert status == 431, status  # the server (head in pieces) or the app
    assert rss_kib(server.proc.pid) - rss_before < 64 * 1024  # nothing near 1 MiB per header kept
    assert httpx.get(f"{server.base}/healthz", timeout=10, trust_env=False).status_code == 200


def test_a_head_arriving_in_pieces_is_refused_past_the_byte_limit(server: Server) -> None:
    """A head sent in 1 KiB pieces, never complete, is refused once past 32 KiB: JSON 431 with
    either parser (the httptools protocol counts the head; h11's own bound says 431), closed."""
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        # Send until the server answers (it must, long before 256 KiB), then read the answer.
        # Each piece waits up to 50 ms for it. (A client that sends on regardless is answered
        # too, since the server lingers: test_service_lingering_close.py.)
        while sent < 256 * 1024 and not select.select([sock], [], [], 0.05)[0]:
            sock.sendall(b"a" * 1024)
            sent += 1024
        status, headers, body = read_response(sock)
        assert sock.recv(1) == b""  # and closed
    assert 32 * 1024 <= sent < 256 * 1024, sent
    assert status == 431, body
    assert json_body(body)["code"] == "headers_too_large"
    assert "32768" in json_body(body)["error"]
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"


MALFORMED = {  # head → what each parser says of it
    b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab": {
        "httptools": "Duplicate Content-Length",
        "h11": "conflicting Content-Length headers",
    },
    b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n": {
        "httptools": "Invalid character in Content-Length",
        "h11": "bad Content-Length",
    },
    b"GARBAGE\r\n\r\n": {
        "httptools": "Invalid method encountered",
        "h11": "illegal request line",
    },
    b"GET /healthz HTTP/1.1\r\nBad Header: 1\r\n\r\n": {
        "httptools": "Invalid header token",
        "h11": "illegal header line",
    },
}  # fmt: skip


def test_a_head_the_parser_rejects_is_a_json_400_naming_why(
    server: Server, request: pytest.FixtureRequest
) -> None:
    parser = request.node.callspec.params["server"]
    for head, reasons in MALFORMED.items():
        status, headers, body = exchange(server.port, head)
        assert status == 400, (head, body)
        error = json_body(body)
        assert error["code"] == "malformed_request", error
        assert error["error"].startswith(f"malformed HTTP request: {reasons[parser]}"), error
        assert headers["content-type"] == "application/json" and headers["connection"] == "close"
        assert headers["server"] == "uvicorn"  # uvicorn's default headers are kept
    assert httpx.get(f"{server.base}/healthz", timeout=10, trust_env=False).status_code == 200


def test_too_many_headers_within_the_size_limit_are_431_json(server: Server) -> None:
    head = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(150))
        + b"\r\n"
    )
    status, headers, body = exchange(server.port, head)
    assert status == 431, body
    assert "at most 100" in json_body(body)["error"]
    assert headers["connection"] == "close"


def test_body_shorter_than_its_content_length_times_out_408(server: Server) -> None:
    """Slowloris body: 10 of 1,000 announced bytes, then silence → 408 JSON after
    BAYESGATE_BODY_READ_TIMEOUT_S (1 s here; allowed up to 20 s on a loaded machine)."""
    head = (
        b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    start = time.monotonic()
    status, headers, body = exchange(server.port, head + b'{"instance')
    took = time.monotonic() - start
    assert status == 408, body
    assert json_body(body)["code"] == "body_timeout"
    assert headers["connection"] == "close"
    assert 0.9 <= took < 20, took


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
