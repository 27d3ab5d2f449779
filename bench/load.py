"""Load benchmark of the prediction service: dynamic batching on vs off, and the engine alone.

Starts ``bayesgate serve`` itself on 127.0.0.1 (a free port), twice — with batching
(``max_batch_size`` = ``--max-batch-size``) and without (``max_batch_size = 1``) — and drives each
with ``--clients`` concurrent keep-alive clients for ``--duration`` seconds (at most
``--max-requests`` requests in all), every request one MNIST test image at K = ``--k`` (or
``--images-per-request`` N images: ``/v1 JSON`` and both ``/v2`` protocols; every figure is then
still per *image*, and the unbatched server is not run — a request of N images is N rows of one
engine call whatever the batch size). Then it
times the MC engine alone (``bayesgate.models.mc.engine.mc_predict`` in this process) at the mean
batch size the
batching server reported in ``/v1/stats``. All processes use ``--threads`` torch threads.

Prints throughput and p50/p95/p99 latency per mode and the ratios measured in this run:
batching ÷ no batching (target ≥ 3 at 32 clients), service ÷ engine at the same mean batch
(target ≥ 0.6) and the server's CPU per image outside the model (server CPU − engine CPU at that
batch; target ≤ 0.25 ms for ``/v2 binary``). The engine row is ``mc_predict`` alone: without the
detector's features or the worker's stop checks. A second reference, ``served model B=…``
(:func:`served_model_alone`: the engine call with the detector's features, every uncertainty
measure and detector score of the answer), gives the CPU outside the *served* model too
(``outside served``): the first figure counts the detector's own work as outside the model. A
third, measured in the same run and process (``outside calls``): the server's CPU beyond the
worker thread's own CPU in its engine calls (``compute_cpu_seconds_total`` of ``/v1/stats``;
with ``--threads 1``, where torch computes on that thread) — the forward with the detector's
features, not the detector's scores or the uncertainty measures (the answer thread's).

    python bench/load.py --duration 10             # bundled model, or an untrained CNN stand-in
    python bench/load.py --model-dir runs/cnn --clients 32 --k 10 --json bench.json
    python bench/load.py --protocols "/v2 binary" --images-per-request 8

Traffic goes to 127.0.0.1 only; every loop is bounded in time and count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.calibration import Calibration, write_calibration
from bayesgate.models.store.directory import ModelCard, load_model, save_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR

BUNDLED = DEFAULT_MODEL_DIR  # what `bayesgate serve` serves without --model-dir
HOST = "127.0.0.1"
MAX_DURATION_S = 120.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def stand_in_model(preset: str, directory: Path) -> Path:
    """An untrained ``preset`` network with a placeholder calibration — same cost per forward as
    a trained one, which is all a throughput benchmark measures."""
    torch.manual_seed(0)
    arch = preset_architecture(preset)
    card = save_model(
        build_network(arch), ModelCard(name=f"stand-in-{preset}", architecture=arch), directory
    )
    write_calibration(
        Calibration(
            model_sha256=card.weights_sha256,
            score="mutual_information",
            target_fpr=0.05,
            k=10,
            thresholds=dict.fromkeys(SCORES, 0.5),
        ),
        directory,
    )
    return directory


def mnist_images(n: int) -> torch.Tensor:
    """MNIST test images when the data is there, uniform noise otherwise."""
    from bayesgate.models.data.mnist import DataError, load_mnist

    try:
        return load_mnist("test", download=False, limit=n)[0]
    except (DataError, OSError):
        return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def bayesgate_command() -> list[str]:
    script = Path(sys.executable).parent / "bayesgate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "bayesgate.cli"]


def _stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds in a ``/proc/…/stat`` file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_cpu_seconds(pid: int) -> float:
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (``/proc/<pid>/task/<tid>/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


class Server:
    """``bayesgate serve [extra_args]`` in a subprocess, stopped with SIGINT on exit (killed after
    ``stop_timeout_s``). Its stderr goes to a temporary file (a pipe nobody reads could fill up
    and block a chatty server), shown if it exits before it is ready."""

    def __init__(
        self,
        model_dir: Path,
        port: int,
        env: dict[str, str],
        extra_args: Sequence[str] = (),
        stop_timeout_s: float = 15.0,
    ) -> None:
        full_env = {**os.environ, **env, "BAYESGATE_MODEL_DIR": str(model_dir)}
        self.env = full_env
        self.base = f"http://{HOST}:{port}"
        self.stop_timeout_s = stop_timeout_s
        self.errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            [*bayesgate_command(), "serve", "--host", HOST, "--port", str(port), *extra_args],
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=self.errors,
            text=True,
        )

    def stderr_text(self) -> str:
        self.errors.seek(0)
        return self.errors.read()

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the server process and the processes it started and
        still runs (an engine process, ``BAYESGATE_ENGINE_PROCESS``; Linux /proc; NaN
        elsewhere)."""
        try:
            return sum(_process_cpu_seconds(pid) for pid in _process_tree(self.proc.pid))
        except (OSError, ValueError, IndexError):
            return float("nan")

    def loop_pid(self) -> int:
        """The process whose main thread runs the event loop: the server's own, except under
        ``bench/granian_proto`` (``BAYESGATE_GRANIAN_PROTO=1`` or ``asgi``), where granian's
        supervisor serves from its one worker process."""
        if self.env.get("BAYESGATE_GRANIAN_PROTO") in ("1", "asgi"):
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            for child in map(int, children.split()):  # also multiprocessing's resource tracker
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
        return self.proc.pid

    def loop_cpu_seconds(self) -> float:
        """CPU time of the serving process's main thread, where uvicorn (or granian's worker)
        runs the event loop: the request path (HTTP, routing, middleware, decoding of small
        bodies, encoding); the model runs in the worker thread, large bodies are decoded in
        other threads. Under granian the HTTP parsing and writing run in its Rust threads, not
        counted here."""
        try:
            pid = self.loop_pid()
            return _stat_cpu_seconds(Path(f"/proc/{pid}/task/{pid}/stat"))
        except (OSError, ValueError, IndexError):
            return float("nan")

    def cpu_by_thread_name(self) -> dict[str, float]:
        """CPU seconds so far of the server process's live threads, summed by OS thread name
        (``/proc/<pid>/task/<tid>/comm``): Python's threads carry the process's name, native
        threads their own (``bgfront-conn``: the native front end, ``--native-port``). A thread that
        ended is no longer counted; each count is in whole clock ticks, rounded on its own, so
        the sum can pass the process's own count by a tick per thread; empty where /proc is not
        there."""
        out: dict[str, float] = {}
        pid = self.loop_pid()
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return out
        for task in tasks:
            try:
                name = (task / "comm").read_text().strip()
                seconds = _stat_cpu_seconds(task / "stat")
            except OSError:  # the thread ended meanwhile
                continue
            out[name] = out.get(name, 0.0) + seconds
        return out

    def get(self, path: str) -> dict[str, Any]:
        with _DIRECT.open(self.base + path, timeout=5) as r:
            return json.load(r)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.stderr_text()}")
            try:
                self.get("/readyz")
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server not ready in time")

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            self.errors.close()


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes
) -> int:
    """One HTTP/1.1 keep-alive POST; returns the status (the body is read and dropped)."""
    writer.write(payload)
    await writer.drain()
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(status_line.split()[1])


