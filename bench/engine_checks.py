"""Cost of making the worker's engine calls stoppable (issue 18): the served engine with and
without :func:`bayesgate.service.engine.checkpoints` (a check before every layer), in one run.

Both variants run alternately, ``--rounds`` times each, on the same ``--batch``-image input with
``--k`` passes and one torch thread; the check is the worker's own (:meth:`BatchWorker._check`
over one job whose deadline is far away). Prints the median seconds per call of each variant,
their ratio (checked ÷ plain), the largest gap between two checks (the stop granularity: how long
a dropped job may still compute) and whether the outputs are bit-identical for one seed.

    python bench/engine_checks.py --batch 256 --k 10 --rounds 40
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from bayesgate.service.engine import checkpoints, mc_engine
from bayesgate.service.jobs import Job
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR
from bayesgate.service.worker import BatchWorker


def one_call(served, plain, x: torch.Tensor, k: int, check=None) -> tuple[float, list[float]]:
    """Seconds of one engine call (as the worker makes it) and the times of its checks; without
    ``check`` on ``plain``, a copy of the network that was never hooked."""
    stamps: list[float] = []
    features = served.detector is not None
    start = time.perf_counter()
    if check is None:
        mc_engine(plain, x, k, None, features=features)
    else:

        def timed() -> None:
            stamps.append(time.perf_counter())
            check()

        with checkpoints(served.network, timed):
            mc_engine(served.network, x, k, None, features=features)
    end = time.perf_counter()
    return end - start, [b - a for a, b in zip([start, *stamps], [*stamps, end], strict=True)]


def bit_identical(served, plain, x: torch.Tensor, k: int) -> bool:
    def run(network: torch.nn.Module) -> torch.Tensor:
        out = mc_engine(network, x, k, torch.Generator().manual_seed(7), features=True)
        return torch.cat([out.probs.flatten(), *(f.flatten() for f in out.features.values())])

    unchecked = run(plain)
    with checkpoints(served.network, lambda: None):
        checked = run(served.network)
    return torch.equal(unchecked, checked)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    served = load_served_model(args.model_dir, "cpu")
    plain = copy.deepcopy(served.network)  # never hooked (checkpoints() hooks once and for all)
    worker = BatchWorker(served)
    x = torch.rand(args.batch, 1, 28, 28)
    jobs = [Job(x=x, k=args.k, seed=None, return_samples=False, deadline=time.monotonic() + 1e9)]

    def check() -> None:  # the worker's check over one far-off job, as in a real call
        worker._check(jobs)

    for _ in range(3):  # warm-up
        one_call(served, plain, x, args.k)
        one_call(served, plain, x, args.k, check)
    unchecked, checked, gaps = [], [], []
    for _ in range(args.rounds):
        unchecked.append(one_call(served, plain, x, args.k)[0])
        seconds, between = one_call(served, plain, x, args.k, check)
        checked.append(seconds)
        gaps.extend(between)
    result = {
        "batch": args.batch,
        "k": args.k,
        "rounds": args.rounds,
        "plain_s_median": round(statistics.median(unchecked), 4),
        "checked_s_median": round(statistics.median(checked), 4),
        "ratio_checked_over_plain": round(
            statistics.median(checked) / statistics.median(unchecked), 4
        ),
        "paired_ratio_median": round(
            statistics.median(c / q for c, q in zip(checked, unchecked, strict=True)), 4
        ),
        "max_gap_between_checks_ms": round(1000 * max(gaps), 1),
        "bit_identical_for_a_seed": bit_identical(served, plain, x, args.k),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
