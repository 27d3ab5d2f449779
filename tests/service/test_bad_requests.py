"""``service/bad_requests.py``: the bytes of the refusals (the live behaviour, both parsers, is in
``test_service_hostile_live.py``)."""

from __future__ import annotations

import json

import h11
import httptools
import pytest

from bayesgate.service import settings as settings_module
from bayesgate.service.bad_requests import (
    NamedBadRequests,
    RecordingParser,
    bad_request_response,
    record_h11_errors,
)
from bayesgate.service.settings import Settings


def split(response: bytes) -> tuple[str, dict[str, str], dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["content-length"]) == len(body)
    return lines[0], headers, json.loads(body)


def test_a_400_names_the_reason_cut_to_200_characters() -> None:
    status, headers, body = split(bad_request_response("x" * 500, [(b"server", b"uvicorn")]))
    assert status == "HTTP/1.1 400 Bad Request" and headers["server"] == "uvicorn"
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    assert body["code"] == "malformed_request"
    assert body["error"] == "malformed HTTP request: " + "x" * 199 + "…" == body["detail"]


class Transport:
    def __init__(self) -> None:
        self.written, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


class State:
    default_headers = ((b"server", b"uvicorn"),)


class Protocol(NamedBadRequests):
    def __init__(self, conn: h11.Connection) -> None:
        self.conn, self.transport, self.server_state = conn, Transport(), State()


def answer_of(conn_data: bytes, max_incomplete: int = 16 * 1024) -> tuple[str, dict]:
    protocol = Protocol(h11.Connection(h11.SERVER, max_incomplete_event_size=max_incomplete))
    record_h11_errors(protocol)
    protocol.conn.receive_data(conn_data)
    with pytest.raises(h11.RemoteProtocolError):
        protocol.conn.next_event()
    protocol.send_400_response("Invalid HTTP request received.")  # as uvicorn calls it
    assert protocol.transport.closed
    status, _, body = split(protocol.transport.written)
    return status, body


def test_h11_s_reason_is_kept_and_its_size_bound_is_a_431(monkeypatch: pytest.MonkeyPatch) -> None:
    status, body = answer_of(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
    assert status == "HTTP/1.1 400 Bad Request"
    assert body["error"] == "malformed HTTP request: conflicting Content-Length headers"
    # below the settings' own floor (1024), so built without validation
    small = Settings.model_construct(max_header_bytes=100, max_header_count=10)
    monkeypatch.setattr(settings_module, "_protocol_settings", [small])
    status, body = answer_of(b"GET / HTTP/1.1\r\nX: " + b"a" * 200, max_incomplete=100)
    assert status == "HTTP/1.1 431 Request Header Fields Too Large"
    assert body["code"] == "headers_too_large" and "more than 100 bytes" in body["error"]


def test_the_httptools_parser_records_its_error_and_forwards_the_rest() -> None:
    protocol = Protocol(h11.Connection(h11.SERVER))

    class Callbacks:
        pass

    parser = RecordingParser(httptools.HttpRequestParser(Callbacks()), protocol)
    parser.feed_data(b"GET / HTTP/1.1\r\n")  # fine so far
    assert parser.get_http_version() == "1.1"  # forwarded to the real parser
    with pytest.raises(httptools.HttpParserError):
        parser.feed_data(b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n")
    protocol.send_400_response("Invalid HTTP request received.")
    _, body = split(protocol.transport.written)[1:]
    assert body["error"] == "malformed HTTP request: Duplicate Content-Length"
