"""Hostile-load figures of issue 18 against a real ``bayesgate serve`` on 127.0.0.1.

Each scenario starts its own server (the bundled model unless ``--model-dir``), runs for a bounded
time or count, and prints one JSON object per scenario; ``--json`` writes them all to a file.

- ``overload``: ``--clients`` (96) clients (each its own one-connection ``httpx`` client) sending
  256-image requests for ``--duration`` s: statuses, how fast a 503 comes back (at the client, and
  in the server's access log), 504s past the deadline + 10 % at the client and in the server, each
  late 504 split by ``X-Request-ID`` and ``httpx`` trace into the load generator's part, the
  server's before its app, the app's and the way back (``late_504s``), the client's own loop lag,
  ``/healthz`` from a separate probe process, jobs computed whose client was not answered 200
  (``succeeded`` jobs minus 200s) and jobs dropped (by reason and stage);
- ``healthz``: ``/healthz`` latency (p50/p99/max) while 16 clients send 256-image requests;
- ``aborted``: ``--aborted`` uploads (3,000 in the issue) sent half and closed at once, then the
  500s in ``/metrics``, tracebacks in the log and ``--probes`` (100) ``/healthz`` probes, each on a
  raw socket and with ``httpx.get``;
- ``bomb``: the 20000×20000 PNG bomb as base64 and as an upload;
- ``sigterm``: steady load (8 raw keep-alive clients, 1 image), SIGTERM, with 1 and 2 worker
  processes: answers, refused connections (the listener closed: nothing accepted) and resets of
  established connections (request written, no answer), 5xx, time to exit vs delay + timeout;
- ``heads``: 1 MiB header, 5,000 headers, a slowloris body: statuses, time to answer, RSS.

    python bench/hostile.py --duration 10 --aborted 3000 --json docs/bench/hostile.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "service"))
from hostile_inputs import png_bomb  # noqa: E402
from load import HOST, Server, free_port  # noqa: E402
from prometheus_text import metric_value  # noqa: E402
from raw_http import (  # noqa: E402
    aborted_upload,
    multipart_body,
    read_response,
)

from bayesgate.service.settings import DEFAULT_MODEL_DIR  # noqa: E402

HTTP_TOTAL = "bayesgate_http_requests_total"


def png_b64(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (28, 28), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def start(args: argparse.Namespace, workers: int = 1, **settings: Any) -> Server:
    env = {
        "BAYESGATE_NUM_THREADS": str(args.threads),
        "OMP_NUM_THREADS": str(args.threads),
        "BAYESGATE_LOG_FORMAT": "json",
        **{f"BAYESGATE_{k.upper()}": str(v) for k, v in settings.items()},
    }
    extra = ("--workers", str(workers)) if workers > 1 else ()
    server = Server(args.model_dir, free_port(), env, extra, stop_timeout_s=60)
    server.wait_ready(300)
    return server


def metrics(server: Server) -> str:
    return httpx.get(server.base + "/metrics", timeout=30, trust_env=False).text


async def loop_lag(stop_at: float, every_s: float = 0.01) -> list[float]:
    """The load generator's own event-loop lag (ms): how late a ``sleep(every_s)`` wakes up."""
    out = []
    while time.monotonic() < stop_at:
        t = time.monotonic()
        await asyncio.sleep(every_s)
        out.append((time.monotonic() - t - every_s) * 1000)
    return out


