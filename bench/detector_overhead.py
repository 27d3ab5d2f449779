"""CPU time per request with and without the detector's density scores, in one run.

    python bench/detector_overhead.py [--model DIR] [--k 20] [--batch 1 32] [--repeats 200]
                                      [--threads 1] [--json out.json]

Variants, timed interleaved (one call of each per round, so drift hits all alike) by
``time.process_time`` (the process's CPU time, not wall time), median over ``--repeats`` rounds:

- ``uncertainty``: what the service computed before the detector — ``mc_predict`` (K passes) and
  the uncertainty scores (predictive entropy, mutual information, variation ratio);
- ``features``: ``mc_predict_features`` (the same K passes, also returning the trunk and MC-averaged
  penultimate features) and the same uncertainty scores — the engine's own overhead;
- ``detector``: ``mc_predict_features``, the same uncertainty scores and every detector score
  (Mahalanobis per layer, −log KD, the fused logit) — what a request's engine call costs now.

Then whole HTTP requests (``--requests N``, one image per ``POST /v1/predict``, K as above): two
in-process apps (ASGI transport, no sockets) on the same weights, one whose calibration.json
references the detector and one whose copy does not (so it serves predictive entropy, as before),
requests alternating between them; CPU time of the process (event loop + worker thread) per
request, median over requests. This is the number the issue's "≤ ~15 %" is about.

The model directory must hold a fitted detector (``bayesgate fit-detector``); default: the bundled
model. Overhead = ``detector / uncertainty − 1`` at the same batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bayesgate.models.detection import load_detector
from bayesgate.models.mc.engine import mc_predict, mc_predict_features
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.directory import load_model

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "pretrained" / "bayesgate-cnn"


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
            measures = {n: fn(out.probs) for n, fn in SCORES.items()}
            with torch.inference_mode():  # as the service: uncertainty once, then the rest
                return detector.scores(out.probs, out.features, measures)

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


def without_detector(model_dir: Path, into: Path) -> Path:
    """A copy of ``model_dir`` whose calibration.json does not reference the detector."""
    copy = Path(shutil.copytree(model_dir, into / "no-detector"))
    calibration = json.loads((copy / "calibration.json").read_text())
    calibration["detector"] = None
    (copy / "calibration.json").write_text(json.dumps(calibration))
    return copy


async def request_cpu_times(model_dir: Path, k: int, requests: int) -> dict[str, float]:
    """Median CPU seconds per ``POST /v1/predict`` (one image), with and without the detector."""
    import httpx

    from bayesgate.service.app import create_app
    from bayesgate.service.settings import Settings

    logging.getLogger("bayesgate").setLevel(logging.WARNING)
    body = {"instances": [[0.5] * 784], "mc_samples": k}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"uncertainty": without_detector(model_dir, Path(tmp)), "detector": model_dir}
        apps = {
            name: create_app(
                Settings(model_dir=d, device="cpu", access_log=False, log_level="warning")
            )
            for name, d in dirs.items()
        }
        times: dict[str, list[float]] = {name: [] for name in apps}
        async with (
            apps["uncertainty"].router.lifespan_context(apps["uncertainty"]),
            apps["detector"].router.lifespan_context(apps["detector"]),
        ):
            clients = {
                name: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b")
                for name, app in apps.items()
            }
            for i in range(requests + 5):
                for name, client in clients.items():
                    t0 = time.process_time()
                    response = await client.post("/v1/predict", json=body)
                    spent = time.process_time() - t0
                    response.raise_for_status()
                    if i >= 5:
                        times[name].append(spent)
            for client in clients.values():
                await client.aclose()
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=300, help="HTTP requests per variant (0: skip)")
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
    result: dict[str, object] = {"k": args.k, "threads": args.threads, "rows": rows}
    if args.requests:
        t = asyncio.run(request_cpu_times(args.model, args.k, args.requests))
        overhead = t["detector"] / t["uncertainty"] - 1
        result["request"] = {**{f"{n}_ms": 1e3 * v for n, v in t.items()}, "overhead": overhead}
        print(
            f"\nPOST /v1/predict, 1 image: {1e3 * t['uncertainty']:.2f} ms CPU without the "
            f"detector, {1e3 * t['detector']:.2f} ms with it: {100 * overhead:+.1f} %"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
