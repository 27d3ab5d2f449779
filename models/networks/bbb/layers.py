"""Bayes-by-Backprop layers (Blundell et al. 2015; Shridhar et al. 2018) with a factorised Gaussian
posterior ``q(w) = Π_i N(w_i; μ_i, σ_i²)``, ``σ = softplus(ρ) = log(1 + e^ρ) > 0``.

Two ways to draw a network sample, chosen per layer by ``sampling``:

- ``"local"`` — the local reparameterisation trick (Kingma et al. 2015): sample the
  pre-activations instead of the weights. For an input ``A`` (``B×…``) and the layer's linear map
  ``∗`` (matrix product or convolution)::

      b = A∗μ_W + μ_b + ε ⊙ sqrt(A²∗σ_W² + σ_b²),   ε ~ N(0, I) of b's shape.

  Every output element of every row draws its own ε, so the noise is *per example*: replicating a
  batch K times gives K independent samples per example. Each output's marginal equals the one
  under weight sampling; for convolutions the correlations between positions are dropped.
- ``"weights"`` — sample ``W = μ_W + σ_W ⊙ ε`` once per forward call and apply it to the whole
  batch. All rows of one call share the sample, so K samples need K calls
  (:mod:`bayesgate.models.mc.engine`
  loops over K for such networks, see ``per_example_noise``).

When noise is drawn follows :class:`bayesgate.models.mc.dropout.MCDropout`: in training mode, and
at inference
inside :func:`bayesgate.models.mc.dropout.mc_sampling` (from its generator when one is given). In
eval mode
outside that block a layer returns the posterior-mean network ``A∗μ_W + μ_b``.

The KL term ``KL[q(w) ‖ p(w)]`` is not returned by ``forward`` (which returns a tensor, so the
layers compose with ``nn.Sequential``): :func:`kl_divergence` walks the modules and sums
:meth:`BayesLayer.kl` of each. For a Gaussian prior ``N(0, s²)`` it is the closed form

    KL = Σ_i [ log(s/σ_i) + (σ_i² + μ_i²)/(2s²) − ½ ];

for Blundell's scale-mixture prior ``π N(0, s₁²) + (1−π) N(0, s₂²)`` (no closed form) it is the
one-sample Monte Carlo estimate ``log q(w) − log p(w)``, ``w = μ + σ ⊙ ε``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bayesgate.models.mc.dropout import mc_state
from bayesgate.models.networks.presets import DEFAULT_PRIOR, SAMPLING_MODES

PRIOR_KINDS = ("gaussian", "scale_mixture")
VAR_FLOOR = 1e-16  # keeps sqrt differentiable where A²∗σ² underflows to 0 (as Shridhar's code)


@dataclass(frozen=True)
class GaussianPrior:
    """``p(w) = N(w; 0, s²)`` independently per weight; ``sigma`` = s."""

    sigma: float = 0.1

    def kl(self, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Closed form ``Σ_i log(s/σ_i) + (σ_i² + μ_i²)/(2s²) − ½`` (a scalar)."""
        s2 = self.sigma**2
        return (
            math.log(self.sigma) - sigma.log() + (sigma.pow(2) + mu.pow(2)) / (2 * s2) - 0.5
        ).sum()


