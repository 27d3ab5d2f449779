"""The UCI regression protocol of Gal & Ghahramani (2016) / Li & Gal (2017, Tables 1–2).

Per standard split: the training rows are cut into a fit part (first 80 %, file order, as in Gal's
``experiment.py``) and a validation part (last 20 %). Every grid candidate ``(p, τ)`` of the
dataset folder is trained for every α at once (:mod:`bayesgate.models.uci.network`), standardised
on the fit
part; for each α the candidate with the highest validation log-likelihood (K_val MC samples) is
kept. With ``refit`` (default) a net with the chosen ``(p, τ)`` is then retrained on the whole
training split (standardised on it) and scored on the test rows with K_test samples; without it
the selected grid net itself is scored (Gal's code does that). Metrics are in original target
units: RMSE of the MC mean and the MC test log-likelihood
(:func:`bayesgate.models.uci.network.gaussian_mc_log_likelihood`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bayesgate.models.uci.config import PAPER_ALPHAS, UCIConfig
from bayesgate.models.uci.data import Standardiser, UCIDataError, UCIDataset
from bayesgate.models.uci.network import (
    GroupedDropoutNet,
    evaluate_members,
    prior_weight_decay,
    train_members,
)

# Li & Gal (2017), Tables 1 and 2: test NLL (nats) and test RMSE at α = 0, 0.5, 1 (PAPER_ALPHAS).
PAPER: dict[str, dict[str, tuple[float, float, float]]] = {
    "bostonHousing": {"nll": (2.42, 2.38, 2.50), "rmse": (2.85, 2.97, 3.04)},
    "concrete": {"nll": (2.98, 2.88, 2.96), "rmse": (4.92, 4.62, 4.76)},
    "energy": {"nll": (1.75, 0.74, 0.81), "rmse": (1.02, 1.11, 1.10)},
    "kin8nm": {"nll": (-0.83, -1.03, -1.10), "rmse": (0.09, 0.09, 0.08)},
    "power-plant": {"nll": (2.79, 2.78, 2.76), "rmse": (4.04, 4.01, 3.98)},
    "protein-tertiary-structure": {"nll": (2.87, 2.87, 2.86), "rmse": (4.28, 4.28, 4.23)},
    "wine-quality-red": {"nll": (0.92, 0.92, 0.95), "rmse": (0.61, 0.62, 0.63)},
    "yacht": {"nll": (1.38, 1.08, 1.15), "rmse": (0.76, 0.85, 0.88)},
    "naval-propulsion-plant": {"nll": (-2.80, -2.80, -2.80), "rmse": (0.01, 0.01, 0.01)},
}
# Their standard errors over splits (appendix D, Tables 1–2; printed with two decimals, so 0.00
# means < 0.005). The Year dataset of those tables is not among our data.
PAPER_SE: dict[str, dict[str, tuple[float, float, float]]] = {
    "bostonHousing": {"nll": (0.05, 0.06, 0.10), "rmse": (0.19, 0.19, 0.17)},
    "concrete": {"nll": (0.02, 0.02, 0.03), "rmse": (0.13, 0.12, 0.15)},
    "energy": {"nll": (0.01, 0.02, 0.02), "rmse": (0.03, 0.02, 0.02)},
    "kin8nm": {"nll": (0.00, 0.00, 0.00), "rmse": (0.00, 0.00, 0.00)},
    "power-plant": {"nll": (0.01, 0.01, 0.00), "rmse": (0.04, 0.04, 0.04)},
    "protein-tertiary-structure": {"nll": (0.00, 0.00, 0.00), "rmse": (0.02, 0.04, 0.01)},
    "wine-quality-red": {"nll": (0.01, 0.01, 0.02), "rmse": (0.01, 0.01, 0.01)},
    "yacht": {"nll": (0.01, 0.04, 0.06), "rmse": (0.05, 0.06, 0.06)},
    "naval-propulsion-plant": {"nll": (0.00, 0.00, 0.00), "rmse": (0.00, 0.00, 0.00)},
}


@dataclass
class _Fitted:
    """A trained grouped net plus the standardiser and member hyper-parameters it used."""

    net: GroupedDropoutNet
    scaler: Standardiser
    members: list[tuple[float, float, float]] = field(default_factory=list)  # (α, p, τ)


Member = tuple[float, float, float | None]  # (α, p, τ in target units; None = learn τ)


def _fit(
    x: np.ndarray,
    y: np.ndarray,
    members: list[Member],
    settings: dict[str, Any],
    generator: torch.Generator,
    progress: bool,
    desc: str,
) -> _Fitted:
    """Train the members together; a member whose τ is None learns it (from ``tau_init``)."""
    scaler = Standardiser.fit(x, y)
    rates = [p for _, p, _ in members]
    net = GroupedDropoutNet(x.shape[1], settings["hidden"], rates, generator=generator)
    taus = torch.tensor(  # τ_n = τ·σ_y² in standardised units
        [settings["tau_init"] if t is None else t * scaler.y_std**2 for _, _, t in members]
    )
    if any(t is None for _, _, t in members):
        net.learn_tau(taus)
    train_members(
        net,
        torch.as_tensor(scaler.transform_x(x), dtype=torch.float32),
        torch.as_tensor(scaler.transform_y(y), dtype=torch.float32),
        alphas=torch.tensor([a for a, _, _ in members]),
        taus=taus,
        weight_decay=prior_weight_decay(rates, x.shape[0], settings["lengthscale"]),
        epochs=settings["epochs"],
        k=settings["k_train"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        tau_lr=settings["tau_lr"],
        generator=generator,
        progress=progress,
        desc=desc,
    )
    if net.learned_taus is not None:  # back to target units: τ = τ_n/σ_y²
        learned = (net.learned_taus.double() / scaler.y_std**2).tolist()
        return _Fitted(
            net, scaler, [(a, p, t) for (a, p, _), t in zip(members, learned, strict=True)]
        )
    return _Fitted(net, scaler, [(a, p, float(t)) for a, p, t in members])


def _score(fitted: _Fitted, x: np.ndarray, y: np.ndarray, k: int, generator: torch.Generator):
    s = fitted.scaler
    return evaluate_members(
        fitted.net,
        torch.as_tensor(s.transform_x(x), dtype=torch.float32),
        y,
        y_mean=s.y_mean,
        y_std=s.y_std,
        taus=[t for _, _, t in fitted.members],
        k=k,
        generator=generator,
    )


def run_split(
    ds: UCIDataset, split: int, config: UCIConfig, *, progress: bool = False
) -> list[dict[str, Any]]:
    """Grid search, (re)fit and test on standard split ``split``; one result row per α."""
    settings = config.resolved(ds)
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + split)
    train_idx, test_idx = ds.split(split)
    fit_idx, val_idx = _hold_out(ds, split, train_idx, config.val_fraction)
    taus = [None] if config.learn_tau else settings["tau_values"]
    grid: list[Member] = [
        (a, p, t) for a in config.alphas for p in settings["dropout_rates"] for t in taus
    ]
    search = _fit(
        ds.x[fit_idx], ds.y[fit_idx], grid, settings, generator, progress, f"split {split} grid"
    )
    val = _score(search, ds.x[val_idx], ds.y[val_idx], config.k_val, generator)
    chosen = _best_member_per_alpha(grid, val["log_likelihood"], config.alphas)
    if config.refit:
        members = [grid[i] for i in chosen]
        desc = f"split {split} refit"
        final = _fit(ds.x[train_idx], ds.y[train_idx], members, settings, generator, progress, desc)
    else:
        final = _Fitted(
            search.net.select(chosen), search.scaler, [search.members[i] for i in chosen]
        )
    test = _score(final, ds.x[test_idx], ds.y[test_idx], config.k_test, generator)
    sizes = {"n_train": int(train_idx.size), "n_test": int(test_idx.size)}
    seconds = round(time.perf_counter() - start, 2)
    return [
        {
            "dataset": ds.name,
            "split": split,
            **dict(zip(("alpha", "dropout", "tau"), final.members[j], strict=True)),
            "val_log_likelihood": float(val["log_likelihood"][i]),
            "val_rmse": float(val["rmse"][i]),
            "test_rmse": float(test["rmse"][j]),
            "test_log_likelihood": float(test["log_likelihood"][j]),
            "test_nll": -float(test["log_likelihood"][j]),
            **sizes,
            "seconds": seconds,
        }
        for j, i in enumerate(chosen)
    ]


def _hold_out(
    ds: UCIDataset, split: int, train_idx: np.ndarray, val_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """The training rows split into (fit, validation): the last ``val_fraction`` validates."""
    n_fit = round((1 - val_fraction) * train_idx.size)
    if n_fit < 2 or n_fit >= train_idx.size:
        raise UCIDataError(f"{ds.name}: split {split} has too few training rows ({train_idx.size})")
    return train_idx[:n_fit], train_idx[n_fit:]


def _best_member_per_alpha(
    grid: list[Member], val_log_likelihood: Any, alphas: tuple[float, ...]
) -> list[int]:
    """For each α, the grid member ``(α, p, τ)`` with the highest validation log-likelihood."""
    chosen = []
    for a in alphas:
        candidates = [i for i, member in enumerate(grid) if member[0] == a]
        chosen.append(max(candidates, key=lambda i: val_log_likelihood[i]))
    return chosen


def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error ``s/√n`` (sample std, ``ddof=1``; NaN for n = 1)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no values to summarise")
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
    return float(v.mean()), se


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per α: number of splits, mean ± SE of test RMSE and NLL, and the comparison with the
    paper (:func:`compare_with_paper`)."""
    out = []
    for alpha in sorted({r["alpha"] for r in rows}):
        sel = [r for r in rows if r["alpha"] == alpha]
        rmse, rmse_se = mean_and_se([r["test_rmse"] for r in sel])
        nll, nll_se = mean_and_se([r["test_nll"] for r in sel])
        entry: dict[str, Any] = {
            "dataset": sel[0]["dataset"],
            "alpha": alpha,
            "splits": len(sel),
            "test_rmse": rmse,
            "test_rmse_se": rmse_se,
            "test_nll": nll,
            "test_nll_se": nll_se,
        }
        out.append(compare_with_paper(entry))
    return out


