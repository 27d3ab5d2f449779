"""Differential fuzzing of the native front end (``--native-port``) against the service itself.

The native port answers a ``/v2`` binary infer request on its own only when it is sure the
service would take it, and relays everything else to the service. So for *any* request, both
ports must give the same status, and for a seeded request the same bytes. A few hundred requests
are made from valid ones by structured mutations (a field set to a wrong type, size, shape or
value; the header length, the raw tensor bytes, the content type or the content coding changed;
a byte of the JSON header overwritten) with a seeded generator, and each is sent to both ports.
Then raw garbage on the native port's socket: every reply is a 4xx or a closed connection, and
the port still serves.
"""

from __future__ import annotations

import copy
import json
import random
import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bayesgate.service.native_build import find_cargo
from tests.service.serve_process import Server, free_port, start_server
from tests.service.test_native_front import post

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "pretrained" / "bayesgate-robust"
CASES = 400
pytestmark = pytest.mark.skipif(find_cargo() is None, reason="cargo (Rust) is not installed")

OUTPUT_NAMES = ["probabilities", "label", "adversarial", "score", "predictive_entropy", "fused"]
WRONG = {
    "shape": [[1, 784], [1, 28, 28], [1, 1, 28, 27], [0, 1, 28, 28], [-1, 1, 28, 28],
              [1, 1, 28, 28, 1], [], "1x1x28x28", [1, 1, 28, 28.0], [2**40, 1, 28, 28],
              [1, 1, 28, "28"], None],
    "datatype": ["FP64", "FP16", "INT8", "UINT8", "BYTES", "fp32", "", 5, None],
    "name": ["inputs", "", None, 3, "INPUT"],
    "mc_samples": [0, 1, 2, -3, 10, 10**6, 1.5, "5", True, None, 2**63],
    "seed": [-1, 0, 2**63 - 1, 2**63, 2**64, 1.0, "1", True, None, -(2**63)],
    "binary_data_output": ["yes", 1, None, False, 0.0],
    "outputs": [[], [{"name": "nope"}], [{"name": "label"}, {"name": "label"}],
                [{"name": "label", "parameters": {"binary_data": "true"}}],
                [{"name": "probabilities", "parameters": {"binary_data": False}}],
                "label", [{}], [{"name": 7}], [{"name": "label", "parameters": []}]],
    "parameters": [[], "x", None, {"seed": 1, "extra": {"deep": [1, 2, {"x": None}]}}],
    "inputs": [[], "x", None],
}  # fmt: skip


def valid_request(rng: random.Random) -> dict[str, Any]:
    """A request the service takes: ``header`` (the JSON header as a dict), ``raw`` bytes."""
    n = rng.choice([1, 1, 2, 3])
    x = np.asarray([rng.random() for _ in range(n * 784)], dtype="<f4")
    raw = x.tobytes()
    parameters: dict[str, Any] = {"seed": rng.randrange(2**31)}
    if rng.random() < 0.5:
        parameters["mc_samples"] = rng.choice([2, 5, 10])
    if rng.random() < 0.6:
        parameters["binary_data_output"] = rng.random() < 0.8
    header: dict[str, Any] = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [n, 1, 28, 28],
                    "parameters": {"binary_data_size": len(raw)}}],
        "parameters": parameters,
    }  # fmt: skip
    if rng.random() < 0.3:
        names = rng.sample(OUTPUT_NAMES, rng.randint(1, 3))
        header["outputs"] = [
            {"name": m, "parameters": {"binary_data": rng.random() < 0.7}} for m in names
        ]
    if rng.random() < 0.1:
        header["id"] = f"req-{rng.randrange(1000)}"
    return {"header": header, "raw": raw, "hcl": None, "content_type": None, "encoding": None,
            "flip": None}  # fmt: skip


