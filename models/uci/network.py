"""BB-α dropout regression nets for the UCI benchmarks, trained G at a time.

The network is Gal's UCI model: ``x → dropout(p) → Linear(D, H) → ReLU → dropout(p) →
Linear(H, 1)`` (dropout on the input and on the hidden layer, H = 50, or 100 for protein).
A hyper-parameter grid of G candidates ``(α_g, p_g, τ_g)`` is trained as **one** batched network:
member g has its own weights ``W1_g`` (``D×H``), ``W2_g`` (``H×1``), biases and dropout rate, and
every forward is two ``torch.baddbmm`` over a ``G×R×D`` stack. Losses are summed over members, so
each member's gradient involves its own loss only, and Adam (element-wise) updates each member
exactly as if it were trained alone on the same minibatch order.

:class:`bayesgate.models.mc.dropout.MCDropout` holds one rate per module, so the per-member rates
here draw
their Bernoulli masks directly (same inverted-dropout rule ``x ⊙ z / (1−p)``); dropout is always
on (training and MC prediction alike), with masks drawn from an explicit ``torch.Generator``.

Objective per member, targets standardised (τ_n = τ·σ_y² is the precision in those units):
``mean_n L_n(α) + λ·(‖W1‖² + ‖W2‖²)``, ``L_n(α)`` the BB-α energy of
:func:`bayesgate.models.mc.losses.alpha_energy` over K samples of
:func:`bayesgate.models.mc.losses.gaussian_log_likelihood`
(the two halves of :func:`bayesgate.models.mc.losses.bbalpha_gaussian_loss`, batched over members),
and
``λ = l²(1−p)/(2N)`` the dropout-VI prior term divided by N (length-scale l, N training rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bayesgate.models.mc.losses import gaussian_log_likelihood, tilted_energy

DEFAULT_MAX_ROWS = 1 << 18  # rows (member × example × sample) per prediction chunk


class GroupedDropoutNet(nn.Module):
    """G independent one-hidden-layer ReLU dropout nets evaluated in one batched forward.

    ``forward(x)`` takes ``G×R×D`` (or ``R×D``, shared by all members) and returns ``G×R×1``:
    ``f_g(x) = (relu((x ⊙ z1/(1−p_g)) W1_g + b1_g) ⊙ z2/(1−p_g)) W2_g + b2_g``, fresh masks
    ``z ~ Bernoulli(1−p_g)`` per row and unit. Weights start Glorot-uniform, biases at 0 (the
    Keras defaults of Gal's code).
    """

    def __init__(
        self,
        in_features: int,
        hidden: int,
        dropout_rates: Sequence[float],
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if in_features < 1 or hidden < 1:
            raise ValueError(f"need positive sizes, got in_features={in_features}, hidden={hidden}")
        self.rates = [float(p) for p in dropout_rates]
        if not self.rates or not all(0 <= p < 1 for p in self.rates):
            raise ValueError(f"dropout rates must be in [0, 1), got {list(dropout_rates)}")
        g = len(self.rates)
        self.w1 = nn.Parameter(_glorot(g, in_features, hidden, generator))
        self.b1 = nn.Parameter(torch.zeros(g, 1, hidden))
        self.w2 = nn.Parameter(_glorot(g, hidden, 1, generator))
        self.b2 = nn.Parameter(torch.zeros(g, 1, 1))
        keep = torch.tensor([1.0 - p for p in self.rates], dtype=torch.float32)
        self.register_buffer("keep", keep.view(g, 1, 1))
        self.in_features, self.hidden = in_features, hidden
        self.log_tau: nn.Parameter | None = None  # see learn_tau

    def learn_tau(self, initial: torch.Tensor) -> None:
        """Make each member's noise precision a parameter, ``τ_g = exp(log_tau_g)`` (in the
        units of the targets it is trained on), starting at ``initial`` (``G``)."""
        if initial.shape != (self.members,) or not bool((initial > 0).all()):
            raise ValueError(f"need {self.members} positive initial taus, got {initial.tolist()}")
        self.log_tau = nn.Parameter(initial.detach().double().log().float())

    @property
    def learned_taus(self) -> torch.Tensor | None:
        """``exp(log_tau)`` (``G``), or None when τ is fixed."""
        return None if self.log_tau is None else self.log_tau.detach().exp()

    @property
    def members(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, *x.shape)
        if x.dim() != 3 or x.shape[0] != self.members or x.shape[2] != self.in_features:
            raise ValueError(
                f"input must be {self.members}×R×{self.in_features} or R×{self.in_features}, "
                f"got {tuple(x.shape)}"
            )
        # (x ⊙ z/(1−p)) W = (x ⊙ z)(W/(1−p)): the rescaling touches the small weight tensor,
        # not the G·R rows.
        h = torch.relu(torch.baddbmm(self.b1, self._mask(x, generator), self.w1 / self.keep))
        return torch.baddbmm(self.b2, self._mask(h, generator), self.w2 / self.keep)

    def _mask(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """``x ⊙ z`` with ``z ~ Bernoulli(1−p_g)`` element-wise (``P(u < 1−p) = 1−p``)."""
        u = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return x * u.lt_(self.keep)

    def select(self, indices: Sequence[int]) -> GroupedDropoutNet:
        """A new net holding copies of the listed members (in that order)."""
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        rates = [self.rates[i] for i in idx.tolist()]
        out = GroupedDropoutNet(self.in_features, self.hidden, rates)
        with torch.no_grad():
            for name in ("w1", "b1", "w2", "b2"):
                getattr(out, name).copy_(getattr(self, name)[idx])
        if self.log_tau is not None:
            out.learn_tau(self.log_tau.detach()[idx].exp())
        return out


def _glorot(g: int, fan_in: int, fan_out: int, generator: torch.Generator | None) -> torch.Tensor:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(g, fan_in, fan_out, generator=generator) * 2 - 1) * bound


def mc_forward(
    model: GroupedDropoutNet,
    x: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``G×B×K×1`` outputs of K dropout passes per example in one forward over ``G·B·K`` rows
    (row ``b·K + k`` of each member is sample k of example b)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"number of MC samples k must be a positive integer, got {k!r}")
    b, d = x.shape
    rows = x.unsqueeze(1).expand(b, k, d).reshape(b * k, d)
    return model(rows, generator).view(model.members, b, k, 1)


def grouped_alpha_energy(log_lik: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """BB-α energies ``G×B`` from ``G×B×K`` log-likelihoods, member g with its own ``α_g``.

    ``−(1/α_g)·(logsumexp_k(α_g·ℓ_gnk) − log K)``, or ``−mean_k ℓ_gnk`` where ``α_g = 0``
    (row by row identical to :func:`bayesgate.models.mc.losses.alpha_energy`; computed by its
    cancellation-free :func:`~bayesgate.models.mc.losses.tilted_energy`).
    """
    if log_lik.dim() != 3 or alphas.shape != log_lik.shape[:1]:
        raise ValueError(
            f"need G×B×K log-likelihoods and G alphas, got {tuple(log_lik.shape)} "
            f"and {tuple(alphas.shape)}"
        )
    if not bool(torch.isfinite(alphas).all()) or bool((alphas < 0).any()):
        raise ValueError(f"alpha must be a finite number ≥ 0, got {alphas.tolist()}")
    positive = (alphas > 0).view(-1, 1)
    safe = torch.where(positive, alphas.view(-1, 1), torch.ones_like(positive, dtype=alphas.dtype))
    return torch.where(positive, tilted_energy(log_lik, safe), -log_lik.mean(dim=2))


def grouped_bbalpha_loss(
    mc_pred: torch.Tensor, y: torch.Tensor, alphas: torch.Tensor, taus: torch.Tensor
) -> torch.Tensor:
    """Per-member mean BB-α Gaussian energy, ``G``: for ``mc_pred`` ``G×B×K×1``, ``y`` ``B×1``
    and precisions ``taus`` ``G``, member g's value equals
    ``bbalpha_gaussian_loss(mc_pred[g], y, alphas[g], taus[g])``."""
    g, b, k, d = mc_pred.shape
    if y.shape != (b, d):
        raise ValueError(f"targets must have shape ({b}, {d}), got {tuple(y.shape)}")
    tau_rows = taus.to(mc_pred.dtype).repeat_interleave(b).unsqueeze(1)
    log_lik = gaussian_log_likelihood(mc_pred.reshape(g * b, k, d), y.repeat(g, 1), tau_rows)
    return grouped_alpha_energy(log_lik.view(g, b, k), alphas.to(mc_pred.dtype)).mean(dim=1)


def prior_weight_decay(dropout_rates: Sequence[float], n: int, lengthscale: float) -> torch.Tensor:
    """``λ_g = l²(1−p_g)/(2N)``: the dropout-VI prior (KL) term ``l²(1−p)/2·‖W‖²`` per example."""
    if n < 1 or lengthscale <= 0:
        raise ValueError(f"need n ≥ 1 and lengthscale > 0, got n={n}, lengthscale={lengthscale}")
    p = torch.tensor([float(r) for r in dropout_rates])
    return lengthscale**2 * (1.0 - p) / (2.0 * n)


def weight_decay_term(model: GroupedDropoutNet, weight_decay: torch.Tensor) -> torch.Tensor:
    """``Σ_g λ_g(‖W1_g‖² + ‖W2_g‖²)``: the L2 part of :func:`train_members`' objective (weights
    only, not the biases; ``λ`` from :func:`prior_weight_decay`)."""
    return (weight_decay * (model.w1.pow(2).sum((1, 2)) + model.w2.pow(2).sum((1, 2)))).sum()


def member_objective(
    model: GroupedDropoutNet,
    x: torch.Tensor,
    y: torch.Tensor,
    alphas: torch.Tensor,
    taus: torch.Tensor,
    weight_decay: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ_g [mean_n L_gn(α_g) + λ_g(‖W1_g‖² + ‖W2_g‖²)], the G energies mean_n L_gn)`` of one
    minibatch (``x`` ``B×D``, ``y`` ``B×1``): what :func:`train_members` descends."""
    energies = grouped_bbalpha_loss(mc_forward(model, x, k, generator), y, alphas, taus)
    return energies.sum() + weight_decay_term(model, weight_decay), energies


