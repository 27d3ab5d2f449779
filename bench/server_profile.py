"""Where a real server's CPU goes under load (py-spy), per thread and per layer of the stack.

Starts ``bayesgate serve`` as ``bench/load.py`` does (batching on), drives it with one protocol of
``bench/load.py`` (32 keep-alive clients, one image per request at K = ``--k``) and samples the
server with ``py-spy record`` (``pip install py-spy``; not a dependency of the project) for
``--duration`` seconds: only running stacks (py-spy leaves idle threads out), every thread.

Each sample is charged to the *innermost* frame of the stack that belongs to a known layer:
the model (``torch``, ``bayesgate.models``), the uncertainty summary and detector
(``service/prediction.py``, ``models/detection``), the batching worker, the request path of the
service (routes, protocol coding, middleware), FastAPI, pydantic, Starlette, uvicorn, asyncio or
uvloop, the Prometheus client, logging, ``other``. The table gives each layer's share of the
samples of the event-loop thread (``MainThread``) and of the worker thread, and the most
expensive functions by own samples.

    python bench/server_profile.py --protocol "/v2 binary" --duration 15

Traffic goes to 127.0.0.1 only; the run is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import load

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (  # (layer, substrings of "file (function)")
    ("detector", ("models/detection",)),
    ("uncertainty summary", ("service/prediction.py", "models/mc/uncertainty")),
    ("model (torch, mc engine)", ("torch/", "models/mc/", "models/networks")),
    ("batching worker", ("service/worker.py", "service/jobs.py", "service/worker_stats.py")),
    ("native bridge", ("service/native_bridge.py", "service/native.py")),
    ("prometheus", ("prometheus_client",)),
    ("logging", ("logging/", "service/logs.py")),
    ("middleware", ("service/middleware.py",)),
    (
        "request path: routes + protocol coding",
        (
            "service/routes",
            "service/inference_protocol.py",
            "service/oip_binary.py",
            "service/inputs.py",
            "service/request_body.py",
            "service/fast_json.py",
            "service/schemas.py",
            "service/deps.py",
            "service/errors.py",
            "service/grpc_server.py",
            "numpy/",
        ),
    ),
    ("pydantic", ("pydantic",)),
    ("fastapi", ("fastapi/",)),
    ("starlette", ("starlette/",)),
    ("uvicorn + httptools", ("uvicorn/", "httptools")),
    ("grpc", ("grpc/",)),
    (
        "asyncio / uvloop / threading",
        ("asyncio/", "uvloop", "threading.py", "concurrent/", "queue.py"),
    ),
)


def layer_of(stack: list[str]) -> str:
    """The layer of the innermost frame (stacks are outermost first) that has one."""
    for frame in reversed(stack):
        for name, keys in LAYERS:
            if any(k in frame for k in keys):
                return name
    return "other"


def read_samples(path: Path) -> dict[str, Counter[tuple[str, ...]]]:
    """py-spy's raw (collapsed) output → {thread name: Counter(stack → samples)}."""
    threads: dict[str, Counter[tuple[str, ...]]] = {}
    for line in path.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text:
            continue
        frames = stack_text.split(";")
        thread = frames[0]
        name = (
            "loop"
            if "MainThread" in thread
            else "worker"
            if "bayesgate-worker" in thread
            else "other"
        )
        threads.setdefault(name, Counter())[tuple(frames[1:])] += int(count)
    return threads


def summarise(threads: dict[str, Counter[tuple[str, ...]]], top: int) -> str:
    total = sum(sum(c.values()) for c in threads.values())
    lines = [f"{total} samples while running (all threads)"]
    for thread in ("loop", "worker", "other"):
        stacks = threads.get(thread)
        if not stacks:
            continue
        n = sum(stacks.values())
        by_layer: Counter[str] = Counter()
        own: Counter[str] = Counter()
        for stack, count in stacks.items():
            by_layer[layer_of(list(stack))] += count
            own[stack[-1] if stack else "?"] += count
        lines.append(f"\n{thread} thread: {n} samples ({100 * n / total:.0f} % of all)")
        for name, count in by_layer.most_common():
            lines.append(f"   {name:<42}{100 * count / n:6.1f} %")
        lines.append("   own samples, top functions:")
        for frame, count in own.most_common(top):
            lines.append(f"     {100 * count / n:5.1f} %  {frame[:110]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--protocol", default="/v2 binary", choices=load.PROTOCOLS)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--raw", type=Path, default=None, help="keep py-spy's collapsed stacks here")
    p.add_argument(
        "--model-dir", type=Path, default=load.BUNDLED, help="model to serve (default: bundled)"
    )
    load.add_load_options(p, per="run", threads_help="torch threads of the server")
    args = p.parse_args(argv)
    if not 0 < args.duration <= load.MAX_DURATION_S:
        p.error(f"need 0 < --duration ≤ {load.MAX_DURATION_S}")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    card = json.loads((args.model_dir / "card.json").read_text())
    name, protocol, bodies = load.workloads(
        load.mnist_images(64), args.k, card["name"], [args.protocol]
    )[0]
    port, grpc_port, native_port = load.free_port(), load.free_port(), load.free_port()
    env = load.server_env(args, args.max_batch_size)
    if protocol is None:
        env["BAYESGATE_GRPC_PORT"] = str(grpc_port)
    if name == load.NATIVE:  # the native front end's port (Python sees only its batches)
        env["BAYESGATE_NATIVE_PORT"] = str(native_port)
    to = native_port if name == load.NATIVE else port

    def go(seconds: float) -> tuple[list[float], int, float]:
        if protocol is None:
            from load_protocols import drive_grpc

            return asyncio.run(drive_grpc(grpc_port, bodies, args.clients, seconds, 10**9))
        return asyncio.run(load.drive(to, bodies, args.clients, seconds, 10**9, protocol=protocol))

    with tempfile.TemporaryDirectory() as tmp, load.Server(args.model_dir, port, env) as server:
        server.wait_ready()
        go(1.0)  # warm-up
        raw = args.raw or Path(tmp) / "stacks.txt"
        record = subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                str(server.loop_pid()),  # the serving process (granian: its worker)
                "-f",
                "raw",
                "-t",
                "--nolineno",
                "-r",
                str(args.rate),
                "-d",
                str(int(args.duration) + 1),
                "--nonblocking",
                "-o",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        latencies, failures, wall = go(args.duration)
        record.wait(timeout=args.duration + 60)
        print(
            f"{name}: {len(latencies)} answers ({failures} failed) in {wall:.1f} s, "
            f"{len(latencies) / wall:.1f}/s; server CPU {server.cpu_seconds():.1f} s in all"
        )
        print(summarise(read_samples(raw), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