def mutate(req: dict[str, Any], rng: random.Random) -> str:
    """One mutation of ``req`` in place; its name."""
    h = req["header"]
    kind = rng.choice(
        ["shape", "datatype", "name", "binary_data_size", "mc_samples", "seed",
         "binary_data_output", "outputs", "parameters", "inputs", "two inputs", "extra key",
         "header length", "truncate", "extend", "value", "content type", "content encoding",
         "flip", "flip"]
    )  # fmt: skip
    inputs, parameters = h.get("inputs"), h.get("parameters")
    tensor = inputs[0] if isinstance(inputs, list) and inputs else None
    if not isinstance(tensor, dict) and kind in ("shape", "datatype", "name", "binary_data_size",
                                                 "two inputs"):  # fmt: skip
        kind = "flip"  # an earlier mutation took the tensor away
    if not isinstance(parameters, dict) and kind in ("mc_samples", "seed", "binary_data_output"):
        kind = "flip"
    if not isinstance(tensor, dict) or not isinstance(tensor.get("parameters"), dict):
        kind = "flip" if kind == "binary_data_size" else kind
    if kind in ("shape", "datatype", "name"):
        tensor[kind] = copy.deepcopy(rng.choice(WRONG[kind]))
    elif kind == "binary_data_size":
        size = len(req["raw"])
        tensor["parameters"]["binary_data_size"] = rng.choice(
            [size - 1, size + 1, 0, -1, str(size), size * 2, size + 0.5, None, True]
        )
    elif kind in ("mc_samples", "seed", "binary_data_output"):
        parameters[kind] = rng.choice(WRONG[kind])
    elif kind in ("outputs", "parameters", "inputs"):
        h[kind] = copy.deepcopy(rng.choice(WRONG[kind]))
    elif kind == "two inputs":
        h["inputs"].append(copy.deepcopy(tensor))
    elif kind == "extra key":
        h[rng.choice(["foo", "model_name", "outputs_x"])] = rng.choice([1, "x", None, [1]])
    elif kind == "header length":
        req["hcl"] = rng.choice([0, -5, 1, "abc", "", "+12", 10**12, "0x10", "delta"])
    elif kind == "truncate":
        req["raw"] = req["raw"][: -rng.randint(1, 8)]
    elif kind == "extend":
        req["raw"] += bytes(rng.randint(1, 8))
    elif kind == "value":
        i = rng.randrange(len(req["raw"]) // 4)
        value = rng.choice([float("nan"), float("inf"), -float("inf"), 1.5, -0.25, 1e30])
        raw = bytearray(req["raw"])
        raw[4 * i : 4 * i + 4] = struct.pack("<f", value)
        req["raw"] = bytes(raw)
    elif kind == "content type":
        req["content_type"] = rng.choice(
            ["application/json", "text/plain", "application/octet-stream", "", "multipart/x"]
        )
    elif kind == "content encoding":  # the body itself stays as it is: only the header claims it
        req["encoding"] = rng.choice(["gzip", "identity", "deflate, identity", "br", ""])
    else:  # overwrite one byte of the encoded header with a printable or any byte
        req["flip"] = (
            rng.random(),
            rng.choice([rng.randrange(256), ord(rng.choice('{}[]",:0a '))]),
        )
    return kind


def encode(req: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    head = bytearray(json.dumps(req["header"]).encode())
    if req["flip"] is not None:
        where, byte = req["flip"]
        head[int(where * len(head))] = byte
    hcl = len(head) if req["hcl"] is None else req["hcl"]
    headers = {"Inference-Header-Content-Length": str(hcl), "X-Request-ID": "fuzz"}
    if req["content_type"] is not None:
        headers["Content-Type"] = req["content_type"]
    if req["encoding"] is not None:
        headers["Content-Encoding"] = req["encoding"]
    return bytes(head) + req["raw"], headers


def seeded(body: bytes, headers: dict[str, str]) -> bool:
    """True when the request carries an integer seed (its answer is then one exact byte string)."""
    try:
        hcl = int(headers["Inference-Header-Content-Length"])
        header = json.loads(body[:hcl])
        seed = header["parameters"]["seed"]
    except (ValueError, KeyError, TypeError, IndexError):
        return False
    return isinstance(seed, int) and not isinstance(seed, bool)


def layout(body: bytes, headers: dict[str, str]) -> tuple:
    """An answer without its values: the JSON head with every ``data`` left out, and the length
    of the binary part."""
    hcl = int(headers.get("inference-header-content-length", len(body)))
    head = json.loads(body[:hcl])
    for output in head.get("outputs", []):
        output.pop("data", None)
    return json.dumps(head, sort_keys=True), len(body) - hcl


@pytest.fixture(scope="module")
def both_ports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    native_port = free_port()
    server = start_server(BUNDLED, tmp_path_factory.mktemp("fuzz"), native_port=native_port)
    try:
        yield server, native_port
    finally:
        server.stop()


def test_every_mutated_request_gets_the_same_answer_on_both_ports(
    both_ports: tuple[Server, int],
) -> None:
    server, native_port = both_ports
    name = json.loads((BUNDLED / "card.json").read_text())["name"]
    path = f"/v2/models/{name}/infer"
    rng = random.Random(20261127)
    kinds: dict[str, int] = {}
    statuses: dict[int, int] = {}
    native_answered = 0
    for case in range(CASES):
        req = valid_request(rng)
        applied = [mutate(req, rng) for _ in range(rng.choice([0, 0, 1, 1, 2]))]
        for kind in applied:
            kinds[kind] = kinds.get(kind, 0) + 1
        body, headers = encode(req)
        a = post(server.port, path, body, headers)
        b = post(native_port, path, body, headers)
        what = (
            f"case {case} ({applied}): service {a[0]} {a[1][:200]!r}, native {b[0]} {b[1][:200]!r}"
        )
        assert a[0] < 500 and b[0] < 500, what
        assert a[0] == b[0], what
        assert a[2].get("content-type") == b[2].get("content-type"), what
        native_answered += "server" not in b[2]  # the service's own answers come from uvicorn
        statuses[a[0]] = statuses.get(a[0], 0) + 1
        if a[0] != 200 or seeded(body, headers):
            assert a[1] == b[1], what
        else:  # unseeded: the same layout, other samples
            assert layout(*a[1:]) == layout(*b[1:]), what
    # the fuzzing reached both sides of every decision: answered natively, relayed, refused
    assert native_answered >= CASES // 10, (native_answered, statuses)
    assert statuses.get(200, 0) >= CASES // 5 and statuses.get(400, 0) >= CASES // 5, statuses
    assert len(kinds) >= 19, kinds


GARBAGE = [
    b"\x00\x01\x02\r\n\r\n",
    b"GET\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v2/models/x/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nInference-Header-Content-Length: 4\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST / HTTP/9.9\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n",
    b"\r\n" * 100,
    b"POST /v2/models/x/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{\xff}",
]


def test_garbage_on_the_native_socket_gets_4xx_or_a_close_and_the_port_keeps_serving(
    both_ports: tuple[Server, int],
) -> None:
    server, native_port = both_ports
    rng = random.Random(7)
    cases = [*GARBAGE, *(bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
                         for _ in range(60))]  # fmt: skip
    replies: list[bytes] = []
    for i, data in enumerate(cases):
        with socket.create_connection(("127.0.0.1", native_port), timeout=5) as s:
            reply = b""
            try:
                s.sendall(data)
                if i >= len(GARBAGE):  # random bytes: no more is coming (half-closed clients
                    s.shutdown(socket.SHUT_WR)  # are dropped unanswered, as documented)
                while chunk := s.recv(65536):
                    reply += chunk
            except (ConnectionResetError, BrokenPipeError, TimeoutError):
                pass  # closed on us, or waiting for the rest of a request: no answer
        if reply:
            status = int(reply.split(b" ", 2)[1])
            assert 400 <= status < 500, (data[:100], reply[:300])
        replies.append(reply)
    # a head that cannot be framed gets a 400 naming the problem
    assert b"malformed HTTP request: Content-Length is not a number" in replies[2]
    assert b"malformed HTTP request: Content-Length values that differ" in replies[4]
    assert b"malformed HTTP request: HTTP version other than" in replies[7]
    assert replies[8].startswith(b"HTTP/1.1 431 ")
    name = json.loads((BUNDLED / "card.json").read_text())["name"]
    req = valid_request(random.Random(1))
    body, headers = encode(req)
    path = f"/v2/models/{name}/infer"
    a, b = post(server.port, path, body, headers), post(native_port, path, body, headers)
    assert a[0] == b[0] == 200 and a[1] == b[1]
    assert server.proc.poll() is None


def test_a_half_closed_client_is_answered_on_neither_port(both_ports: tuple[Server, int]) -> None:
    """A client that shuts its sending side after a whole request is taken as gone by the main
    port (uvicorn ends the connection at the end of stream) and by the native port alike."""
    server, native_port = both_ports
    name = json.loads((BUNDLED / "card.json").read_text())["name"]
    body, headers = encode(valid_request(random.Random(2)))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST /v2/models/{name}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"{head}\r\n"
    ).encode() + body
    for port in [server.port, native_port] * 3:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            # corked: the request and the FIN leave together, however late this process runs
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            s.sendall(request)
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        assert reply == b"", (port, reply[:200])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(request)  # the same request, the connection kept open: answered
            assert s.recv(12) == b"HTTP/1.1 200"


def test_the_main_port_s_head_limits_hold_on_the_native_port(
    both_ports: tuple[Server, int],
) -> None:
    """A request the native port would take but whose head is past the main port's limits
    (``BAYESGATE_MAX_HEADER_COUNT``, ``BAYESGATE_MAX_HEADER_BYTES``) gets the main port's 431 on
    both ports; at the limits it is answered."""
    server, native_port = both_ports
    name = json.loads((BUNDLED / "card.json").read_text())["name"]
    body, headers = encode(valid_request(random.Random(3)))
    path = f"/v2/models/{name}/infer"
    many = {**headers, **{f"X-Extra-{i}": "1" for i in range(100)}}  # 100 + http.client's own
    big = {**headers, "X-Big": "a" * 33_000}
    few = {**headers, **{f"X-Extra-{i}": "1" for i in range(20)}}
    for extra, status in ((many, 431), (big, 431), (few, 200)):
        a, b = post(server.port, path, body, extra), post(native_port, path, body, extra)
        assert a[0] == b[0] == status, (a[0], b[0], a[1][:200], b[1][:200])
        if status == 200:
            assert a[1] == b[1]
        else:  # the relay sends its own Connection header: the byte count in the text differs
            assert all("BAYESGATE_MAX_HEADER" in json.loads(r[1])["error"] for r in (a, b))