async def heavy_clients(
    base: str, clients: int, duration: float, images: int, k: int, lag: list[float] | None = None
) -> list[tuple[int, float, str]]:
    """``clients`` loops sending ``images``-image requests until ``duration`` has passed:
    ``(status, seconds at the client, X-Request-ID)`` per request; ``lag`` gets the client's
    own loop lag (:func:`loop_lag`). Each loop has its own one-connection ``httpx`` client: one
    pool shared by all loops made requests wait up to 3.7 s in the pool before their head was
    sent (``httpx`` trace), counted against the server's deadline."""
    body = json.dumps({"images": [png_b64(i) for i in range(images)], "mc_samples": k}).encode()
    out: list[tuple[int, float, str]] = []
    phases.clear()
    one = httpx.Limits(max_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        pool = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=base, timeout=120, limits=one, trust_env=False)
            )
            for _ in range(clients)
        ]
        stop_at = time.monotonic() + duration

        async def loop(client: int) -> None:
            c = pool[client]
            n = 0
            while time.monotonic() < stop_at:
                n += 1
                rid = f"c{client}-{n}"
                headers = {"content-type": "application/json", "x-request-id": rid}
                t = time.monotonic()
                stamps = phases.setdefault(rid, {"start": t, "wall": time.time()})

                async def trace(event: str, _: dict, stamps: dict = stamps) -> None:
                    stamps[event] = time.monotonic()

                try:
                    r = await c.post(
                        "/v1/predict",
                        content=body,
                        headers=headers,
                        extensions={"trace": trace},
                    )
                    status = r.status_code
                except httpx.TransportError:
                    status = 0
                out.append((status, time.monotonic() - t, rid))
                if status == 503:
                    await asyncio.sleep(1.0)  # honour Retry-After: 1

        lagged = asyncio.ensure_future(loop_lag(stop_at))
        await asyncio.gather(*(loop(i) for i in range(clients)))
        if lag is not None:
            lag.extend(await lagged)
    return out


phases: dict[str, dict[str, float]] = {}  # X-Request-ID → httpx trace event → time.monotonic()

PHASES = {
    "connect_started_s": "connection.connect_tcp.started",
    "connect_s": "connection.connect_tcp.complete",
    "head_started_s": "http11.send_request_headers.started",
    "head_sent_s": "http11.send_request_headers.complete",
    "body_sent_s": "http11.send_request_body.complete",
    "answer_head_s": "http11.receive_response_headers.complete",
}


def before_and_after_app(
    stamps: dict[str, float], window: tuple[float, float] | None
) -> dict[str, float]:
    """Seconds from the client's head sent to the request reaching the app (the server's accept,
    read and parse: its loop), and from the access-log line to the client having the answer's
    head (the answer's way back, the client's own loop); wall clocks of one machine, ±1 ms."""
    sent = stamps.get("http11.send_request_headers.complete")
    got = stamps.get("http11.receive_response_headers.complete")
    if window is None or sent is None or got is None:
        return {}
    wall = stamps["wall"] - stamps["start"]  # monotonic → wall clock
    return {
        "head_to_app_s": round(window[0] - (sent + wall), 3),
        "log_to_client_s": round(got + wall - window[1], 3),
    }


def late_504s(
    results: list[tuple[int, float, str]], log: str, timeout: float
) -> list[dict[str, float]]:
    """The 504s later than ``timeout`` + 10 % at the client, each with the server's own duration
    (its access log: the request reaching the app to its answer) and the difference, spent
    outside the app (connection, head, loops, the client's own lag)."""
    server = server_durations(log)
    windows = server_windows(log)
    out = []
    for status, seconds, rid in results:
        if status == 504 and seconds > 1.1 * timeout:
            in_server = server.get(rid, float("nan")) / 1000
            stamps = phases.get(rid, {})
            at = {
                name: round(stamps[event] - stamps["start"], 3)
                for name, event in PHASES.items()
                if event in stamps
            }
            out.append(
                {
                    "client_s": round(seconds, 3),
                    "server_s": round(in_server, 3),
                    "outside_s": round(seconds - in_server, 3),
                    **at,
                    **before_and_after_app(stamps, windows.get(rid)),
                }
            )
    return out


PROBE_PROCESS = """
import json, socket, sys, time
port, until = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
out = []
while time.monotonic() < until:
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n")
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            data += sock.recv(4096)
    out.append((time.monotonic() - t) * 1000)
    time.sleep(0.05)
print(json.dumps(out))
"""


def probe_process(port: int, duration: float) -> subprocess.Popen[str]:
    """A separate light process probing ``/healthz`` on new raw connections every 50 ms (away
    from the load generator's loop and GIL): the server's responsiveness, accept to answer (the
    probe's own time in the app is well under a millisecond)."""
    return subprocess.Popen(
        [sys.executable, "-c", PROBE_PROCESS, str(port), str(duration)],
        stdout=subprocess.PIPE,
        text=True,
    )


