"""The floor under the service's request path: what uvicorn alone costs per request on this
machine, with an ASGI app that does nothing but read the body and send a fixed answer.

Starts ``uvicorn`` in a subprocess (one process, the event loop on the main thread, uvloop when
installed) with the HTTP parser ``--http`` (``h11``, what ``bayesgate serve`` uses because it
bounds the request head, or ``httptools``) and drives it as ``bench/load.py`` drives the service:
``--clients`` keep-alive clients sending the ``/v2 binary`` bodies (one image, 3,136 bytes after
the JSON header) for ``--duration`` seconds. Prints requests/s and the server's CPU ms per
request: no model, no framework, no middleware — any service on this stack pays at least this.

    python bench/asgi_floor.py --http h11 --duration 10
    python bench/asgi_floor.py --http httptools --duration 10

Traffic goes to 127.0.0.1 only; the run is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import load

ANSWER = b'{"model_name":"floor","outputs":[' + b'{"name":"x","datatype":"FP32","shape":[1]},' * 8
ANSWER = ANSWER[:-1] + b"]}"
LENGTH = str(len(ANSWER)).encode()


async def app(scope: dict, receive: Any, send: Any) -> None:
    """Read the whole body, answer ``ANSWER`` as JSON."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", LENGTH)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--http", choices=("h11", "httptools"), default="h11")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0, help="seconds (≤ 120)")
    args = p.parse_args(argv)
    if not 0 < args.duration <= load.MAX_DURATION_S:
        p.error(f"need 0 < --duration ≤ {load.MAX_DURATION_S}")
    _, protocol, bodies = load.workloads(load.mnist_images(64), 10, "floor", ["/v2 binary"])[0]
    port = load.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "asgi_floor:app", "--host", load.HOST, "--port",
         str(port), "--http", args.http, "--log-level", "warning", "--no-access-log"],
        cwd=Path(__file__).parent,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                asyncio.run(load.drive(port, bodies, 1, 0.2, 5, protocol=protocol))
                break
            except OSError:
                time.sleep(0.2)
        asyncio.run(load.drive(port, bodies, args.clients, 1.0, 10**6, protocol=protocol))
        cpu0 = cpu_seconds(server.pid)
        latencies, failures, wall = asyncio.run(
            load.drive(port, bodies, args.clients, args.duration, 10**7, protocol=protocol)
        )
        cpu = cpu_seconds(server.pid) - cpu0
    finally:
        server.terminate()
        server.wait(timeout=15)
    n = len(latencies)
    print(
        f"uvicorn --http {args.http}, empty ASGI app: {n} requests ({failures} failed), "
        f"{n / wall:.0f}/s, server CPU {1000 * cpu / n:.3f} ms per request, "
        f"CPU share {cpu / wall:.2f}; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
