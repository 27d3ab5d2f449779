"""Would a logit-based uncertainty score replace predictive entropy in the min-p rule? A probe.

The served rule is min-p over the fused logit and predictive entropy; replacing entropy by a
score that sees rotated digits better, without losing CW-L2, would cost no extra p-value. Scores,
from K MC passes of logits ``l_k`` (``p_k = softmax(l_k)``, ``p̄ = mean_k p_k``):

- ``entropy`` ``H(p̄)``; ``mutual_information`` ``H(p̄) − mean_k H(p_k)``; ``one_minus_max_p``
  ``1 − max_c p̄_c`` (Hendrycks & Gimpel 2017);
- ``energy_mean`` ``−mean_k logsumexp_c l_kc`` and ``energy_of_mean`` ``−logsumexp_c mean_k l_kc``
  (Liu et al. 2020, "Energy-based out-of-distribution detection");
- ``neg_max_logit`` ``−max_c mean_k l_kc`` (Hendrycks et al. 2022, "Scaling out-of-distribution
  detection for real-world settings").

Each score's threshold is at 5 % FPR on the first 5 000 validation digits; reported: the clean
FPR on the first 1 000 test digits, and per set the fraction flagged / AUROC against those clean
digits — OOD sets made from the 1 000 digits, and the *successful* cached ``detect-eval``
adversarial examples of the model (digits right clean and wrong after the attack) when the cache
has them.

    bench/quiet.sh python bench/logit_scores_probe.py --json docs/robustness/logit-scores/probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "pretrained" / "bayesgate-robust"
OOD = ("rotated", "blurred", "shifted", "letters")
ATTACKS = {  # detect-eval cache file prefixes (the robust table's settings)
    "cw": "cw_iterations100_binary_steps3_lr0.1_const10.0_confidence1.0-n300",
    "pgd": "pgd_eps0.3_eps_iter0.01_steps40-n1000",
    "targeted": "targeted_eta0.01_steps40_targetrandom-n1000",
    "fgs0.3": "fgs_eta0.3-n1000",
}


def logit_scores(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every score of the module docstring from ``B×K×C`` logits (higher = more suspicious)."""
    from bayesgate.models.mc.uncertainty import (
        mutual_information,
        predictive_entropy,
        predictive_mean,
    )

    p = torch.softmax(logits, dim=-1)
    mean_logits = logits.mean(dim=1)
    return {  # the served measures' own functions for the first two
        "entropy": predictive_entropy(p),
        "mutual_information": mutual_information(p),
        "one_minus_max_p": 1.0 - predictive_mean(p).max(dim=-1).values,
        "energy_mean": -torch.logsumexp(logits, dim=-1).mean(dim=1),
        "energy_of_mean": -torch.logsumexp(mean_logits, dim=-1),
        "neg_max_logit": -mean_logits.max(dim=-1).values,
    }


def mc_logits_of(network: torch.nn.Module, x: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    from bayesgate.models.mc.dropout import mc_sampling
    from bayesgate.models.mc.engine import mc_logits

    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode(), mc_sampling(generator):
        return torch.cat([mc_logits(network, x[i : i + 500], k) for i in range(0, len(x), 500)])


def probe(
    network: torch.nn.Module,
    x_val: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    sets: dict[str, torch.Tensor],
    adversarial: dict[str, torch.Tensor],
    k: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    """Thresholds on ``x_val`` at 5 % FPR; flagged fraction and AUROC (vs ``x_test``) per set;
    an adversarial set keeps the rows right on ``x_test[:n]`` and wrong on the example."""
    from bayesgate.attacks.metrics import auroc, flag_rate, threshold_at_fpr

    def run(x: torch.Tensor) -> tuple[dict[str, np.ndarray], torch.Tensor]:
        logits = mc_logits_of(network, x, k, seed)
        scores = {n: v.numpy() for n, v in logit_scores(logits).items()}
        return scores, logits.softmax(-1).mean(dim=1).argmax(-1)

    val, _ = run(x_val)
    clean, predicted = run(x_test)
    scored = {name: run(x)[0] for name, x in sets.items()}
    counts = {name: len(x) for name, x in sets.items()}
    for name, x_adv in adversarial.items():
        scores, adv_pred = run(x_adv)
        n = len(x_adv)
        keep = ((predicted[:n] == y_test[:n]) & (adv_pred != y_test[:n])).numpy()
        scored[name] = {s: v[keep] for s, v in scores.items()}
        counts[name] = int(keep.sum())
    result: dict[str, Any] = {"k": k, "n": counts, "scores": {}}
    for score, values in val.items():
        threshold = threshold_at_fpr(values, 0.05)
        result["scores"][score] = {
            "threshold": float(threshold),
            "clean_test_fpr": flag_rate(clean[score], threshold),
            "flagged": {n: flag_rate(s[score], threshold) for n, s in scored.items()},
            "auroc": {n: auroc(clean[score], s[score]) for n, s in scored.items()},
        }
    return result


def cached_attacks(model_sha: str) -> dict[str, torch.Tensor]:
    """The model's cached ``detect-eval`` examples named in :data:`ATTACKS` (those present)."""
    from bayesgate.attacks.detect_eval import default_cache_dir

    root = default_cache_dir() / model_sha[:16]
    found = {}
    for name, prefix in ATTACKS.items():
        files = sorted(root.glob(f"{prefix}-*.npz"))
        if files:
            found[name] = torch.from_numpy(np.load(files[0])["x_adv"])
    return found


def table(result: dict[str, Any]) -> str:
    sets = list(result["n"])
    lines = [f"{'score':18s}{'clean FPR':>10s}" + "".join(f"{s:>16s}" for s in sets)]
    for score, r in result["scores"].items():
        cells = "".join(f"{100 * r['flagged'][s]:9.1f}/{r['auroc'][s]:.3f}".rjust(16) for s in sets)
        lines.append(f"{score:18s}{100 * r['clean_test_fpr']:10.1f}{cells}")
    lines.append("n: " + ", ".join(f"{s} {n}" for s, n in result["n"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--val-limit", type=int, default=5000)
    parser.add_argument("--test-limit", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from bayesgate.attacks.ood import ood_images
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.store.directory import load_model

    loaded = load_model(args.model)
    x_val, _ = load_mnist("val", limit=args.val_limit)
    x_test, y_test = load_mnist("test", limit=args.test_limit)
    sets = {name: ood_images(name, x_test, seed=0) for name in OOD}
    adversarial = cached_attacks(loaded.card.weights_sha256)
    result = probe(loaded.network.eval(), x_val, x_test, y_test, sets, adversarial, k=args.k)
    result["model"] = loaded.card.name
    result["command"] = "python bench/logit_scores_probe.py " + " ".join(argv or sys.argv[1:])
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