Request = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[int]]


@dataclass(frozen=True)
class Protocol:
    """How a request body travels over HTTP: path, content type, and for the binary tensor
    extension the JSON header's length (``Inference-Header-Content-Length``)."""

    name: str
    path: str
    content_type: str
    header_lengths: tuple[int, ...] = ()  # per body, binary extension only

    def http(self, host: str, port: int, body: bytes, i: int = -1) -> bytes:
        extra = ""
        if self.header_lengths:
            extra = f"Inference-Header-Content-Length: {self.header_lengths[i]}\r\n"
        if self.content_type:  # none, as tritonclient.http sends binary bodies
            extra += f"Content-Type: {self.content_type}\r\n"
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        )
        return head.encode() + body


async def drive(
    port: int,
    bodies: list[bytes],
    clients: int,
    duration_s: float,
    max_requests: int,
    request: Request = _request,
    protocol: Protocol | None = None,
) -> tuple[list[float], int, float]:
    """``clients`` concurrent connections sending ``bodies`` round-robin, each exchange made by
    ``request`` (returns the status); returns (latencies of 200 answers in seconds, number of
    non-200 answers, wall seconds). ``protocol``: path and headers (default ``/v1/predict`` JSON).
    """
    latencies: list[float] = []
    failures = 0
    sent = 0
    stop_at = time.perf_counter() + duration_s

    proto = protocol or Protocol("/v1 JSON", "/v1/predict", "application/json")
    payloads = [proto.http(HOST, port, b, i) for i, b in enumerate(bodies)]

    async def client(i: int) -> None:
        nonlocal failures, sent
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            j = i
            while time.perf_counter() < stop_at and sent < max_requests:
                sent += 1
                t0 = time.perf_counter()
                status = await request(reader, writer, payloads[j % len(payloads)])
                if status == 200:
                    latencies.append(time.perf_counter() - t0)
                else:
                    failures += 1
                j += clients
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies, failures, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def server_env(args: argparse.Namespace, batch: int) -> dict[str, str]:
    """The server's ``BAYESGATE_*`` settings for a run with these options and batch size."""
    return {
        "BAYESGATE_MAX_BATCH_SIZE": str(batch),
        "BAYESGATE_MAX_QUEUE_DELAY_MS": str(args.max_queue_delay_ms),
        "BAYESGATE_NUM_THREADS": str(args.threads),
        "BAYESGATE_QUEUE_CAPACITY": str(max(256, 4 * args.clients)),
        "BAYESGATE_MAX_MC_SAMPLES": str(max(100, args.k)),
        "BAYESGATE_REQUEST_TIMEOUT_S": "60",
        "BAYESGATE_LOG_LEVEL": "warning",
        "BAYESGATE_DEVICE": args.device,
        "OMP_NUM_THREADS": str(args.threads),
    }