def compare_with_paper(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` (a :func:`summarise` row) with the paper's values and SEs and whether ours is
    within two combined standard errors of them (:func:`within_2se`)."""
    entry = dict(entry)
    paper = paper_values(entry["dataset"], entry["alpha"])
    if paper is not None:
        entry["paper_nll"], entry["paper_rmse"], entry["paper_nll_se"], entry["paper_rmse_se"] = (
            paper
        )
        entry["nll_within_2se"] = within_2se(
            entry["test_nll"], entry["test_nll_se"], paper[0], paper[2]
        )
        entry["rmse_within_2se"] = within_2se(
            entry["test_rmse"], entry["test_rmse_se"], paper[1], paper[3]
        )
    return entry


def paper_values(dataset: str, alpha: float) -> tuple[float, float, float, float] | None:
    """(NLL, RMSE, SE of NLL, SE of RMSE) of Li & Gal's Tables 1–2 for the dataset folder name
    and α, if reported."""
    if dataset not in PAPER or alpha not in PAPER_ALPHAS:
        return None
    j = PAPER_ALPHAS.index(alpha)
    values, errors = PAPER[dataset], PAPER_SE[dataset]
    return values["nll"][j], values["rmse"][j], errors["nll"][j], errors["rmse"][j]


def within_2se(
    mean: float, se: float, reference: float, reference_se: float = 0.0, rounding: float = 0.005
) -> bool | None:
    """``|mean − reference| ≤ 2·√(se² + reference_se²) + rounding`` (None when our SE is
    undefined); ``rounding`` is half a unit of the paper's last printed digit (two decimals)."""
    if math.isnan(se):
        return None
    return bool(abs(mean - reference) <= 2 * math.hypot(se, reference_se) + rounding)


def grid_edge_counts(rows: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """How often a chosen hyper-parameter sits at the lowest or highest value of its grid:
    per column ``{"low": n, "high": n}``, and ``at_an_edge`` = rows with any choice at an edge
    (grids of one value offer no choice and are skipped; a learned τ has no grid)."""
    grids = {
        column: grid
        for column, grid in (
            ("dropout", settings["dropout_rates"]),
            ("tau", settings["tau_values"]),
        )
        if len(grid) >= 2
    }
    counts: dict[str, Any] = {"choices": len(rows)}
    for column, grid in grids.items():
        counts[column] = {
            "low": sum(math.isclose(r[column], min(grid)) for r in rows),
            "high": sum(math.isclose(r[column], max(grid)) for r in rows),
        }
    counts["at_an_edge"] = sum(
        any(_at_edge(r[column], grid) for column, grid in grids.items()) for r in rows
    )
    return counts


def _at_edge(value: float, grid: list[float]) -> bool:
    return math.isclose(value, min(grid)) or math.isclose(value, max(grid))
