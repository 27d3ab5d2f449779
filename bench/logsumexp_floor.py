"""What the kernel density's floored logsumexp
(:func:`~bayesgate.models.detection.kde.logsumexp_rows`) saves, measured in one run, and a check
that it changes no score.

1. ``exp``: float32 ``exp`` of 5 000 values whose results are normal floats against 5 000 whose
   results underflow (below e^−87.34) — the cost the floor avoids.
2. ``logsumexp``: ``torch.logsumexp`` against ``logsumexp_rows`` on the served model's own kernel
   terms for ``--batch`` MNIST test digits (their predicted classes' samples).
3. ``answers``: the worker's whole answer step
   (:func:`~bayesgate.service.prediction.answer_columns`: uncertainty, every detector score)
   for the same batch, with the plain logsumexp and with the floored one, alternating.
4. ``same scores``: every detector score of the first ``--limit`` test digits (K as calibrated,
   seed 0, batches of 500 and of 1) with each version, compared bit for bit.

    python bench/logsumexp_floor.py --batch 10 --limit 10000
    python bench/logsumexp_floor.py --model-dir models/pretrained/bayesgate-cnn --limit 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import kde as kde_module
from bayesgate.models.detection.detector import collect_features
from bayesgate.service.engine import mc_engine
from bayesgate.service.prediction import answer_columns
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR


def plain_logsumexp_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x, dim=1)


@contextmanager
def plain() -> Any:
    """Inside the block the kernel density uses torch's logsumexp as it is."""
    floored = kde_module.logsumexp_rows
    kde_module.logsumexp_rows = plain_logsumexp_rows
    try:
        yield
    finally:
        kde_module.logsumexp_rows = floored


def per_call_us(fn: Callable[[], Any], seconds: float) -> float:
    for _ in range(20):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def paired(a: Callable[[], Any], b: Callable[[], Any], rounds: int, seconds: float) -> list:
    """``rounds`` alternating timings of ``a`` and ``b`` (µs per call each)."""
    return [(per_call_us(a, seconds), per_call_us(b, seconds)) for _ in range(rounds)]


def median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def all_scores(served: Any, x: torch.Tensor, batch: int) -> dict[str, torch.Tensor]:
    detector = served.detector
    probs, feats = collect_features(served.network, x, detector.k, batch_size=batch, seed=0)
    with torch.inference_mode():
        if batch > 1:
            return detector.scores(probs, feats)
        rows = [
            detector.scores(probs[i : i + 1], {n: f[i : i + 1] for n, f in feats.items()})
            for i in range(x.shape[0])
        ]
    return {n: torch.cat([r[n] for r in rows]) for n in rows[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    ap.add_argument("--batch", type=int, default=10, help="images in the timed batch")
    ap.add_argument("--limit", type=int, default=2000, help="test digits whose scores are compared")
    ap.add_argument("--single-limit", type=int, default=200, help="of those, scored one at a time")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="per timing")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    served = load_served_model(args.model_dir, "cpu")
    if served.detector is None or served.detector.kde is None:
        print(f"{args.model_dir}: the model has no kernel density", file=sys.stderr)
        return 2
    out: dict[str, Any] = {"model": served.name, "batch": args.batch, "torch": torch.__version__}

    g = torch.Generator().manual_seed(0)
    normal, underflow = torch.randn(5000, generator=g) - 40, torch.randn(5000, generator=g) - 95
    ex = paired(lambda: normal.exp(), lambda: underflow.exp(), args.rounds, args.seconds / 4)
    out["exp_us"] = {"normal": median([a for a, _ in ex]), "underflow": median([b for _, b in ex])}

    x = load_mnist("test", download=False, limit=max(args.batch, args.limit))[0]
    batch = x[: args.batch]
    res = mc_engine(served.network, batch, served.detector.k, g, features=True)
    probs, feats = res.probs, res.features
    kde = served.detector.kde
    f = feats[served.detector.kde_layer].float()
    classes = probs.mean(1).argmax(-1)
    terms = torch.cat(
        [f[b : b + 1] @ kde._class_terms(int(c), f.dtype)[0] - kde._class_terms(int(c), f.dtype)[1]
         for b, c in enumerate(classes.tolist())]
    )  # fmt: skip
    below = float((terms < terms.amax(1, keepdim=True) - 87.34).float().mean())
    lse = paired(
        lambda: torch.logsumexp(terms, dim=1),
        lambda: kde_module.logsumexp_rows(terms),
        args.rounds,
        args.seconds / 2,
    )
    out["kernel_terms"] = {"shape": list(terms.shape), "share_underflowing": below}
    out["logsumexp_us"] = {
        "plain": median([a for a, _ in lse]),
        "floored": median([b for _, b in lse]),
    }

    def answers() -> Any:
        return answer_columns(probs, served, feats)

    def plain_answers() -> Any:
        with plain():
            return answers()

    ans = paired(plain_answers, answers, args.rounds, args.seconds)
    out["answers_us"] = {
        "plain": median([a for a, _ in ans]),
        "floored": median([b for _, b in ans]),
    }

    mismatched: dict[str, int] = {}
    compared = 0
    for size, limit in ((500, args.limit), (1, args.single_limit)):
        xs = x[:limit]
        new = all_scores(served, xs, size)
        with plain():
            old = all_scores(served, xs, size)
        for name in new:
            bad = int((new[name].double().numpy() != old[name].double().numpy()).sum())
            mismatched[name] = mismatched.get(name, 0) + bad
        compared += xs.shape[0]
    out["same_scores"] = {"images": compared, "mismatched_by_score": mismatched}

    e, s, a = out["exp_us"], out["logsumexp_us"], out["answers_us"]
    print(f"{served.name}, batch {args.batch}, torch {torch.__version__}, one thread")
    exp_ratio = e["underflow"] / e["normal"]
    print(
        f"exp of 5000 float32: normal {e['normal']:.1f} µs, "
        f"underflowing {e['underflow']:.1f} µs ({exp_ratio:.1f}×)"
    )
    print(
        f"kernel terms {terms.shape[0]}×{terms.shape[1]}, {below:.1%} underflow: logsumexp "
        f"{s['plain']:.1f} → {s['floored']:.1f} µs ({s['plain'] / s['floored']:.2f}× faster)"
    )
    print(
        f"answer step for the batch: {a['plain']:.0f} → {a['floored']:.0f} µs "
        f"({a['plain'] / a['floored']:.2f}×; medians of {args.rounds} alternating rounds)"
    )
    total = sum(mismatched.values())
    print(
        f"scores of {compared} digits ({args.limit} in batches of 500, {args.single_limit} one "
        f"at a time), {len(mismatched)} scores each: {total} differ"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if total == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
