"""Evaluation of a network's MC predictive on labelled data.

With ``p̄`` the MC-averaged predictive over K passes:
accuracy ``mean_n 1[argmax p̄_n = y_n]``; test log-likelihood ``mean_n log((1/K) Σ_k p_k(y_n))``
(NLL is its negative); Brier ``mean_n Σ_c (p̄_nc − 1[c = y_n])²``; ECE with 15 equal-width bins
on the confidence ``max_c p̄_nc``; and the mean predictive entropy and mutual information.
"""

from __future__ import annotations

import torch
from torch import nn

from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.mc.uncertainty import (
    mc_log_likelihood,
    mutual_information,
    predictive_entropy,
    predictive_mean,
)


def expected_calibration_error(mean_probs: torch.Tensor, y: torch.Tensor, bins: int = 15) -> float:
    """``ECE = Σ_b (|B_b|/N)·|acc(B_b) − conf(B_b)|`` over equal-width confidence bins."""
    conf, pred = mean_probs.max(dim=1)
    correct = (pred == y).double()
    edges = torch.linspace(0, 1, bins + 1, dtype=conf.dtype)
    which = torch.bucketize(conf, edges[1:-1], right=True)
    ece = torch.zeros((), dtype=torch.float64)
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            ece += (
                in_bin.double().mean()
                * (correct[in_bin].mean() - conf[in_bin].double().mean()).abs()
            )
    return float(ece)


def metrics_from_mc(
    probs: torch.Tensor, log_probs: torch.Tensor, y: torch.Tensor
) -> dict[str, float]:
    """All metrics from ``B×K×C`` MC samples and int64 labels."""
    mean = predictive_mean(probs)
    ll = mc_log_likelihood(log_probs, y)
    onehot = torch.nn.functional.one_hot(y, mean.shape[1]).to(mean.dtype)
    return {
        "accuracy": float((mean.argmax(1) == y).double().mean()),
        "log_likelihood": float(ll.double().mean()),
        "nll": float(-ll.double().mean()),
        "brier": float((mean - onehot).pow(2).sum(1).double().mean()),
        "ece": expected_calibration_error(mean, y),
        "mean_predictive_entropy": float(predictive_entropy(probs).double().mean()),
        "mean_mutual_information": float(mutual_information(probs).double().mean()),
    }


@torch.no_grad()
def collect_mc(
    model: nn.Module,
    x: torch.Tensor,
    k: int,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 500,
    seed: int | None = 0,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MC samples ``(probs, log_probs)``, ``N×K×C`` on the CPU, for a whole data set in batches."""
    from tqdm.auto import tqdm

    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    probs, log_probs = [], []
    for i in tqdm(
        range(0, x.shape[0], batch_size), desc=f"MC K={k}", disable=not progress, leave=False
    ):
        out = mc_predict(model, x[i : i + batch_size].to(device), k, generator=generator)
        probs.append(out.probs.cpu())
        log_probs.append(out.log_probs.cpu())
    return torch.cat(probs), torch.cat(log_probs)


def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    k: int = 100,
    device: torch.device | str = "cpu",
    batch_size: int = 500,
    seed: int | None = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Metrics of the K-sample MC predictive on ``(x, y)`` (see module docstring)."""
    probs, log_probs = collect_mc(
        model, x, k, device=device, batch_size=batch_size, seed=seed, progress=progress
    )
    return metrics_from_mc(probs, log_probs, y.cpu())
