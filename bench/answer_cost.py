"""What building the answers costs per batch, counted: the worker's step after its engine call
(:func:`~bayesgate.service.prediction.predictions` — uncertainty summary, detector scores, one
``Prediction`` per image), for MNIST test images (the inputs ``bench/load.py`` sends; uniform noise
without the data, which the served model puts in fewer classes, so the kernel density's per-class
loop runs fewer times).

Per batch size B, from one engine output (``K`` passes with features, one torch thread):

- ``torch calls``: Python-level torch functions and tensor methods (a ``TorchFunctionMode``;
  attribute reads such as ``.shape`` left out); each one is a trip through the dispatcher and,
  for most, a release and re-take of the GIL — in a server, a chance to wait for it;
- ``aten ops``: every operator the profiler records, nested ones included;
- ``py calls``: Python function calls (``cProfile``), torch's and ours;
- ``classes``: distinct predicted classes in the batch (one kernel-density group each);
- ``ms/img``: wall time per image of ``predictions`` repeated for ``--seconds``, the same output
  each time (cache-warm; the worker's answers come right after a fresh engine call and cost more:
  ``bench/engine_interference.py --step answer-after-engine``);
- ``after N MB`` (``--flush-mb N,…``): the same, with N MB written between calls (not timed), so
  each call starts with the caches that much colder (this machine: 1 MB L2 per core, a 32 MB
  L3).

Run it with each version's interpreter (a worktree's ``.venv``) to compare two versions:

    python bench/answer_cost.py --batches 1,16,32 --json out.json
    python bench/answer_cost.py --batches 10 --flush-mb 4,16,32,64
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from bayesgate.service.engine import mc_engine
from bayesgate.service.prediction import predictions
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR


class CountCalls(TorchFunctionMode):
    """Counts every torch function and tensor method called from Python inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") != "__get__":  # not attribute reads (.shape, .dtype)
            self.calls += 1
        return func(*args, **(kwargs or {}))


def images(n: int) -> tuple[torch.Tensor, str]:
    """``n`` MNIST test images when the data is there, else uniform noise."""
    from bayesgate.models.data.mnist import DataError, load_mnist

    try:
        return load_mnist("test", download=False, limit=n)[0], "mnist"
    except (DataError, OSError):
        return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(0)), "noise"


def counts(step: Any) -> dict[str, int]:
    step()  # warm: the detector's per-class and per-dtype caches are filled on first use
    with CountCalls() as mode:
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    aten = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    profiler = cProfile.Profile()
    profiler.enable()
    step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    return {"torch_calls": mode.calls, "aten_ops": aten, "py_calls": stats.total_calls}


def ms_per_image(step: Any, batch: int, seconds: float) -> float:
    step()
    calls, start = 0, time.perf_counter()
    while calls < 5 or time.perf_counter() - start < seconds:
        step()
        calls += 1
    return 1000 * (time.perf_counter() - start) / (calls * batch)


def ms_per_image_flushed(step: Any, batch: int, seconds: float, mb: int) -> float:
    """:func:`ms_per_image` with ``mb`` MB written (untimed) before each call."""
    junk = torch.zeros(mb * 2**20 // 4)
    step()
    calls, timed, start = 0, 0.0, time.perf_counter()
    while calls < 5 or time.perf_counter() - start < seconds:
        junk.add_(1.0)
        t = time.perf_counter()
        step()
        timed += time.perf_counter() - t
        calls += 1
    return 1000 * timed / (calls * batch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--batches", default="1,16,32")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seconds", type=float, default=2.0, help="timing per batch size (≤ 30)")
    p.add_argument("--flush-mb", default="", help="also time with N MB written between calls")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        flushes = [int(n) for n in args.flush_mb.split(",") if n.strip()]
    except ValueError:
        p.error(f"--flush-mb: a comma-separated list of whole MB, got {args.flush_mb!r}")
    if any(not 0 < n <= 1024 for n in flushes):
        p.error("--flush-mb: each in 1..1024")
    if not 0 < args.seconds <= 30:
        p.error("need 0 < --seconds ≤ 30")
    torch.set_num_threads(1)
    served = load_served_model(args.model_dir, "cpu")
    features = served.detector is not None
    batches = [int(b) for b in args.batches.split(",")]
    x_all, source = images(max(batches))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent,
        check=False,
    ).stdout.strip()
    import bayesgate.service.prediction as module

    print(
        f"{served.name}, K={args.k}, inputs {source}, features: {features}; "
        f"predictions from {module.__file__}; load average {os.getloadavg()[0]:.1f}"
    )
    flush_head = "".join(f"{f'after {n} MB':>13}" for n in flushes)
    print(
        f"{'B':>4}{'classes':>9}{'torch calls':>13}{'aten ops':>10}{'py calls':>10}{'ms/img':>9}"
        + flush_head
    )
    rows = []
    for batch in batches:
        x = x_all[:batch]
        out = mc_engine(
            served.network, x, args.k, torch.Generator().manual_seed(0), features=features
        )
        probs, feats = (out.probs, out.features) if features else (out, None)

        def step(probs: torch.Tensor = probs, feats: Any = feats) -> object:
            return predictions(probs, served, feats)

        classes = int(probs.mean(1).argmax(-1).unique().numel())
        row = {"batch": batch, "classes": classes, **counts(step)}
        row["ms_per_image"] = ms_per_image(step, batch, args.seconds)
        row["ms_per_image_after_flush"] = {
            str(n): ms_per_image_flushed(step, batch, args.seconds, n) for n in flushes
        }
        rows.append(row)
        flushed = "".join(f"{v:>13.3f}" for v in row["ms_per_image_after_flush"].values())
        print(
            f"{batch:>4}{classes:>9}{row['torch_calls']:>13}{row['aten_ops']:>10}"
            f"{row['py_calls']:>10}{row['ms_per_image']:>9.3f}" + flushed,
            flush=True,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "model": served.name,
                    "inputs": source,
                    "predictions_module": module.__file__,
                    "bench_commit": commit,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "load_average_end": os.getloadavg()[0],
                    "rows": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
