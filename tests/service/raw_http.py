"""Raw-socket HTTP helpers for the hostile-client tests and ``bench/hostile.py`` (127.0.0.1 only).

A real client library would not send half a body, oversized headers or a Content-Length it never
honours; these do, with bounded loops and timeouts.
"""

from __future__ import annotations

import json
import socket
import time

MULTIPART_BOUNDARY = "bayesgatehostile"


def upload_head(port: int, body_length: int, path: str = "/v1/predict/file") -> bytes:
    """Request line and headers of a multipart upload announcing ``body_length`` bytes."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: multipart/form-data; boundary={MULTIPART_BOUNDARY}\r\n"
        f"Content-Length: {body_length}\r\n\r\n"
    ).encode()


def multipart_body(data: bytes) -> bytes:
    """A multipart body with ``data`` as the field ``file``."""
    return (
        (
            f"--{MULTIPART_BOUNDARY}\r\n"
            'Content-Disposition: form-data; name="file"; filename="x.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{MULTIPART_BOUNDARY}--\r\n".encode()
    )


def aborted_upload(port: int, body: bytes, fraction: float = 0.5, timeout: float = 10) -> None:
    """Send the headers and ``fraction`` of ``body``, then close the connection (no answer read)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(upload_head(port, len(body)) + body[: int(len(body) * fraction)])
        time.sleep(0.01)  # let the server start reading the body before the hang-up


def read_response(sock: socket.socket, limit: int = 1 << 20) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response (Content-Length framed, or up to EOF); ``(status, headers,
    body)``; status 0 when the server closed without answering."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "-1"))
    while (length < 0 or len(body) < length) and len(body) < limit:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def json_body(body: bytes) -> dict:
    return json.loads(body.decode())