@dataclass(frozen=True)
class ScaleMixturePrior:
    """Blundell's ``p(w) = π N(w; 0, s₁²) + (1−π) N(w; 0, s₂²)`` per weight."""

    pi: float = 0.5
    sigma1: float = 1.0
    sigma2: float = math.exp(-6)

    def log_prob(self, w: torch.Tensor) -> torch.Tensor:
        """``log p(w)`` elementwise, by logsumexp of the two weighted component densities."""
        comps = [
            math.log(weight) - math.log(s) - 0.5 * math.log(2 * math.pi) - w.pow(2) / (2 * s**2)
            for weight, s in ((self.pi, self.sigma1), (1.0 - self.pi, self.sigma2))
        ]
        return torch.logaddexp(comps[0], comps[1])

    def kl(self, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """One-sample estimate ``Σ_i log q(w_i) − log p(w_i)``, ``w = μ + σ ⊙ ε`` (a scalar).

        ``log q(w_i) = −log σ_i − ½ log 2π − ε_i²/2``.
        """
        eps = torch.randn_like(mu)
        w = mu + sigma * eps
        log_q = -sigma.log() - 0.5 * math.log(2 * math.pi) - eps.pow(2) / 2
        return (log_q - self.log_prob(w)).sum()


Prior = GaussianPrior | ScaleMixturePrior


def make_prior(spec: dict[str, Any] | None) -> Prior:
    """Prior from its JSON description, e.g. ``{"kind": "gaussian", "sigma": 0.1}`` or
    ``{"kind": "scale_mixture", "pi": 0.5, "sigma1": 1.0, "sigma2": 0.0025}``."""
    spec = dict(DEFAULT_PRIOR if spec is None else spec)
    kind = spec.pop("kind", None)
    if kind not in PRIOR_KINDS:
        raise ValueError(f"prior kind must be one of {', '.join(PRIOR_KINDS)}, got {kind!r}")
    cls = GaussianPrior if kind == "gaussian" else ScaleMixturePrior
    try:
        prior = cls(**{k: float(v) for k, v in spec.items()})
    except TypeError as exc:
        raise ValueError(f"bad {kind} prior parameters {spec}: {exc}") from exc
    sigmas = [prior.sigma] if isinstance(prior, GaussianPrior) else [prior.sigma1, prior.sigma2]
    if any(s <= 0 for s in sigmas):
        raise ValueError(f"prior standard deviations must be > 0, got {sigmas}")
    if isinstance(prior, ScaleMixturePrior) and not 0.0 < prior.pi < 1.0:
        raise ValueError(f"scale-mixture weight pi must be in (0, 1), got {prior.pi}")
    return prior


def _noise(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard normal noise of ``like``'s shape, dtype and device, from ``generator`` if given."""
    if generator is None:
        return torch.randn_like(like)
    return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)


class BayesLayer(nn.Module):
    """Shared machinery: parameters ``weight_mu, weight_rho`` (and ``bias_mu, bias_rho``),
    sampling mode, prior and KL. Subclasses define the linear map :meth:`_linear_map`."""

    def __init__(
        self,
        weight_shape: tuple[int, ...],
        fan_in: int,
        bias: bool,
        prior: Prior,
        sampling: str,
        rho_init: float,
        mu_init_std: float | None,
    ) -> None:
        super().__init__()
        check_sampling(sampling)
        self.prior = prior
        self.sampling = sampling
        self.weight_mu = nn.Parameter(torch.empty(weight_shape))
        self.weight_rho = nn.Parameter(torch.empty(weight_shape))
        if bias:
            self.bias_mu = nn.Parameter(torch.empty(weight_shape[0]))
            self.bias_rho = nn.Parameter(torch.empty(weight_shape[0]))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_rho", None)
        self.reset_parameters(fan_in, rho_init, mu_init_std)

    @torch.no_grad()
    def reset_parameters(self, fan_in: int, rho_init: float, mu_init_std: float | None) -> None:
        """``μ ~ N(0, mu_init_std²)`` (Shridhar's code: 0.1), or with ``None``
        ``μ ~ U(−1/√fan_in, 1/√fan_in)`` (PyTorch's default scale, which keeps the activation
        scale of deep stacks); ``ρ ~ N(rho_init, 0.1²)`` (σ ≈ e^rho_init: nearly deterministic)."""
        bound = 1.0 / math.sqrt(fan_in)
        for mu, rho in self._pairs():
            if mu_init_std is None:
                mu.uniform_(-bound, bound)
            else:
                mu.normal_(0.0, mu_init_std)
            rho.normal_(rho_init, 0.1)

    def _pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(self.weight_mu, self.weight_rho)]
        if self.bias_mu is not None:
            pairs.append((self.bias_mu, self.bias_rho))
        return pairs

    def _linear_map(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def kl(self) -> torch.Tensor:
        """``KL[q ‖ p]`` of this layer's weights and biases (scalar; see the module docstring)."""
        return sum(
            (self.prior.kl(mu, F.softplus(rho)) for mu, rho in self._pairs()),
            start=torch.zeros((), device=self.weight_mu.device),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sampling, generator = mc_state()
        if not (self.training or sampling):
            return self._linear_map(x, self.weight_mu, self.bias_mu)
        w_sigma = F.softplus(self.weight_rho)
        b_sigma = None if self.bias_rho is None else F.softplus(self.bias_rho)
        if self.sampling == "weights":
            w = self.weight_mu + w_sigma * _noise(self.weight_mu, generator)
            b = (
                None
                if b_sigma is None
                else self.bias_mu + b_sigma * _noise(self.bias_mu, generator)
            )
            return self._linear_map(x, w, b)
        mean = self._linear_map(x, self.weight_mu, self.bias_mu)
        var = self._linear_map(
            x * x, w_sigma * w_sigma, None if b_sigma is None else b_sigma * b_sigma
        )
        return mean + (var + VAR_FLOOR).sqrt() * _noise(mean, generator)

    def extra_repr(self) -> str:
        return f"sampling={self.sampling}, prior={self.prior}"


class BayesLinear(BayesLayer):
    """Dense BBB layer: ``x`` ``B×in`` → ``B×out``; weights ``out×in``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        prior: Prior | None = None,
        sampling: str = "local",
        rho_init: float = -5.0,
        mu_init_std: float | None = None,
    ) -> None:
        super().__init__(
            (out_features, in_features),
            in_features,
            bias,
            prior or GaussianPrior(),
            sampling,
            rho_init,
            mu_init_std,
        )
        self.in_features, self.out_features = in_features, out_features

    def _linear_map(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, " + super().extra_repr()


class BayesConv2d(BayesLayer):
    """2-D convolutional BBB layer: ``B×C_in×H×W`` → ``B×C_out×H'×W'``; kernels
    ``C_out×C_in×k×k``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        bias: bool = True,
        *,
        prior: Prior | None = None,
        sampling: str = "local",
        rho_init: float = -5.0,
        mu_init_std: float | None = None,
    ) -> None:
        super().__init__(
            (out_channels, in_channels, kernel_size, kernel_size),
            in_channels * kernel_size * kernel_size,
            bias,
            prior or GaussianPrior(),
            sampling,
            rho_init,
            mu_init_std,
        )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def _linear_map(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, " + super().extra_repr()
        )


def check_sampling(mode: str) -> None:
    if mode not in SAMPLING_MODES:
        raise ValueError(
            f"BBB sampling mode must be one of {', '.join(SAMPLING_MODES)}, got {mode!r}"
        )


def bayes_layers(model: nn.Module) -> list[BayesLayer]:
    """Every :class:`BayesLayer` inside ``model`` (depth-first module order)."""
    return [m for m in model.modules() if isinstance(m, BayesLayer)]


def has_bayes_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds at least one BBB layer (and so needs a KL term in its loss)."""
    return any(isinstance(m, BayesLayer) for m in model.modules())


def kl_divergence(model: nn.Module) -> torch.Tensor:
    """``KL[q(w) ‖ p(w)] = Σ_layers KL_layer`` over every BBB layer of ``model`` (a scalar with
    gradients; 0 for a network without BBB layers)."""
    terms = [layer.kl() for layer in bayes_layers(model)]
    if not terms:
        return torch.zeros(())
    return torch.stack(terms).sum()


def set_sampling(model: nn.Module, mode: str) -> None:
    """Switch every BBB layer of ``model`` to ``mode`` (``"local"`` or ``"weights"``)."""
    check_sampling(mode)
    for layer in bayes_layers(model):
        layer.sampling = mode
