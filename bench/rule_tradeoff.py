"""The detector rules tried on ``bayesgate-robust`` as points of one trade-off: attacks let through
the flag against rotated digits flagged, from their committed ``detect-eval`` outputs.

Each rule is ``LABEL=DIR`` with ``DIR/detect_eval.json`` a ``bayesgate detect-eval`` result on the
same test images (the robust table's cached attacks). Per rule, from the ``fused`` score:

- ``rotated``: the fraction of MNIST rotated 90° flagged at the rule's threshold;
- ``cw_through``: CW-L2 successes not flagged, over the digits CW was run on and classified right
  clean (``bench/detect_eval_ci.py``'s "evaded" / "eligible");
- ``linf_through``: the same summed over the L∞ attacks (FGS η = 0.1/0.2/0.3, targeted, PGD),
  over their eligible digits (one attack per digit each: a digit can count several times);
- ``clean_fpr``: the clean test FPR at the threshold.

Writes ``OUT.png`` (two panels: rotated against CW-L2 and against L∞ pass-through) and
``OUT.json`` (the points).

    python bench/rule_tradeoff.py --out docs/robustness/rule_tradeoff \\
        "(d) served=docs/robustness/unseen" "(g) trunk 2x2=docs/robustness/grid" \\
        "(h) pixel QDA=docs/robustness/pixel-qda" "(i) Fisher=docs/robustness/fisher" \\
        "(j) outliers=docs/robustness/outliers"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detect_eval_ci import row_ci  # a sibling script, not a package

ROTATED = "ood:rotated"
LINF = ("fgs:", "targeted:", "pgd:")


def rule_point(result: dict[str, Any], score: str = "fused") -> dict[str, float]:
    """The trade-off coordinates of one detect-eval result (module docstring); the attack counts
    are :func:`detect_eval_ci.row_ci`'s ``evaded`` / ``eligible``."""
    rows = [row_ci(r, int(result["images"]), (score,)) for r in result["rows"]]
    attacks = {r["set"]: (r[score]["evaded"], r["eligible"]) for r in rows if "evaded" in r[score]}
    cw_k, cw_n = next(v for key, v in attacks.items() if key.startswith("cw:"))
    linf = [v for key, v in attacks.items() if key.startswith(LINF)]
    rotated = next(r for r in result["rows"] if r["set"] == ROTATED)
    return {
        "rotated": rotated["scores"][score]["tpr_at_threshold"],
        "cw_through": cw_k / cw_n,
        "cw_through_k": cw_k,
        "cw_eligible": cw_n,
        "linf_through": sum(k for k, _ in linf) / sum(n for _, n in linf),
        "linf_through_k": sum(k for k, _ in linf),
        "linf_eligible": sum(n for _, n in linf),
        "clean_fpr": result["clean_test_fpr"][score],
    }


def plot(points: dict[str, dict[str, float]], path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    panels = (("cw_through", "CW-L2: digits through the flag (%)"),
              ("linf_through", "L∞ attacks: digits through the flag (%, summed)"))  # fmt: skip
    for ax, (key, xlabel) in zip(fig.subplots(1, 2), panels, strict=True):
        for label, p in points.items():
            ax.scatter(100 * p[key], 100 * p["rotated"], s=40)
            ax.annotate(label, (100 * p[key], 100 * p["rotated"]), textcoords="offset points",
                        xytext=(6, 4), fontsize=9)  # fmt: skip
        right = max(100 * p[key] for p in points.values())
        ax.set_xlim(-0.05 * right, 1.35 * right)  # room for the labels right of the points
        ax.axhline(95, color="grey", lw=0.8, ls="--")
        ax.text(ax.get_xlim()[0], 95.3, " target: rotated ≥ 95 %", fontsize=8, color="grey")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("MNIST rotated 90°: flagged (%)")
        ax.set_ylim(70, 100)
        ax.grid(alpha=0.3)
    fig.suptitle("bayesgate-robust: each rule at its 5 % validation threshold (test split; "
                 "better = up and left)", fontsize=10)  # fmt: skip
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rules", nargs="+", help="LABEL=DIR with DIR/detect_eval.json")
    parser.add_argument("--out", type=Path, required=True, help="OUT.png and OUT.json")
    args = parser.parse_args(argv)
    points = {}
    for spec in args.rules:
        label, _, folder = spec.partition("=")
        if not folder:
            parser.error(f"{spec!r}: expected LABEL=DIR")
        source = Path(folder) / "detect_eval.json"
        if not source.is_file():
            parser.error(f"{spec!r}: no {source} (a `bayesgate detect-eval` output folder)")
        result = json.loads(source.read_text())
        points[label] = {**rule_point(result), "source": f"{folder}/detect_eval.json"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = plot(points, args.out.with_suffix(".png"))
    args.out.with_suffix(".json").write_text(json.dumps(points, indent=1) + "\n")
    for label, p in points.items():
        print(f"{label}: rotated {100 * p['rotated']:.1f} %, CW-L2 through "
              f"{p['cw_through_k']}/{p['cw_eligible']}, L∞ through {p['linf_through_k']}/"
              f"{p['linf_eligible']}, clean FPR {100 * p['clean_fpr']:.1f} %")  # fmt: skip
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
