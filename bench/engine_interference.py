"""Is the batching worker slowed by the GIL, or by the other core being busy? The worker's engine
call timed alone, beside a Python co-runner in *another process* (no shared GIL), and beside the
same co-runner in *another thread* of this process (shared GIL, like the event loop).

The engine call is the worker's: ``mc_engine(network, x, K, None, features=<detector>)`` over
``--batch`` images inside :func:`~bayesgate.service.engine.checkpoints` (a Python check before
every layer, as the worker runs it), one torch thread. With ``--step answer`` the timed step is
instead what the worker does next: building the answers from that call's output
(:func:`~bayesgate.service.prediction.predictions`: uncertainty summary, detector scores, one
``Prediction`` per image), the same output each time; with ``--step answer-after-engine`` the
answers are built from a fresh engine call's output each time, as in the worker, and only they
are timed (the engine call ran just before, untimed). The co-runner imitates the event loop: it
runs pure Python (JSON encode/decode and dict building, roughly what a request costs on the loop)
for ``--burst-us`` µs, then sleeps for as long again × ``(1 − duty) / duty`` — busy a fraction
``--duty`` of the time. ``--inputs mnist`` uses MNIST test images (as ``bench/load.py``) instead
of uniform noise: the served model puts them in more classes, and the answers' kernel density
works class by class. The thread co-runner runs with CPython's switch interval at
``--switch-interval-us`` (the server's default, 100 µs).

For each condition, per image: wall ms (1 / throughput of the engine loop) and the engine
thread's own CPU ms (``time.thread_time``). A GIL-bound slow-down shows as wall ≫ CPU in the
thread condition only; a shared-core slow-down (caches, memory bandwidth, the host's SMT
siblings under a VM) as higher CPU per image in both co-run conditions.

    python bench/engine_interference.py --seconds 3 --rounds 3 --json out.json

Conditions alternate within each round: alone, process, thread.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bayesgate.service.engine import checkpoints, mc_engine
from bayesgate.service.prediction import predictions
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR

CONDITIONS = ("alone", "process", "thread")


def python_work(until: float) -> int:
    """Pure-Python work until ``time.perf_counter() >= until``; returns the iterations done."""
    n = 0
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 784], "data": list(range(64))}]})
    while time.perf_counter() < until:
        doc = json.loads(body)
        answer = {f"k{i}": [v * 0.5 for v in doc["inputs"][0]["data"][:16]] for i in range(4)}
        json.dumps(answer)
        n += 1
    return n


def co_run(stop: Any, burst_s: float, duty: float) -> None:
    """Busy ``burst_s``, idle ``burst_s × (1 − duty) / duty``, until ``stop`` is set."""
    idle = burst_s * (1 - duty) / duty
    while not stop.is_set():
        python_work(time.perf_counter() + burst_s)
        if idle > 0:
            time.sleep(idle)


def _process_main(stop: Any, ready: Any, burst_s: float, duty: float) -> None:
    ready.set()
    co_run(stop, burst_s, duty)


def time_engine(step: Any, batch: int, seconds: float) -> dict[str, float]:
    """Wall and thread-CPU ms per image of ``step`` repeated for ``seconds`` (of its timed part
    when it returns one: ``(wall s, CPU s)``)."""
    step()
    calls, start, cpu0 = 0, time.perf_counter(), time.thread_time()
    timed_wall = timed_cpu = 0.0
    parts = False
    while calls < 3 or time.perf_counter() - start < seconds:
        part = step()
        if isinstance(part, tuple):
            parts = True
            timed_wall, timed_cpu = timed_wall + part[0], timed_cpu + part[1]
        calls += 1
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu0
    if parts:
        wall, cpu = timed_wall, timed_cpu
    return {
        "wall_ms_per_image": 1000 * wall / (calls * batch),
        "cpu_ms_per_image": 1000 * cpu / (calls * batch),
        "calls": calls,
    }


def measure(condition: str, step: Any, args: argparse.Namespace) -> dict[str, float]:
    burst, duty = args.burst_us / 1e6, args.duty
    if condition == "alone":
        return time_engine(step, args.batch, args.seconds)
    if condition == "process":
        ctx = mp.get_context("spawn")
        stop, ready = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_process_main, args=(stop, ready, burst, duty), daemon=True)
        proc.start()
        ready.wait(30)
        try:
            return time_engine(step, args.batch, args.seconds)
        finally:
            stop.set()
            proc.join(10)
    stop_t = threading.Event()
    thread = threading.Thread(target=co_run, args=(stop_t, burst, duty), daemon=True)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(args.switch_interval_us / 1e6)
    thread.start()
    try:
        return time_engine(step, args.batch, args.seconds)
    finally:
        stop_t.set()
        thread.join(10)
        sys.setswitchinterval(previous)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--k", type=int, default=10)
    p.add_argument(
        "--step",
        choices=("engine", "answer", "answer-after-engine"),
        default="engine",
        help="what is timed: the engine call, building the answer from its output (the same "
        "output each time), or building the answer right after each engine call (untimed)",
    )
    p.add_argument(
        "--inputs",
        choices=("noise", "mnist"),
        default="noise",
        help="uniform noise (the model puts it in few classes) or MNIST test images, which "
        "bench/load.py sends (more classes: more kernel-density groups in the answers)",
    )
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (≤ 30)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (≤ 10)")
    p.add_argument("--duty", type=float, default=0.45, help="co-runner's busy fraction (0, 1]")
    p.add_argument("--burst-us", type=float, default=600.0, help="co-runner's busy stretch")
    p.add_argument("--switch-interval-us", type=float, default=100.0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not (0 < args.seconds <= 30 and 1 <= args.rounds <= 10 and 0 < args.duty <= 1):
        p.error("need 0 < --seconds ≤ 30, 1 ≤ --rounds ≤ 10, 0 < --duty ≤ 1")
    torch.set_num_threads(1)
    served = load_served_model(args.model_dir, "cpu")
    features = served.detector is not None
    x = torch.rand(args.batch, *served.input_shape, generator=torch.Generator().manual_seed(0))
    if args.inputs == "mnist":
        from bayesgate.models.data.mnist import load_mnist

        x = load_mnist("test", download=False, limit=args.batch)[0]

    def engine() -> object:
        with checkpoints(served.network, lambda: None):
            return mc_engine(served.network, x, args.k, None, features=features)

    out = engine()
    probs, feats = (out.probs, out.features) if features else (out, None)

    def answer() -> object:
        return predictions(probs, served, feats)

    def answer_after_engine() -> tuple[float, float]:
        fresh = engine()
        start, cpu0 = time.perf_counter(), time.thread_time()
        if features:
            predictions(fresh.probs, served, fresh.features)
        else:
            predictions(fresh, served, None)
        return time.perf_counter() - start, time.thread_time() - cpu0

    step = {"engine": engine, "answer": answer, "answer-after-engine": answer_after_engine}[
        args.step
    ]

    print(
        f"{served.name}, {args.step}, B={args.batch}, K={args.k}, {args.inputs}, "
        f"features: {features}, predictions from {sys.modules[predictions.__module__].__file__}; "
        f"co-runner duty "
        f"{args.duty:g}, bursts {args.burst_us:g} µs; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for condition in CONDITIONS:
            row = {"round": r + 1, "condition": condition, **measure(condition, step, args)}
            runs.append(row)
            print(
                f"round {r + 1} {condition:<8} wall {row['wall_ms_per_image']:.3f} ms/img  "
                f"engine thread CPU {row['cpu_ms_per_image']:.3f} ms/img",
                flush=True,
            )
    medians = {
        c: {
            key: statistics.median(r[key] for r in runs if r["condition"] == c)
            for key in ("wall_ms_per_image", "cpu_ms_per_image")
        }
        for c in CONDITIONS
    }
    for c, m in medians.items():
        print(f"median {c:<8} wall {m['wall_ms_per_image']:.3f}  CPU {m['cpu_ms_per_image']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "model": served.name,
                    "predictions_module": sys.modules[predictions.__module__].__file__,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "load_average_end": os.getloadavg()[0],
                    "runs": runs,
                    "medians": medians,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
