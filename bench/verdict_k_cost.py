"""CPU per image of the served engine call plus the detector's scores at several K, interleaved
in one run (one torch thread, one batch of test digits): what a less noisy verdict costs.

    python bench/verdict_k_cost.py --k 20 50          # prints ms per image and each K ÷ the first
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "pretrained" / "bayesgate-robust"


def measure(model: Path, ks: list[int], batch: int, repeats: int, warmup: int = 5) -> dict:
    """``{K: CPU ms per image}`` of ``mc_engine`` with the detector's features + its scores."""
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.detection import load_detector
    from bayesgate.models.store.directory import load_model
    from bayesgate.service.engine import mc_engine

    loaded = load_model(model)
    network = loaded.network.eval()
    detector = load_detector(model, weights_sha256=loaded.card.weights_sha256)
    x, _ = load_mnist("test", limit=batch)
    cpu = dict.fromkeys(ks, 0.0)
    for r in range(warmup + repeats):
        for k in ks:  # interleaved: the machine's drift hits every K alike
            start = time.process_time()
            out = mc_engine(network, x, k, None, features=detector.layers)
            detector.scores(out.probs, out.features)
            if r >= warmup:
                cpu[k] += time.process_time() - start
    return {k: 1000 * v / repeats / batch for k, v in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--k", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=35)
    args = parser.parse_args(argv)
    if min(args.k) < 1 or args.batch < 1 or args.repeats < 1:
        parser.error("--k, --batch and --repeats must be ≥ 1")
    torch.set_num_threads(1)
    ms = measure(args.model, args.k, args.batch, args.repeats)
    first = args.k[0]
    for k, value in ms.items():
        print(f"K = {k:>4}: {value:.3f} ms CPU per image (B = {args.batch}), "
              f"{value / ms[first]:.2f}× K = {first}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