def latency_stats(latencies: list[float], failures: int, wall: float) -> dict[str, float]:
    """Requests, failures, throughput (per second of ``wall``) and latency percentiles in ms."""
    return {
        "requests": len(latencies),
        "failed": failures,
        "throughput": len(latencies) / wall,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p95_ms": 1000 * percentile(latencies, 95),
        "p99_ms": 1000 * percentile(latencies, 99),
        "mean_ms": 1000 * statistics.fmean(latencies) if latencies else float("nan"),
    }


def run_mode(
    name: str, model_dir: Path, bodies: list[bytes], args: argparse.Namespace, batch: int
) -> dict[str, Any]:
    """One server, ``/v1 JSON`` only (kept for ``bench/ray_replicas.py``-style callers)."""
    protocol = Protocol("/v1 JSON", "/v1/predict", "application/json")
    return run_server(model_dir, args, batch, [(name, protocol, bodies)])[0]


Workload = tuple[
    str, "Protocol | None", list[Any]
]  # (row name, HTTP protocol or None = gRPC, bodies)


def run_server(
    model_dir: Path, args: argparse.Namespace, batch: int, workloads: list[Workload]
) -> list[dict[str, Any]]:
    """Start one server (gRPC on too when a workload needs it) and drive each workload in turn:
    a short warm-up, then ``--duration`` seconds; the server's CPU and ``/v1/stats`` deltas."""
    port, grpc_port, native_port = free_port(), free_port(), free_port()
    env = server_env(args, batch)
    if any(protocol is None for _, protocol, _ in workloads):
        env["BAYESGATE_GRPC_PORT"] = str(grpc_port)
    if any(name == NATIVE for name, _, _ in workloads):
        env["BAYESGATE_NATIVE_PORT"] = str(native_port)
    rows = []
    with Server(model_dir, port, env) as server:
        server.wait_ready()
        for name, protocol, bodies in workloads:

            def go(
                seconds: float,
                cap: int,
                protocol: Protocol | None = protocol,
                bodies=bodies,
                to: int = native_port if name == NATIVE else port,
            ):
                if protocol is None:
                    from load_protocols import drive_grpc

                    return asyncio.run(drive_grpc(grpc_port, bodies, args.clients, seconds, cap))
                return asyncio.run(drive(to, bodies, args.clients, seconds, cap, protocol=protocol))

            go(min(1.0, args.duration), 10_000)  # warm-up
            before, cpu0 = server.get("/v1/stats"), server.cpu_seconds()
            loop0, client0 = server.loop_cpu_seconds(), time.process_time()
            threads0 = server.cpu_by_thread_name()
            latencies, failures, wall = go(args.duration, args.max_requests)
            client_cpu = time.process_time() - client0
            threads1 = server.cpu_by_thread_name()
            after, cpu1 = server.get("/v1/stats"), server.cpu_seconds()
            per = getattr(args, "images_per_request", 1)
            row = _row(name, batch, latencies, failures, wall, before, after, cpu1 - cpu0, per)
            loop_cpu = server.loop_cpu_seconds() - loop0
            n = len(latencies)
            row["cpu_ms_loop"] = 1000 * loop_cpu / (n * per) if n else float("nan")
            # the server's CPU per image by thread name, same window (JSON only)
            row["cpu_ms_by_thread_name"] = {
                name: 1000 * (seconds - threads0.get(name, 0.0)) / (n * per) if n else float("nan")
                for name, seconds in sorted(threads1.items())
            }
            # threads that ended in the window (connections closed at its end, say): the
            # process's CPU beyond its live threads' (± a clock tick per thread)
            row["cpu_ms_threads_ended"] = row["cpu_ms_per_request"] - sum(
                row["cpu_ms_by_thread_name"].values()
            )
            # the load generator's own CPU (this process): it shares the machine with the server
            row["client_cpu_ms_per_request"] = 1000 * client_cpu / n if n else float("nan")
            rows.append(row)
    return rows


