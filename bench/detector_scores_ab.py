"""``Detector.scores`` CPU time with the current formulas vs the ones before issue 15's second pass,
interleaved in one process (so load drift hits both alike).

Usage: python bench/detector_scores_ab.py [--model DIR] [--rounds 1500] [--batch 1 32]

"before" swaps back, by monkeypatching, the three formulas the second pass replaced:
Mahalanobis as ``((f − μ_c) P) · (f − μ_c)`` over a ``B×C×D`` difference (now whitened), the KDE as
``logsumexp(−clamp(‖f‖² + ‖s‖² − 2f·s, 0)/σ²)`` (now with precomputed per-class terms), and the
min-p score through the stacked ``B×F`` p-values (now a running minimum). Prints the median CPU
time (``time.process_time``, one thread) per ``scores()`` call after 100 warm-up rounds, and checks
that both give the same scores up to float32 rounding.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from bayesgate.models.detection import conformal, kde, load_detector, mahalanobis
from bayesgate.models.mc.engine import mc_predict_features
from bayesgate.models.mc.uncertainty import SCORES
from bayesgate.models.store.directory import load_model

MODEL = Path(__file__).resolve().parents[1] / "models/pretrained/bayesgate-cnn"


def old_distances(self, f: torch.Tensor) -> torch.Tensor:
    diff = f.to(self.means.dtype).unsqueeze(1) - self.means.unsqueeze(0)
    return ((diff @ self.precision) * diff).sum(dim=-1).clamp_min(0.0)


def old_class_log_density(self, f: torch.Tensor, c: int) -> torch.Tensor:
    lo, hi = self._bounds[c]
    s = self._rows[lo:hi].to(f.dtype)
    sq = (f * f).sum(1, keepdim=True) + (s * s).sum(1) - 2.0 * (f @ s.T)
    return torch.logsumexp(-sq.clamp_min(0.0) / self.bandwidth**2, dim=1) - math.log(hi - lo)


def old_score(self, scores) -> torch.Tensor:
    return -torch.log(self.p_values(scores).amin(dim=-1))


NEW = (
    mahalanobis.ClassGaussians.distances,
    kde.ClassKDE._class_log_density,
    conformal.ConformalFusion.score,
)
OLD = (old_distances, old_class_log_density, old_score)


def use(impl: tuple) -> None:
    mahalanobis.ClassGaussians.distances = impl[0]
    kde.ClassKDE._class_log_density = impl[1]
    conformal.ConformalFusion.score = impl[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    for b in args.batch:
        x = torch.rand(b, 1, 28, 28, generator=torch.Generator().manual_seed(b))
        out = mc_predict_features(loaded.network, x, detector.k)
        measures = {n: fn(out.probs) for n, fn in SCORES.items()}
        times: dict[str, list[float]] = {"before": [], "now": []}
        results = {}
        with torch.inference_mode():
            for r in range(args.rounds + 100):
                for name, impl in (("before", OLD), ("now", NEW)):
                    use(impl)
                    t0 = time.process_time()
                    results[name] = detector.scores(out.probs, out.features, measures)
                    if r >= 100:
                        times[name].append(time.process_time() - t0)
        use(NEW)
        worst = max(
            float(((results["now"][n] - v).abs() / v.abs().clamp_min(1.0)).max())
            for n, v in results["before"].items()
        )
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(
            f"batch {b}: before {med['before']:.0f} µs, now {med['now']:.0f} µs per scores() "
            f"({med['now'] / med['before'] - 1:+.0%}); largest relative difference {worst:.1e}"
        )


if __name__ == "__main__":
    main()
