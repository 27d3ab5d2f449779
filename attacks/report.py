"""Markdown report of a calibration (``calibration.md``) with its ROC and histogram PNGs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bayesgate.attacks.calibrate import SCORE_LABELS, CalibrationRun
from bayesgate.attacks.plots import histogram_plot, roc_plot
from bayesgate.models.store.calibration import Calibration
from bayesgate.models.store.files import HIST_FILE, REPORT_FILE, ROC_FILE
from bayesgate.outputs import write_text_atomically


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
    write_plots(run, directory, model_name)
    path = directory / REPORT_FILE
    write_text_atomically(path, report_text(run, model_name))
    return path


def write_plots(run: CalibrationRun, directory: Path, model_name: str) -> None:
    """ROC curves of every score and histograms of the active one, clean vs adversarial."""
    cal = run.calibration
    roc_plot(
        run.clean_scores,
        run.adversarial_scores,
        directory / ROC_FILE,
        title=f"{model_name}: successful adversarial vs clean test images",
    )
    histogram_plot(
        run.clean_scores[cal.score],
        [(attack, adv[cal.score]) for attack, adv in run.adversarial_scores],
        directory / HIST_FILE,
        cal.score,
        cal.threshold,
        title=f"{model_name}: {_score_label(cal.score)} (K={cal.k})",
    )


def thresholds_table(cal: Calibration) -> str:
    """Per score: threshold, realised validation FPR, mean validation score."""
    val = cal.validation
    return markdown_table(
        ["score", "threshold", "realised val FPR", "mean val score"],
        [
            [
                _score_label(n) + (" (active)" if n == cal.score else ""),
                f"{t:.6g}",
                val["realised_fpr"][n],
                val["mean_score"][n],
            ]
            for n, t in cal.thresholds.items()
        ],
    )


def attacks_table(cal: Calibration) -> str:
    """Per attack: success, accuracy under attack and the active score's detection metrics."""
    return markdown_table(
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


def auroc_table(cal: Calibration) -> str:
    """AUROC of every score (columns) for every attack (rows)."""
    return markdown_table(
        ["attack", *(_score_label(n) for n in cal.thresholds)],
        [[r["label"], *(r["scores"][n]["auroc"] for n in cal.thresholds)] for r in cal.attacks],
    )


def report_text(run: CalibrationRun, model_name: str) -> str:
    """The Markdown of ``calibration.md``."""
    cal = run.calibration
    val = cal.validation
    first = cal.attacks[0] if cal.attacks else {}
    return f"""# Calibration of {model_name}

Model weights sha256 `{cal.model_sha256}`; created {cal.created}.

An input is flagged adversarial when its **{_score_label(cal.score)}** over K={cal.k} MC dropout
passes exceeds **{cal.threshold:.6g}**, the threshold that flags at most
{cal.target_fpr:.1%} of the {val["images"]} clean validation images (never the test set).
Attacks differentiate the MC log-predictive over K={val["k_attack"]} passes.
{_detector_paragraph(cal)}
## Thresholds (validation)

Validation accuracy {fmt(val["accuracy"])}.

{thresholds_table(cal)}

## Detection on the test set

{run.test_images} test images (clean accuracy {fmt(first.get("clean_accuracy"))}). Metrics
compare the *successful* adversarial examples with all clean test images; "TPR @ threshold" uses
the validation threshold above, "TPR @ 5% FPR" the best threshold on the clean test scores.
The validation threshold flags {fmt(first.get("fpr_at_threshold"))} of the clean test images.

{attacks_table(cal)}

AUROC by score:

{auroc_table(cal)}

![ROC curves]({ROC_FILE})

![score histograms]({HIST_FILE})
"""


def _detector_paragraph(cal: Calibration) -> str:
    """When ``calibration.json`` links a fused detector, the paragraph saying that the detector,
    not this score, decides the served flag; else nothing."""
    if cal.detector is None:
        return ""
    return f"""
**The service does not flag by this score.** This `calibration.json` links the fused detector
(`{cal.detector["file"]}`), and the service flags inputs by the detector's score, at the
threshold, target FPR and K `bayesgate fit-detector` set. The threshold above is kept for
{_score_label(cal.score)} (an admin may switch to it); to change the flag's false-positive rate,
re-fit the detector: `bayesgate fit-detector MODEL --target-fpr …`.
"""


def _score_label(name: str) -> str:
    return SCORE_LABELS.get(name, name)