def _row(
    name: str,
    batch: int,
    latencies: list[float],
    failures: int,
    wall: float,
    before: dict[str, Any],
    after: dict[str, Any],
    cpu: float,
    per_request: int = 1,
) -> dict[str, Any]:
    """One mode's row. ``requests``, ``throughput`` and the CPU figures count *images* (HTTP
    requests × ``per_request``; the latencies are per HTTP request, ``http_requests`` their
    number); the client's CPU stays per HTTP request."""
    calls = after["engine_calls"] - before["engine_calls"]
    instances = after["instances"] - before["instances"]
    compute = after["compute_seconds_total"] - before["compute_seconds_total"]
    compute_cpu = after.get("compute_cpu_seconds_total", 0.0) - before.get(
        "compute_cpu_seconds_total", 0.0
    )
    stats = latency_stats(latencies, failures, wall)
    done = len(latencies) * per_request
    stats["requests"] = done
    stats["throughput"] = done / wall
    return {
        "mode": name,
        "max_batch_size": batch,
        **stats,
        "http_requests": len(latencies),
        "images_per_request": per_request,
        "mean_batch": instances / calls if calls else 0.0,
        "cpu_ms_per_request": 1000 * cpu / done if done else float("nan"),
        "cpu_share": cpu / wall,
        # the worker's engine calls (the answers are built beside them, in the answer thread,
        # since 55c6af6), wall time: per image, and the share of the run the worker spent in
        # them (1 = it never waited for work)
        "worker_ms_per_image": 1000 * compute / instances if instances else float("nan"),
        "worker_busy": compute / wall,
        # the worker thread's CPU in those calls, and the server's CPU beyond it, per image: a
        # reference for "the model" measured in the same run, in the same process (the engine
        # rows are timed later, in this process); valid for one torch thread (--threads 1)
        "worker_cpu_ms_per_image": 1000 * compute_cpu / instances if instances else float("nan"),
        "cpu_ms_outside_engine_calls": 1000 * (cpu - compute_cpu) / done if done else float("nan"),
    }


def back_to_back(
    call: Callable[[], Any], mode: str, batch: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``call()`` (one batch of ``batch`` images) three times to warm up, then back to back for
    ``--duration`` seconds (at most ``--max-requests`` images); CPU time is this process's."""
    for _ in range(3):
        call()
    calls, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < args.duration and calls * batch < args.max_requests:
        call()
        calls += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "mode": mode,
        "max_batch_size": batch,
        "requests": calls * batch,
        "failed": 0,
        "throughput": calls * batch / wall,
        "p50_ms": float("nan"),
        "p95_ms": float("nan"),
        "p99_ms": float("nan"),
        "mean_ms": 1000 * wall / calls,
        "mean_batch": float(batch),
        "cpu_ms_per_request": 1000 * cpu / (calls * batch),
        "cpu_share": cpu / wall,
    }


