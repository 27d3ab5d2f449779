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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bayesgate.attacks.adaptive_settings import AdaptivePGDParameters
from bayesgate.attacks.methods.square import margin

ScoreFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``x`` (B×…) ↦ ``(log p̄(·|x) B×C, detector score B)``, differentiable, fresh masks per call."""

CLIP_MIN, CLIP_MAX = 0.0, 1.0


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
class AdaptivePGD(AdaptivePGDParameters):
    """The adaptive attack of the module docstring: radius ``eps``, ``steps`` steps of
    ``step_size`` (default ``eps/25``), detector weight ``weight`` (λ), margins ``kappa`` (κ) and
    ``delta`` (δ), and the ``schedule`` of the detector term — declared, with their checks, in
    :class:`~bayesgate.attacks.adaptive_settings.AdaptivePGDParameters`."""

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
        x_t = self._start(x, generator)
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
            x_t = self._step(x_t.detach(), grad, x)
        found = first >= 0
        best[~found] = x_t.detach()[~found]
        return AdaptiveResult(best, found, first)

    def _start(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """A uniform random point of the ε-ball around ``x`` (in [0, 1])."""
        start = torch.rand(x.shape, generator=generator, device="cpu").to(x.device)
        return self._project(x + (2 * start - 1) * self.eps, x)

    def _step(self, x_t: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One signed-gradient step down the loss, projected: ``clip(Π_ε(x_t − α·sgn ∇L))``."""
        return self._project(x_t - self.alpha * grad.sign(), x)

    def _unflagged(self, score: torch.Tensor, threshold: float) -> torch.Tensor:
        """With λ = 0 (plain PGD) the attack ignores the detector altogether."""
        return score <= threshold if self.weight > 0 else torch.ones_like(score, dtype=torch.bool)

    def loss(
        self,
        m: torch.Tensor,
        score: torch.Tensor,
        threshold: float,
        gate: torch.Tensor | float | None = None,
    ) -> torch.Tensor:
        """``relu(m + κ) + λ·g·relu(s − threshold + δ)`` per example (module docstring); ``g`` is
        ``gate`` when given, else this point's (:meth:`gate`)."""
        gate = self.gate(m) if gate is None else gate
        detector = torch.relu(score - threshold + self.delta)
        return torch.relu(m + self.kappa) + self.weight * gate * detector

    def gate(self, m: torch.Tensor) -> torch.Tensor:
        """``g`` at margins ``m`` (no gradient): ``1[m < 0]`` (``misclassify-first``) or 1
        (``joint``)."""
        if self.schedule == "misclassify-first":
            return (m < 0).detach().to(m.dtype)
        return torch.ones_like(m, requires_grad=False)

    def _project(self, x_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``clip(Π_ε(x_t))``: into the L∞ ball of radius ε around ``x``, then into [0, 1]."""
        return torch.min(torch.max(x_t, x - self.eps), x + self.eps).clamp(CLIP_MIN, CLIP_MAX)
