"""What one engine call of the batching worker costs per image, by batch size: the MC engine
alone, the engine with the detector's features, and the answer built from it (uncertainty
summary, detector scores, one :class:`~bayesgate.service.prediction.Prediction` per image).

This is the ceiling batching works against: a server without batching pays the B = 1 column
per image, one with batching the B = mean-batch column, plus the request path either way.

    python bench/worker_cost.py --batches 1,16,32 --k 10

CPU time of this process (``time.process_time``), ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bayesgate.service.engine import mc_engine
from bayesgate.service.prediction import predictions
from bayesgate.service.served_model import ServedModel, load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR

BUNDLED = DEFAULT_MODEL_DIR  # the model `bayesgate serve` serves by default


def cpu_ms_per_image(step: Callable[[], object], batch: int, seconds: float) -> float:
    """CPU ms per image of ``step`` (one call over ``batch`` images), repeated ``seconds``."""
    step()
    calls, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while calls < 3 or time.perf_counter() - start < seconds:
        step()
        calls += 1
    return 1000 * (time.process_time() - cpu0) / (calls * batch)


def costs(served: ServedModel, batch: int, k: int, seconds: float) -> tuple[float, float, float]:
    """CPU ms per image: engine alone, engine with features, building the answers."""
    detector = served.detector is not None
    x = torch.rand(batch, *served.input_shape, generator=torch.Generator().manual_seed(0))
    out = mc_engine(served.network, x, k, None, features=detector)
    probs, feats = (out.probs, out.features) if detector else (out, None)
    engine = cpu_ms_per_image(partial(mc_engine, served.network, x, k, None), batch, seconds)
    with_features = cpu_ms_per_image(
        partial(mc_engine, served.network, x, k, None, features=detector), batch, seconds
    )
    answer = cpu_ms_per_image(partial(predictions, probs, served, feats), batch, seconds)
    return engine, with_features, answer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, default=BUNDLED)
    p.add_argument("--batches", default="1,16,32")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (≤ 60)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if not 0 < args.seconds <= 60:
        p.error("need 0 < --seconds ≤ 60")
    torch.set_num_threads(args.threads)
    served = load_served_model(args.model_dir, "cpu")
    detector = served.detector is not None
    print(f"{served.name}, K={args.k}, detector: {detector}; CPU ms per image")
    print(f"{'B':>4}{'engine':>10}{'+features':>11}{'answer':>9}{'worker':>9}{'per call':>10}")
    for batch in (int(b) for b in args.batches.split(",")):
        engine, with_features, answer = costs(served, batch, args.k, args.seconds)
        worker = with_features + answer
        print(
            f"{batch:>4}{engine:>10.3f}{with_features:>11.3f}{answer:>9.3f}{worker:>9.3f}"
            f"{worker * batch:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