def engine_alone(model_dir: Path, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """``mc_predict`` on ``batch`` images back to back (:func:`back_to_back`, this process,
    ``--threads`` torch threads); CPU time is this process's, i.e. the engine's."""
    torch.set_num_threads(args.threads)
    device = torch.device("cpu" if args.device == "auto" else args.device)
    net = load_model(model_dir, device).network
    x = mnist_images(batch).to(device)
    return back_to_back(lambda: mc_predict(net, x, args.k), f"engine B={batch}", batch, args)


def served_model_alone(model_dir: Path, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """What the served model computes per batch, without the server: the engine call with the
    detector's features (:func:`~bayesgate.service.engine.mc_engine`) plus every uncertainty
    measure and detector score of the answer (no ``Prediction`` objects, no hand-offs), on
    ``batch`` images back to back (:func:`back_to_back`)."""
    from bayesgate.models.mc.uncertainty import summary
    from bayesgate.service.engine import mc_engine
    from bayesgate.service.served_model import load_served_model

    torch.set_num_threads(args.threads)
    device = "cpu" if args.device == "auto" else str(args.device)
    served = load_served_model(model_dir, device)
    detector = served.detector
    x = mnist_images(batch).to(device)

    def call() -> None:
        if detector is None:
            summary(mc_engine(served.network, x, args.k, None))
            return
        out = mc_engine(served.network, x, args.k, None, features=detector.layers)
        summary(out.probs)
        detector.scores(out.probs, out.features)

    return back_to_back(call, f"served model B={batch}", batch, args)


COLUMNS = [  # (title, key, format)
    ("mode", "mode", "<22"),
    ("max batch", "max_batch_size", ">10"),
    ("mean batch", "mean_batch", ">11.1f"),
    ("images", "requests", ">8"),
    ("failed", "failed", ">7"),
    ("images/s", "throughput", ">10.1f"),
    ("p50 ms", "p50_ms", ">8.1f"),
    ("p95 ms", "p95_ms", ">8.1f"),
    ("p99 ms", "p99_ms", ">8.1f"),
    ("CPU ms/img", "cpu_ms_per_request", ">11.2f"),
    ("outside", "cpu_ms_outside_model", ">9.2f"),
    ("outside served", "cpu_ms_outside_served_model", ">15.2f"),
    ("outside calls", "cpu_ms_outside_engine_calls", ">14.2f"),
    ("loop", "cpu_ms_loop", ">7.2f"),
    ("CPU share", "cpu_share", ">10.2f"),
    ("worker ms/img", "worker_ms_per_image", ">14.2f"),
    ("worker busy", "worker_busy", ">12.2f"),
    ("client ms/req", "client_cpu_ms_per_request", ">14.2f"),
]


def table(rows: list[dict[str, Any]]) -> str:
    widths = [int("".join(ch for ch in fmt.split(".")[0] if ch.isdigit())) for _, _, fmt in COLUMNS]
    head = "".join(
        f"{title:{'<' if i == 0 else '>'}{w}}"
        for i, ((title, _, _), w) in enumerate(zip(COLUMNS, widths, strict=True))
    )
    lines = [head]
    for r in rows:
        lines.append("".join(f"{r.get(key, float('nan')):{fmt}}" for _, key, fmt in COLUMNS))
    return "\n".join(lines)


def add_load_options(p: argparse.ArgumentParser, per: str, threads_help: str) -> None:
    """The load and server options shared by the load benchmarks (``per``: what one run is)."""
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0, help=f"seconds per {per} (≤ 120)")
    p.add_argument("--max-requests", type=int, default=200_000, help=f"cap per {per}")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=1, help=threads_help)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")


NATIVE = "native /v2 binary"  # /v2 binary to the native front end's port (--native-port)
PROTOCOLS = ("/v1 JSON", "/v1 PNG", "/v2 JSON", "/v2 binary", "gRPC", NATIVE)
UNBATCHED = ("/v1 JSON", "/v2 binary", NATIVE)  # also run without batching


MULTI_IMAGE = ("/v1 JSON", "/v2 JSON", "/v2 binary", NATIVE)  # N images per request possible


