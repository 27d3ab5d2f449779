"""Sampling uncertainty of a ``bayesgate detect-eval`` result, from its ``detect_eval.json`` alone.

    python bench/detect_eval_ci.py DIR/detect_eval.json --out DIR/detect_eval_ci.json

Per row (attack or OOD set) and per score (default: predictive entropy and the served fused
score), with n₁ positives (successful adversarial examples / OOD images) and n₀ clean negatives:

- flagged fraction p̂ = k/n₁ at the calibrated threshold, with its Wilson 95 % interval
  ``(p̂ + z²/2n₁ ± z·√(p̂(1−p̂)/n₁ + z²/4n₁²)) / (1 + z²/n₁)``, z = 1.96;
- AUROC A with the Hanley & McNeil (1982) standard error
  ``SE² = (A(1−A) + (n₁−1)(Q₁−A²) + (n₀−1)(Q₂−A²)) / (n₁·n₀)``, ``Q₁ = A/(2−A)``,
  ``Q₂ = 2A²/(1+A)`` (it assumes exponential-like score distributions; a rough guide);
- the AUROC's resolution in positives, 1/n₁: A is the mean over the positives of the fraction of
  clean scores each one exceeds, so one positive more that sat among the clean scores would move
  A by up to 1/n₁. At A = 1 the standard error above is 0, and 1/n₁ is the honest error bar.

For an attack row also the attack's successes the score did not flag, k_evaded = n₁ − k, as a
fraction of the eligible digits (those classified right clean): what gets through the flag per
digit attacked. The clean row has the fraction of clean test images flagged (the test FPR) with its
Wilson interval.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

Z95 = 1.959964
SCORES = ("predictive_entropy", "fused")


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (n ≥ 1)."""
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - half) / scale), min(1.0, (centre + half) / scale)


def hanley_mcneil_se(auroc: float, n_pos: int, n_neg: int) -> float:
    """Hanley–McNeil standard error of an AUROC from n_pos positives and n_neg negatives."""
    a = auroc
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def row_ci(row: dict[str, Any], n_neg: int, scores: tuple[str, ...]) -> dict[str, Any]:
    """n positives and, per score, AUROC ± SE, 1/n and the flagged fraction's interval."""
    n_pos = int(row["successful"]) if row["kind"] == "attack" else int(row["images"])
    out: dict[str, Any] = {"set": row["set"], "label": row["label"], "n": n_pos}
    if row["kind"] == "attack":
        out["eligible"] = int(row["eligible"])
    for name in scores:
        m = row["scores"][name]
        entry: dict[str, Any] = {"auroc": m["auroc"], "flagged": m["tpr_at_threshold"]}
        if n_pos > 0 and m["auroc"] is not None:
            k = round(m["tpr_at_threshold"] * n_pos)
            lo, hi = wilson(k, n_pos)
            entry |= {
                "flagged_k": k,
                "flagged_wilson95": [round(lo, 4), round(hi, 4)],
                "auroc_se_hanley_mcneil": round(hanley_mcneil_se(m["auroc"], n_pos, n_neg), 4),
                "auroc_resolution": round(1 / n_pos, 4),
            }
            if row["kind"] == "attack":
                entry["evaded"] = n_pos - k
                entry["evaded_of_eligible"] = round((n_pos - k) / int(row["eligible"]), 4)
        out[name] = entry
    return out


def confidence(result: dict[str, Any], scores: tuple[str, ...] = SCORES) -> dict[str, Any]:
    """The uncertainty of every row of a detect-eval result, and of its clean test FPRs."""
    n_neg = int(result["images"])
    clean = {}
    for name in scores:
        fpr = result["clean_test_fpr"][name]
        k = round(fpr * n_neg)
        lo, hi = wilson(k, n_neg)
        clean[name] = {"fpr": fpr, "k": k, "wilson95": [round(lo, 4), round(hi, 4)]}
    return {
        "model": result["model"],
        "images": n_neg,
        "z": Z95,
        "clean_test_fpr": clean,
        "rows": [row_ci(row, n_neg, scores) for row in result["rows"]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="detect_eval.json")
    parser.add_argument("--out", type=Path, required=True, help="JSON to write")
    parser.add_argument("--scores", nargs="+", default=list(SCORES))
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    out = confidence(result, tuple(args.scores))
    out["command"] = f"python bench/detect_eval_ci.py {args.result} --out {args.out}"
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for row in out["rows"]:
        cells = [f"{row['label']}: n={row['n']}"]
        for name in args.scores:
            e = row[name]
            if "flagged_k" in e:
                lo, hi = e["flagged_wilson95"]
                cells.append(
                    f"{name} AUROC {e['auroc']:.3f}±{e['auroc_se_hanley_mcneil']:.3f} "
                    f"(1/n {e['auroc_resolution']:.3f}), flagged {e['flagged_k']}/{row['n']} "
                    f"[{lo:.3f}, {hi:.3f}]"
                    + (f", evaded {e['evaded']}/{row['eligible']}" if "evaded" in e else "")
                )
        print("; ".join(cells))


if __name__ == "__main__":
    main()
