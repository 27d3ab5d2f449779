"""Markdown report of a calibration (``calibration.md``) with its ROC and histogram PNGs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bayesgate.attacks.calibrate import SCORE_LABELS, CalibrationRun
from bayesgate.attacks.plots import histogram_plot, roc_plot

REPORT_FILE = "calibration.md"
ROC_FILE = "calibration_roc.png"
HIST_FILE = "calibration_hist.png"


def fmt(value: Any, digits: int = 3) -> str:
    """``None`` → ``n/a``; floats to ``digits`` places; anything else as ``str``."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells through :func:`fmt`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(run: CalibrationRun, directory: Path | str, model_name: str) -> Path:
    """Write ``calibration.md``, ``calibration_roc.png`` and ``calibration_hist.png``."""
    directory = Path(directory)
    cal = run.calibration
    score = cal.score
    roc_plot(
        run.clean_scores,
        run.adversarial_scores,
        directory / ROC_FILE,
        title=f"{model_name}: successful adversarial vs clean test images",
    )
    histogram_plot(
        run.clean_scores[score],
        [(spec, adv[score]) for spec, adv in run.adversarial_scores],
        directory / HIST_FILE,
        score,
        cal.threshold,
        title=f"{model_name}: {SCORE_LABELS[score]} (K={cal.k})",
    )
    val = cal.validation
    thresholds = markdown_table(
        ["score", "threshold", "realised val FPR", "mean val score"],
        [
            [
                SCORE_LABELS[n] + (" (active)" if n == score else ""),
                f"{t:.6g}",
                val["realised_fpr"][n],
                val["mean_score"][n],
            ]
            for n, t in cal.thresholds.items()
        ],
    )
    per_attack = markdown_table(
        [
            "attack",
            "success rate",
            "successful",
            "acc. under attack",
            "AUROC",
            "TPR @ threshold",
            "TPR @ 5% FPR",
            "FPR @ 95% TPR",
        ],
        [
            [
                r["label"],
                r["success_rate"],
                f"{r['successful']}/{r['eligible']}",
                r["adversarial_accuracy"],
                r.get("auroc"),
                r.get("tpr_at_threshold"),
                r.get("tpr_at_5fpr"),
                r.get("fpr_at_95tpr"),
            ]
            for r in cal.attacks
        ],
    )
    auroc_by_score = markdown_table(
        ["attack", *(SCORE_LABELS[n] for n in cal.thresholds)],
        [[r["label"], *(r["scores"][n]["auroc"] for n in cal.thresholds)] for r in cal.attacks],
    )
    first = cal.attacks[0] if cal.attacks else {}
    text = f"""# Calibration of {model_name}

Model weights sha256 `{cal.model_sha256}`; created {cal.created}.

An input is flagged adversarial when its **{SCORE_LABELS[score]}** over K={cal.k} MC dropout
passes exceeds **{cal.threshold:.6g}**, the threshold that flags at most
{cal.target_fpr:.1%} of the {val["images"]} clean validation images (never the test set).
Attacks differentiate the MC log-predictive over K={val["k_attack"]} passes.

## Thresholds (validation)

Validation accuracy {fmt(val["accuracy"])}.

{thresholds}

## Detection on the test set

{run.test_images} test images (clean accuracy {fmt(first.get("clean_accuracy"))}). Metrics
compare the *successful* adversarial examples with all clean test images; "TPR @ threshold" uses
the validation threshold above, "TPR @ 5% FPR" the best threshold on the clean test scores.
The validation threshold flags {fmt(first.get("fpr_at_threshold"))} of the clean test images.

{per_attack}

AUROC by score:

{auroc_by_score}

![ROC curves]({ROC_FILE})

![score histograms]({HIST_FILE})
"""
    path = directory / REPORT_FILE
    path.write_text(text)
    return path