def train_members(
    model: GroupedDropoutNet,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    alphas: torch.Tensor,
    taus: torch.Tensor,
    weight_decay: torch.Tensor,
    epochs: int,
    k: int = 10,
    batch_size: int = 128,
    lr: float = 1e-3,
    tau_lr: float | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    desc: str = "train",
) -> list[float]:
    """Adam on ``Σ_g [mean_n L_gn(α_g) + λ_g(‖W1_g‖² + ‖W2_g‖²)]``, minibatches of ``batch_size``
    reshuffled every epoch; ``x`` ``N×D`` and ``y`` ``N`` standardised, ``taus`` in the same
    units. If the net learns τ (:meth:`GroupedDropoutNet.learn_tau`), ``taus`` is ignored and
    ``log τ_g`` is a parameter of the same energy — the Gaussian log-density's ``½·log τ`` term
    keeps it finite — updated by Adam at ``tau_lr`` (default ``lr``). Start τ low: the energy's
    gradient in ``log τ`` is ``τ·r²/2 − ½`` per example (``r`` the residual), ≥ −½ below the
    optimum but unbounded above it, and a huge early gradient stalls Adam for a long time.
    Returns the mean (over members) training energy of each epoch."""
    g = model.members
    for name, t in (("alphas", alphas), ("taus", taus), ("weight_decay", weight_decay)):
        if t.shape != (g,):
            raise ValueError(f"{name} must have one value per member ({g}), got {tuple(t.shape)}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"need epochs ≥ 1 and batch size ≥ 1, got {epochs} and {batch_size}")
    n = x.shape[0]
    y = y.view(n, 1)
    weights = [model.w1, model.b1, model.w2, model.b2]
    groups: list[dict] = [{"params": weights}]
    if model.log_tau is not None:
        groups.append({"params": [model.log_tau], "lr": tau_lr or lr})
    optimizer = torch.optim.Adam(groups, lr=lr)
    history: list[float] = []
    model.train()
    for _ in tqdm(range(epochs), desc=desc, disable=not progress, leave=False):
        order = torch.randperm(n, generator=generator)
        total = 0.0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            tau = taus if model.log_tau is None else model.log_tau.exp()
            objective, energies = member_objective(
                model, x[idx], y[idx], alphas, tau, weight_decay, k, generator
            )
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            optimizer.step()
            total += float(energies.detach().mean()) * idx.numel()
        history.append(total / n)
    model.eval()
    return history


def gaussian_mc_log_likelihood(
    samples: torch.Tensor, y: torch.Tensor, tau: torch.Tensor | float
) -> torch.Tensor:
    """Per-example MC predictive log-density in the units of ``samples`` and ``y``:

    ``logsumexp_k(−(τ/2)(y_n − f_nk)²) − log K − ½ log 2π + ½ log τ``

    for ``samples`` ``…×B×K``, ``y`` ``B`` and ``tau`` a scalar or one value per leading index;
    returns ``…×B``. A sample ``f_n = μ + σ·f̃_n`` in original units with ``τ`` in original units
    gives the standardised value minus ``log σ``.
    """
    tau = torch.as_tensor(tau, dtype=samples.dtype)
    tau = tau.view(*tau.shape, 1, 1)
    k = samples.shape[-1]
    sq = (y.to(samples.dtype).unsqueeze(-1) - samples).pow(2)
    lse = torch.logsumexp(-0.5 * tau * sq, dim=-1)
    return lse - math.log(k) - 0.5 * math.log(2 * math.pi) + 0.5 * torch.log(tau[..., 0])


@torch.no_grad()
def evaluate_members(
    model: GroupedDropoutNet,
    x: torch.Tensor,
    y: np.ndarray,
    *,
    y_mean: float,
    y_std: float,
    taus: Sequence[float],
    k: int,
    generator: torch.Generator | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> dict[str, np.ndarray]:
    """Test metrics per member from K MC samples, in the original target units.

    ``x`` is the standardised ``B×D`` input, ``y`` the ``B`` targets in original units, ``taus``
    the G precisions in original units. Samples are mapped back as ``f = y_mean + y_std·f̃`` and
    scored in float64. Returns ``rmse`` (of the MC mean ``(1/K)Σ_k f_k``) and
    ``log_likelihood`` (mean of :func:`gaussian_mc_log_likelihood` over examples), each ``G``.
    """
    g, b = model.members, x.shape[0]
    if len(taus) != g or y.shape != (b,):
        raise ValueError(f"need {g} taus and {b} targets, got {len(taus)} and {y.shape}")
    tau = torch.tensor(list(taus), dtype=torch.float64)
    target = torch.as_tensor(y, dtype=torch.float64)
    sq_err = torch.zeros(g, dtype=torch.float64)
    ll_sum = torch.zeros(g, dtype=torch.float64)
    per_chunk = max(1, max_rows // (g * k))
    model.eval()
    for start in range(0, b, per_chunk):
        xc, yc = x[start : start + per_chunk], target[start : start + per_chunk]
        f = mc_forward(model, xc, k, generator)[..., 0].double() * y_std + y_mean  # G×b×K
        sq_err += (f.mean(dim=2) - yc).pow(2).sum(dim=1)
        ll_sum += gaussian_mc_log_likelihood(f, yc, tau).sum(dim=1)
    return {"rmse": (sq_err / b).sqrt().numpy(), "log_likelihood": (ll_sum / b).numpy()}
