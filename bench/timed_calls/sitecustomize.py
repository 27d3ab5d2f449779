"""Time the answer path's calls inside a real server (thread CPU and wall time per call).

Put this folder first on ``PYTHONPATH`` of a server (``bench/load.py`` passes its environment
on) and set ``BG_TIMED_CALLS_DIR``: once the service modules are imported, the worker's
``_answer``, ``answer_columns`` and the native bridge's ``_submit``, ``_finish``,
``output_bytes``, ``NativeFront.next_batch`` and ``NativeFront.complete`` are wrapped, and at
exit each process writes ``timed_calls-<pid>.json``: ``{name: [calls, cpu_s, wall_s]}``.

    BG_TIMED_CALLS_DIR=/tmp/tc PYTHONPATH=bench/timed_calls \\
        bench/quiet.sh python bench/load.py --duration 10 --protocols "native /v2 binary"

A measuring aid for the docs' figures, not part of the service.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = os.environ.get("BG_TIMED_CALLS_DIR")
totals: dict[str, list[float]] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            t = totals.setdefault(name, [0, 0.0, 0.0])
            t[0] += 1
            t[1] += time.thread_time() - cpu
            t[2] += time.perf_counter() - wall

    return call


def install() -> None:
    worker = sys.modules["bayesgate.service.worker"]
    bridge = sys.modules["bayesgate.service.native_bridge"]
    native = sys.modules["bayesgate.service.native"]
    worker.BatchWorker._answer = timed("_answer", worker.BatchWorker._answer)
    worker.answer_columns = timed("answer_columns", worker.answer_columns)
    bridge.output_bytes = timed("output_bytes", bridge.output_bytes)
    for name in ("_submit", "_finish"):
        setattr(bridge.NativeBridge, name, timed(name, getattr(bridge.NativeBridge, name)))
    for name in ("next_batch", "complete"):
        setattr(native.NativeFront, name, timed(name, getattr(native.NativeFront, name)))


def ready() -> bool:
    names = ("worker", "native_bridge", "native")
    modules = [sys.modules.get(f"bayesgate.service.{n}") for n in names]
    classes = ("BatchWorker", "NativeBridge", "NativeFront")
    return all(m is not None and hasattr(m, c) for m, c in zip(modules, classes, strict=True))


if OUT:
    real_import = builtins.__import__

    def hook(*args: Any, **kwargs: Any) -> Any:
        module = real_import(*args, **kwargs)
        if ready():
            builtins.__import__ = real_import
            install()
        return module

    builtins.__import__ = hook

    @atexit.register
    def dump() -> None:
        if totals:
            path = Path(OUT) / f"timed_calls-{os.getpid()}.json"
            path.write_text(json.dumps(totals, indent=1))
