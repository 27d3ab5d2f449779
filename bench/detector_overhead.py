"""CPU time per request with and without the detector's density scores, in one run.

    python bench/detector_overhead.py [--model DIR] [--k 20] [--batch 1 32] [--repeats 200]
                                      [--threads 1] [--json out.json]

Variants, timed interleaved (one call of each per round, so drift hits all alike) by
``time.process_time`` (the process's CPU time, not wall time), median over ``--repeats`` rounds:

- ``uncertainty``: what the service computed before the detector — ``mc_predict`` (K passes) and
  the uncertainty scores (predictive entropy, mutual information, variation ratio);
- ``features``: ``mc_predict_features`` (the same K passes, also returning the trunk and MC-averaged
  penultimate features) and the same uncertainty scores — the engine's own overhead;
- ``detector``: ``mc_predict_features`` and every detector score (Mahalanobis per layer, −log KD,
  the fused logit) — what a request costs now.

The model directory must hold a fitted detector (``bayesgate fit-detector``); default: the bundled
model. Overhead = ``detector / uncertainty − 1`` at the same batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bayesgate.models.detection import load_detector
from bayesgate.models.mc.engine import mc_predict, mc_predict_features
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.directory import load_model

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "pretrained" / "bayesgate-default"


def variants(model_dir: Path, k: int) -> Callable[[torch.Tensor], dict[str, Callable[[], object]]]:
    loaded = load_model(model_dir)
    detector = load_detector(model_dir, weights_sha256=loaded.card.weights_sha256)
    net = loaded.network

    def make(x: torch.Tensor) -> dict[str, Callable[[], object]]:
        def uncertainty() -> object:
            probs = mc_predict(net, x, k).probs
            return {n: fn(probs) for n, fn in SCORES.items()}

        def features() -> object:
            out = mc_predict_features(net, x, k)
            return {n: fn(out.probs) for n, fn in SCORES.items()}, out.features

        def with_detector() -> object:
            out = mc_predict_features(net, x, k)
            with torch.inference_mode():
                return detector.scores(out.probs, out.features)

        return {"uncertainty": uncertainty, "features": features, "detector": with_detector}

    return make


def cpu_times(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median CPU seconds per call of each variant, interleaved, after 3 warm-up rounds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(repeats + 3):
        for name, fn in calls.items():
            t0 = time.process_time()
            fn()
            if round_ >= 3:
                times[name].append(time.process_time() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    make = variants(args.model, args.k)
    rows = []
    print(
        f"model {args.model.name}, K = {args.k}, {args.threads} thread(s), "
        f"torch {torch.__version__}"
    )
    print(
        "| batch | uncertainty ms | + features ms | + detector ms | engine overhead "
        "| detector overhead |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for b in args.batch:
        x = torch.rand(b, 1, 28, 28, generator=torch.Generator().manual_seed(b))
        t = cpu_times(make(x), args.repeats)
        row = {"batch": b, **{f"{n}_ms": 1e3 * v for n, v in t.items()}}
        row["engine_overhead"] = t["features"] / t["uncertainty"] - 1
        row["detector_overhead"] = t["detector"] / t["uncertainty"] - 1
        rows.append(row)
        print(
            f"| {b} | {row['uncertainty_ms']:.2f} | {row['features_ms']:.2f} | "
            f"{row['detector_ms']:.2f} | {100 * row['engine_overhead']:+.1f} % | "
            f"{100 * row['detector_overhead']:+.1f} % |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"k": args.k, "threads": args.threads, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
