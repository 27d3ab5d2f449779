"""Compare fusion rules of the bundled detector on the scores dumped by
``bench/fusion_scores_dump.py`` (clean validation parts, clean test, cached attacks, OOD sets).

Usage: python bench/fusion_variants.py SCORES.npz [--out JSON]

Every rule is fitted/calibrated on clean validation images only (``val_fit``: p-value reference,
``val_thr``: the threshold at 5 % FPR) — except (a), whose coefficients were fitted on FGS and
targeted examples by ``fit-detector``. Reported per set: AUROC vs clean test and the fraction
flagged at the threshold; plus the clean test FPR.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bayesgate.attacks.metrics import auroc, threshold_at_fpr

FIVE = (
    "predictive_entropy",
    "mutual_information",
    "mahalanobis_trunk",
    "mahalanobis_penultimate",
    "neg_log_kde",
)


def p_values(reference: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Conformal p-value ``(1 + #{r ≥ v}) / (n + 1)`` by a direct sort/search."""
    ref = np.sort(reference)
    above = len(ref) - np.searchsorted(ref, values, side="left")
    return (1.0 + above) / (len(ref) + 1.0)


def rules(data: dict[str, np.ndarray]) -> dict[str, dict[str, object]]:
    def p_rule(names, combine):
        def score(part):
            ps = np.stack([p_values(data[f"val_fit/{n}"], data[f"{part}/{n}"]) for n in names])
            if combine == "min":
                return -np.log(ps.min(axis=0))
            if combine == "fisher":
                return -2 * np.log(ps).sum(axis=0)
            raise ValueError(combine)

        return score

    def raw(name):
        return lambda part: data[f"{part}/{name}"]

    return {
        "(a) LR (today)": raw("fused"),
        "entropy alone": raw("predictive_entropy"),
        "(b) min-p, 5 scores": p_rule(FIVE, "min"),
        "(b') Fisher, 5 scores": p_rule(FIVE, "fisher"),
        "(b'') min-p, entropy + trunk": p_rule(("predictive_entropy", "mahalanobis_trunk"), "min"),
        "(d) min-p, LR + entropy": p_rule(("fused", "predictive_entropy"), "min"),
        "(d') min-p, LR + entropy + MI": p_rule(
            ("fused", "predictive_entropy", "mutual_information"), "min"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scores", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with np.load(args.scores) as f:
        data = dict(f)
    sets = sorted({k.split("/")[0] for k in data} - {"val_fit", "val_thr", "test_clean"})
    out = {}
    for rule, score in rules(data).items():
        thr = threshold_at_fpr(score("val_thr"), 0.05)
        clean = score("test_clean")
        row = {
            "val_fpr": float(np.mean(score("val_thr") > thr)),
            "test_fpr": float(np.mean(clean > thr)),
        }
        for s in sets:
            pos = score(s)
            flagged = float(np.mean(pos > thr))
            row[s] = {"auroc": auroc(clean, pos), "flagged": flagged, "n": len(pos)}
        out[rule] = row
    print(f"{'rule':32s} {'valFPR':>6s} {'tstFPR':>6s} " + " ".join(f"{s[:14]:>14s}" for s in sets))
    for rule, row in out.items():
        cells = " ".join(f"{row[s]['auroc']:.3f}/{100 * row[s]['flagged']:5.1f}%" for s in sets)
        print(f"{rule:32s} {row['val_fpr']:6.3f} {row['test_fpr']:6.3f} {cells}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
