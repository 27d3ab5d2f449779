"""Files of a detector evaluation: ``detect_eval.json``, ``.csv``, ``.md`` and ROC curves (PNG)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from matplotlib.figure import Figure

from bayesgate.attacks.detect_eval import DetectionEval
from bayesgate.attacks.metrics import roc_curve
from bayesgate.outputs import write_atomically, write_text_atomically

TABLE_SCORES = (
    "predictive_entropy",
    "mutual_information",
    "mahalanobis_trunk",
    "mahalanobis_penultimate",
    "neg_log_kde",
    "fused",
    "fused_logistic",
)
SHORT = {
    "predictive_entropy": "H",
    "mutual_information": "MI",
    "mahalanobis_trunk": "Maha trunk",
    "mahalanobis_penultimate": "Maha pen.",
    "neg_log_kde": "−log KD",
    "fused": "fused",
    "fused_logistic": "LR logit",
}
TABLES = (  # (title, metric) of each markdown table
    ("**AUROC**", "auroc"),
    ("**Flagged at the calibrated threshold (TPR)**", "tpr_at_threshold"),
    (
        "**Clean FPR at 95 % TPR** (the share of clean test images a threshold that flags 95 % of "
        "the set's positives would flag too; lower is better)",
        "fpr_at_95tpr",
    ),
)
CSV_FIELDS = (
    "set",
    "label",
    "kind",
    "score",
    "positives",
    "success_rate",
    "auroc",
    "tpr_at_threshold",
    "fpr_at_threshold",
    "tpr_at_5fpr",
    "fpr_at_95tpr",
)


def detect_eval_paths(out: Path | str) -> dict[str, Path]:
    """The four files :func:`write_detect_eval` writes into ``out``, by kind."""
    out = Path(out)
    return {
        "json": out / "detect_eval.json",
        "csv": out / "detect_eval.csv",
        "md": out / "detect_eval.md",
        "roc": out / "detect_eval_roc.png",
    }


def write_detect_eval(result: DetectionEval, out: Path | str) -> dict[str, Path]:
    """Write the four files into ``out``; returns their paths by kind."""
    Path(out).mkdir(parents=True, exist_ok=True)
    data = result.to_json()
    paths = detect_eval_paths(out)
    write_text_atomically(
        paths["json"], json.dumps(_finite(data), indent=2, ensure_ascii=False) + "\n"
    )
    _write_csv(data["rows"], paths["csv"])
    write_text_atomically(paths["md"], markdown_tables(data))
    roc_grid(result, paths["roc"])
    return paths


def _positives(row: dict[str, Any]) -> int:
    return int(row["successful"]) if row["kind"] == "attack" else int(row["images"])


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    def write(f: IO[str]) -> None:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            for score, m in row["scores"].items():
                writer.writerow(
                    {
                        "set": row["set"],
                        "label": row["label"],
                        "kind": row["kind"],
                        "score": score,
                        "positives": _positives(row),
                        "success_rate": row.get("success_rate"),
                        **{k: m.get(k) for k in CSV_FIELDS[6:]},
                    }
                )

    write_atomically(path, write)


def _fmt(value: Any, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_tables(data: dict[str, Any]) -> str:
    """AUROC per score, TPR at the calibrated thresholds, clean FPR at 95 % TPR per score, and the
    clean test FPRs."""
    rows = data["rows"]
    scores = [s for s in TABLE_SCORES if s in data["thresholds"] or s in rows[0]["scores"]]
    head = "| set | success | positives | " + " | ".join(SHORT[s] for s in scores) + " |"
    rule = "|---|---:|---:|" + "---:|" * len(scores)
    lines = [
        f"Model `{data['model']}`, first {data['images']} test images (clean accuracy "
        f"{data['clean_accuracy']:.4f}); scores with K = {data['k']}, attacks through the "
        f"K = {data['k_attack']} log-predictive, seed {data['seed']}. Positives: successful "
        "adversarial examples / all OOD images; negatives: all clean test images.",
    ]
    for title, metric in TABLES:
        lines += ["", title, "", head, rule, *(_row(row, scores, metric) for row in rows)]
    fpr = data["clean_test_fpr"]
    lines += [
        "",
        "**Clean test FPR at the calibrated thresholds** (validation target "
        f"{data['target_fpr']:g}): "
        + ", ".join(f"{SHORT[s]} {_fmt(fpr.get(s))}" for s in scores if s in fpr),
        "",
    ]
    return "\n".join(lines)


def _row(row: dict[str, Any], scores: Sequence[str], metric: str) -> str:
    success = _fmt(row.get("success_rate")) if row["kind"] == "attack" else "–"
    cells = [_fmt(row["scores"][s].get(metric)) if s in row["scores"] else "–" for s in scores]
    return f"| {row['label']} | {success} | {_positives(row)} | " + " | ".join(cells) + " |"


def roc_grid(result: DetectionEval, path: Path, scores: Sequence[str] = TABLE_SCORES) -> Path:
    """One panel per score, one ROC curve per set; the dot is the calibrated threshold."""
    scores = [s for s in scores if s in result.clean]
    cols = 3
    rows = -(-len(scores) // cols)
    fig = Figure(figsize=(4.3 * cols, 4.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, scores, strict=False):
        _roc_panel(ax, result, name)
    for ax in axes[len(scores) :]:
        ax.set_visible(False)
    fig.suptitle(f"{result.config['model']}: detection on the test split", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _roc_panel(ax: Any, result: DetectionEval, name: str) -> None:
    clean = result.clean[name]
    threshold = result.thresholds.get(name)
    ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls=":")
    for s in result.sets:
        pos = s.scores[name]
        if pos.size == 0:
            continue
        fpr, tpr, _ = roc_curve(clean, pos)
        style = "-" if s.kind == "attack" else "--"
        (line,) = ax.plot(fpr, tpr, style, lw=1.2, label=s.label)
        if threshold is not None:
            ax.plot(
                np.mean(clean > threshold), np.mean(pos > threshold), "o", ms=3.5, c=line.get_c()
            )
    ax.set(xlabel="FPR (clean test)", ylabel="TPR", xlim=(0, 1), ylim=(0, 1.01))
    ax.set_title(SHORT.get(name, name), fontsize=10)
    ax.legend(fontsize=6, loc="lower right")


def _finite(value: Any) -> Any:
    """NaN/inf → ``None`` (JSON has neither); numpy scalars → Python numbers."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return round(float(value), 6) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
