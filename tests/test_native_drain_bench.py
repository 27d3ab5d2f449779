"""bench/native_drain.py's parts that decide its numbers: how one connection's outcome is
classified (answered, refused, reset), and the infer request it sends, framed as the service
parses it."""

from __future__ import annotations

import asyncio
import json
import socket

from bench_scripts import load_bench

from bayesgate.service.oip_binary import split_body


async def outcome_against(handler: object) -> str:
    bench = load_bench("native_drain")
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await bench.one(port, "native", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_an_answer_a_refusal_and_a_reset_are_told_apart() -> None:
    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno")
        await writer.drain()
        writer.close()

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()  # a reset, no answer

    async def half_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        writer.close()

    assert asyncio.run(outcome_against(answers)) == "native:503"
    assert asyncio.run(outcome_against(hangs_up)) == "native:reset"
    assert asyncio.run(outcome_against(half_answers)) == "native:reset"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    bench = load_bench("native_drain")
    assert asyncio.run(bench.one(closed, "relay", b"GET / HTTP/1.1\r\n\r\n")) == "refused"


def test_the_infer_request_is_one_image_in_the_binary_extension() -> None:
    bench = load_bench("native_drain")
    raw = bench.infer_request(8002, "bayesgate-robust")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/bayesgate-robust/infer HTTP/1.1"
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    header, payload = split_body(body, headers["inference-header-content-length"])
    request = json.loads(header)
    (tensor,) = request["inputs"]
    assert tensor["shape"] == [1, 1, 28, 28] and tensor["datatype"] == "FP32"
    assert len(payload) == tensor["parameters"]["binary_data_size"] == 28 * 28 * 4
    assert request["parameters"]["binary_data_output"] is True
