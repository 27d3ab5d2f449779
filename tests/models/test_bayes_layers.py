"""Bayes-by-Backprop layers: KL against float64/Monte-Carlo references, local reparameterisation
against weight sampling and the analytic moments, when noise is drawn."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesgate.models.mc.dropout import mc_sampling
from bayesgate.models.networks.bbb.layers import (
    BayesConv2d,
    BayesLinear,
    GaussianPrior,
    ScaleMixturePrior,
    kl_divergence,
    make_prior,
    set_sampling,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _widen(layer: nn.Module, rho: float, seed: int = 0) -> nn.Module:
    """Give the posterior a visible spread (σ = softplus(ρ ± noise)) and non-trivial means."""
    g = _gen(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("rho"):
                p.copy_(rho + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return layer


def test_gaussian_kl_matches_float64_reference() -> None:
    g = _gen(0)
    mu = torch.randn(7, 5, generator=g, dtype=torch.float64)
    sigma = torch.rand(7, 5, generator=g, dtype=torch.float64) * 0.5 + 0.01
    prior = GaussianPrior(sigma=0.3)
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(mu, sigma),
        torch.distributions.Normal(
            torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
        ),
    ).sum()
    assert torch.allclose(prior.kl(mu, sigma), ref, rtol=1e-10)
    # by hand for one weight: μ=1, σ=s=0.3 → KL = μ²/(2s²) = 1/0.18
    one = prior.kl(torch.ones(1, dtype=torch.float64), torch.full((1,), 0.3, dtype=torch.float64))
    assert math.isclose(float(one), 1 / 0.18, rel_tol=1e-12)
    # q = p → 0
    zero = prior.kl(torch.zeros(3), torch.full((3,), 0.3))
    assert abs(float(zero)) < 1e-6


def test_gaussian_kl_matches_monte_carlo() -> None:
    """``E_q[log q(w) − log p(w)]`` estimated from 400k float64 draws per weight."""
    mu = torch.tensor([0.3, -1.0, 0.0], dtype=torch.float64)
    sigma = torch.tensor([0.05, 0.2, 0.5], dtype=torch.float64)
    q = torch.distributions.Normal(mu, sigma)
    p = torch.distributions.Normal(*torch.tensor([0.0, 0.4], dtype=torch.float64))
    w = q.sample((400_000,))
    mc = (q.log_prob(w) - p.log_prob(w)).mean(0)
    closed = torch.stack([GaussianPrior(0.4).kl(mu[i : i + 1], sigma[i : i + 1]) for i in range(3)])
    se = (q.log_prob(w) - p.log_prob(w)).std(0) / math.sqrt(w.shape[0])
    assert ((mc - closed).abs() < 5 * se + 1e-9).all(), (mc, closed)


def test_scale_mixture_kl_estimate_is_unbiased() -> None:
    """Mean of the one-sample estimates ≈ ``∫ q (log q − log p)`` by float64 quadrature."""
    prior = ScaleMixturePrior(pi=0.5, sigma1=1.0, sigma2=math.exp(-3))
    mu, sigma = torch.tensor([0.2]), torch.tensor([0.1])
    grid = torch.linspace(-2, 2, 400_001, dtype=torch.float64)
    q = torch.distributions.Normal(0.2, 0.1)
    log_q = q.log_prob(grid)
    log_p = torch.logaddexp(
        math.log(0.5) + torch.distributions.Normal(0.0, 1.0).log_prob(grid),
        math.log(0.5) + torch.distributions.Normal(0.0, math.exp(-3)).log_prob(grid),
    )
    exact = float(torch.trapezoid(log_q.exp() * (log_q - log_p), grid))
    torch.manual_seed(0)
    n = 20_000  # n iid one-sample estimates, summed by kl(): their mean is kl/n
    estimate = float(prior.kl(mu.repeat(n), sigma.repeat(n))) / n
    assert abs(estimate - exact) < 0.02 * abs(exact) + 0.01, (estimate, exact)
    # the elementwise log density integrates to 1 (wide grid: the N(0, 1) component's tails)
    wide = torch.linspace(-10, 10, 400_001, dtype=torch.float64)
    total = float(torch.trapezoid(prior.log_prob(wide).exp(), wide))
    assert math.isclose(total, 1.0, abs_tol=1e-6)


def test_kl_is_gathered_by_walking_the_modules() -> None:
    torch.manual_seed(0)
    prior = GaussianPrior(0.2)
    net = nn.Sequential(
        BayesConv2d(1, 3, 3, prior=prior),
        nn.Softplus(),
        nn.Flatten(),
        nn.Sequential(BayesLinear(3 * 4 * 4, 5, prior=prior), nn.Softplus()),
        BayesLinear(5, 2, bias=False, prior=prior),
    )
    ref = torch.zeros((), dtype=torch.float64)
    for name, p in net.named_parameters():
        if name.endswith("_mu"):
            rho = net.get_parameter(name[:-3] + "_rho").detach().double()
            q = torch.distributions.Normal(p.detach().double(), F.softplus(rho))
            p_ref = torch.distributions.Normal(*torch.tensor([0.0, 0.2], dtype=torch.float64))
            ref += torch.distributions.kl_divergence(q, p_ref).sum()
    kl = kl_divergence(net)
    assert kl.requires_grad and kl.dim() == 0
    assert math.isclose(float(kl.detach()), float(ref), rel_tol=1e-5)
    assert float(kl_divergence(nn.Linear(3, 2))) == 0.0  # no BBB layer, no KL
    out = net(torch.rand(2, 1, 6, 6))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 2)  # a tensor, not (out, kl)


def _moments(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return samples.mean(0), samples.var(0)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_local_reparameterisation_matches_weight_sampling(kind: str) -> None:
    """Per-output marginal mean and variance: LRT samples, weight samples and the analytic
    ``A∗μ + μ_b`` and ``A²∗σ² + σ_b²`` agree (n = 4000 samples each, 6-σ bounds)."""
    torch.manual_seed(0)
    if kind == "linear":
        layer = _widen(BayesLinear(4, 3), rho=-1.0)
        x = torch.tensor([[0.5, -1.0, 2.0, 0.3]])
        apply = F.linear
    else:
        layer = _widen(BayesConv2d(2, 2, 3, padding=1), rho=-1.0)
        x = torch.rand(1, 2, 4, 4, generator=_gen(1))

        def apply(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return F.conv2d(a, w, b, padding=1)

    sig_w, sig_b = F.softplus(layer.weight_rho), F.softplus(layer.bias_rho)
    mean_ref = apply(x, layer.weight_mu, layer.bias_mu)[0].detach()
    var_ref = apply(x * x, sig_w**2, sig_b**2)[0].detach()
    n = 4000
    layer.eval()
    with torch.no_grad(), mc_sampling(_gen(2)):
        lrt = layer(x.expand(n, *x.shape[1:]))  # one forward: per-row noise
        set_sampling(layer, "weights")
        ws = torch.cat([layer(x) for _ in range(n)])  # one weight sample per call
    for samples in (lrt, ws):
        mean, var = _moments(samples)
        assert ((mean - mean_ref).abs() < 6 * (var_ref / n).sqrt()).all()
        assert ((var / var_ref - 1).abs() < 6 * math.sqrt(2 / n)).all()
    m1, v1 = _moments(lrt)
    m2, v2 = _moments(ws)
    assert ((m1 - m2).abs() < 6 * (2 * var_ref / n).sqrt()).all()
    assert ((v1 / v2 - 1).abs() < 8 * math.sqrt(2 / n)).all()


def test_noise_only_in_training_or_inside_mc_sampling() -> None:
    layer = _widen(BayesLinear(4, 3), rho=-1.0)
    x = torch.rand(5, 4, generator=_gen(0))
    posterior_mean = F.linear(x, layer.weight_mu, layer.bias_mu)
    layer.eval()
    assert torch.equal(layer(x), posterior_mean)
    layer.train()
    assert not torch.allclose(layer(x), posterior_mean)
    layer.eval()
    for mode in ("local", "weights"):
        set_sampling(layer, mode)
        with mc_sampling(_gen(3)):
            a = layer(x)
        with mc_sampling(_gen(3)):
            b = layer(x)
        assert torch.equal(a, b), f"{mode}: same generator state must give the same sample"
        assert not torch.allclose(a, posterior_mean)
        with mc_sampling(_gen(4)):
            assert not torch.allclose(layer(x), a)


def test_gradients_reach_mean_and_rho() -> None:
    for mode in ("local", "weights"):
        layer = BayesConv2d(1, 2, 3, sampling=mode).train()
        (layer(torch.rand(2, 1, 5, 5)).pow(2).sum() + layer.kl()).backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{mode}: no gradient for {name}"


def test_bad_configuration_is_rejected_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="sampling mode"):
        BayesLinear(2, 2, sampling="flipout")
    with pytest.raises(ValueError, match="prior kind"):
        make_prior({"kind": "laplace", "scale": 1.0})
    with pytest.raises(ValueError, match="> 0"):
        make_prior({"kind": "gaussian", "sigma": 0.0})
    with pytest.raises(ValueError, match="pi"):
        make_prior({"kind": "scale_mixture", "pi": 1.0, "sigma1": 1.0, "sigma2": 0.1})
    with pytest.raises(ValueError, match="bad gaussian prior"):
        make_prior({"kind": "gaussian", "scale": 1.0})
    assert make_prior(None) == GaussianPrior(0.1)