def workloads(
    images: torch.Tensor, k: int, model: str, names: Sequence[str], per_request: int = 1
) -> list[Workload]:
    import load_protocols as lp

    if per_request > 1 and set(names) - set(MULTI_IMAGE):
        raise ValueError(f"several images per request only with {', '.join(MULTI_IMAGE)}")
    make = {
        "/v1 JSON": lambda: lp.v1_json(images, k, per_request),
        "/v1 PNG": lambda: lp.v1_png(images, k),
        "/v2 JSON": lambda: lp.v2_json(images, k, model, per_request),
        "/v2 binary": lambda: lp.v2_binary(images, k, model, per_request),
        NATIVE: lambda: lp.v2_binary(images, k, model, per_request),
        "gRPC": lambda: (None, lp.grpc_requests(images, k, model)),
    }
    return [(name, *make[name]()) for name in names]


def ratios_and_outside(
    batched: list[dict[str, Any]],
    single: list[dict[str, Any]],
    engines: dict[int, dict],
    served: dict[int, dict] | None = None,
) -> dict[str, Any]:
    """Per protocol: server CPU ms per image outside the model (server CPU − engine CPU at the
    same mean batch), service ÷ engine at that batch; batching ÷ no batching where both ran.
    With ``served`` (:func:`served_model_alone` rows by batch) also the CPU outside the *served*
    model (server CPU − engine with features, uncertainty measures and detector scores)."""
    out: dict[str, Any] = {}
    by_name = {r["mode"]: r for r in single}
    for row in batched:
        engine = engines[max(1, round(row["mean_batch"]))]
        row["cpu_ms_outside_model"] = row["cpu_ms_per_request"] - engine["cpu_ms_per_request"]
        model = (served or {}).get(max(1, round(row["mean_batch"])))
        if model is not None:
            row["cpu_ms_outside_served_model"] = (
                row["cpu_ms_per_request"] - model["cpu_ms_per_request"]
            )
        row["service_over_engine"] = row["throughput"] / engine["throughput"]
        # the same ratio from CPU per image: robust to the two runs getting different CPU shares
        row["engine_cpu_over_service_cpu"] = (
            engine["cpu_ms_per_request"] / row["cpu_ms_per_request"]
        )
        if row["mode"] in by_name:
            row["batching_over_no_batching"] = (
                row["throughput"] / by_name[row["mode"]]["throughput"]
            )
    for row in single:
        row["cpu_ms_outside_model"] = row["cpu_ms_per_request"] - engines[1]["cpu_ms_per_request"]
        row["mode"] = f"{row['mode']} unbatched"
    best = max(batched, key=lambda r: r["service_over_engine"])
    out["best_protocol"] = best["mode"]
    out["service_over_engine_best"] = best["service_over_engine"]
    top = max(engines)  # what batching can gain in the engine itself: B=top ÷ B=1
    out["engine_batch_gain"] = {
        "batch": top,
        "ratio": engines[top]["throughput"] / engines[1]["throughput"],
    }
    return out


def summary(batched: list[dict[str, Any]], ratios: dict[str, Any]) -> str:
    lines = [
        "protocol      service/engine  batching/no batching  CPU ms/img outside model"
        "  event loop CPU ms/img  engine CPU ÷ server CPU"
    ]
    for r in batched:
        b = r.get("batching_over_no_batching")
        lines.append(
            f"{r['mode']:<14}{r['service_over_engine']:>14.2f}"
            f"{(f'{b:.2f}×' if b else '—'):>22}{r['cpu_ms_outside_model']:>26.2f}"
            f"{r['cpu_ms_loop']:>23.2f}{r['engine_cpu_over_service_cpu']:>25.2f}"
        )
    lines.append(
        f"best service / engine: {ratios['service_over_engine_best']:.2f} "
        f"({ratios['best_protocol']})"
        "  — targets: service/engine ≥ 0.6, batching ≥ 3×, /v2 binary outside ≤ 0.25 ms"
    )
    gain = ratios["engine_batch_gain"]
    lines.append(f"engine alone B={gain['batch']} ÷ B=1: {gain['ratio']:.2f}×")
    return "\n".join(lines)


