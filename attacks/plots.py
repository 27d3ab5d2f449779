"""PNG plots of calibration and sweep results (matplotlib's object API, no pyplot state).

Each function takes plain arrays or result rows and writes one PNG, returning its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from bayesgate.attacks.methods import Attack
from bayesgate.attacks.metrics import auroc, roc_curve

DPI = 110
SCORE_LABELS = {
    "predictive_entropy": "predictive entropy (nats)",
    "mutual_information": "mutual information (nats)",
    "variation_ratio": "variation ratio",
}


def _save(fig: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def roc_plot(
    clean: dict[str, np.ndarray],
    adversarial: Sequence[tuple[Attack, dict[str, np.ndarray]]],
    path: Path | str,
    scores: Sequence[str] = ("predictive_entropy", "mutual_information", "variation_ratio"),
    title: str = "",
) -> Path:
    """ROC curves (successful adversarial vs clean), one panel per score, one line per attack."""
    fig = Figure(figsize=(4.2 * len(scores), 4.0), layout="constrained")
    axes = fig.subplots(1, len(scores), squeeze=False)[0]
    for ax, name in zip(axes, scores, strict=True):
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls=":")
        for attack, adv in adversarial:
            if adv[name].size == 0:
                continue
            fpr, tpr, _ = roc_curve(clean[name], adv[name])
            ax.plot(fpr, tpr, lw=1.4, label=f"{attack.label} ({auroc(clean[name], adv[name]):.3f})")
        ax.axvline(0.05, color="0.5", lw=0.8, ls="--")
        ax.set(xlabel="false-positive rate (clean)", ylabel="true-positive rate (adversarial)")
        ax.set_title(SCORE_LABELS.get(name, name), fontsize=10)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
        ax.legend(fontsize=7, loc="lower right", title="AUROC", title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def histogram_plot(
    clean: np.ndarray,
    adversarial: Sequence[tuple[Attack, np.ndarray]],
    path: Path | str,
    score: str,
    threshold: float | None = None,
    title: str = "",
) -> Path:
    """Score histograms, clean vs successful adversarial, one panel per attack."""
    n = max(1, len(adversarial))
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(4.0 * cols, 3.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    hi = max([float(clean.max()), *(float(a.max()) for _, a in adversarial if a.size)])
    bins = np.linspace(0.0, hi * 1.02 + 1e-9, 41)
    for ax, (attack, adv) in zip(axes, adversarial, strict=False):
        ax.hist(clean, bins=bins, density=True, alpha=0.55, label=f"clean ({clean.size})")
        if adv.size:
            ax.hist(adv, bins=bins, density=True, alpha=0.55, label=f"adversarial ({adv.size})")
        if threshold is not None:
            ax.axvline(threshold, color="k", lw=1, ls="--", label="threshold")
        ax.set_title(attack.label, fontsize=10)
        ax.set_xlabel(SCORE_LABELS.get(score, score))
        ax.legend(fontsize=7)
    for ax in axes[len(adversarial) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def _by_model(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["model"], []).append(row)
    return grouped


def sweep_plot(
    rows: Sequence[dict[str, Any]],
    path: Path | str,
    x: str,
    panels: Sequence[tuple[str, str]],
    xlabel: str,
    title: str = "",
) -> Path:
    """One panel per ``(column, axis label)``, one line per model, ``x`` on the horizontal axis."""
    fig = Figure(figsize=(4.2 * len(panels), 3.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for name, model_rows in _by_model(rows).items():
        ordered = sorted(model_rows, key=lambda r: r[x])
        xs = [r[x] for r in ordered]
        for ax, (column, _) in zip(axes, panels, strict=True):
            ax.plot(xs, [r[column] for r in ordered], marker=".", lw=1.4, label=name)
    for ax, (_, label) in zip(axes, panels, strict=True):
        ax.set(xlabel=xlabel, ylabel=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    return _save(fig, path)