def overload(args: argparse.Namespace) -> dict[str, Any]:
    timeout = args.request_timeout
    lag: list[float] = []
    with start(args, request_timeout_s=timeout) as server:
        probe = probe_process(int(server.base.rsplit(":", 1)[1]), args.duration)
        results = asyncio.run(
            heavy_clients(server.base, args.clients, args.duration, 256, args.k, lag)
        )
        probe.wait(60)
        text = metrics(server)
        log = server.stderr_text()
    probes_ms = json.loads(probe.communicate()[0])
    statuses = [s for s, _, _ in results]
    answered_200 = statuses.count(200)
    succeeded = metric_value(text, "bayesgate_inference_requests_total", outcome="succeeded")
    server_504 = server_ms(log, "/v1/predict", 504)
    late = late_504s(results, log, timeout)
    return {
        "scenario": f"overload: 256-image requests, {args.clients} clients, {args.duration:g} s",
        "request_timeout_s": timeout,
        "k": args.k,
        "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
        "503_latency_ms_p50_max": [
            round(percentile([t * 1000 for s, t, _ in results if s == 503], q), 1)
            for q in (50, 100)
        ],
        "503_in_server_ms_p50_max": [
            round(percentile(server_ms(log, "/v1/predict", 503), q), 1) for q in (50, 100)
        ],
        "504_in_server_ms_p50_max": [round(percentile(server_504, q), 1) for q in (50, 100)],
        "504_in_server_beyond_deadline_plus_10pct": sum(
            1 for ms in server_504 if ms > 1100 * timeout
        ),
        "504_beyond_deadline_plus_10pct": len(late),
        "late_504s": late,
        "client_loop_lag_ms_p50_p99_max": [round(percentile(lag, q), 1) for q in (50, 99, 100)],
        "healthz_probe_process_ms_p50_p99_max": [
            round(percentile(probes_ms, q), 1) for q in (50, 99, 100)
        ],
        "any_answer_beyond_deadline_plus_10pct": sum(1 for _, t, _ in results if t > 1.1 * timeout),
        "jobs_computed_not_answered_200": succeeded - answered_200,
        "jobs_dropped": {
            f"{r}/{stage}": metric_value(
                text, "bayesgate_jobs_dropped_total", reason=r, stage=stage
            )
            for r in ("deadline", "client_gone")
            for stage in ("queued", "computing")
        },
    }


def access_records(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if '"bayesgate.access"' in line]


def server_windows(log: str) -> dict[str, tuple[float, float]]:
    """``X-Request-ID`` → (wall-clock time the request reached the app, time its access-log line
    was written, just after the answer), from the log's ``ts`` (ms) and ``duration_ms``."""
    out = {}
    for r in access_records(log):
        end = dt.datetime.fromisoformat(r["ts"]).timestamp()
        out[r["request_id"]] = (end - float(r["duration_ms"]) / 1000, end)
    return out


def server_durations(log: str) -> dict[str, float]:
    """``X-Request-ID`` → the server's duration (ms) of that request (its access log)."""
    return {r["request_id"]: float(r["duration_ms"]) for r in access_records(log)}


def server_ms(log: str, route: str, status: int) -> list[float]:
    """Durations (ms) in the server's JSON access log of ``route``'s answers with ``status``: from
    the request reaching the app to its answer written."""
    return [
        float(r["duration_ms"])
        for r in access_records(log)
        if r.get("route") == route and r.get("status") == status
    ]


async def probe_healthz(base: str, until: float) -> list[float]:
    out = []
    async with httpx.AsyncClient(base_url=base, timeout=30, trust_env=False) as c:
        while time.monotonic() < until:
            t = time.monotonic()
            await c.get("/healthz")
            out.append((time.monotonic() - t) * 1000)
            await asyncio.sleep(0.05)
    return out


