"""SIGTERM under steady load on the native front end's port (``serve --native-port``): what each
connection opened through the shutdown got.

Each round starts ``bayesgate serve`` with a native port (drain delay 1 s), runs ``--clients``
loops for ``--load`` s, sends SIGTERM and keeps the loops going until the process has exited.
Every request goes on a new connection with ``Connection: close`` (the accept queue is where a
closing listener loses connections). Half the loops send a ``/v2`` binary infer request (answered
by the native front end itself), half ``GET /healthz`` (relayed to the main port). Outcomes:

- ``native:<status>`` / ``relay:<status>``: answered;
- ``refused``: ``connect()`` failed — the port was closed, nothing was accepted;
- ``native:reset`` / ``relay:reset``: the connection was established and the request written,
  but it was closed or reset without an answer.

``--hogs N`` runs N busy-looping processes beside it: the native acceptor then falls behind now
and then, which is when a closing listener has connections in its queue (on an idle loopback it
hardly ever has).

    python bench/native_drain.py --rounds 6 --hogs 2 --json docs/bench/native_drain.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile import read_answer, start
from load import HOST, free_port

from bayesgate.service.settings import DEFAULT_MODEL_DIR


def infer_request(port: int, model: str) -> bytes:
    """One 28×28 image as a ``/v2`` binary infer request, binary outputs, on a closing
    connection."""
    raw = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32).tobytes()
    head = json.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1, 28, 28],
                    "parameters": {"binary_data_size": len(raw)}}],
        "parameters": {"binary_data_output": True, "mc_samples": 10},
    }).encode()  # fmt: skip
    return (
        (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\n"
            f"Content-Length: {len(head) + len(raw)}\r\nConnection: close\r\n\r\n"
        ).encode()
        + head
        + raw
    )


async def one(port: int, kind: str, request: bytes) -> str:
    """One request on a new connection: its outcome (see the module docstring)."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return "refused"
    try:
        writer.write(request)
        await writer.drain()
        status, _ = await asyncio.wait_for(read_answer(reader), 60)
        return f"{kind}:{status}"
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
        return f"{kind}:reset"
    finally:
        writer.close()


async def loops(port: int, requests: list[tuple[str, bytes]], stop: asyncio.Event) -> list[str]:
    outcomes: list[str] = []

    async def loop(kind: str, request: bytes) -> None:
        while not stop.is_set():
            outcome = await one(port, kind, request)
            outcomes.append(outcome)
            if outcome == "refused":
                await asyncio.sleep(0.05)

    await asyncio.gather(*(loop(kind, request) for kind, request in requests))
    return outcomes


def round_once(args: argparse.Namespace) -> tuple[list[str], int, float]:
    native_port = free_port()
    server = start(args, native_port=native_port, drain_delay_s=1.0, drain_timeout_s=10)
    try:
        model = httpx.get(server.base + "/v1/models", timeout=30, trust_env=False).json()
        request = infer_request(native_port, model["models"][0]["name"])
        healthz = f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode()
        kinds = [("native", request) if i % 2 == 0 else ("relay", healthz)
                 for i in range(args.clients)]  # fmt: skip

        async def run() -> tuple[list[str], float]:
            stop = asyncio.Event()
            task = asyncio.ensure_future(loops(native_port, kinds, stop))
            await asyncio.sleep(args.load)
            t = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            while server.proc.poll() is None and time.monotonic() - t < 60:
                await asyncio.sleep(0.02)
            exit_s = time.monotonic() - t
            await asyncio.sleep(0.2)  # the loops see the closed port
            stop.set()
            return await task, exit_s

        outcomes, exit_s = asyncio.run(run())
        code = server.proc.wait(timeout=60)
    finally:
        server.__exit__()
    return outcomes, code, exit_s


def one_round(args: argparse.Namespace, i: int, total: dict[str, int]) -> dict[str, Any]:
    """Round ``i``: its outcomes (added to ``total``), exit code and time to exit."""
    outcomes, code, exit_s = round_once(args)
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    for k, v in counts.items():
        total[k] = total.get(k, 0) + v
    result = {"round": i, "outcomes": counts, "exit_code": code, "exit_seconds": round(exit_s, 2)}
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=8, help="loops (half native, half relayed)")
    p.add_argument("--load", type=float, default=2.0, help="seconds of load before SIGTERM")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hogs", type=int, default=0, help="busy-looping processes beside the run")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    total: dict[str, int] = {}
    rounds: list[dict[str, Any]] = []
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        for i in range(args.rounds):
            rounds.append(one_round(args, i, total))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    result = {
        "scenario": f"SIGTERM under steady load on the native port, {args.clients} loops, "
        f"a new connection per request, {args.hogs} busy process(es) beside it",
        "rounds": rounds,
        "total": total,
        "resets": sum(v for k, v in total.items() if k.endswith(":reset")),
        "5xx": sum(v for k, v in total.items() if k.split(":")[-1].startswith("5")),
    }
    print(json.dumps({k: result[k] for k in ("total", "resets", "5xx")}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
