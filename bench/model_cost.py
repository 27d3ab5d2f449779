"""CPU time per image of two models' full engine call (K passes, features, every detector score),
timed interleaved in one run, and the ratio between them.

    python bench/model_cost.py [--models DIR DIR] [--k 20] [--batch 1 32] [--repeats 100]
                               [--threads 1] [--json out.json]

Default: the two bundled models, ``bayesgate-cnn`` (``cnn``) and ``bayesgate-robust``
(``cnn-wide``). Each model's call is what the service's worker runs per batch when the model has a
fitted detector — :func:`detector_overhead.variants`' ``detector`` variant: ``mc_predict_features``,
the uncertainty scores and :meth:`Detector.scores`. Timing by :func:`detector_overhead.cpu_times`
(process CPU time, median over rounds, one call of each model per round so drift hits both
alike). The ratio, not the absolute time, is the number to quote: it is measured in one run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from detector_overhead import cpu_times, variants

PRETRAINED = Path(__file__).resolve().parents[1] / "models" / "pretrained"
DEFAULT_MODELS = [PRETRAINED / "bayesgate-cnn", PRETRAINED / "bayesgate-robust"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=Path, nargs=2, default=DEFAULT_MODELS)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    makers = {d.name: variants(d, args.k) for d in args.models}
    (first, second) = makers
    rows = []
    for batch in args.batch:
        x = torch.rand(batch, 1, 28, 28)
        calls = {name: make(x)["detector"] for name, make in makers.items()}
        seconds = cpu_times(calls, args.repeats)
        per_image = {name: 1e3 * s / batch for name, s in seconds.items()}
        rows.append(
            {"batch": batch, "ms_per_image": per_image, "ratio": seconds[second] / seconds[first]}
        )
        print(
            f"B={batch:3d} K={args.k}: "
            + ", ".join(f"{n} {ms:.3f} ms/image" for n, ms in per_image.items())
            + f"; {second} ÷ {first} = {rows[-1]['ratio']:.2f}×"
        )
    if args.json:
        out = {"k": args.k, "threads": args.threads, "repeats": args.repeats, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