def healthz(args: argparse.Namespace) -> dict[str, Any]:
    async def both(base: str) -> tuple[list[tuple[int, float, str]], list[float]]:
        until = time.monotonic() + args.duration
        return await asyncio.gather(
            heavy_clients(base, 16, args.duration, 256, args.k), probe_healthz(base, until)
        )

    with start(args, request_timeout_s=args.request_timeout) as server:
        results, probes = asyncio.run(both(server.base))
    statuses = [s for s, _, _ in results]
    return {
        "scenario": f"/healthz while 16 clients send 256-image requests, {args.duration:g} s",
        "probes": len(probes),
        "healthz_ms_p50_p99_max": [round(percentile(probes, q), 1) for q in (50, 99, 100)],
        "load_statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
    }


def healthz_probes(server: Server, n: int) -> dict[str, list[float]]:
    """``n`` ``/healthz`` probes 50 ms apart, each timed two ways (ms): ``httpx.get`` (a new
    client and connection per probe, as before) and a raw socket (a new connection, nothing else
    at the client)."""
    port = int(server.base.rsplit(":", 1)[1])
    httpx_ms, raw_ms = [], []
    for _ in range(n):
        t = time.monotonic()
        httpx.get(server.base + "/healthz", timeout=30, trust_env=False)
        httpx_ms.append((time.monotonic() - t) * 1000)
        t = time.monotonic()
        one_exchange(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", timeout=30)
        raw_ms.append((time.monotonic() - t) * 1000)
        time.sleep(0.05)
    return {"httpx": httpx_ms, "raw": raw_ms}


def aborted(args: argparse.Namespace) -> dict[str, Any]:
    buffer = io.BytesIO()
    Image.new("L", (28, 28)).save(buffer, format="PNG")
    body = multipart_body(buffer.getvalue() + b"\0" * 4096)
    with start(args) as server:
        port = int(server.base.rsplit(":", 1)[1])
        t = time.monotonic()
        for _ in range(args.aborted):
            aborted_upload(port, body, fraction=0.5)
        send_s = time.monotonic() - t
        time.sleep(2.0)
        probes = healthz_probes(server, args.probes)
        text = metrics(server)
        log = server.stderr_text()
    route = "/v1/predict/file"
    return {
        "scenario": f"{args.aborted} aborted uploads (half the body, then close)",
        "send_seconds": round(send_s, 2),
        "counted_499": metric_value(text, HTTP_TOTAL, route=route, status="499"),
        "counted_500": metric_value(text, HTTP_TOTAL, status="500"),
        "tracebacks_in_log": log.count("Traceback"),
        "healthz_probes": args.probes,
        **{
            f"healthz_after_ms_p50_p99_max_{how}": [
                round(percentile(ms, q), 1) for q in (50, 99, 100)
            ]
            for how, ms in probes.items()
        },
    }


def bomb(args: argparse.Namespace) -> dict[str, Any]:
    data = png_bomb()
    with start(args) as server:
        as_b64 = httpx.post(
            server.base + "/v1/predict",
            json={"images": [base64.b64encode(data).decode()]},
            timeout=60,
            trust_env=False,
        )
        upload = httpx.post(
            server.base + "/v1/predict/file",
            files={"file": ("bomb.png", data, "image/png")},
            timeout=60,
            trust_env=False,
        )
    return {
        "scenario": f"PNG bomb 20000×20000 ({len(data)} bytes)",
        "base64": [as_b64.status_code, as_b64.json().get("error")],
        "upload": [upload.status_code, upload.json().get("error")],
    }


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """One HTTP/1.1 response (Content-Length framed): ``(status, server closes the connection)``."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
    await reader.readexactly(int(headers.get("content-length", "0")))
    return int(head[0].split()[1]), headers.get("connection") == "close"


async def steady(port: int, clients: int, stop: asyncio.Event) -> list[str]:
    """``clients`` keep-alive loops of 1-image requests on raw connections, each outcome one of:

    - an HTTP status (the request was answered);
    - ``refused``: ``connect()`` failed — the listener was closed, nothing was accepted;
    - ``reset:new`` / ``reset:reused``: the TCP connection was established (accepted by the
      kernel) and the request written, but the server closed or reset it without an answer — on a
      connection opened for this request, or on one that had carried earlier requests.
    """
    payload = json.dumps({"images": [png_b64(0)], "mc_samples": 10}).encode()
    request = (
        f"POST /v1/predict HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    outcomes: list[str] = []

    async def loop() -> None:
        writer = None
        while not stop.is_set():
            new = writer is None
            if new:
                try:
                    reader, writer = await asyncio.open_connection(HOST, port)
                except OSError:
                    outcomes.append("refused")
                    await asyncio.sleep(0.1)
                    continue
            try:
                writer.write(request)
                await writer.drain()
                status, closes = await asyncio.wait_for(read_answer(reader), 60)
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                outcomes.append("reset:new" if new else "reset:reused")
                writer.close()
                writer = None
                continue
            outcomes.append(str(status))
            if closes:
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(loop() for _ in range(clients)))
    return outcomes


def sigterm(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    delay, drain = 1.0, 10.0
    server = start(args, workers=workers, drain_delay_s=delay, drain_timeout_s=drain)

    async def run() -> tuple[list[str], float]:
        stop = asyncio.Event()
        port = int(server.base.rsplit(":", 1)[1])
        task = asyncio.ensure_future(steady(port, 8, stop))
        await asyncio.sleep(3.0)
        t = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        while server.proc.poll() is None and time.monotonic() - t < 120:
            await asyncio.sleep(0.05)
        exit_s = time.monotonic() - t
        stop.set()
        return await task, exit_s

    try:
        outcomes, exit_s = asyncio.run(run())
        code = server.proc.wait(timeout=60)
    finally:
        server.__exit__()
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    return {
        "scenario": f"SIGTERM under steady load (8 clients), {workers} worker(s)",
        "outcomes": counts,
        "5xx": sum(v for k, v in counts.items() if k.isdigit() and int(k) >= 500),
        "resets_of_accepted_connections": sum(
            v for k, v in counts.items() if k.startswith("reset")
        ),
        "exit_code": code,
        "exit_seconds": round(exit_s, 2),
        "drain_delay_plus_timeout_s": delay + drain,
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def one_exchange(port: int, data: bytes, timeout: float = 60) -> tuple[int, float]:
    t = time.monotonic()
    status = 0
    with (
        socket.create_connection((HOST, port), timeout=timeout) as sock,
        contextlib.suppress(OSError),
    ):
        sock.sendall(data)
        status = read_response(sock)[0]
    return status, round(time.monotonic() - t, 2)


def heads(args: argparse.Namespace) -> dict[str, Any]:
    huge = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    many += b"".join(b"X-H%d: v\r\n" % i for i in range(5000)) + b"\r\n"
    slow = (
        b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"instances'
    )
    eight = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-Big%d: " % i + b"a" * (64 << 20) + b"\r\n" for i in range(1)
    )
    with start(args, body_read_timeout_s=5) as server:
        port = int(server.base.rsplit(":", 1)[1])
        rss0 = rss_kib(server.proc.pid)
        out = {
            "scenario": "request heads and slow bodies (BAYESGATE_BODY_READ_TIMEOUT_S=5)",
            "1_MiB_header": one_exchange(port, huge),
            "5000_headers": one_exchange(port, many),
            "64_MiB_header": one_exchange(port, eight),
            "slowloris_body_10_of_1000_bytes": one_exchange(port, slow),
        }
        out["rss_growth_kib"] = rss_kib(server.proc.pid) - rss0
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per load scenario")
    p.add_argument("--clients", type=int, default=96)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--request-timeout", type=float, default=5.0)
    p.add_argument("--aborted", type=int, default=3000)
    p.add_argument("--probes", type=int, default=100, help="/healthz probes after the aborts")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--only",
        nargs="*",
        default=["bomb", "heads", "aborted", "healthz", "overload", "sigterm1", "sigterm2"],
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    scenarios = {
        "bomb": bomb,
        "heads": heads,
        "aborted": aborted,
        "healthz": healthz,
        "overload": overload,
        "sigterm1": lambda a: sigterm(a, 1),
        "sigterm2": lambda a: sigterm(a, 2),
    }
    results = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "scenarios": []}
    for name in args.only:
        result = scenarios[name](args)
        result["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
        print(json.dumps(result), flush=True)
        results["scenarios"].append(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
