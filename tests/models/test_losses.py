"""BB-α losses against brute-force float64 references (explicit loops over n and k)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesgate.models.mc.losses import (
    alpha_energy,
    bbalpha_gaussian_loss,
    bbalpha_softmax_loss,
    gaussian_log_likelihood,
    l2_penalty,
)
from bayesgate.models.networks.dropout import DropoutCNN, DropoutMLP


def _ref_softmax_bbalpha(logits: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """``mean_n −(1/α)·log((1/K) Σ_k p_k(y_n)^α)``; α = 0: ``mean_n −(1/K) Σ_k log p_k(y_n)``."""
    b, k, _ = logits.shape
    total = 0.0
    for n in range(b):
        liks = []
        for j in range(k):
            z = logits[n, j].astype(np.float64)
            e = np.exp(z - z.max())
            liks.append(e[y[n]] / e.sum())
        liks = np.array(liks)
        if alpha == 0:
            total += -np.mean(np.log(liks))
        else:
            total += -(1.0 / alpha) * np.log(np.mean(liks**alpha))
    return total / b


def _ref_gaussian_bbalpha(pred: np.ndarray, y: np.ndarray, alpha: float, tau: float) -> float:
    """Li & Gal eq. 10 with the density written out.

    ``N(y; f, τ⁻¹ I) = Π_d √(τ/2π)·exp(−τ(y_d − f_d)²/2)``.
    """
    b, k, d = pred.shape
    total = 0.0
    for n in range(b):
        dens = []
        for j in range(k):
            p = 1.0
            for i in range(d):
                err = y[n, i] - pred[n, j, i]
                p *= math.sqrt(tau / (2 * math.pi)) * math.exp(-tau * err**2 / 2)
            dens.append(p)
        dens = np.array(dens)
        if alpha == 0:
            total += -np.mean(np.log(dens))
        else:
            total += -(1.0 / alpha) * np.log(np.mean(dens**alpha))
    return total / b


def _logits(seed: int, b: int = 5, k: int = 7, c: int = 4, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, k, c, generator=g, dtype=torch.float64) * scale


def _labels(seed: int, b: int = 5, c: int = 4) -> torch.Tensor:
    return torch.randint(0, c, (b,), generator=torch.Generator().manual_seed(seed + 1000))


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_softmax_loss_matches_bruteforce_reference(alpha: float, seed: int) -> None:
    logits, y = _logits(seed), _labels(seed)
    ref = _ref_softmax_bbalpha(logits.numpy(), y.numpy(), alpha)
    got = bbalpha_softmax_loss(logits, y, alpha)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(ref, rel=1e-12, abs=1e-12)
    # float32 inputs: same value to single precision
    got32 = bbalpha_softmax_loss(logits.float(), y, alpha)
    assert got32.item() == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_alpha_zero_is_the_exact_vi_limit(seed: int) -> None:
    logits, y = _logits(seed), _labels(seed)
    b, k, _ = logits.shape
    log_p = torch.log_softmax(logits, dim=-1)
    vi = -sum(log_p[n, j, y[n]].item() for n in range(b) for j in range(k)) / (b * k)
    assert bbalpha_softmax_loss(logits, y, 0.0).item() == pytest.approx(vi, rel=1e-14)
    assert bbalpha_softmax_loss(logits, y, 0).item() == pytest.approx(
        _ref_softmax_bbalpha(logits.numpy(), y.numpy(), 0.0), rel=1e-12
    )
    # exact limit, not a tiny α: in float32 a tiny α would lose everything to cancellation
    got32 = bbalpha_softmax_loss(logits.float(), y, 0.0).item()
    assert got32 == pytest.approx(vi, rel=1e-6)


def test_alpha_to_zero_is_continuous() -> None:
    logits, y = _logits(3), _labels(3)
    at_zero = bbalpha_softmax_loss(logits, y, 0.0).item()
    # L(α) = L(0) − (α/2)·Var_k(ℓ) + O(α²); Var of ℓ here is O(10), so |Δ| ≲ 1e-5
    assert bbalpha_softmax_loss(logits, y, 1e-6).item() == pytest.approx(at_zero, abs=1e-4)
    assert bbalpha_softmax_loss(logits, y, 1e-9).item() == pytest.approx(at_zero, abs=1e-7)
    # and the energy decreases with α (Jensen / power-mean inequality)
    values = [bbalpha_softmax_loss(logits, y, a).item() for a in (0.0, 0.5, 1.0, 2.0)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 1e-6, 0.5, 1.0, 2.0, 10.0])
def test_single_sample_equals_cross_entropy(alpha: float) -> None:
    logits, y = _logits(4, b=6, k=1, c=5), _labels(4, b=6, c=5)
    ce = F.cross_entropy(logits[:, 0], y)
    assert bbalpha_softmax_loss(logits, y, alpha).item() == pytest.approx(ce.item(), rel=1e-9)


def test_alpha_one_is_negative_log_of_mean_probability() -> None:
    logits, y = _logits(5), _labels(5)
    probs = torch.softmax(logits, dim=-1)
    b = logits.shape[0]
    ref = -np.mean([math.log(probs[n, :, y[n]].mean().item()) for n in range(b)])
    assert bbalpha_softmax_loss(logits, y, 1.0).item() == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 10.0])
def test_softmax_loss_is_stable_for_huge_logits(alpha: float) -> None:
    g = torch.Generator().manual_seed(7)
    logits = (torch.randint(0, 2, (8, 5, 10), generator=g).float() * 2 - 1) * 1e4
    logits.requires_grad_(True)
    y = torch.randint(0, 10, (8,), generator=g)
    loss = bbalpha_softmax_loss(logits, y, alpha)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 10.0])
def test_huge_logits_give_the_analytic_value(alpha: float) -> None:
    # every pass puts logit +1e4 on class 0 and −1e4 on class 1, label 1: ℓ = −2e4 for all k,
    # so L = −ℓ = 2e4 whatever α (all passes agree).
    y = torch.ones(3, dtype=torch.long)
    # float32 weights w_k = exp(αℓ_k − logsumexp) carry the rounding of a logsumexp of size
    # α·2e4 (ulp 2⁻⁶ at 2e5), hence the looser float32 tolerance on the gradient.
    for dtype, rtol in ((torch.float64, 1e-9), (torch.float32, 1e-2)):
        logits = torch.tensor([[1e4, -1e4]], dtype=dtype).repeat(3, 4, 1).requires_grad_(True)
        loss = bbalpha_softmax_loss(logits, y, alpha)
        assert loss.item() == pytest.approx(2e4, rel=1e-6)
        loss.backward()
        # dL/dz_{n,k,1} = −(1/B)·w_k·(1 − p_1) with w_k = 1/K when all ℓ agree; z_{n,k,0} opposite
        expected = torch.full((3, 4), 1 / 12, dtype=dtype)
        assert torch.allclose(logits.grad[..., 1], -expected, rtol=rtol, atol=0)
        assert torch.allclose(logits.grad[..., 0], expected, rtol=rtol, atol=0)


def test_softmax_loss_shape_and_value_errors() -> None:
    logits, y = _logits(0), _labels(0)
    with pytest.raises(ValueError, match="B×K×C"):
        bbalpha_softmax_loss(logits[:, 0], y, 0.5)
    with pytest.raises(ValueError, match="labels must have shape"):
        bbalpha_softmax_loss(logits, y.view(-1, 1), 0.5)
    with pytest.raises(ValueError, match="labels must have shape"):
        bbalpha_softmax_loss(logits, torch.cat([y, y]), 0.5)
    with pytest.raises(ValueError, match="alpha"):
        bbalpha_softmax_loss(logits, y, -0.5)
    with pytest.raises(ValueError, match="B×K"):
        alpha_energy(torch.zeros(2, 3, 4), 0.5)


def test_alpha_energy_bruteforce() -> None:
    g = torch.Generator().manual_seed(11)
    log_lik = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 5
    for alpha in (0.5, 1.0, 3.0):
        got = alpha_energy(log_lik, alpha)
        for n in range(4):
            ref = -(1 / alpha) * math.log(sum(math.exp(alpha * v) for v in log_lik[n].tolist()) / 6)
            assert got[n].item() == pytest.approx(ref, rel=1e-12)


def _energy_reference(log_lik: torch.Tensor, alpha: float) -> list[float]:
    """``−(1/α)·log((1/K) Σ_k exp(α·ℓ_nk))`` per row in 40-digit arithmetic (mpmath)."""
    with mpmath.workdps(40):
        a = mpmath.mpf(alpha)
        return [
            float(
                -mpmath.log(mpmath.fsum(mpmath.exp(a * mpmath.mpf(v)) for v in row) / len(row)) / a
            )
            for row in log_lik.double().tolist()
        ]


def _float32_log_lik(k: int, seed: int = 0) -> torch.Tensor:
    """``ℓ_nk = log softmax(z)[0]`` of spread-out float32 logits: values from ≈ −0.01 to −20."""
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(64, k, 10, generator=g) * 3, dim=-1)[:, :, 0]


@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("alpha", [1e-8, 1e-6, 1e-4, 0.5])
def test_small_alpha_energy_is_accurate_in_float32(alpha: float, k: int) -> None:
    # logsumexp(α·ℓ) − log K in float32 was 4–5 % off at α = 1e-6 and 100 % at 1e-8
    log_lik = _float32_log_lik(k)
    got = alpha_energy(log_lik, alpha)
    assert got.dtype == torch.float32
    ref = torch.tensor(_energy_reference(log_lik, alpha), dtype=torch.float64)
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=0)


def test_energy_tends_to_the_vi_value_with_the_analytic_slope() -> None:
    # L(α) = −mean_k ℓ − (α/2)·Var_k(ℓ) + O(α²) (cumulant expansion of log mean exp(αℓ))
    log_lik = _float32_log_lik(10, seed=1)
    at_zero = alpha_energy(log_lik, 0.0)
    for alpha in (1e-10, 1e-8):
        assert torch.allclose(alpha_energy(log_lik, alpha), at_zero, rtol=1e-6, atol=0)
    ll64 = log_lik.double()
    slope = (alpha_energy(ll64, 1e-6) - alpha_energy(ll64, 0.0)) / 1e-6
    half_var = ll64.var(dim=1, unbiased=False) / 2
    assert torch.allclose(slope, -half_var, rtol=1e-4, atol=0)


@pytest.mark.parametrize("alpha", [1e-6, 0.5, 3.0])
def test_energy_gradient_is_minus_the_tilted_weights(alpha: float) -> None:
    # ∂L_n/∂ℓ_nk = −w_nk, w_nk = softmax_k(α·ℓ_nk): the passes weighted by p_k(y)^α
    log_lik = _float32_log_lik(5, seed=2).double().requires_grad_(True)
    alpha_energy(log_lik, alpha).sum().backward()
    weights = torch.softmax(alpha * log_lik.detach(), dim=1)
    # autograd's expm1′ = expm1 + 1 leaves the tiny weights an absolute error of float64's ulp
    assert torch.allclose(log_lik.grad, -weights, rtol=1e-10, atol=1e-15)


# ---------------------------------------------------------------- regression


def _regression_batch(seed: int, b: int = 4, k: int = 6, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(b, k, d, generator=g, dtype=torch.float64)
    y = torch.randn(b, d, generator=g, dtype=torch.float64)
    return pred, y


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("tau", [0.5, 3.0])
def test_gaussian_loss_matches_li_gal_eq10(alpha: float, tau: float) -> None:
    pred, y = _regression_batch(int(tau * 10))
    ref = _ref_gaussian_bbalpha(pred.numpy(), y.numpy(), alpha, tau)
    assert bbalpha_gaussian_loss(pred, y, alpha, tau).item() == pytest.approx(ref, rel=1e-12)
    tau_t = torch.tensor(tau, dtype=torch.float64)
    assert bbalpha_gaussian_loss(pred, y, alpha, tau_t).item() == pytest.approx(ref, rel=1e-12)


def test_gaussian_log_likelihood_matches_torch_normal() -> None:
    pred, y = _regression_batch(1)
    tau = 2.5
    normal = torch.distributions.Normal(pred, 1 / math.sqrt(tau))
    ref = normal.log_prob(y.unsqueeze(1)).sum(dim=2)
    got = gaussian_log_likelihood(pred, y, tau)
    assert got.shape == (4, 6)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_gaussian_alpha_zero_limit() -> None:
    pred, y = _regression_batch(2)
    tau = 1.7
    ref = _ref_gaussian_bbalpha(pred.numpy(), y.numpy(), 0.0, tau)
    at_zero = bbalpha_gaussian_loss(pred, y, 0.0, tau).item()
    assert at_zero == pytest.approx(ref, rel=1e-12)
    assert bbalpha_gaussian_loss(pred, y, 1e-7, tau).item() == pytest.approx(at_zero, abs=1e-5)


def test_gaussian_learnable_tau_gets_the_analytic_gradient() -> None:
    pred, y = _regression_batch(3)
    tau = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    bbalpha_gaussian_loss(pred, y, 0.0, tau).backward()
    # α = 0: L = mean_{n,k} [ (τ/2)‖y_n − f_k‖² − (D/2) log τ + const ]
    sq = (y.unsqueeze(1) - pred).pow(2).sum(2)
    expected = (0.5 * sq - 3 / (2 * 2.0)).mean()
    assert tau.grad is not None
    assert tau.grad.item() == pytest.approx(expected.item(), rel=1e-12)

    # learnable log τ (the usual parametrisation), α = 0.5, float32: finite, non-zero gradient
    log_tau = torch.tensor(0.3, requires_grad=True)
    loss = bbalpha_gaussian_loss(pred.float(), y.float(), 0.5, log_tau.exp())
    loss.backward()
    assert torch.isfinite(log_tau.grad) and log_tau.grad.abs() > 0


def test_gaussian_loss_is_stable_for_large_errors() -> None:
    pred, y = _regression_batch(4)
    pred = (pred * 1e3).float().requires_grad_(True)
    loss = bbalpha_gaussian_loss(pred, y.float(), 10.0, 5.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(pred.grad).all()


def test_gaussian_shape_errors() -> None:
    pred, y = _regression_batch(0)
    with pytest.raises(ValueError, match="B×K×D"):
        bbalpha_gaussian_loss(pred[:, 0], y, 0.5, 1.0)
    with pytest.raises(ValueError, match="targets must have shape"):
        bbalpha_gaussian_loss(pred, y[:, :2], 0.5, 1.0)
    with pytest.raises(ValueError, match="targets must have shape"):
        gaussian_log_likelihood(pred, y[:3], 1.0)


# ---------------------------------------------------------------- weight decay


@pytest.mark.parametrize(
    "model",
    [
        DropoutMLP(hidden=(7, 5), in_shape=(1, 3, 3), classes=4),
        DropoutCNN(channels=3, hidden=6, in_shape=(1, 8, 8), classes=3),
        nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2, bias=False)),
    ],
    ids=["mlp", "cnn", "sequential"],
)
def test_l2_penalty_is_the_hand_sum_over_weights(model: nn.Module) -> None:
    expected = 0.0
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            expected += float((module.weight.detach().double() ** 2).sum())
    got = l2_penalty(model)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # biases are excluded: changing them leaves the penalty unchanged
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(10.0)
    assert l2_penalty(model).item() == pytest.approx(expected, rel=1e-6)


def test_l2_penalty_of_a_parameter_free_model_is_zero_and_differentiable() -> None:
    assert l2_penalty(nn.ReLU()).item() == 0.0
    model = nn.Linear(3, 2)
    l2_penalty(model).backward()
    assert torch.allclose(model.weight.grad, 2 * model.weight.detach())
    assert model.bias.grad is None


def test_an_alpha_that_underflows_is_the_exact_limit_not_nan() -> None:
    """float32 rounds α = 1e-50 to 0; the energy is then ``−mean_k ℓ_k`` (the α → 0 limit, by
    hand here), with a finite gradient, for the scalar loss and the UCI per-member α alike."""
    from bayesgate.models.uci.network import grouped_alpha_energy

    ell = -torch.rand(4, 6, dtype=torch.float32).requires_grad_()
    limit = -ell.detach().mean(1)
    for tiny in (1e-50, 1e-300):
        energy = alpha_energy(ell, tiny)
        assert torch.equal(energy.detach(), limit)
        (g,) = torch.autograd.grad(energy.sum(), ell)
        torch.testing.assert_close(g, torch.full_like(g, -1 / 6))
    grouped = grouped_alpha_energy(
        ell.detach().expand(2, 4, 6), torch.tensor([1e-50, 0.0]).double()
    )
    assert torch.equal(grouped, limit.expand(2, 4))


@pytest.mark.parametrize("alpha", [math.inf, math.nan, -0.5])
def test_a_non_finite_or_negative_alpha_is_refused(alpha: float) -> None:
    from bayesgate.errors import InvalidArgument
    from bayesgate.models.training.train import TrainConfig
    from bayesgate.models.uci.network import grouped_alpha_energy

    with pytest.raises(ValueError, match="alpha must be a finite number ≥ 0"):
        alpha_energy(torch.zeros(2, 3), alpha)
    with pytest.raises(ValueError, match="alpha must be a finite number ≥ 0"):
        grouped_alpha_energy(torch.zeros(1, 2, 3), torch.tensor([alpha]))
    with pytest.raises(InvalidArgument, match="alpha must be a finite number ≥ 0"):
        TrainConfig(alpha=alpha)


def test_a_row_with_no_likely_pass_has_infinite_energy_not_nan() -> None:
    """Every ``ℓ_k = −∞`` (p(y) underflowed in every pass): the energy is ``+∞`` for every α
    (``−(1/α)·log 0``), not NaN from ``−∞ − (−∞)`` in the shift."""
    ell = torch.tensor([[-math.inf, -math.inf, -math.inf], [-1.0, -2.0, -3.0]])
    for alpha in (0.0, 0.5, 1.0):
        energy = alpha_energy(ell, alpha)
        assert energy[0] == math.inf and torch.isfinite(energy[1])
