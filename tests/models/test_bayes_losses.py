"""ELBO and BB-α objectives of Bayes-by-Backprop networks, and the β schedules."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from bayesgate.models.networks.bbb.losses import (
    bbb_bbalpha_loss,
    beta_weight,
    elbo_loss,
    parse_beta_schedule,
)


@pytest.mark.parametrize("m", [1, 2, 7, 390, 2000])
@pytest.mark.parametrize("schedule", ["blundell", "uniform", "0.25"])
def test_beta_schedules_sum_to_one_per_epoch(schedule: str, m: int) -> None:
    total = math.fsum(beta_weight(schedule, i, m) for i in range(1, m + 1))
    expected = 0.25 * m if schedule == "0.25" else 1.0
    assert math.isclose(total, expected, rel_tol=1e-12)


def test_blundell_schedule_matches_the_exact_fraction() -> None:
    for m in (1, 3, 10, 60):
        for i in range(1, m + 1):
            exact = Fraction(2 ** (m - i), 2**m - 1)
            assert math.isclose(beta_weight("blundell", i, m), float(exact), rel_tol=1e-14)
    assert beta_weight("blundell", 1, 5000) == 0.5  # no overflow for large M
    assert beta_weight("blundell", 2000, 5000) == 0.0  # 2^-2000 underflows, harmlessly
    assert beta_weight("uniform", 4, 8) == 0.125


def test_bad_schedules_and_indices_are_rejected() -> None:
    assert parse_beta_schedule("0.1") == 0.1
    assert parse_beta_schedule("uniform") == "uniform"
    for bad in ("standard", "-1", "nan", ""):
        with pytest.raises(ValueError, match="beta"):
            parse_beta_schedule(bad)
    with pytest.raises(ValueError, match="1 ≤ i ≤ M"):
        beta_weight("uniform", 0, 3)
    with pytest.raises(ValueError, match="1 ≤ i ≤ M"):
        beta_weight("uniform", 4, 3)


def _data(b: int = 5, k: int = 4, c: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        3 * torch.randn(b, k, c, generator=g, dtype=torch.float64),
        torch.randint(0, c, (b,), generator=g),
    )


def test_elbo_is_nll_times_n_plus_beta_kl_over_n() -> None:
    logits, y = _data()
    kl = torch.tensor(123.0, dtype=torch.float64)
    n, beta = 1000, 0.3
    b, k, _ = logits.shape
    nll = 0.0
    for i in range(b):
        for j in range(k):
            p = torch.softmax(logits[i, j], 0)[y[i]]
            nll -= math.log(float(p))
    nll /= b * k
    expected = (n * nll + beta * 123.0) / n
    assert math.isclose(float(elbo_loss(logits, y, kl, n, beta)), expected, rel_tol=1e-12)


def test_bbalpha_tends_to_the_elbo_as_alpha_goes_to_zero() -> None:
    logits, y = _data()
    kl = torch.tensor(50.0, dtype=torch.float64)
    elbo = float(elbo_loss(logits, y, kl, 200, 0.5))
    assert float(bbb_bbalpha_loss(logits, y, kl, 200, 0.5, alpha=0.0)) == elbo
    gaps = [abs(float(bbb_bbalpha_loss(logits, y, kl, 200, 0.5, a)) - elbo) for a in (1e-2, 1e-4)]
    assert gaps[1] < 1e-3 and gaps[1] < gaps[0] / 50  # O(α) convergence


def test_bbalpha_one_is_the_log_of_the_mc_average() -> None:
    logits, y = _data()
    kl = torch.tensor(10.0, dtype=torch.float64)
    p = torch.softmax(logits, -1).gather(2, y.view(-1, 1, 1).expand(-1, logits.shape[1], 1))
    expected = float(-p.squeeze(2).mean(1).log().mean()) + 0.1 * 10.0 / 40
    got = float(bbb_bbalpha_loss(logits, y, kl, 40, 0.1, alpha=1.0))
    assert math.isclose(got, expected, rel_tol=1e-12)
    # Jensen: the α = 1 energy is below the ELBO for the same samples
    assert got < float(elbo_loss(logits, y, kl, 40, 0.1))


def test_bad_arguments_are_rejected() -> None:
    logits, y = _data()
    kl = torch.tensor(1.0)
    with pytest.raises(ValueError, match="≥ 1"):
        elbo_loss(logits, y, kl, 0, 0.1)
    with pytest.raises(ValueError, match="beta"):
        elbo_loss(logits, y, kl, 10, -0.1)
    with pytest.raises(ValueError, match="scalar"):
        elbo_loss(logits, y, torch.ones(2), 10, 0.1)
    with pytest.raises(ValueError, match="alpha"):
        bbb_bbalpha_loss(logits, y, kl, 10, 0.1, alpha=-1.0)
