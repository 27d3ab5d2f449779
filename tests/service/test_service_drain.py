"""Drain of a real ``bayesgate serve``: ``Connection: close`` once draining, and at the drain
deadline every request still waiting gets the documented JSON 503 (not uvicorn's plain-text 500
on cancellation) before the process exits 0.

Requests are held in the worker by the batching delay: batches of up to 16 images wait up to 60 s
to fill, so three one-image requests are still waiting when the drain timeout (3 s) expires.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from raw_http import json_body, read_response
from serve_process import start_server

DRAIN_DELAY_S = 1.0
DRAIN_TIMEOUT_S = 3.0
WAITING = 3
BODY = b'{"instances": [[' + b", ".join([b"0.5"] * 784) + b']], "mc_samples": 2}'


def post(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(
        b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
    )
    return sock


def test_drain_deadline_answers_waiting_requests_json_503(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = start_server(
        tiny_model_dir,
        tmp_path,
        max_batch_size=16,
        max_queue_delay_ms=60_000,
        request_timeout_s=120,
        drain_delay_s=DRAIN_DELAY_S,
        drain_timeout_s=DRAIN_TIMEOUT_S,
    )
    waiting: list[socket.socket] = []
    try:
        keep_alive = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        keep_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        before = read_response(keep_alive)
        waiting = [post(server.port) for _ in range(WAITING)]
        time.sleep(1.0)  # the requests reach the worker (bounded: their answers come at drain)
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(DRAIN_DELAY_S / 3)  # within the drain delay: still served, but draining
        keep_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        during = read_response(keep_alive)
        answers = [read_response(sock) for sock in waiting]
        answered_after = time.monotonic() - sigterm_at
        code = server.proc.wait(timeout=60)
    finally:
        for sock in waiting:
            sock.close()
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    log = server.log_path.read_text()
    assert before[0] == 200 and before[1].get("connection") != "close"
    assert during[0] == 200 and during[1]["connection"] == "close", during
    for status, headers, body in answers:
        assert status == 503, (status, body)
        assert headers["content-type"] == "application/json"
        error = json_body(body)
        assert error["code"] == "not_ready" and "drain timeout" in error["error"], error
        assert headers["connection"] == "close"
    # answered before uvicorn's deadline (delay + timeout + 0.1 s), allowing for a loaded host
    assert DRAIN_TIMEOUT_S <= answered_after < DRAIN_DELAY_S + DRAIN_TIMEOUT_S + 10
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log
    assert "Cancel" not in log  # uvicorn had nothing left to cancel
