"""Adaptive white-box attack on a detector: L∞ PGD that misclassifies *and* evades the detector.

The attacker knows the network and the detector (the detector is public) and differentiates both
through the MC predictive, with fresh dropout masks at every step (expectation over
transformations: every step's gradient is that of a new K-pass estimate). ``score_fn(x)`` returns
``(log p̄(·|x) B×C, s(x) B)`` — the log-predictive and the detector score, both differentiable in
``x``; an input is flagged when ``s(x) > threshold``.

Loss minimised at every step (``y`` the clean label, ``m`` the margin)::

    m(x) = log p̄(y|x) − max_{c≠y} log p̄(c|x)
    L(x) = relu(m(x) + κ) + λ · g(x) · relu(s(x) − threshold + δ)

Schedule ``"misclassify-first"`` (default): ``g(x) = 1[m(x) < 0]`` on this step's draw, so the
detector term is off until the example is misclassified. A detector term weighted in from the
first step (``"joint"``: ``g = 1``) can pin a confidently classified digit at the clean point: near
it the detector's gradient dwarfs the margin's and the iterate never leaves the class — which
looks like robustness and is not (Tramèr et al. 2020). Both relu's stop pushing once their goal is
met with a margin (κ nats, δ score units), so the other term takes over.

Steps are signed-gradient steps projected onto the ε-ball and [0, 1], from a uniform random start
(Madry et al. 2018). Per example the attack keeps the last iterate that its own K-sample query saw
misclassified and unflagged; where there was none, the final iterate. With λ = 0 it is plain
(margin-loss) PGD that ignores the detector: it keeps the last iterate its query saw
misclassified. The verdict that counts is the caller's, on a fresh independent MC draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from bayesgate.attacks.methods.square import margin
from bayesgate.errors import InvalidArgument

ScoreFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``x`` (B×…) ↦ ``(log p̄(·|x) B×C, detector score B)``, differentiable, fresh masks per call."""

SCHEDULES = ("misclassify-first", "joint")
CLIP_MIN, CLIP_MAX = 0.0, 1.0


def check_radius(name: str, value: float) -> None:
    """:class:`InvalidArgument` naming ``name`` (a flag or parameter) unless ``value`` is an L∞
    radius in (0, 1] (NaN and ∞ are not)."""
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise InvalidArgument(f"{name} must be in (0, 1], got {value}")


def check_non_negative(name: str, value: float) -> None:
    """:class:`InvalidArgument` naming ``name`` unless ``value`` is finite and ≥ 0 (a weight λ or
    a margin κ, δ: NaN would also end up as invalid JSON in the results)."""
    if not (math.isfinite(value) and value >= 0.0):
        raise InvalidArgument(f"{name} must be a finite number ≥ 0, got {value}")


def checked_images(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached; ``ValueError`` unless every value lies in [0, 1]."""
    if x.min() < CLIP_MIN or x.max() > CLIP_MAX:
        raise ValueError("images must lie in [0, 1]")
    return x.detach()


@dataclass(frozen=True)
class AdaptiveResult:
    """``x_adv`` (shape of ``x``), ``found`` (B bool: the attack's own query saw an iterate
    misclassified and unflagged) and ``first_step`` (B int64, the first such step, −1 if none)."""

    x_adv: torch.Tensor
    found: torch.Tensor
    first_step: torch.Tensor


@dataclass(frozen=True)
class AdaptivePGD:
    """The adaptive attack of the module docstring: radius ``eps``, ``steps`` steps of
    ``step_size`` (default ``eps/25``), detector weight ``weight`` (λ), margins ``kappa`` (κ) and
    ``delta`` (δ), and the ``schedule`` of the detector term."""

    eps: float = 0.3
    steps: int = 100
    step_size: float | None = None
    weight: float = 1.0
    kappa: float = 1.0
    delta: float = 0.5
    schedule: str = "misclassify-first"

    optimizer: ClassVar[str] = "pgd"  # what minimises the loss (reports, cache names)

    def __post_init__(self) -> None:
        check_radius("adaptive eps", self.eps)
        if self.steps < 1:
            raise InvalidArgument(f"adaptive steps must be ≥ 1, got {self.steps}")
        if self.step_size is not None and not 0.0 < self.step_size <= self.eps:
            raise InvalidArgument(f"adaptive step_size must be in (0, eps], got {self.step_size}")
        check_non_negative("adaptive weight", self.weight)
        check_non_negative("adaptive kappa", self.kappa)
        check_non_negative("adaptive delta", self.delta)
        if self.schedule not in SCHEDULES:
            raise InvalidArgument(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else self.eps / 25

    @property
    def starts(self) -> int:
        """Random starts per example (one; the APGD variant restarts)."""
        return 1

    @property
    def cache_tag(self) -> str:
        """What sets this attack apart in an image-cache name beyond the shared fields."""
        return ""

    def __call__(
        self,
        score_fn: ScoreFn,
        x: torch.Tensor,
        y: torch.Tensor,
        threshold: float,
        *,
        generator: torch.Generator | None = None,
    ) -> AdaptiveResult:
        """Attack ``x`` (B×…, in [0, 1]) away from labels ``y``; ``generator`` draws the start."""
        x = checked_images(x)
        start = torch.rand(x.shape, generator=generator, device="cpu").to(x.device)
        x_t = self._project(x + (2 * start - 1) * self.eps, x)
        best = x_t.clone()
        first = torch.full((x.shape[0],), -1, dtype=torch.int64, device=x.device)
        for t in range(self.steps + 1):
            x_t.requires_grad_(True)
            log_p, score = score_fn(x_t)
            m = margin(log_p, y)
            success = ((m < 0) & self._unflagged(score, threshold)).detach()
            best[success] = x_t.detach()[success]
            first[success & (first < 0)] = t
            if t == self.steps:
                break
            grad = torch.autograd.grad(self.loss(m, score, threshold).sum(), x_t)[0]
            x_t = self._project(x_t.detach() - self.alpha * grad.sign(), x)
        found = first >= 0
        best[~found] = x_t.detach()[~found]
        return AdaptiveResult(best, found, first)

    def _unflagged(self, score: torch.Tensor, threshold: float) -> torch.Tensor:
        """With λ = 0 (plain PGD) the attack ignores the detector altogether."""
        return score <= threshold if self.weight > 0 else torch.ones_like(score, dtype=torch.bool)

    def loss(self, m: torch.Tensor, score: torch.Tensor, threshold: float) -> torch.Tensor:
        """``relu(m + κ) + λ·g·relu(s − threshold + δ)`` per example (module docstring)."""
        gate = (m < 0).detach().to(m.dtype) if self.schedule == "misclassify-first" else 1.0
        detector = torch.relu(score - threshold + self.delta)
        return torch.relu(m + self.kappa) + self.weight * gate * detector

    def _project(self, x_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``clip(Π_ε(x_t))``: into the L∞ ball of radius ε around ``x``, then into [0, 1]."""
        return torch.min(torch.max(x_t, x - self.eps), x + self.eps).clamp(CLIP_MIN, CLIP_MAX)