def thread_table(rows: list[dict[str, Any]], floor: float = 0.005) -> str:
    """The server's CPU ms per image by OS thread name, one line per server mode (threads under
    ``floor`` left out; ``ended``: threads that ended in the window, e.g. the native front end's
    connection threads when the clients hang up). ``bg-worker`` computes, ``bg-answers`` builds
    the answers (measures, detector scores), ``bg-native`` feeds the native front end's batches
    to the worker, ``bgfront-*`` are its Rust threads, and the process's own name
    (``bayesgate``) is the event loop and every other Python thread."""
    lines = ["server CPU ms/img by thread"]
    for r in rows:
        by_name = r.get("cpu_ms_by_thread_name")
        if not by_name:
            continue
        parts = {**by_name, "ended": r.get("cpu_ms_threads_ended", 0.0)}
        shown = sorted(((v, k) for k, v in parts.items() if v >= floor), reverse=True)
        lines.append(f"  {r['mode']:<28}" + "  ".join(f"{k} {v:.3f}" for v, k in shown))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model-dir", type=Path, default=None, help="default: bundled model, else a stand-in"
    )
    p.add_argument(
        "--stand-in", default="cnn", help="preset of the untrained stand-in (default cnn)"
    )
    p.add_argument(
        "--protocols",
        default=",".join(PROTOCOLS),
        help=f"comma-separated subset of {', '.join(PROTOCOLS)}",
    )
    add_load_options(p, per="mode", threads_help="torch threads (server and engine)")
    p.add_argument(
        "--images-per-request",
        type=int,
        default=1,
        help=f"images in each request ({', '.join(MULTI_IMAGE)} only; ≤ --max-batch-size)",
    )
    args = p.parse_args(argv)
    per = args.images_per_request
    if not 1 <= per <= args.max_batch_size:
        p.error(f"--images-per-request must be in 1 … --max-batch-size ({args.max_batch_size})")
    if not 0 < args.duration <= MAX_DURATION_S or args.clients < 1 or args.max_requests < 1:
        p.error(f"need 0 < --duration ≤ {MAX_DURATION_S}, --clients ≥ 1, --max-requests ≥ 1")
    names = [n.strip() for n in args.protocols.split(",") if n.strip()]
    if not names or set(names) - set(PROTOCOLS):
        p.error(f"--protocols: choose from {', '.join(PROTOCOLS)}")
    if per > 1 and set(names) - set(MULTI_IMAGE):
        p.error(f"--images-per-request > 1 works with {', '.join(MULTI_IMAGE)} only")
    if args.json is not None:  # before the runs, not after them
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            p.error(f"--json: cannot make {args.json.parent} ({exc.strerror or exc})")

    tmp = Path(tempfile.mkdtemp(prefix="bayesgate-bench-"))
    try:
        if args.model_dir is not None:
            model_dir, model_note = args.model_dir, str(args.model_dir)
        elif BUNDLED.is_dir():
            model_dir, model_note = BUNDLED, "bundled default model"
        else:
            model_dir = stand_in_model(args.stand_in, tmp / "stand-in")
            model_note = f"untrained {args.stand_in} stand-in, no bundled model yet"
        card = json.loads((model_dir / "card.json").read_text())
        work = workloads(mnist_images(64 * per), args.k, card["name"], names, per)
        load_start = os.getloadavg()[0]
        print(
            f"model {card['name']} ({model_note}); K={args.k}; {args.clients} clients; "
            f"{args.duration:g} s per mode; {args.threads} torch thread(s); "
            f"{per} image{'s' if per > 1 else ''} per request; "
            f"{os.cpu_count()} CPUs, load average {load_start:.1f}",
            flush=True,
        )
        batched = run_server(model_dir, args, args.max_batch_size, work)
        unbatched = [w for w in work if w[0] in UNBATCHED] if per == 1 else []
        single = run_server(model_dir, args, 1, unbatched) if unbatched else []
        sizes = {1, args.max_batch_size // 2} | {max(1, round(r["mean_batch"])) for r in batched}
        engines = {b: engine_alone(model_dir, b, args) for b in sorted(sizes)}
        served = {
            b: served_model_alone(model_dir, b, args)
            for b in sorted({max(1, round(r["mean_batch"])) for r in batched})
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ratios = ratios_and_outside(batched, single, engines, served)
    rows = [*batched, *single, *engines.values(), *served.values()]
    print(table(rows))
    print(summary(batched, ratios))
    print(thread_table([*batched, *single]))
    print(f"load average at the start {load_start:.1f}, at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": card["name"],
                    "model_note": model_note,
                    "load_average": [load_start, os.getloadavg()[0]],
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "rows": rows,
                    **ratios,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
