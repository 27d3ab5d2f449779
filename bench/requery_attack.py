"""The re-query attacker: the flag is stochastic, so send the same adversarial image again.

The served verdict depends on the MC draw (fresh dropout masks per request, or the masks of a
``seed`` the client chooses: ``/v1`` and ``/v2`` accept one). An attacker who holds adversarial
images (here: those ``bayesgate adaptive-eval`` cached) can resubmit each one with new seeds and
keep the first answer that is misclassified and not flagged. This measures that attacker: for
``N = 1, 2, 5, …`` independent draws (K = the detector's, seeds ``base … base + N − 1``), the
fraction of the eligible digits (right clean, on draw 0 of the clean images) for which **at
least one** of the N draws is misclassified and unflagged::

    pass-through(N) = (1/n_eligible) · Σ_i 1[∃ d < N : pred_d(x_i) ≠ y_i ∧ s_d(x_i) ≤ threshold]

N = 1 is the single-shot number ``adaptive-eval`` reports (on another draw). Usage::

    python bench/requery_attack.py ~/.cache/bayesgate/detect-eval/<model>/adaptive-eps0.3-…npz \\
        --limit 1000 --draws 50 --json docs/robustness/requery.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesgate.attacks.adaptive_eval import judge
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection.store import load_detector
from bayesgate.models.store.directory import load_model
from bayesgate.service.settings import DEFAULT_MODEL_DIR

BASE_SEED = 2_000_003  # apart from the attack's (0, 7) and adaptive-eval's verdict (1_000_003)


def verdicts(loaded: Any, detector: Any, x: torch.Tensor, y: torch.Tensor, seed: int, k: int):
    """``(correct, flagged)`` boolean arrays of one MC draw seeded ``seed`` (the verdict
    ``adaptive-eval`` judges by, :func:`bayesgate.attacks.adaptive_eval.judge`)."""
    verdict = judge(loaded.network, detector, x, y, k, seed)
    return verdict["correct"], verdict["flagged"]


def requery(
    loaded: Any, detector: Any, x_adv: torch.Tensor, x: torch.Tensor, y: torch.Tensor, draws: int
) -> dict[str, Any]:
    """Pass-through after N draws for N in 1, 2, 5, 10, 20, 50 (≤ ``draws``)."""
    k = int(detector.k)
    eligible, _ = verdicts(loaded, detector, x, y, BASE_SEED - 1, k)
    through = np.zeros(x.shape[0], dtype=bool)
    misclassified_once = np.zeros(x.shape[0], dtype=bool)
    curve = {}
    for d in range(draws):
        correct, flagged = verdicts(loaded, detector, x_adv, y, BASE_SEED + d, k)
        through |= eligible & ~correct & ~flagged
        misclassified_once |= eligible & ~correct
        if d + 1 in (1, 2, 5, 10, 20, 50, 100) or d + 1 == draws:
            curve[d + 1] = {
                "through": int(through.sum()),
                "through_rate": float(through.sum() / eligible.sum()),
                "misclassified_in_some_draw_rate": float(misclassified_once.sum() / eligible.sum()),
            }
    return {"eligible": int(eligible.sum()), "k": k, "curve": curve}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("npz", type=Path, nargs="+", help="adaptive-eval cache files (x_adv, found)")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--limit", type=int, default=1000, help="first N test digits (as attacked)")
    p.add_argument("--draws", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.draws < 1 or args.limit < 1:
        p.error("--draws and --limit must be ≥ 1")
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    detector = load_detector(args.model, loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=args.limit)
    results = {}
    for path in args.npz:
        with np.load(path, allow_pickle=False) as data:
            x_adv = torch.from_numpy(data["x_adv"])
        if x_adv.shape != x.shape:
            p.error(f"{path.name}: {tuple(x_adv.shape)} images, expected {tuple(x.shape)}")
        results[path.name] = requery(loaded, detector, x_adv, x, y, args.draws)
        print(path.name)
        for n, row in results[path.name]["curve"].items():
            print(
                f"  N = {n:>3}: misclassified and unflagged in some draw "
                f"{row['through']:>4} of {results[path.name]['eligible']} "
                f"({100 * row['through_rate']:.1f} %); misclassified in some draw "
                f"{100 * row['misclassified_in_some_draw_rate']:.1f} %",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"model": loaded.card.name, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
