"""A real ``bayesgate serve`` process on 127.0.0.1 for the service tests (not a test module).

stderr goes to a file (a pipe nobody reads would fill up and block the server's logging); the
server's JSON log lines are read back from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

API_KEY = "test-admin-key-0123456789"


def bayesgate_command() -> list[str]:
    script = Path(sys.executable).parent / "bayesgate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "bayesgate.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    port: int
    log_path: Path

    def log_records(self) -> list[dict[str, Any]]:
        """Every complete stderr line, parsed as JSON (fails on a line that is not). A last line
        without its newline is still being written (the processes log while this reads): left
        for the next call."""
        data = self.log_path.read_bytes()
        lines = data[: data.rfind(b"\n") + 1].decode().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send ``sig`` and wait for the exit code. SIGKILL (or a timeout) kills the server's whole
        session: a killed ``--workers N`` supervisor would leave its workers running."""
        if sig == signal.SIGKILL:
            self.kill_all()
        elif self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise

    def kill_all(self) -> None:
        """SIGKILL to every process of the server's session (it is its own session leader)."""
        with contextlib.suppress(ProcessLookupError):  # all gone already
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def start_server(
    model_dir: Path,
    log_dir: Path,
    ready_timeout: float = 90,
    args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    **settings: object,
) -> Server:
    """Start ``bayesgate serve [args]`` with ``BAYESGATE_<NAME>`` = each setting (and
    ``extra_env``); wait for ``/readyz``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BAYESGATE_", "PROMETHEUS_"))}
    env.update(
        BAYESGATE_MODEL_DIR=str(model_dir),
        BAYESGATE_NUM_THREADS="1",
        BAYESGATE_LOG_LEVEL="info",
        BAYESGATE_LOG_FORMAT="json",
        OMP_NUM_THREADS="1",
        # What the image and a plain `pip install .` run (no uvloop there; the dev venv has it
        # through ray[serve], and tests/service/test_service_server.py's servers use it).
        BAYESGATE_EVENT_LOOP="asyncio",
    )
    env.update({f"BAYESGATE_{k.upper()}": str(v) for k, v in settings.items()})
    env.update(extra_env or {})
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [*bayesgate_command(), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            start_new_session=True,  # its workers too can be killed at once (Server.kill_all)
        )
    server = Server(proc, f"http://127.0.0.1:{port}", port, log_path)
    deadline = time.monotonic() + ready_timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {log_path.read_text()}")
        if time.monotonic() > deadline:
            server.stop(signal.SIGKILL)
            raise AssertionError(f"server not ready in {ready_timeout} s: {log_path.read_text()}")
        try:
            if httpx.get(f"{server.base}/readyz", timeout=2, trust_env=False).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def per_process(metrics_dir: Path, metric: str, labels: dict[str, str] | None = None) -> dict:
    """``{pid: value}`` of one metric sample from each process's own multiprocess files.

    Each process's ``*_<pid>.db`` files are copied to a directory of their own and read with
    ``MultiProcessCollector`` there — so the value is that process's alone, not the aggregate.
    """
    pids = {p.stem.rsplit("_", 1)[1] for p in metrics_dir.glob("*.db")}
    out: dict[int, float] = {}
    for pid in pids:
        with tempfile.TemporaryDirectory() as tmp:
            for f in metrics_dir.glob(f"*_{pid}.db"):
                shutil.copy(f, tmp)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=tmp)
            for family in registry.collect():
                for sample in family.samples:
                    if sample.name != metric:
                        continue
                    got = {k: v for k, v in sample.labels.items() if k != "pid"}
                    if labels is None or all(got.get(k) == v for k, v in labels.items()):
                        out[int(pid)] = out.get(int(pid), 0.0) + sample.value
    return out
