"""``evaluate-robust`` outputs: ``robust.json``, ``robust.md`` (one table for all models) and
``robust.png`` (worst-of robust accuracy, and the adaptive detector attack's pass-through rate
where it ran, against ε, one line per model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bayesgate.outputs import write_text_atomically

ADAPTIVE_KEY = "misclassified_not_flagged"


def output_paths(out: Path) -> dict[str, Path]:
    """The three files :func:`write_outputs` writes into ``out``, by kind."""
    return {"json": out / "robust.json", "markdown": out / "robust.md", "plot": out / "robust.png"}


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write the three files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = output_paths(out)
    write_text_atomically(paths["json"], json.dumps(result, indent=2) + "\n")
    write_text_atomically(paths["markdown"], markdown_table(result))
    robust_plot(result, paths["plot"])
    return paths


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def markdown_table(result: dict[str, Any]) -> str:
    """One row per (model, ε): clean accuracy, each attack's robust accuracy, the worst of them,
    and the adaptive detector attack's rate and clean FPR where the model has a fused detector."""
    models = result["models"]
    labels = list(models[0]["eps"][0]["robust_accuracy"]) if models else []
    head = ["model", "ε", "n", "clean acc", *labels, "worst of", "misclassified & not flagged",
            "clean FPR"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for m in models:
        adaptive = m.get("adaptive") or {}
        for row in m["eps"]:
            rate = adaptive.get("by_eps", {}).get(f"{row['eps']:g}")
            cells = [m["name"], f"{row['eps']:g}", str(m["images"]), _pct(m["clean_accuracy"]),
                     *(_pct(row["robust_accuracy"][a]) for a in labels),
                     _pct(row["robust_accuracy_worst_of"]), _pct(rate),
                     _pct(adaptive.get("clean_fpr"))]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    not_run = [m for m in models if m.get("adaptive") and m["adaptive"].get("status") != "ran"]
    notes = [
        f"- {m['name']}: adaptive detector attack — {m['adaptive']['status']}" for m in not_run
    ]
    s = result["settings"]
    caption = (
        f"\nRobust accuracy = correct clean and under every attack (worst of, per digit), first "
        f"{models[0]['images'] if models else 0} test digits; attacks through the MC predictive "
        f"(K = {s['k_attack']} fresh-mask passes per query), verdicts on an independent draw of "
        f"K = {s['k_eval']}.\n"
    )
    if any((m.get("adaptive") or {}).get("status") == "ran" for m in models):
        caption += (
            "Misclassified & not flagged: issue 15's adaptive attack on the fused detector, worst "
            "over plain PGD and every detector weight λ, as a fraction of the digits classified "
            "right clean; clean FPR: the detector's flag rate on those clean digits.\n"
        )
    return "\n".join(lines) + "\n" + caption + ("\n" + "\n".join(notes) + "\n" if notes else "")


def robust_plot(result: dict[str, Any], path: Path) -> Path:
    """Worst-of robust accuracy vs ε (left) and misclassified-and-not-flagged vs ε (right)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    any_adaptive = False
    for m in result["models"]:
        eps = [r["eps"] for r in m["eps"]]
        left.plot(eps, [100 * r["robust_accuracy_worst_of"] for r in m["eps"]], "o-",
                  label=m["name"])  # fmt: skip
        by_eps = (m.get("adaptive") or {}).get("by_eps") or {}
        if by_eps:
            any_adaptive = True
            xs = sorted(float(e) for e in by_eps)
            right.plot(xs, [100 * by_eps[f"{e:g}"] for e in xs], "o-", label=m["name"])
    left.set(xlabel="ε (L∞)", ylabel="robust accuracy, worst of (%)", ylim=(-2, 102),
             title="PGD × restarts, APGD-CE, APGD-DLR")  # fmt: skip
    left.legend(fontsize=8)
    right.set(xlabel="ε (L∞)", ylabel="misclassified and not flagged (%)", ylim=(-2, 102),
              title="adaptive attack vs fused detector")  # fmt: skip
    if any_adaptive:
        right.legend(fontsize=8)
    else:
        right.text(0.5, 0.5, "adaptive detector attack not run\n(see the notes under the table)",
                   ha="center", transform=right.transAxes)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
